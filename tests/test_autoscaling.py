"""spec.autoscaling without a cluster: its rules, the ScaledObject, the replicas the
Deployment runs, and the Autoscaling condition in every case decide() meets."""

import pytest

from inferentia_operator.core import autoscaling, status
from inferentia_operator.core.api import InferentiaModelSpec
from inferentia_operator.core.autoscaling import Prometheus
from inferentia_operator.core.compile.job import compile_job
from inferentia_operator.core.observed import WriteFailure
from inferentia_operator.core.parsing import parse_spec
from inferentia_operator.core.pod.ports import scrape_relabelings
from inferentia_operator.core.scale_to_zero.holder import holder_deployment
from inferentia_operator.core.scale_to_zero.holder import replicas_service as replicas_service_of
from inferentia_operator.core.scaling.keda import scaled_object
from inferentia_operator.core.serving.deployment import serving_deployment
from inferentia_operator.core.serving.service import service
from inferentia_operator.core.status import status_document
from specs import make_spec
from test_decide import NOW, UID, Observed, built, decide, live, model_body

PROMETHEUS = Prometheus("http://prometheus.monitoring:9090")
BATCHED = {"serving.batching": {"maxBatchSize": 4}, "processesPerReplica": 2}


def scaled_spec(**overrides):
    return make_spec(**{**BATCHED, "autoscaling": {"minReplicas": 2, "maxReplicas": 5}, **overrides})


def findings(spec):
    return [(f.path, f.message, f.severity) for f in parse_spec(spec)[1]]


def errors_of(spec):
    return [(path, message) for path, message, severity in findings(spec) if severity == "error"]


# --- the rules -----------------------------------------------------------------------------


def test_a_range_that_is_no_range_is_refused():
    assert errors_of(scaled_spec(**{"autoscaling": {"minReplicas": 4, "maxReplicas": 3}})) == [
        ("spec.autoscaling.minReplicas", "4 is larger than maxReplicas 3; valid values are at most maxReplicas")
    ]


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("minReplicas", -1, "-1 is too small; valid values are at least 0"),
        ("idleSeconds", 86401, "86401 is too large; valid values are at most 86400"),
        ("holdSeconds", 0, "0 is too small; valid values are at least 1"),
        ("maxHeldRequests", 0, "0 is too small; valid values are at least 1"),
        ("maxReplicas", 2**31, "2147483648 is too large; valid values are at most 2147483647"),
        ("targetInFlight", 0, "0 is too small; valid values are at least 1"),
        ("windowSeconds", 3601, "3601 is too large; valid values are at most 3600"),
        ("scaleUpStabilizationSeconds", -1, "-1 is too small; valid values are at least 0"),
        ("scaleDownStabilizationSeconds", "5m", "'5m' is not a whole number; valid values are whole numbers"),
    ],
)
def test_counts_and_windows_are_bounded(field, value, message):
    spec = scaled_spec(**{f"autoscaling.{field}": value})
    assert errors_of(spec) == [(f"spec.autoscaling.{field}", message)]


def test_max_replicas_is_required():
    assert errors_of(scaled_spec(**{"autoscaling": {"minReplicas": 1}})) == [("spec.autoscaling.maxReplicas", "is required")]


def test_pods_that_count_no_requests_cannot_autoscale():
    spec = make_spec(autoscaling={"maxReplicas": 3})
    assert [p for p, _ in errors_of(spec)] == ["spec.autoscaling"]
    assert "spec.serving.batching" in errors_of(spec)[0][1]


def test_vllm_without_batching_must_name_its_target():
    vllm = {"compute.family": "inf2", "serving.runtime": "vllm", "model.architecture": "transformer", "compile.buckets": [[128]]}
    assert [p for p, _ in errors_of(make_spec(**vllm, autoscaling={"maxReplicas": 3}))] == ["spec.autoscaling.targetInFlight"]
    assert errors_of(make_spec(**vllm, autoscaling={"maxReplicas": 3, "targetInFlight": 32})) == []
    assert errors_of(make_spec(**vllm, **{"serving.batching": {"maxBatchSize": 8}}, autoscaling={"maxReplicas": 3})) == []


def test_a_replica_that_would_compile_as_it_starts_is_a_warning():
    warned = [(p, m) for p, m, s in findings(scaled_spec()) if s == "warning" and p == "spec.autoscaling"]
    assert len(warned) == 1 and "compiles the model as it starts" in warned[0][1]
    assert not [p for p, _, s in findings(scaled_spec(**{"compile.image": "example.com/c:1"})) if p == "spec.autoscaling"]


# --- what it renders -----------------------------------------------------------------------


def test_the_target_defaults_to_the_replicas_parallelism():
    spec = InferentiaModelSpec.model_validate(scaled_spec())
    assert autoscaling.target_in_flight(spec) == 8  # 2 processes x batches of 4
    spec = InferentiaModelSpec.model_validate(scaled_spec(**{"autoscaling.targetInFlight": 3}))
    assert autoscaling.target_in_flight(spec) == 3


def test_the_query_sums_the_gauges_averaged_over_the_window():
    spec = InferentiaModelSpec.model_validate(scaled_spec())
    assert autoscaling.in_flight_query(spec, "ns", "m", PROMETHEUS) == (
        'sum(avg_over_time({__name__=~"inferentia_num_requests_waiting|inferentia_num_requests_running",'
        'namespace="ns",inferentia_dev_model="m"}[60s]))'
    )
    instant = InferentiaModelSpec.model_validate(scaled_spec(**{"autoscaling.windowSeconds": 0}))
    labels = Prometheus("http://p:9090", "kubernetes_namespace", "model")
    assert autoscaling.in_flight_query(instant, "ns", "m", labels) == (
        'sum({__name__=~"inferentia_num_requests_waiting|inferentia_num_requests_running",kubernetes_namespace="ns",model="m"})'
    )


def test_vllm_is_scaled_on_vllms_own_gauges():
    spec = InferentiaModelSpec.model_validate(
        make_spec(
            **{"compute.family": "inf2", "serving.runtime": "vllm", "model.architecture": "transformer", "compile.buckets": [[128]]},
            autoscaling={"maxReplicas": 2, "targetInFlight": 16},
        )
    )
    assert '__name__=~"vllm:num_requests_waiting|vllm:num_requests_running"' in autoscaling.in_flight_query(spec, "ns", "m", PROMETHEUS)


def test_the_scaled_object_targets_the_model_and_is_owned_by_it():
    m = built(model_body(**scaled_spec()))
    body = scaled_object(m, PROMETHEUS)
    assert body["metadata"]["ownerReferences"][0]["uid"] == UID and body["metadata"]["ownerReferences"][0]["controller"]
    assert body["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "inferentia-operator"
    spec = body["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "inferentia.dev/v1alpha1", "kind": "InferentiaModel", "name": "m"}
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (2, 5)
    assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == {
        "scaleUp": {"stabilizationWindowSeconds": 60},
        "scaleDown": {"stabilizationWindowSeconds": 300},
    }
    [trigger] = spec["triggers"]
    assert (trigger["type"], trigger["metricType"], trigger["metadata"]["threshold"]) == ("prometheus", "AverageValue", "8")
    assert trigger["metadata"]["serverAddress"] == PROMETHEUS.address
    # An open Prometheus: no authentication, no region.
    assert "authenticationRef" not in trigger and "awsRegion" not in trigger["metadata"]


def test_an_authenticated_prometheus_is_named_by_the_trigger():
    """Amazon Managed Prometheus answers only SigV4-signed queries: KEDA signs them for the
    region in the trigger's awsRegion, with the identity of a (Cluster)TriggerAuthentication
    whose podIdentity provider is aws (https://keda.sh/docs/latest/scalers/prometheus/)."""
    amp = Prometheus(
        "https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-1",
        authentication="keda-aws",
        authentication_kind="ClusterTriggerAuthentication",
        aws_region="us-east-1",
    )
    [trigger] = scaled_object(built(model_body(**scaled_spec())), amp)["spec"]["triggers"]
    assert trigger["authenticationRef"] == {"name": "keda-aws", "kind": "ClusterTriggerAuthentication"}
    assert trigger["metadata"]["awsRegion"] == "us-east-1"


def test_the_cli_takes_the_authentication_and_region():
    from inferentia_operator.cli import parser, settings_from

    args = parser().parse_args(
        ["render", "x.yaml", "--prometheus-address", "http://p:9090", "--prometheus-authentication", "bearer",
         "--prometheus-aws-region", "eu-west-1"]
    )  # fmt: skip
    prometheus = settings_from(args).prometheus
    assert (prometheus.authentication, prometheus.authentication_kind, prometheus.aws_region) == (
        "bearer",
        "TriggerAuthentication",
        "eu-west-1",
    )


@pytest.mark.parametrize("replicas,scaled,expected", [(1, True, 2), (3, True, 3), (9, True, 5), (3, False, 2), (0, True, 2)])
def test_the_deployment_runs_spec_replicas_within_the_range_or_the_minimum_while_nothing_scales(replicas, scaled, expected):
    spec = InferentiaModelSpec.model_validate(scaled_spec(replicas=replicas))
    assert autoscaling.desired_replicas(spec, scaled) == expected


def test_a_label_value_is_a_promql_string():
    assert autoscaling._label_value('a"b\\c') == '"a\\"b\\\\c"'  # noqa: SLF001


# --- decide() --------------------------------------------------------------------------------


def autoscaling_condition(decision_or_report):
    report = getattr(decision_or_report, "report", decision_or_report)
    return next((c for c in status_document(report.status)["conditions"] if c["type"] == "Autoscaling"), None)


def test_without_a_prometheus_address_nothing_is_written_and_the_model_says_so():
    d = decide(Observed(model_body(**scaled_spec())), NOW)
    assert "ScaledObject" not in [o["kind"] for o in d.apply]
    deployment = next(o for o in d.apply if o["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 2
    said = autoscaling_condition(d)
    assert (said["status"], said["reason"]) == ("False", "PrometheusNotConfigured")
    assert status_document(d.report.status)["autoscaling"] == {
        "minReplicas": 2,
        "maxReplicas": 5,
        "targetInFlight": 8,
        "desiredReplicas": 2,
    }


def test_the_scaled_object_is_written_and_the_deployment_holds_the_minimum_until_it_exists():
    body = model_body(replicas=4, **scaled_spec())
    d = decide(Observed(body, prometheus=PROMETHEUS), NOW)
    # Behind its batching front end, the model's pods admit other pods to the front end's port alone.
    assert [o["kind"] for o in d.apply] == ["ConfigMap", "Service", "Deployment", "PodDisruptionBudget", "NetworkPolicy", "ScaledObject"]
    assert next(o for o in d.apply if o["kind"] == "Deployment")["spec"]["replicas"] == 2


def test_once_the_scaled_object_exists_the_deployment_follows_spec_replicas_within_the_range():
    body = model_body(replicas=4, **scaled_spec())
    m = built(body)
    ready = live(scaled_object(m, PROMETHEUS), conditions=[{"type": "Ready", "status": "True"}])
    d = decide(Observed(body, prometheus=PROMETHEUS, scaled_object=ready), NOW)
    assert "ScaledObject" not in [o["kind"] for o in d.apply]  # as applied: not written again
    assert next(o for o in d.apply if o["kind"] == "Deployment")["spec"]["replicas"] == 4
    said = autoscaling_condition(d)
    assert (said["status"], said["reason"]) == ("True", "ScaledObjectReady")
    assert "between 2 and 5 replicas, 8 requests in flight per replica; 4 desired now" in said["message"]
    doc = status_document(d.report.status)["autoscaling"]
    assert (doc["desiredReplicas"], doc["scaledObject"]) == (4, "m")


def test_keda_not_installed_is_reported_without_holding_back_ready():
    body = model_body(**scaled_spec())
    o = Observed(body, prometheus=PROMETHEUS)
    d = decide(o, NOW)
    refused = [WriteFailure("ScaledObject", "m", 404, "the server could not find the requested resource")]
    reported = status.report(o, NOW, d.basis, refused)
    said = autoscaling_condition(reported)
    assert (said["status"], said["reason"]) == ("False", "KEDANotInstalled")
    ready = next(c for c in status_document(reported.status)["conditions"] if c["type"] == "Ready")
    assert ready["reason"] != "ApplyFailed"
    assert [e.reason for e in reported.events if e.type == "Warning"] == ["KEDANotInstalled"]


def test_keda_not_ready_and_not_yet_reporting():
    body = model_body(**scaled_spec())
    m = built(body)
    written = live(scaled_object(m, PROMETHEUS))
    said = autoscaling_condition(decide(Observed(body, prometheus=PROMETHEUS, scaled_object=written), NOW))
    assert (said["status"], said["reason"]) == ("Unknown", "WaitingForKEDA")
    failing = live(written, conditions=[{"type": "Ready", "status": "False", "reason": "ScaledObjectCheckFailed", "message": "boom"}])
    said = autoscaling_condition(decide(Observed(body, prometheus=PROMETHEUS, scaled_object=failing), NOW))
    assert (said["status"], said["reason"]) == ("False", "ScaledObjectNotReady")
    assert said["message"].endswith("ScaledObjectCheckFailed: boom")


def test_autoscaling_turned_off_deletes_the_scaled_object_of_the_model_only():
    scaled = model_body(**scaled_spec())
    ours = live(scaled_object(built(scaled), PROMETHEUS))
    plain = model_body(**BATCHED)
    d = decide(Observed(plain, prometheus=PROMETHEUS, scaled_object=ours), NOW)
    assert ("ScaledObject", "m") in d.delete
    assert autoscaling_condition(d) is None and "autoscaling" not in status_document(d.report.status)
    theirs = {**ours, "metadata": {"name": "m", "namespace": "ns", "resourceVersion": "3"}}
    d = decide(Observed(plain, prometheus=PROMETHEUS, scaled_object=theirs), NOW)
    assert ("ScaledObject", "m") not in d.delete


def test_while_the_cluster_serves_no_scaled_objects_none_is_written_and_the_model_says_so():
    d = decide(Observed(model_body(**scaled_spec()), prometheus=PROMETHEUS, scaled_objects_served=False), NOW)
    assert "ScaledObject" not in [o["kind"] for o in d.apply]
    assert next(o for o in d.apply if o["kind"] == "Deployment")["spec"]["replicas"] == 2
    said = autoscaling_condition(d)
    assert (said["status"], said["reason"]) == ("False", "KEDANotInstalled")


# --- scale to zero ----------------------------------------------------------------------------

ZERO = {"compile.image": "example.com/compile:1", "autoscaling": {"minReplicas": 0, "maxReplicas": 2, "idleSeconds": 30}}


def test_zero_needs_a_compile_step():
    assert errors_of(scaled_spec(autoscaling={"minReplicas": 0, "maxReplicas": 2})) == [
        (
            "spec.autoscaling.minReplicas",
            "0 needs spec.compile.image: a replica that starts from zero must fetch its compiled artefact, not compile the "
            "model as it starts (tens of minutes for a large model, aws-neuron-sdk#1368); valid values without it are at least 1",
        )
    ]
    assert errors_of(scaled_spec(**ZERO)) == []


def test_a_model_that_scales_to_zero_is_polled_goes_to_zero_when_idle_and_counts_held_requests():
    m = built(model_body(**scaled_spec(**ZERO)))
    spec = scaled_object(m, PROMETHEUS)["spec"]
    assert (spec["minReplicaCount"], spec["cooldownPeriod"], spec["pollingInterval"]) == (0, 30, 5)
    assert "inferentia_num_requests_waiting" in spec["triggers"][0]["metadata"]["query"]
    # Until it has an artefact, a start from zero would find nothing to fetch: one replica at least.
    assert scaled_object(m, PROMETHEUS, has_artefact=False)["spec"]["minReplicaCount"] == 1


def compiled_job(m):
    from test_decide import complete

    return complete(compile_job(m))


def zero_observed(replicas, *, available=1, holder_available=1, service_to_holder=False, deployment_replicas=1):
    body = model_body(replicas=replicas, **scaled_spec(**ZERO))
    m = built(body)
    scaler = live(scaled_object(m, PROMETHEUS), conditions=[{"type": "Ready", "status": "True"}])
    deployment = live(serving_deployment(m, deployment_replicas), availableReplicas=available)
    replicas_svc = live(replicas_service_of(m))
    holder = live(holder_deployment(m), availableReplicas=holder_available)
    return m, Observed(
        body, prometheus=PROMETHEUS, scaled_object=scaler, deployment=deployment, service=live(service(m, service_to_holder)),
        jobs=[compiled_job(m)], others=[replicas_svc, holder],
    )  # fmt: skip


def applied_kind(d, kind, name):
    return next((o for o in d.apply if o["kind"] == kind and o["metadata"]["name"] == name), None)


def test_warm_the_service_points_at_the_replicas():
    m, o = zero_observed(1)
    d = decide(o, NOW)
    assert applied_kind(d, "Service", "m") is None  # already pointing at the replicas
    assert not d.delete


def test_going_to_zero_the_service_moves_to_the_holder_before_the_last_replica_stops():
    m, o = zero_observed(0)
    d = decide(o, NOW)
    svc = applied_kind(d, "Service", "m")
    assert svc["spec"]["selector"]["app.kubernetes.io/component"] == "holder"
    assert applied_kind(d, "Deployment", "m") is None  # still 1: not yet
    # Once the Service is seen at the holder, the Deployment goes to zero.
    m, o = zero_observed(0, service_to_holder=True)
    d = decide(o, NOW)
    assert applied_kind(d, "Deployment", "m")["spec"]["replicas"] == 0


def test_without_an_available_holder_the_model_keeps_a_replica():
    m, o = zero_observed(0, holder_available=0)
    d = decide(o, NOW)
    assert applied_kind(d, "Service", "m") is None
    assert applied_kind(d, "Deployment", "m") is None  # stays at 1


def test_starting_from_zero_the_holder_keeps_the_service_until_a_replica_is_available():
    m, o = zero_observed(1, available=0, service_to_holder=True, deployment_replicas=0)
    d = decide(o, NOW)
    assert applied_kind(d, "Service", "m") is None  # still the holder
    assert applied_kind(d, "Deployment", "m")["spec"]["replicas"] == 1
    m, o = zero_observed(1, available=1, service_to_holder=True)
    assert applied_kind(decide(o, NOW), "Service", "m")["spec"]["selector"]["app.kubernetes.io/component"] == "serving"


def test_the_holder_forwards_to_the_replicas_service_and_waits_for_it_to_exist():
    """The holder names the replicas Service, which its pods find through the variables the
    kubelet sets for each Service that exists when a pod starts: so it is created after it."""
    holder = holder_deployment(built(model_body(**scaled_spec(**ZERO))))
    args = holder["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:5] == ["hold", "--upstream-service", "m-replicas", "--ports", "8080"]  # the front end's: the model's one door
    body = model_body(**scaled_spec(**ZERO))
    d = decide(Observed(body, prometheus=PROMETHEUS, jobs=[compiled_job(built(body))]), NOW)
    assert applied_kind(d, "Service", "m-replicas") is not None and applied_kind(d, "Deployment", "m-holder") is None
    replicas_service = live(replicas_service_of(built(body)))
    d = decide(Observed(body, prometheus=PROMETHEUS, jobs=[compiled_job(built(body))], others=[replicas_service]), NOW)
    assert applied_kind(d, "Deployment", "m-holder") == holder


def test_a_model_that_no_longer_scales_to_zero_parks_its_holder_at_no_replica():
    m, o = zero_observed(1, service_to_holder=True)
    o.model["spec"] |= {"autoscaling": {**o.model["spec"]["autoscaling"], "minReplicas": 1}}
    d = decide(o, NOW)
    assert not d.delete  # the operator may delete no Deployment or Service
    parked = applied_kind(d, "Deployment", "m-holder")["spec"]
    # Whole: an apply of replicas alone would drop the selector and template (422).
    assert parked["replicas"] == 0 and parked["selector"] and parked["template"]["spec"]["containers"]
    assert applied_kind(d, "Service", "m")["spec"]["selector"]["app.kubernetes.io/component"] == "serving"


def test_at_zero_the_model_is_ready_and_says_it_is_scaled_to_zero():
    m, o = zero_observed(0, service_to_holder=True, available=0, deployment_replicas=0)
    o.own("Deployment")["status"] |= {"observedGeneration": 1, "replicas": 0, "updatedReplicas": 0, "readyReplicas": 0}
    ready = next(c for c in status_document(decide(o, NOW).report.status)["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "ScaledToZero")


@pytest.mark.parametrize("processes", [1, 2, 8])
def test_every_vllm_process_is_scraped_and_the_target_is_what_they_carry_together(processes):
    """The ScaledObject's target is the whole replica's parallelism (processes x maxBatchSize):
    the query must count every process's requests, so Prometheus must scrape every process's
    port (each vLLM process serves its own /metrics), and the endpoint picker must see each.
    Relabelled as Prometheus does (one target per declared port, keep rules anchored at both
    ends, joined with ';'): a replica whose every process is full reads exactly its target."""
    import re

    from inferentia_operator.core.autoscaling import in_flight_query, target_in_flight
    from inferentia_operator.core.planner import plan
    from inferentia_operator.core.pod.model import Model
    from inferentia_operator.core.routing import pool as routing

    spec = InferentiaModelSpec.model_validate(make_spec(**{
        "compute.family": "inf2", "compute.inf": 4, "processesPerReplica": processes, "serving.runtime": "vllm",
        "model.architecture": "transformer", "serving.batching": {"maxBatchSize": 4}, "autoscaling": {"maxReplicas": 3},
    }))  # fmt: skip
    m = Model("llm", "ns", "uid", spec, plan(spec))
    template = serving_deployment(m)["spec"]["template"]
    meta = {
        f"__meta_kubernetes_pod_annotation_{re.sub('[^a-zA-Z0-9_]', '_', k)}": v for k, v in template["metadata"]["annotations"].items()
    }
    ports = [p for c in template["spec"]["containers"] for p in c.get("ports", [])]
    kept = []
    for port in ports:
        labels = {**meta, "__meta_kubernetes_pod_container_port_name": port["name"]}
        rules = [r for r in scrape_relabelings() if r["action"] == "keep"]
        if all(re.fullmatch(r["regex"], ";".join(labels.get(s, "") for s in r["source_labels"])) for r in rules):
            kept.append(port["containerPort"])
    assert kept == routing.target_ports(m) and len(kept) == processes
    # Each kept process full (maxBatchSize sequences running), the query's sum over them is the target.
    assert len(kept) * 4 == target_in_flight(spec) == processes * 4
    # The query selects the model's gauges by namespace and model alone: no port or process is left out.
    query = in_flight_query(spec, "ns", "llm", Prometheus("http://p"))
    assert "serve" not in query and "port" not in query


def test_the_documented_scrape_job_keeps_what_the_code_keeps():
    """docs/install/prometheus-scrape-job.yaml (shown in docs/autoscaling.md) relabels as the
    local cluster's Prometheus does: pod.ports.scrape_relabelings, then the query's labels."""
    from pathlib import Path

    import yaml

    from inferentia_operator.core.pod.ports import scrape_relabelings

    [job] = yaml.safe_load((Path(__file__).resolve().parent.parent / "docs" / "install" / "prometheus-scrape-job.yaml").read_text())
    rules = job["relabel_configs"]
    assert rules[: len(scrape_relabelings())] == scrape_relabelings()
    targets = {r.get("target_label") for r in rules}
    assert {"namespace", "pod"} <= targets and {"action": "labelmap", "regex": "__meta_kubernetes_pod_label_(.+)"} in rules
