"""Autoscaling (spec.autoscaling): the KEDA ScaledObject a model gets, the replicas its
Deployment runs, and the Autoscaling condition. Pure, no API client.

KEDA scales the InferentiaModel itself, through its scale subresource: the HPA that KEDA
makes writes spec.replicas, and the operator carries spec.replicas (within the range) to
the Deployment. So there is one count, in the model, which `kubectl get`, GitOps tools
and the operator all read, and the operator never writes a replica count that an
autoscaler owns.

The signal is Cortex's: the requests a replica holds, queued plus being served, summed
over the model's pods, and divided by the target per replica (an ``AverageValue`` target
of an external metric, which the HPA divides by the target and rounds up:
https://kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/#algorithm-details).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import api
from .objects import Obj

SCALED_OBJECT_API_VERSION = "keda.sh/v1alpha1"
SCALED_OBJECT_KIND = "ScaledObject"
# What the API server answers (404) for a resource it does not serve, as opposed to a
# namespace it does not have ("namespaces \"x\" not found").
NOT_SERVED = "the server could not find the requested resource"

# The request gauges each serving pod exports (docs/autoscaling.md): the batching front
# end's, named after the Gateway API Inference Extension's model server protocol, or vLLM's own.
FRONT_END_GAUGES = ("inferentia_num_requests_waiting", "inferentia_num_requests_running")
VLLM_GAUGES = ("vllm:num_requests_waiting", "vllm:num_requests_running")
# What the holder of a model at zero replicas exports (batching/holder.py): the requests it holds.
HELD_GAUGE = "inferentia_num_requests_waiting"
# How often KEDA asks whether a model at zero has demand (its own default is 30 s): part of
# every start from zero, with Prometheus's scrape interval.
ZERO_POLLING_SECONDS = 5


@dataclass(frozen=True)
class Prometheus:
    """Where KEDA reads the gauges, and the labels Prometheus gives a pod's namespace and
    model: operator settings (``run --prometheus-address`` etc., chart values
    ``autoscaling.prometheus.*``). The defaults are the labels of Prometheus's example
    Kubernetes configuration (its ``labelmap`` of pod labels, and ``namespace``)."""

    address: str = ""
    namespace_label: str = "namespace"
    model_label: str = "inferentia_dev_model"
    # A Prometheus that wants credentials: the KEDA TriggerAuthentication (in each model's
    # namespace) or ClusterTriggerAuthentication the trigger names, and for Amazon Managed
    # Prometheus the region KEDA signs its queries for (SigV4).
    authentication: str = ""
    authentication_kind: str = "TriggerAuthentication"
    aws_region: str = ""


NO_PROMETHEUS = Prometheus()  # the default: no address, so autoscaled models run at minReplicas


def scales_to_zero(spec: api.InferentiaModelSpec) -> bool:
    return spec.autoscaling is not None and spec.autoscaling.min_replicas == 0


def lowest(spec: api.InferentiaModelSpec, has_artefact: bool = True) -> int:
    """The fewest replicas the autoscaler may set: minReplicas, but 1 for a model that scales
    to zero until its first compile completed (a start from zero must find an artefact)."""
    assert spec.autoscaling is not None
    return spec.autoscaling.min_replicas if spec.autoscaling.min_replicas > 0 or has_artefact else 1


def target_in_flight(spec: api.InferentiaModelSpec) -> int:
    """spec.autoscaling.targetInFlight, else the replica's parallelism: each process runs one
    batch of at most maxBatchSize at a time (with vLLM, maxBatchSize is --max-num-seqs).
    A vLLM model without serving.batching must name it (rules.autoscaling.AUTOSCALING_TARGET)."""
    assert spec.autoscaling is not None
    if spec.autoscaling.target_in_flight is not None:
        return spec.autoscaling.target_in_flight
    assert spec.serving.batching is not None
    return spec.processes_per_replica * spec.serving.batching.max_batch_size


def _label_value(value: str) -> str:
    """A PromQL string literal: backslash and double quote escaped."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def in_flight_query(spec: api.InferentiaModelSpec, namespace: str, name: str, prometheus: Prometheus) -> str:
    """The model's in-flight requests, summed over its pods, averaged over the window."""
    assert spec.autoscaling is not None
    gauges: tuple[str, ...] = VLLM_GAUGES if spec.serving.runtime == "vllm" else FRONT_END_GAUGES
    if scales_to_zero(spec) and HELD_GAUGE not in gauges:
        gauges = (*gauges, HELD_GAUGE)  # the holder's: requests that wait for a replica to start
    selector = (
        f'{{__name__=~"{"|".join(gauges)}",'
        f"{prometheus.namespace_label}={_label_value(namespace)},{prometheus.model_label}={_label_value(name)}}}"
    )
    window = spec.autoscaling.window_seconds
    return f"sum(avg_over_time({selector}[{window}s]))" if window else f"sum({selector})"


def scaled_object(
    spec: api.InferentiaModelSpec,
    namespace: str,
    name: str,
    metadata: dict[str, Any],
    prometheus: Prometheus,
    has_artefact: bool = True,
    push_address: str | None = None,
) -> dict[str, Any]:
    """The ScaledObject (https://keda.sh/docs/latest/reference/scaledobject-spec/) with a
    Prometheus trigger (https://keda.sh/docs/latest/scalers/prometheus/) and, with
    ``push_address``, an external-push trigger on the holder's external scaler
    (https://keda.sh/docs/latest/scalers/external-push/): the requests it holds reach KEDA the
    moment they arrive, where the Prometheus trigger sees them only after a scrape and a poll.
    ``metadata``: the child's name, labels and owner reference, as for every other child."""
    a = spec.autoscaling
    assert a is not None
    # To and from zero KEDA acts itself: it polls the trigger every pollingInterval, starts a
    # replica when the query is above 0, and goes to zero cooldownPeriod after it last was.
    zero = {"pollingInterval": ZERO_POLLING_SECONDS, "cooldownPeriod": a.idle_seconds} if scales_to_zero(spec) else {}
    return {
        "apiVersion": SCALED_OBJECT_API_VERSION,
        "kind": SCALED_OBJECT_KIND,
        "metadata": metadata,
        "spec": {
            "scaleTargetRef": {"apiVersion": api.API_VERSION, "kind": api.KIND, "name": name},
            **zero,
            "minReplicaCount": lowest(spec, has_artefact),
            "maxReplicaCount": a.max_replicas,
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": {
                        "scaleUp": {"stabilizationWindowSeconds": a.scale_up_stabilization_seconds},
                        "scaleDown": {"stabilizationWindowSeconds": a.scale_down_stabilization_seconds},
                    }
                }
            },
            "triggers": [
                {
                    "type": "prometheus",
                    "name": "in-flight-requests",
                    "metricType": "AverageValue",
                    "metadata": {
                        "serverAddress": prometheus.address,
                        "query": in_flight_query(spec, namespace, name, prometheus),
                        "threshold": str(target_in_flight(spec)),
                        **({"awsRegion": prometheus.aws_region} if prometheus.aws_region else {}),
                    },
                    **(
                        {"authenticationRef": {"name": prometheus.authentication, "kind": prometheus.authentication_kind}}
                        if prometheus.authentication
                        else {}
                    ),
                },
                *(
                    [
                        {
                            "type": "external-push",
                            "name": "held-requests",
                            "metricType": "AverageValue",
                            "metadata": {"scalerAddress": push_address},
                        }
                    ]
                    if push_address
                    else []
                ),
            ],
        },
    }


def desired_replicas(spec: api.InferentiaModelSpec, scaled: bool, has_artefact: bool = True) -> int:
    """The Deployment's replicas: spec.replicas, within the range while something scales the
    model (its ScaledObject exists), else minReplicas, and at least 1, since nothing would
    start it from zero: never silently a fixed count."""
    a = spec.autoscaling
    if a is None:
        return spec.replicas
    if not scaled:
        return max(a.min_replicas, 1)
    return min(max(spec.replicas, lowest(spec, has_artefact)), a.max_replicas)


@dataclass(frozen=True)
class Engine:
    """What autoscaling found: the ScaledObject as the caches hold it (None when absent), and
    what writing it met, when it was written (the API server's status code and message)."""

    configured: bool  # the operator has a Prometheus address
    live: dict[str, Any] | None
    refused: tuple[int, str] | None = None
    conflict: str | None = None  # an object of someone else's has the ScaledObject's name


def condition(spec: api.InferentiaModelSpec, name: str, engine: Engine) -> api.Condition | None:
    """The Autoscaling condition, for a model with spec.autoscaling; None without."""
    a = spec.autoscaling
    if a is None:
        return None
    floor = f"the model runs minReplicas ({a.min_replicas})" if a.min_replicas else "the model runs 1 replica"
    if not engine.configured:
        return api.Condition(
            type="Autoscaling", status="False", reason="PrometheusNotConfigured",
            message=f"the operator has no Prometheus address (run --prometheus-address, chart value "
            f"autoscaling.prometheus.address) to read in-flight requests from; {floor}",
        )  # fmt: skip
    if engine.conflict is not None:
        return api.Condition(type="Autoscaling", status="False", reason="ScaledObjectConflict", message=f"{engine.conflict}; {floor}")
    if engine.refused is not None:
        code, message = engine.refused
        if code == 404 and message == NOT_SERVED:
            return api.Condition(
                type="Autoscaling", status="False", reason="KEDANotInstalled",
                message=f"this cluster does not serve KEDA's ScaledObject ({SCALED_OBJECT_API_VERSION}); "
                f"install KEDA (https://keda.sh/docs/latest/deploy/) and the operator writes it within a resync; {floor}",
            )  # fmt: skip
        return api.Condition(
            type="Autoscaling", status="False", reason="ScaledObjectRefused",
            message=f"the API server refused ScaledObject {name}: {code} {message}; {floor}",
        )  # fmt: skip
    if engine.live is None:
        return api.Condition(type="Autoscaling", status="Unknown", reason="Pending", message=f"ScaledObject {name} is being written")
    ready = Obj(engine.live).condition("Ready")
    scaling = f"between {a.min_replicas} and {a.max_replicas} replicas"
    if ready.get("status") == "True":
        return api.Condition(
            type="Autoscaling", status="True", reason="ScaledObjectReady",
            message=f"KEDA scales the model {scaling}, {target_in_flight(spec)} requests in flight per replica; "
            f"{desired_replicas(spec, True)} desired now",
        )  # fmt: skip
    if ready.get("status") == "False":
        said = ": ".join(str(x) for x in (ready.get("reason"), ready.get("message")) if x) or "no reason given"
        return api.Condition(
            type="Autoscaling", status="False", reason="ScaledObjectNotReady",
            message=f"KEDA cannot scale the model with ScaledObject {name}: {said}",
        )  # fmt: skip
    return api.Condition(
        type="Autoscaling", status="Unknown", reason="WaitingForKEDA",
        message=f"ScaledObject {name} has no Ready condition from KEDA yet (is KEDA's operator running?)",
    )  # fmt: skip
