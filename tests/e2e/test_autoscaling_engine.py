"""spec.autoscaling on a cluster that has no KEDA yet, then gets it: the operator says so in
the model's status, runs minReplicas meanwhile, and writes the ScaledObject once KEDA's CRD
is served, with nothing restarted. Its own control plane (no real node, no KEDA), the
operator with exactly the chart's ClusterRole."""

from __future__ import annotations

import json

import pytest
from kit import Cluster, OperatorProcess, bind_user_to_operator_role, condition, localcluster, wait_for

from specs import make_model, make_spec

PROMETHEUS = "http://prometheus.monitoring.svc:9090"


@pytest.fixture(scope="module")
def bare(cluster, tmp_path_factory):
    """A second control plane without KEDA, with the InferentiaModel CRD and the operator."""
    if cluster.local is None:
        pytest.skip("needs the built-in control plane: it starts a second one without KEDA")
    from kit import CRD_FILE

    state = tmp_path_factory.mktemp("no-keda")
    local = localcluster.LocalCluster(state / "cluster", die_with_parent=True)
    try:
        local.up()
        c = Cluster(local.kubeconfig, cluster.bin_dir, local)
        c.kubectl("apply", "--server-side", "-f", str(CRD_FILE.parent))
        localcluster.wait_established(c.kubectl, "inferentiamodels.inferentia.dev")
        bind_user_to_operator_role(c, "inferentia-operator", "e2e-operator")
        op = OperatorProcess(
            local.user_kubeconfig("inferentia-operator"), state / "operator.log", resync_seconds=2.0,
            extra_args=("--prometheus-address", PROMETHEUS),
        )  # fmt: skip
        op.start()
        try:
            yield c
        finally:
            op.stop()
    finally:
        local.down()


def turn_off(c, name: str, field: str, **also) -> None:
    """Removes ``spec.<field>`` from the model (and sets what ``also`` says) in one write that
    needs no resourceVersion."""
    patch = {"spec": {field: None, **also}}
    c.kubectl("patch", "inferentiamodel", name, "--type=merge", "-p", json.dumps(patch))


def test_without_keda_the_model_says_so_runs_min_replicas_and_scales_once_keda_is_installed(bare):
    c = bare
    spec = make_spec(
        **{
            "serving.batching": {"maxBatchSize": 4, "maxLatencyMs": 100},
            "processesPerReplica": 2,
            "autoscaling": {"minReplicas": 2, "maxReplicas": 4},
        }
    )
    c.kubectl("apply", "-f", "-", input=json.dumps(make_model("scaled", "default", spec)))

    def model() -> dict:
        return c.get("inferentiamodel", "scaled")

    wait_for(lambda: condition(model(), "Autoscaling").get("reason") == "KEDANotInstalled", 60, "Autoscaling=False KEDANotInstalled")
    said = condition(model(), "Autoscaling")
    assert said["status"] == "False" and "install KEDA" in said["message"] and "minReplicas (2)" in said["message"], said
    # Not a reason to hold back serving: the model is not blocked by it.
    assert condition(model(), "Stalled").get("status") == "False"
    wait_for(lambda: c.get("deployment", "scaled")["spec"]["replicas"] == 2, 60, "the Deployment at minReplicas")
    status = model()["status"]["autoscaling"]
    assert {k: status[k] for k in status if k != "query"} == {"minReplicas": 2, "maxReplicas": 4, "targetInFlight": 8, "desiredReplicas": 2}
    assert status["query"].startswith("sum(avg_over_time(")
    events = c.get("events", "--field-selector", "involvedObject.name=scaled")["items"]
    assert any(e["reason"] == "KEDANotInstalled" and e["type"] == "Warning" for e in events), [e["reason"] for e in events]
    # `kubectl get` shows the range.
    header, row = c.kubectl("get", "inferentiamodel", "scaled").stdout.splitlines()[:2]

    def column(name: str) -> str:  # read by position: an empty column (CORES) leaves no word
        start = header.index(f" {name} ") + 1
        return row[start:].split()[0]

    assert (column("MIN"), column("MAX")) == ("2", "4"), (header, row)

    # KEDA's CRDs arrive (as its chart installs them): the operator, which watches CRDs, writes
    # the ScaledObject within a resync, nothing restarted.
    c.kubectl("apply", "--server-side", "-f", str(c.bin_dir / "keda-crds"))
    wait_for(lambda: c.kubectl("get", "scaledobject", "scaled", check=False).returncode == 0, 60, "the ScaledObject")
    scaled_object = c.get("scaledobject", "scaled")
    owner = scaled_object["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "InferentiaModel",
        "scaled",
        model()["metadata"]["uid"],
        True,
    )
    assert scaled_object["spec"]["scaleTargetRef"] == {"apiVersion": "inferentia.dev/v1alpha1", "kind": "InferentiaModel", "name": "scaled"}
    assert (scaled_object["spec"]["minReplicaCount"], scaled_object["spec"]["maxReplicaCount"]) == (2, 4)
    [trigger] = scaled_object["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metadata"]["threshold"] == "8", trigger
    assert trigger["metadata"]["serverAddress"] == PROMETHEUS
    assert trigger["metadata"]["query"] == (
        'sum(avg_over_time({__name__=~"inferentia_num_requests_waiting|inferentia_num_requests_running",'
        'namespace="default",inferentia_dev_model="scaled"}[60s]))'
    )
    behavior = scaled_object["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior == {"scaleUp": {"stabilizationWindowSeconds": 60}, "scaleDown": {"stabilizationWindowSeconds": 300}}
    # No KEDA operator runs in this cluster to take it up, and the status says that.
    wait_for(lambda: condition(model(), "Autoscaling").get("reason") == "WaitingForKEDA", 60, "Autoscaling=Unknown WaitingForKEDA")
    wait_for(lambda: model()["status"]["autoscaling"].get("scaledObject") == "scaled", 30, "status.autoscaling.scaledObject")

    # What scales the model writes spec.replicas through /scale; the Deployment follows it within the range.
    c.kubectl("scale", "inferentiamodel", "scaled", "--replicas=3")
    wait_for(lambda: c.get("deployment", "scaled")["spec"]["replicas"] == 3, 60, "the Deployment at 3")
    c.kubectl("scale", "inferentiamodel", "scaled", "--replicas=9")
    wait_for(lambda: c.get("deployment", "scaled")["spec"]["replicas"] == 4, 60, "the Deployment at maxReplicas")
    assert model()["status"]["autoscaling"]["desiredReplicas"] == 4

    # Autoscaling turned off: the ScaledObject goes, and the count is spec.replicas again. A merge
    # patch, not `kubectl replace`: replace reads the model's resourceVersion and then writes,
    # and a status the operator writes in between fails it with a Conflict.
    turn_off(c, "scaled", "autoscaling", replicas=1)
    wait_for(lambda: c.kubectl("get", "scaledobject", "scaled", check=False).returncode != 0, 60, "the ScaledObject to go")
    wait_for(lambda: c.get("deployment", "scaled")["spec"]["replicas"] == 1, 60, "the Deployment at spec.replicas")
    assert not condition(model(), "Autoscaling") and "autoscaling" not in model()["status"]


def test_a_scaled_object_of_someone_elses_is_left_alone_and_reported(bare):
    """A ScaledObject written by hand (as the operator's docs once showed) under the model's
    name: never adopted or overwritten, and the model says why it runs at minReplicas."""
    c = bare
    c.kubectl("apply", "--server-side", "-f", str(c.bin_dir / "keda-crds"))
    theirs = {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": "handmade", "namespace": "default"},
        "spec": {
            "scaleTargetRef": {"apiVersion": "inferentia.dev/v1alpha1", "kind": "InferentiaModel", "name": "handmade"},
            "triggers": [{"type": "cpu", "metadata": {"value": "50"}}],
        },
    }
    c.kubectl("apply", "-f", "-", input=json.dumps(theirs))
    spec = make_spec(**{"serving.batching": {"maxBatchSize": 2}, "autoscaling": {"minReplicas": 2, "maxReplicas": 3}})
    c.kubectl("apply", "-f", "-", input=json.dumps(make_model("handmade", "default", spec)))
    wait_for(
        lambda: condition(c.get("inferentiamodel", "handmade"), "Autoscaling").get("reason") == "ScaledObjectConflict",
        60, "Autoscaling=False ScaledObjectConflict",
    )  # fmt: skip
    assert c.get("scaledobject", "handmade")["spec"]["triggers"] == theirs["spec"]["triggers"]
    assert "ownerReferences" not in c.get("scaledobject", "handmade")["metadata"]
    wait_for(lambda: c.get("deployment", "handmade")["spec"]["replicas"] == 2, 60, "the Deployment at minReplicas")
    assert condition(c.get("inferentiamodel", "handmade"), "Ready").get("reason") != "NameConflict"


def test_the_install_guides_manifests_and_an_amp_scaled_object_are_what_the_api_server_takes(bare, tmp_path):
    """docs/install.md's manifests, applied as a reader would (server-side dry run, against
    KEDA's own CRDs for its ClusterTriggerAuthentication), and the ScaledObject the operator
    writes for Amazon Managed Prometheus: KEDA's schema takes its authenticationRef and awsRegion."""
    from kit import ROOT

    from inferentia_operator.core.autoscaling import Prometheus
    from inferentia_operator.core.scaling.keda import scaled_object
    from test_decide import built, model_body

    c = bare
    c.kubectl("apply", "--server-side", "-f", str(c.bin_dir / "keda-crds"))
    localcluster.wait_established(c.kubectl, "clustertriggerauthentications.keda.sh")
    guide = ROOT / "docs" / "install"
    for name in ("models-reader.yaml", "storageclass-gp3.yaml", "keda-aws-authentication.yaml"):
        result = c.kubectl("apply", "--dry-run=server", "-f", str(guide / name), check=False)
        assert result.returncode == 0, (name, result.stderr)
    amp = Prometheus("https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-1", authentication="keda-aws",
                     authentication_kind="ClusterTriggerAuthentication", aws_region="us-east-1")  # fmt: skip
    spec = {"serving.batching": {"maxBatchSize": 8}, "autoscaling": {"minReplicas": 1, "maxReplicas": 3}}
    body = scaled_object(built(model_body(**spec)), amp)
    body["metadata"].pop("ownerReferences")  # no owner in this namespace: the schema is what is checked
    body["metadata"]["namespace"] = "default"
    result = c.kubectl("apply", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(body), check=False)
    assert result.returncode == 0, result.stderr
    [trigger] = json.loads(result.stdout)["spec"]["triggers"]
    assert trigger["authenticationRef"] == {"name": "keda-aws", "kind": "ClusterTriggerAuthentication"}
    assert trigger["metadata"]["awsRegion"] == "us-east-1"


def test_without_the_inference_extension_the_model_says_so_and_gets_its_pool_once_installed(bare):
    """spec.routing.inferencePool on a cluster without the Gateway API Inference Extension's
    CRDs: the model's Routing condition says so and the model serves through its Service; once
    the CRDs (the Extension's v1.1.0, from its Go module) are applied, the operator writes the
    pool and then its endpoint picker, nothing restarted; the condition follows the picker's
    Deployment, unavailable while its pod cannot run and available once kwok's fleet runs it;
    turned off, the pool goes and the picker is parked."""
    c = bare
    from test_part_routing import VLLM

    spec = make_spec(**VLLM)
    c.kubectl("apply", "-f", "-", input=json.dumps(make_model("routed", "default", spec)))

    def model() -> dict:
        return c.get("inferentiamodel", "routed")

    def exists(kind: str, name: str) -> bool:
        return c.kubectl("get", kind, name, check=False).returncode == 0

    wait_for(
        lambda: condition(model(), "Routing").get("reason") == "InferencePoolNotInstalled", 60, "Routing=False InferencePoolNotInstalled"
    )
    said = condition(model(), "Routing")
    assert said["status"] == "False" and "install its CRDs" in said["message"] and "serves through its Service" in said["message"], said
    assert condition(model(), "Stalled").get("status") == "False"
    assert exists("deployment", "routed") and not exists("deployment", "routed-epp")  # serving goes on; no picker without a pool

    # The fleet's kwok nodes would run the picker's pod, and make it Ready, within a second or
    # two of its Deployment: cordoned, they hold it Pending, so that "unavailable" lasts.
    nodes = [n["metadata"]["name"] for n in c.get("nodes")["items"]]
    c.kubectl("cordon", *nodes)
    try:
        c.install_inference_extension()
        wait_for(lambda: exists("inferencepool", "routed"), 60, "the InferencePool")
        pool = c.get("inferencepool", "routed")
        assert pool["spec"]["selector"] == {
            "matchLabels": {"inferentia.dev/model": "routed", "app.kubernetes.io/component": "serving", "inferentia.dev/traffic": "on"}
        }
        assert pool["spec"]["targetPorts"] == [{"number": 8000}, {"number": 8001}]  # each vLLM process's own port
        assert pool["spec"]["endpointPickerRef"]["name"] == "routed-epp"
        assert pool["metadata"]["ownerReferences"][0]["uid"] == model()["metadata"]["uid"]
        for kind in ("deployment", "service", "serviceaccount", "rolebinding"):
            wait_for(lambda kind=kind: exists(kind, "routed-epp"), 60, f"the endpoint picker's {kind}")
        assert c.get("rolebinding", "routed-epp")["roleRef"]["name"] == "inferentia-operator-endpoint-picker"
        try:
            wait_for(
                lambda: condition(model(), "Routing").get("reason") == "EndpointPickerUnavailable",
                60,
                "Routing=False EndpointPickerUnavailable",
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {condition(model(), 'Routing')}") from None
    finally:
        c.kubectl("uncordon", *nodes)
    wait_for(lambda: condition(model(), "Routing").get("reason") == "EndpointPickerAvailable", 60, "Routing=True EndpointPickerAvailable")

    turn_off(c, "routed", "routing")
    wait_for(lambda: not exists("inferencepool", "routed"), 60, "the InferencePool to go")
    wait_for(lambda: c.get("deployment", "routed-epp")["spec"]["replicas"] == 0, 60, "the picker parked")
    assert not condition(model(), "Routing")
