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
from typing import Any, Literal

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
    # Which pool of a disaggregated model a pod serves in (its inferentia.dev/pool label, as the labelmap names it).
    pool_label: str = "inferentia_dev_pool"


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
            "advanced": _behaviour(a.scale_up_stabilization_seconds, a.scale_down_stabilization_seconds),
            "triggers": [
                _prometheus_trigger(
                    "in-flight-requests", in_flight_query(spec, namespace, name, prometheus), target_in_flight(spec), prometheus
                ),
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


def _behaviour(up_seconds: int, down_seconds: int) -> dict[str, Any]:
    """The HPA's stabilization windows, as KEDA passes them on (the ScaledObject's advanced section)."""
    return {
        "horizontalPodAutoscalerConfig": {
            "behavior": {
                "scaleUp": {"stabilizationWindowSeconds": up_seconds},
                "scaleDown": {"stabilizationWindowSeconds": down_seconds},
            }
        }
    }


def _prometheus_trigger(name: str, query: str, threshold: int, prometheus: Prometheus, empty_is_error: bool = False) -> dict[str, Any]:
    """A Prometheus trigger whose query's value the HPA divides by the replicas and compares
    with ``threshold`` (AverageValue). ``empty_is_error``: a query that finds no series is an
    error to KEDA rather than 0 (ignoreNullValues "false": "the scaler will return error when
    Prometheus target is lost", https://keda.sh/docs/2.13/scalers/prometheus/), which KEDA's
    Ready condition then reports, and on which the HPA scales nothing down."""
    return {
        "type": "prometheus",
        "name": name,
        "metricType": "AverageValue",
        "metadata": {
            "serverAddress": prometheus.address,
            "query": query,
            "threshold": str(threshold),
            **({"awsRegion": prometheus.aws_region} if prometheus.aws_region else {}),
            **({"ignoreNullValues": "false"} if empty_is_error else {}),
        },
        **(
            {"authenticationRef": {"name": prometheus.authentication, "kind": prometheus.authentication_kind}}
            if prometheus.authentication
            else {}
        ),
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
    said = _not_scaled(engine, name, "the model", floor)
    if said is not None:
        return said
    return api.Condition(
        type="Autoscaling", status="True", reason="ScaledObjectReady",
        message=f"KEDA scales the model between {a.min_replicas} and {a.max_replicas} replicas, {target_in_flight(spec)} requests "
        f"in flight per replica; {desired_replicas(spec, True)} desired now",
    )  # fmt: skip


# --- prefill and decode pools (spec.disaggregation.<pool>.autoscaling) ------------------------
#
# Each pool scales on its own servers' vLLM gauges, through a ScaledObject on its own Deployment
# (the model's spec.replicas is the proxy's). vLLM's "Production Metrics"
# (https://docs.vllm.ai/en/stable/usage/metrics/): vllm:num_requests_waiting, "Number of requests
# waiting to be processed", vllm:num_requests_running, "Number of requests in model execution
# batches", and vllm:kv_cache_usage_perc, "KV-cache usage. 1 means 100 percent usage" (named
# vllm:gpu_cache_usage_perc before vLLM 0.10; the plugin's vLLM has the new name). A prefill
# server's queue is what a request's time to first token waits in; a decode server's time per
# output token grows with the sequences it batches and is bounded by the KV cache they hold.
PoolRole = Literal["prefill", "decode"]
PROMPT_QUEUE_GAUGE = "vllm:num_requests_waiting"
RUNNING_GAUGE = "vllm:num_requests_running"
KV_CACHE_GAUGE = "vllm:kv_cache_usage_perc"


@dataclass(frozen=True)
class PoolSignal:
    """One trigger of a pool's ScaledObject: its name, its query, and the value per replica it aims at."""

    trigger: str
    query: str
    target: int
    what: str  # the signal, as status names it


def pool_autoscaling(spec: api.InferentiaModelSpec, role: PoolRole) -> api.PoolAutoscaling | None:
    d = spec.disaggregation
    return None if d is None else d.pool(role).autoscaling


def _pool_query(gauge: str, namespace: str, name: str, role: PoolRole, window: int, prometheus: Prometheus) -> str:
    """One gauge of the pool's servers, summed over its pods, averaged over the window."""
    selector = (
        f"{gauge}{{{prometheus.namespace_label}={_label_value(namespace)},{prometheus.model_label}={_label_value(name)},"
        f"{prometheus.pool_label}={_label_value(role)}}}"
    )
    return f"sum(avg_over_time({selector}[{window}s]))" if window else f"sum({selector})"


def pool_signals(
    spec: api.InferentiaModelSpec, role: PoolRole, namespace: str, name: str, prometheus: Prometheus
) -> tuple[PoolSignal, ...]:
    """What the pool scales on: prefill on its prompt queue; decode on its running sequences and
    its KV-cache use in percent (KEDA gives the HPA one metric a trigger, and the HPA takes the
    largest count they ask for: https://kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/#scaling-on-multiple-metrics).
    A target left out is the replica's batch, serving.batching.maxBatchSize (vLLM's --max-num-seqs;
    rules/disaggregation.py asks for it otherwise)."""
    a = pool_autoscaling(spec, role)
    assert a is not None
    batch = spec.serving.batching.max_batch_size if spec.serving.batching is not None else None
    if isinstance(a, api.PrefillAutoscaling):
        waiting = a.target_waiting or batch
        assert waiting is not None
        query = _pool_query(PROMPT_QUEUE_GAUGE, namespace, name, role, a.window_seconds, prometheus)
        return (PoolSignal("prompt-queue", query, waiting, f"{waiting} requests waiting"),)
    assert isinstance(a, api.DecodeAutoscaling)
    running = a.target_running or batch
    assert running is not None
    kv = _pool_query(KV_CACHE_GAUGE, namespace, name, role, a.window_seconds, prometheus)
    return (
        PoolSignal("running-sequences", _pool_query(RUNNING_GAUGE, namespace, name, role, a.window_seconds, prometheus), running,
                   f"{running} sequences running"),
        PoolSignal("kv-cache-usage", f"100 * {kv}", a.target_kv_cache_percent, f"{a.target_kv_cache_percent}% of its KV cache"),
    )  # fmt: skip


def pool_scaled_object(
    spec: api.InferentiaModelSpec,
    role: PoolRole,
    namespace: str,
    name: str,
    deployment: str,
    metadata: dict[str, Any],
    prometheus: Prometheus,
) -> dict[str, Any]:
    """The pool's ScaledObject: it scales the pool's Deployment (``deployment``) itself, between
    minReplicas (at least 1: a pool never goes to zero) and maxReplicas."""
    a = pool_autoscaling(spec, role)
    assert a is not None
    return {
        "apiVersion": SCALED_OBJECT_API_VERSION,
        "kind": SCALED_OBJECT_KIND,
        "metadata": metadata,
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment},
            "minReplicaCount": a.min_replicas,
            "maxReplicaCount": a.max_replicas,
            "advanced": _behaviour(a.scale_up_stabilization_seconds, a.scale_down_stabilization_seconds),
            # A pool always has a server, and vLLM always exports these gauges: a query that
            # finds nothing means Prometheus does not see the pool (its scrapes refused by the
            # pools' NetworkPolicy, a label named otherwise), which read as 0 would hold the pool
            # at minReplicas under any load while KEDA said Ready.
            "triggers": [
                _prometheus_trigger(s.trigger, s.query, s.target, prometheus, empty_is_error=True)
                for s in pool_signals(spec, role, namespace, name, prometheus)
            ],
        },
    }


def pool_desired_replicas(spec: api.InferentiaModelSpec, role: PoolRole, scaled: bool, live: int | None) -> int:
    """The pool Deployment's replicas. Without the pool's autoscaling, its replicas. With it,
    while its ScaledObject exists or is being written (``scaled``), what the Deployment runs now
    (``live``: the count the HPA last set, or the pool's before it autoscaled), kept within the
    range, so the operator keeps KEDA's count as last observed (a write for another reason can
    undo a scaling the HPA made a moment before, until the next sync: docs/autoscaling.md);
    else (and for a pool not yet running) minReplicas."""
    d = spec.disaggregation
    assert d is not None
    pool = d.pool(role)
    a = pool.autoscaling
    if a is None:
        return pool.replicas
    if not scaled or live is None:
        return a.min_replicas
    return min(max(live, a.min_replicas), a.max_replicas)


@dataclass(frozen=True)
class PoolFacts:
    """One pool with its own autoscaling, as the autoscaling part concluded (scaling/part.py):
    its ScaledObject's name (the pool Deployment's), its range, its signals (none without
    Prometheus) and the replicas its Deployment runs."""

    role: PoolRole
    name: str
    autoscaling: api.PoolAutoscaling
    signals: tuple[PoolSignal, ...]
    replicas: int


def pools_condition(pools: tuple[tuple[PoolFacts, Engine], ...]) -> api.Condition | None:
    """The Autoscaling condition of a model whose pools scale, one ScaledObject a pool, from each
    pool's facts and what writing its ScaledObject found: True once KEDA scales every such pool;
    otherwise what the first pool that is not scaled met. Meanwhile each pool runs its minReplicas."""
    if not pools:
        return None
    floor = "; ".join(f"the {p.role} pool runs minReplicas ({p.autoscaling.min_replicas})" for p, _ in pools)
    if not pools[0][1].configured:
        return api.Condition(
            type="Autoscaling", status="False", reason="PrometheusNotConfigured",
            message=f"the operator has no Prometheus address (run --prometheus-address, chart value "
            f"autoscaling.prometheus.address) to read the pools' vLLM metrics from; {floor}",
        )  # fmt: skip
    for p, engine in pools:
        said = _not_scaled(engine, p.name, f"the {p.role} pool", floor)
        if said is not None:
            return said
    scaling = "; ".join(
        f"the {p.role} pool between {p.autoscaling.min_replicas} and {p.autoscaling.max_replicas} replicas on "
        f"{' and '.join(s.what for s in p.signals)} per replica, {p.replicas} desired now"
        for p, _ in pools
    )
    return api.Condition(type="Autoscaling", status="True", reason="ScaledObjectReady", message=f"KEDA scales {scaling}")


def _not_scaled(engine: Engine, name: str, what: str, floor: str) -> api.Condition | None:
    """What keeps one ScaledObject from scaling ``what``, as the Autoscaling condition says it;
    None once KEDA says it is Ready."""
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
    if ready.get("status") == "True":
        return None
    said = ": ".join(str(x) for x in (ready.get("reason"), ready.get("message")) if x) or "no reason given"
    if ready.get("status") == "False":
        return api.Condition(
            type="Autoscaling", status="False", reason="ScaledObjectNotReady",
            message=f"KEDA cannot scale {what} with ScaledObject {name}: {said}",
        )  # fmt: skip
    if ready.get("status") == "Unknown":
        # KEDA reported, unsure: some of the triggers fail (its PartialTriggerError), or the
        # ScaledObject is being set up. Its own words, not a question whether it runs.
        return api.Condition(
            type="Autoscaling", status="Unknown", reason="ScaledObjectNotReady",
            message=f"KEDA is not sure it can scale {what} with ScaledObject {name}: {said}",
        )  # fmt: skip
    return api.Condition(
        type="Autoscaling", status="Unknown", reason="WaitingForKEDA",
        message=f"ScaledObject {name} has no Ready condition from KEDA yet (is KEDA's operator running?)",
    )  # fmt: skip
