"""The :class:`Model` every builder and part takes, and its plan ConfigMap's content and name."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from inferentia_operator.core.api import InferentiaModelSpec, Plan
from inferentia_operator.core.catalogue import FAMILIES
from inferentia_operator.core.cores import on_vllm_plugin
from inferentia_operator.core.findings import Finding
from inferentia_operator.core.launcher import LAUNCHER
from inferentia_operator.core.names import DEFAULT_OPERATOR_IMAGE, PLAN_MOUNT
from inferentia_operator.core.planner import plan
from inferentia_operator.core.pod.contribution import PodContribution
from inferentia_operator.core.pod.pools import ROLES
from inferentia_operator.programs import (
    COMPILE_PROGRAM,
    HUB_SNAPSHOT_MODULE,
    NXDI_COMPILE_PROGRAM,
    SERVE_PROGRAM,
    VLLM_COMPILE_PROGRAM,
    VLLM_WORKER_PROGRAM,
)
from inferentia_operator.programs import source as program_source


@dataclass(frozen=True)
class Model:
    """What the builders need to know about the owning InferentiaModel."""

    name: str
    namespace: str
    uid: str
    spec: InferentiaModelSpec
    plan: Plan
    # The operator's own image (--operator-image): the artefact fetch and upload, and the
    # batching front end unless the spec names another.
    operator_image: str = DEFAULT_OPERATOR_IMAGE
    # The scheduler of its serving pods when they take devices from the device plugin (the
    # operator's --scheduler-name); "" the cluster's default scheduler.
    scheduler_name: str = ""
    # The node-local artefact cache the serving pods' fetch asks first (the operator's
    # --node-cache-url); "" none.
    node_cache_url: str = ""
    # Where the node cache's pods run, labelled with what each holds (core/holds.py); "" none.
    node_cache_namespace: str = ""
    # The node plugin mounts the cache's views in serving pods (the operator's --node-views).
    node_views: bool = False
    # KEDA's namespace (the operator's --keda-namespace), the one that may reach a holder's
    # external scaler; "" no NetworkPolicy for it.
    keda_namespace: str = ""
    # The namespace of the Prometheus that scrapes the pods (the operator's --prometheus-namespace),
    # which a disaggregated model's pools admit to their port; "" only the model's proxy reaches it.
    prometheus_namespace: str = ""

    # The plan ConfigMap's content and name, built once a Model: the Deployment, the compile
    # Job, the ConfigMap itself and the clean-up of superseded plans all name it, and its
    # content carries the operator's programs (tens of kB to serialise and hash each time).
    @functools.cached_property
    def plan_files(self) -> Mapping[str, str]:
        return _plan_files(self)

    @functools.cached_property
    def plan_files_hash(self) -> str:
        return stable_hash(self.plan_files, 8)

    # The plan's hash, which every serving pod's template carries and status compares with.
    @functools.cached_property
    def plan_hash(self) -> str:
        return plan_hash(self.plan)

    # With prefill and decode pools (spec.disaggregation): each pool's model, in ROLES' order,
    # planned once a Model. The serving part builds each pool's children from it and the
    # clean-up keeps its plan ConfigMap, on every reconcile; the model the reconcile checked
    # and planned is kept (decide.RECENT_MODELS), and its pools with it.
    @functools.cached_property
    def pools(self) -> tuple[Model, ...]:
        if self.spec.disaggregation is None:
            return ()
        # Each pool's spec passed the model's rules (rules/disaggregation.py), so it is planned
        # without checking them again.
        efa = self.spec.disaggregation.efa  # each pool planned for its chips and its EFA devices
        return tuple(replace(self, spec=spec, plan=plan(spec, checked=[], pool_efa=efa)) for spec in map(self.spec.pool_spec, ROLES))

    # The instance types the model's serving pods may land on: its plan's, or with pools each
    # pool's (an EFA pool's are those with EFA devices for it), in the plans' order. What
    # fill-ahead fills and device faults name; not the proxy's, which takes no Neuron device.
    @functools.cached_property
    def serving_instance_types(self) -> list[str]:
        return list(dict.fromkeys(t for m in self.pools or (self,) for t in m.plan.instance_types))


def stable_hash(value: Any, length: int = 10) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:length]


def plan_document(plan: Plan) -> dict[str, Any]:
    """The plan as status, plan.json and the CLI show it: camelCase, fields that do not
    apply to the family (lnc and tensorParallelSize on inf1) left out."""
    return plan.model_dump(by_alias=True, mode="json", exclude_none=True)


def plan_hash(plan: Plan) -> str:
    return stable_hash(plan.model_dump(mode="json", exclude_none=True))


def vllm_plugin(model: Model) -> bool:
    """The vLLM preset on a family where vLLM runs on the vLLM Neuron plugin (trn2, trn3)."""
    return on_vllm_plugin(model.spec, FAMILIES[model.plan.family])


def vllm_nxd(model: Model) -> bool:
    """The vLLM preset on a family where vLLM runs on NxD Inference (inf2, trn1)."""
    return model.spec.serving.runtime == "vllm" and FAMILIES[model.plan.family].vllm == "nxd-inference"


def user_env_names(model: Model) -> set[str]:
    return {e.name for e in model.spec.serving.env or []}


def _plan_files(model: Model) -> dict[str, str]:
    data = {"plan.json": json.dumps(plan_document(model.plan), indent=2, sort_keys=True)}
    # The one rule for the environment: what the user sets in serving.env wins over what the
    # operator plans, in every process. The launcher exports env-i over the container's
    # environment, so a planned name the user set must not be in env-i at all.
    mine = user_env_names(model)
    for i, env in enumerate(model.plan.env):
        data[f"env-{i}"] = "".join(f"{k}={v}\n" for k, v in env.items() if k not in mine)
    data["launch.sh"] = LAUNCHER
    # The operator's programs, only where they run: a model that needs neither keeps its
    # ConfigMap (and so its pods) as it was.
    if model.spec.compiles_with_program or model.spec.serves_with_program:
        data[COMPILE_PROGRAM] = program_source(COMPILE_PROGRAM)
    if model.spec.serves_with_program:
        data[SERVE_PROGRAM] = program_source(SERVE_PROGRAM)
    if vllm_plugin(model) and model.spec.compile.image:
        data[VLLM_COMPILE_PROGRAM] = program_source(VLLM_COMPILE_PROGRAM)
    if vllm_nxd(model) and model.spec.compile.image:
        data[NXDI_COMPILE_PROGRAM] = program_source(NXDI_COMPILE_PROGRAM)
    if (vllm_plugin(model) or vllm_nxd(model)) and model.spec.compile.image:
        data[HUB_SNAPSHOT_MODULE] = program_source(HUB_SNAPSHOT_MODULE)
    if model.plan.nodes:
        data[VLLM_WORKER_PROGRAM] = program_source(VLLM_WORKER_PROGRAM)
    return data


# What one object may hold in etcd (the API server's default --max-request-bytes is 1.5 MiB,
# and a ConfigMap's data is capped at 1 MiB): the plan must fit, with room for metadata.
CONFIGMAP_DATA_LIMIT = 1024 * 1024 - 16 * 1024


def plan_size_findings(model: Model) -> list[Finding]:
    """The plan ConfigMap must fit its object; a plan of 128 processes with long compiler
    arguments does not, and the API server would refuse it on every reconcile."""
    size = sum(len(k) + len(v.encode()) for k, v in model.plan_files.items())
    if size <= CONFIGMAP_DATA_LIMIT:
        return []
    return [
        Finding(
            "spec.compile.extraArgs",
            f"the plan of {model.plan.groups} processes with these compiler arguments is {size} bytes, more than the "
            f"{CONFIGMAP_DATA_LIMIT} a ConfigMap can hold; valid plans use fewer processesPerReplica or shorter extraArgs",
        )
    ]


def plan_configmap_name(model: Model) -> str:
    # Named after its whole content, not only the plan: the ConfigMap is immutable, so an
    # operator upgrade that changes the launcher must make a new one, never edit the old.
    return f"{model.name}-plan-{model.plan_files_hash}"


def plan_volume(model: Model) -> dict[str, Any]:
    return {"name": "plan", "configMap": {"name": plan_configmap_name(model)}}


def mounted_plan(model: Model) -> PodContribution:
    """The plan ConfigMap (the plan, each process's environment, the launcher and the operator's
    programs), read-only where the main container reads it."""
    return PodContribution(mounts=({"name": "plan", "mountPath": PLAN_MOUNT, "readOnly": True},), volumes=(plan_volume(model),))
