"""Each prefill and decode pool scaling on its own signal (spec.disaggregation.<pool>.autoscaling):
a KEDA ScaledObject per pool on the pool's Deployment, its queries on the pool servers' vLLM
gauges, the replicas the operator leaves the pool's Deployment (never writing over KEDA), the
Autoscaling condition and status.pools, and the ScaledObjects' removal."""

from __future__ import annotations

import pytest

from inferentia_operator.core.api import InferentiaModelSpec
from inferentia_operator.core.autoscaling import Prometheus
from inferentia_operator.core.decide import decide, rendered
from inferentia_operator.core.observed import Observed
from inferentia_operator.core.planner import plan
from inferentia_operator.core.pod.model import Model
from inferentia_operator.core.serving.deployment import serving_deployment
from inferentia_operator.core.settings import Settings
from specs import DROP, pd_spec

UID = "0c6a1d2e-0000-4000-8000-000000000001"
NOW = "2026-01-01T00:00:00Z"
PROMETHEUS = Settings(prometheus=Prometheus("http://prometheus:9090"))
NO_PROMETHEUS = Settings()
PREFILL = {"minReplicas": 1, "maxReplicas": 4, "targetWaiting": 2}
DECODE = {"minReplicas": 2, "maxReplicas": 6, "targetRunning": 8, "targetKvCachePercent": 70, "windowSeconds": 30}
SCALED = {"disaggregation.prefill.autoscaling": PREFILL, "disaggregation.decode.autoscaling": DECODE}


def spec_of(**overrides) -> dict:
    return pd_spec(**{**SCALED, **overrides})


def model_of(spec: dict) -> Model:
    parsed = InferentiaModelSpec.model_validate(spec)
    return Model("m", "ns", UID, parsed, plan(parsed))


def body_of(spec: dict) -> dict:
    return {"metadata": {"name": "m", "namespace": "ns", "uid": UID, "generation": 1}, "spec": spec, "status": {}}


def kids(spec: dict, settings: Settings = PROMETHEUS) -> dict[tuple[str, str], dict]:
    return {(c["kind"], c["metadata"]["name"]): c for c in rendered(model_of(spec), settings)}


def converged(spec: dict, settings: Settings, replicas: dict[str, int] | None = None, ready: dict | None = None, **rest) -> Observed:
    """Every child live as rendered (Deployments rolled out, at ``replicas`` where given: what the
    HPA set), ScaledObjects with KEDA's Ready condition (``ready``: status by name, default True)."""
    objs = []
    for child in rendered(model_of(spec), settings):
        name = child["metadata"]["name"]
        meta = {**child["metadata"], "generation": 1, "uid": "u-" + name}
        obj = {**child, "metadata": meta}
        if child["kind"] == "Deployment":
            n = (replicas or {}).get(name, child["spec"]["replicas"])
            obj["spec"] = {**child["spec"], "replicas": n}
            obj["status"] = {
                "observedGeneration": 1, "replicas": n, "readyReplicas": n, "updatedReplicas": n, "availableReplicas": n,
                "conditions": [{"type": "Available", "status": "True"}, {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}],
            }  # fmt: skip
            for container in obj["spec"]["template"]["spec"]["containers"]:
                for env in container.get("env", []):
                    if "fieldRef" in env.get("valueFrom", {}):
                        env["valueFrom"]["fieldRef"]["apiVersion"] = "v1"
        if child["kind"] == "ScaledObject":
            obj["status"] = {"conditions": [{"type": "Ready", "status": (ready or {}).get(name, "True")}]}
        objs.append(obj)
    return Observed.of(body_of(spec), *objs, **rest)


def condition(decision, kind: str = "Autoscaling"):
    return next((c for c in decision.report.status.conditions if c.type == kind), None)


# --- the ScaledObjects ------------------------------------------------------------------------


def test_each_pool_gets_a_scaled_object_on_its_own_deployment():
    children = kids(spec_of())
    for role, a in (("prefill", PREFILL), ("decode", DECODE)):
        so = children[("ScaledObject", f"m-{role}")]
        assert so["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": f"m-{role}"}
        assert ("Deployment", f"m-{role}") in children
        assert (so["spec"]["minReplicaCount"], so["spec"]["maxReplicaCount"]) == (a["minReplicas"], a["maxReplicas"])
        assert so["metadata"]["ownerReferences"][0]["uid"] == UID
        behavior = so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
        assert (behavior["scaleUp"]["stabilizationWindowSeconds"], behavior["scaleDown"]["stabilizationWindowSeconds"]) == (60, 300)
    # The model's spec.replicas is the proxy's: no ScaledObject scales the model itself.
    assert ("ScaledObject", "m") not in children


def test_prefill_scales_on_its_prompt_queue_per_replica():
    (trigger,) = kids(spec_of())[("ScaledObject", "m-prefill")]["spec"]["triggers"]
    assert (trigger["type"], trigger["name"], trigger["metricType"]) == ("prometheus", "prompt-queue", "AverageValue")
    assert trigger["metadata"] == {
        "serverAddress": "http://prometheus:9090",
        "query": 'sum(avg_over_time(vllm:num_requests_waiting{namespace="ns",inferentia_dev_model="m",inferentia_dev_pool="prefill"}[60s]))',
        "threshold": "2",
        "ignoreNullValues": "false",
    }


def test_a_pool_query_that_finds_nothing_is_an_error_to_keda_not_a_zero():
    """A pool never has no server, and vLLM always exports its gauges: a pool query that finds
    nothing means Prometheus does not see the pool (its scrapes refused by the pools'
    NetworkPolicy, a label it names otherwise). Read as 0 (KEDA's default), the pool would
    stay at minReplicas under any load while its ScaledObject, and so the model, said Ready;
    as an error, KEDA's Ready condition says so and the HPA scales down on no blind reading.
    The whole model's query keeps the default: a model scaled to zero has no pod to find."""
    children = kids(spec_of())
    for name in ("m-prefill", "m-decode"):
        assert {t["metadata"]["ignoreNullValues"] for t in children[("ScaledObject", name)]["spec"]["triggers"]} == {"false"}
    whole = kids(pd_spec(disaggregation=DROP, autoscaling={"maxReplicas": 3, "targetInFlight": 4}))[("ScaledObject", "m")]
    assert "ignoreNullValues" not in whole["spec"]["triggers"][0]["metadata"]


def test_decode_scales_on_running_sequences_and_kv_cache_use_whichever_asks_more():
    running, kv = kids(spec_of())[("ScaledObject", "m-decode")]["spec"]["triggers"]
    selector = '{namespace="ns",inferentia_dev_model="m",inferentia_dev_pool="decode"}'
    assert (running["name"], running["metadata"]["threshold"]) == ("running-sequences", "8")
    assert running["metadata"]["query"] == f"sum(avg_over_time(vllm:num_requests_running{selector}[30s]))"
    assert (kv["name"], kv["metadata"]["threshold"]) == ("kv-cache-usage", "70")
    # vLLM reports the share as a fraction (1 is 100 percent): the query counts percent.
    assert kv["metadata"]["query"] == f"100 * sum(avg_over_time(vllm:kv_cache_usage_perc{selector}[30s]))"
    assert {t["metricType"] for t in (running, kv)} == {"AverageValue"}


def test_targets_left_out_are_the_batch_and_eighty_percent_and_a_zero_window_reads_the_gauge_as_it_is():
    spec = spec_of(
        **{
            "serving.batching": {"maxBatchSize": 6},
            "disaggregation.prefill.autoscaling": {"maxReplicas": 2, "windowSeconds": 0},
            "disaggregation.decode.autoscaling": {"maxReplicas": 2},
        }
    )
    children = kids(spec)
    (waiting,) = children[("ScaledObject", "m-prefill")]["spec"]["triggers"]
    running, kv = children[("ScaledObject", "m-decode")]["spec"]["triggers"]
    assert [t["metadata"]["threshold"] for t in (waiting, running, kv)] == ["6", "6", "80"]
    assert waiting["metadata"]["query"].startswith("sum(vllm:num_requests_waiting{")


def test_only_the_autoscaled_pool_gets_a_scaled_object_the_other_keeps_its_replicas():
    spec = pd_spec(**{"disaggregation.decode.autoscaling": DECODE})
    children = kids(spec)
    assert ("ScaledObject", "m-decode") in children and ("ScaledObject", "m-prefill") not in children
    assert children[("Deployment", "m-prefill")]["spec"]["replicas"] == 2  # pd_spec's prefill replicas


def test_the_pools_labels_are_the_operators_prometheus_settings():
    settings = Settings(prometheus=Prometheus("http://p:9090", namespace_label="ns_", model_label="model_", pool_label="pool_"))
    (trigger,) = kids(spec_of(), settings)[("ScaledObject", "m-prefill")]["spec"]["triggers"]
    assert '{ns_="ns",model_="m",pool_="prefill"}' in trigger["metadata"]["query"]


def test_the_pool_pods_are_scraped_as_the_models_are_and_labelled_with_their_pool():
    """Prometheus finds each pool server's vLLM /metrics from the pod's prometheus.io annotations
    (serving/runtime.py), and the pool label is what each pool's query selects on."""
    children = kids(spec_of())
    for role in ("prefill", "decode"):
        template = children[("Deployment", f"m-{role}")]["spec"]["template"]
        annotations = template["metadata"]["annotations"]
        assert (annotations["prometheus.io/scrape"], annotations["prometheus.io/path"], annotations["prometheus.io/port"]) == (
            "true", "/metrics", "8000",
        )  # fmt: skip
        assert annotations["inferentia.dev/metrics-port"] == "serve"
        assert template["metadata"]["labels"]["inferentia.dev/pool"] == role


def test_a_pool_replica_scaled_away_drains_as_the_serving_deployments_do():
    model = model_of(spec_of())
    pool_pod = kids(spec_of())[("Deployment", "m-decode")]["spec"]["template"]["spec"]
    serving_pod = serving_deployment(model.pools[1], 1)["spec"]["template"]["spec"]
    assert pool_pod["terminationGracePeriodSeconds"] == serving_pod["terminationGracePeriodSeconds"]
    assert pool_pod["containers"][0].get("lifecycle") == serving_pod["containers"][0].get("lifecycle")


# --- the replicas the operator leaves each pool's Deployment ----------------------------------


def test_without_a_scaled_object_each_pool_runs_its_minimum():
    children = kids(spec_of(**{"disaggregation.prefill.replicas": 5}))
    assert children[("Deployment", "m-prefill")]["spec"]["replicas"] == 1
    assert children[("Deployment", "m-decode")]["spec"]["replicas"] == 2


@pytest.mark.parametrize(("hpa_set", "kept"), [(3, 3), (9, 4), (0, 1)])
def test_while_its_scaled_object_exists_a_pools_deployment_keeps_what_the_hpa_set_within_the_range(hpa_set, kept):
    observed = converged(spec_of(), PROMETHEUS, replicas={"m-prefill": hpa_set})
    decision = decide(observed, NOW, PROMETHEUS)
    written = {(c["kind"], c["metadata"]["name"]): c for c in decision.apply}
    if hpa_set == kept:
        assert ("Deployment", "m-prefill") not in written  # the operator leaves KEDA's count alone
    else:
        assert written[("Deployment", "m-prefill")]["spec"]["replicas"] == kept
    assert decision.report.status.pools.prefill.desired_replicas == kept


def test_a_running_pool_that_starts_to_autoscale_keeps_its_replicas_while_its_scaled_object_is_written():
    """Five prefill replicas serving; the pool's autoscaling is added. Dropping to minReplicas
    until KEDA's HPA acts would take four serving replicas away for the HPA to start again
    (the next reconcile reads that 1 as what the HPA set): the pool keeps its count, within
    the range, from the moment the ScaledObject is to be written."""
    before = pd_spec(**{"disaggregation.prefill.replicas": 5, "disaggregation.decode.autoscaling": DECODE})
    observed = converged(before, PROMETHEUS)
    after = Observed(body_of(spec_of()), observed.children)  # prefill's autoscaling added: 1 to 4
    decision = decide(after, NOW, PROMETHEUS)
    written = {(c["kind"], c["metadata"]["name"]): c for c in decision.apply}
    assert ("ScaledObject", "m-prefill") in written
    assert written[("Deployment", "m-prefill")]["spec"]["replicas"] == 4, "5 held within the range, not 1"
    assert decision.report.status.pools.prefill.desired_replicas == 4


def test_a_converged_model_whose_pools_scale_writes_and_deletes_nothing():
    decision = decide(converged(spec_of(), PROMETHEUS, replicas={"m-prefill": 3, "m-decode": 5}), NOW, PROMETHEUS)
    assert (decision.apply, decision.delete) == ([], [])


# --- what status says -------------------------------------------------------------------------


def test_without_prometheus_the_pools_run_their_minimum_and_the_model_says_so():
    decision = decide(Observed.of(body_of(spec_of())), NOW, NO_PROMETHEUS)
    assert not [c for c in decision.apply if c["kind"] == "ScaledObject"]
    said = condition(decision)
    assert (said.status, said.reason) == ("False", "PrometheusNotConfigured")
    assert "the prefill pool runs minReplicas (1); the decode pool runs minReplicas (2)" in said.message
    pools = decision.report.status.pools
    assert (pools.prefill.desired_replicas, pools.decode.desired_replicas) == (1, 2)
    assert pools.decode.autoscaling.model_dump() == {"min_replicas": 2, "max_replicas": 6, "scaled_object": None, "queries": None}


def test_while_keda_is_not_served_no_scaled_object_is_written_and_the_model_says_so():
    decision = decide(Observed.of(body_of(spec_of()), unserved=frozenset({"ScaledObject"})), NOW, PROMETHEUS)
    assert not [c for c in decision.apply if c["kind"] == "ScaledObject"]
    said = condition(decision)
    assert (said.status, said.reason) == ("False", "KEDANotInstalled")
    assert said.message.endswith("the prefill pool runs minReplicas (1); the decode pool runs minReplicas (2)")
    # Autoscaling never holds back Ready: the pools serve at their minimum meanwhile.
    assert condition(decision, "Ready").reason != "KEDANotInstalled"


def test_a_fresh_model_writes_both_scaled_objects_and_waits_for_them():
    decision = decide(Observed.of(body_of(spec_of())), NOW, PROMETHEUS)
    assert sorted(c["metadata"]["name"] for c in decision.apply if c["kind"] == "ScaledObject") == ["m-decode", "m-prefill"]
    said = condition(decision)
    assert (said.status, said.reason, said.message) == ("Unknown", "Pending", "ScaledObject m-prefill is being written")


def test_once_keda_scales_both_pools_status_names_each_scaled_object_and_its_queries():
    decision = decide(converged(spec_of(), PROMETHEUS, replicas={"m-prefill": 3}), NOW, PROMETHEUS)
    said = condition(decision)
    assert (said.status, said.reason) == ("True", "ScaledObjectReady")
    assert said.message == (
        "KEDA scales the prefill pool between 1 and 4 replicas on 2 requests waiting per replica, 3 desired now; "
        "the decode pool between 2 and 6 replicas on 8 sequences running and 70% of its KV cache per replica, 2 desired now"
    )
    pools = decision.report.status.pools
    assert pools.prefill.autoscaling.scaled_object == "m-prefill" and pools.decode.autoscaling.scaled_object == "m-decode"
    assert [q.split("{")[0] for q in pools.decode.autoscaling.queries] == [
        "sum(avg_over_time(vllm:num_requests_running", "100 * sum(avg_over_time(vllm:kv_cache_usage_perc",
    ]  # fmt: skip
    assert pools.prefill.desired_replicas == 3
    assert decision.report.status.autoscaling is None  # the model's own: none with pools


def test_a_pool_keda_cannot_scale_is_named():
    decision = decide(converged(spec_of(), PROMETHEUS, ready={"m-decode": "False"}), NOW, PROMETHEUS)
    said = condition(decision)
    assert (said.status, said.reason) == ("False", "ScaledObjectNotReady")
    assert "the decode pool with ScaledObject m-decode" in said.message


def test_a_pool_keda_reports_unsure_of_is_named_with_what_keda_said_not_as_keda_silent():
    """KEDA sets its Ready condition Unknown when some of a ScaledObject's triggers fail (the
    decode pool's KV-cache query finding nothing, its running-sequences one answering). That is
    KEDA reporting, with its reason: status must repeat it, not ask whether KEDA runs."""
    observed = converged(spec_of(), PROMETHEUS)
    unsure = {"type": "Ready", "status": "Unknown", "reason": "PartialTriggerError", "message": "Some triggers defined in ScaledObject are not working correctly"}  # fmt: skip
    for so in observed.children["ScaledObject"]:
        if so["metadata"]["name"] == "m-decode":
            so["status"] = {"conditions": [unsure]}
    said = condition(decide(observed, NOW, PROMETHEUS))
    assert (said.status, said.reason) == ("Unknown", "ScaledObjectNotReady")
    assert "the decode pool with ScaledObject m-decode: PartialTriggerError: Some triggers" in said.message
    assert "is KEDA's operator running" not in said.message


def test_someone_elses_scaled_object_under_a_pools_name_is_a_conflict_and_left_alone():
    theirs = {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "m-prefill", "namespace": "ns", "uid": "x"}}
    decision = decide(Observed.of(body_of(spec_of()), theirs), NOW, PROMETHEUS)
    assert ("ScaledObject", "m-prefill") not in {(c["kind"], c["metadata"]["name"]) for c in decision.apply}
    said = condition(decision)
    assert (said.status, said.reason) == ("False", "ScaledObjectConflict") and "m-prefill" in said.message


# --- clean-up ---------------------------------------------------------------------------------


def test_a_pool_whose_autoscaling_goes_loses_its_scaled_object_and_runs_its_replicas():
    observed = converged(spec_of(), PROMETHEUS)
    now = pd_spec(**{"disaggregation.decode.autoscaling": DECODE})  # prefill's autoscaling removed
    observed = Observed(body_of(now), observed.children)
    decision = decide(observed, NOW, PROMETHEUS)
    assert decision.delete == [("ScaledObject", "m-prefill")]
    written = {(c["kind"], c["metadata"]["name"]): c for c in decision.apply}
    assert written[("Deployment", "m-prefill")]["spec"]["replicas"] == 2


def test_without_prometheus_any_longer_both_scaled_objects_go():
    decision = decide(converged(spec_of(), PROMETHEUS), NOW, NO_PROMETHEUS)
    assert sorted(decision.delete) == [("ScaledObject", "m-decode"), ("ScaledObject", "m-prefill")]


def test_a_model_without_pools_any_more_loses_the_pools_scaled_objects_but_never_someone_elses():
    observed = converged(spec_of(), PROMETHEUS)
    theirs = {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "m-decode", "namespace": "ns", "uid": "x"}}
    children = {
        **observed.children,
        "ScaledObject": [*(so for so in observed.children["ScaledObject"] if so["metadata"]["name"] != "m-decode"), theirs],
    }
    single = pd_spec(disaggregation=DROP)
    decision = decide(Observed(body_of(single), children), NOW, PROMETHEUS)
    assert ("ScaledObject", "m-prefill") in decision.delete
    assert ("ScaledObject", "m-decode") not in decision.delete


def test_a_model_that_leaves_its_pools_for_whole_model_autoscaling_gets_its_own_scaled_object_at_once():
    observed = converged(spec_of(), PROMETHEUS)
    single = pd_spec(disaggregation=DROP, autoscaling={"maxReplicas": 3, "targetInFlight": 4})
    decision = decide(Observed(body_of(single), observed.children), NOW, PROMETHEUS)
    assert sorted(d for d in decision.delete if d[0] == "ScaledObject") == [("ScaledObject", "m-decode"), ("ScaledObject", "m-prefill")]
    assert ("ScaledObject", "m") in {(c["kind"], c["metadata"]["name"]) for c in decision.apply}
