"""The serving pods' claim on their Neuron devices (allocation dra): its name and content, which
the serving pods name and the device-claims part makes the template of; and how a serving pod
gets its devices, from that claim or from the device plugin."""

from __future__ import annotations

from typing import Any

from inferentia_operator.core.catalogue import DRA_CONFIG_API_VERSION, DRA_DRIVER, DRA_GROUP_ATTRIBUTE, FAMILIES
from inferentia_operator.core.pod.contribution import PodContribution
from inferentia_operator.core.pod.model import Model, stable_hash

# The pod's claim on its Neuron devices, with allocation dra.
CLAIM = "neurons"


def claim_template_name(model: Model) -> str:
    """Named after its content: a ResourceClaimTemplate's spec cannot change, so a new plan
    makes a new one, and the pods of the previous plan keep the claims already made from theirs."""
    return f"{model.name}-neurons-{stable_hash(claim_spec(model), 6)}"


def claim_spec(model: Model) -> dict[str, Any]:
    """The claim each replica makes, as AWS's templates for the Neuron DRA driver write it
    (catalogue.DRA_DRIVER): ExactCount of the class's devices, on the plan's instance types,
    from one connected-device group when there are several, with the LNC as NeuronConfig."""
    plan = model.plan
    types = ", ".join(f"'{t}'" for t in plan.instance_types)
    devices: dict[str, Any] = {
        "requests": [
            {
                "name": CLAIM,
                "exactly": {
                    "deviceClassName": DRA_DRIVER,
                    "allocationMode": "ExactCount",
                    "count": plan.chips or 0,
                    "selectors": [{"cel": {"expression": f"device.attributes['{DRA_DRIVER}'].instanceType in [{types}]"}}],
                },
            }
        ]
    }
    if plan.connected_devices:
        devices["constraints"] = [{"requests": [CLAIM], "matchAttribute": DRA_GROUP_ATTRIBUTE.format(plan.connected_devices)}]
    if plan.lnc is not None and len(FAMILIES[plan.family].lnc_values) > 1:
        parameters = {"apiVersion": DRA_CONFIG_API_VERSION, "kind": "NeuronConfig", "logicalNeuronCore": plan.lnc}
        devices["config"] = [{"requests": [CLAIM], "opaque": {"driver": DRA_DRIVER, "parameters": parameters}}]
    return {"devices": devices}


def devices(model: Model) -> PodContribution:
    """Where a serving pod's Neuron devices come from: with allocation dra, a claim made from the
    template the device-claims part writes, named by the serve container; else the device
    plugin, whose devices the scheduler the operator names places."""
    if model.plan.allocation == "dra":  # devices from a resource claim, not the device plugin
        template = {"name": CLAIM, "resourceClaimTemplateName": claim_template_name(model)}
        return PodContribution(claims=({"name": CLAIM},), resource_claims=(template,))
    # On EKS the Neuron scheduler extension places multi-device requests only
    # through a second scheduler the pod names
    # (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/containers/tutorials/k8s-multiple-scheduler.html);
    # a DRA claim needs no extension.
    return PodContribution(scheduler_name=model.scheduler_name)
