"""A replica across two nodes (spec.compute.nodes: 2) on the kwok fleet, with LeaderWorkerSet's
own controller and webhooks (cluster/leaderworkerset.py) and the operator under the chart's
ClusterRole: one group placed on two Trn1 nodes with EFA, counted as one replica, scaled by
whole groups through the model's scale subresource (as KEDA scales it), a worker's restarted
container bringing its group back, its pods kept in one part of the network by
compute.topologyKey, and the model back on one node as a Deployment; then the real KEDA and
Prometheus of cluster/autoscaling.py scaling such a model by whole groups. kwok runs no container: what the pods run is
tests/test_multi_node.py's."""

from __future__ import annotations

import json

import pytest
from kit import condition, wait_for

from inferentia_operator.core.names import DEFAULT_OPERATOR_IMAGE
from specs import make_model, make_spec

GROUP = "leaderworkerset.sigs.k8s.io"
TWO_NODES = {
    "model.uri": "s3://models/llama-3.1-70b/", "model.architecture": "transformer", "model.precision": "bf16",
    "compute.family": "trn1", "compute.inf": 16, "compute.nodes": 2, "compute.cpu": "8", "compute.memory": "64Gi",
    "compile.buckets": [[4096]], "serving.runtime": "vllm", "serving.port": 8000, "serving.batching": {"maxBatchSize": 4},
}  # fmt: skip


@pytest.fixture
def lws(cluster):
    if cluster.kubectl("get", "crd", "leaderworkersets.leaderworkerset.x-k8s.io", check=False).returncode:
        pytest.skip("no LeaderWorkerSet CRD on this cluster (the local cluster runs LWS's controller: cluster/leaderworkerset.py)")
    return cluster


def pods(cluster, namespace: str) -> list[dict]:
    found = cluster.get("pods", "-n", namespace, "-l", f"{GROUP}/name=llm")["items"]
    return [p for p in found if p["metadata"].get("deletionTimestamp") is None]


def counts(model: dict) -> tuple[int | None, int | None]:
    status = model.get("status", {})
    return status.get("replicas"), status.get("readyReplicas")


def restart_container(cluster, namespace: str, pod: str) -> None:
    """What a real kubelet reports when a worker's container dies and is started again: its
    restartCount goes up. kwok runs no kubelet, so the test writes it. LWS makes the group again
    on that, or on seeing the pod being deleted (pkg/controllers/pod_controller.go,
    handleRestartPolicy, v0.8.0); a deleted kwok pod is gone too soon for LWS to see it going."""
    patch = [{"op": "replace", "path": "/status/containerStatuses/0/restartCount", "value": 1}]
    cluster.kubectl("patch", "pod", pod, "-n", namespace, "--subresource=status", "--type=json", "-p", json.dumps(patch))


def test_a_two_node_replica_is_one_group_placed_counted_scaled_and_recreated(lws, operator, namespace):
    cluster = lws
    spec = make_spec(**TWO_NODES)
    cluster.kubectl("apply", "-f", "-", input=json.dumps(make_model("llm", namespace, spec)))

    def model() -> dict:
        return cluster.get("inferentiamodel", "llm", "-n", namespace)

    wait_for(lambda: condition(model(), "Ready").get("status") == "True", 120, "the model Ready as one group")
    status = model()["status"]
    assert (status["replicas"], status["readyReplicas"]) == (1, 1), status
    assert status["plan"]["nodes"] == 2 and status["plan"]["tensorParallelSize"] == 64 and status["plan"]["efaDevices"] == 8, status
    group = cluster.get("leaderworkerset", "llm", "-n", namespace)
    assert group["spec"]["leaderWorkerTemplate"]["size"] == 2, group["spec"]
    deployments = cluster.get("deployments", "-n", namespace)["items"]
    assert not deployments, [d["metadata"]["name"] for d in deployments]
    # One pod a node, each with every chip of its node and its EFA devices, ranked by LWS's webhook.
    members = sorted(pods(cluster, namespace), key=lambda p: p["metadata"]["labels"][f"{GROUP}/worker-index"])
    # What each pod was when read, for a failure to show (this step once failed unexplained).
    seen = [(p["metadata"]["name"], p["metadata"]["labels"], p["spec"].get("nodeName"), p["status"].get("phase")) for p in members]
    assert [p["metadata"]["labels"][f"{GROUP}/worker-index"] for p in members] == ["0", "1"], (seen, status)
    nodes = {p["spec"].get("nodeName") for p in members}
    assert len(nodes) == 2, seen
    for p in members:
        limits = p["spec"]["containers"][0]["resources"]["limits"]
        assert (limits["aws.amazon.com/neuron"], limits["vpc.amazonaws.com/efa"]) == ("16", "8"), limits
        env = {e["name"]: e.get("value") for e in p["spec"]["containers"][0]["env"]}
        # Under the group's own headless Service, named after its leader (UniquePerReplica).
        leader = members[0]["metadata"]["name"]
        assert env["LWS_LEADER_ADDRESS"] == f"{leader}.{leader}.{namespace}", (env, seen)
        assert (env["ENABLE_NEURON_MULTI_NODE"], env["WORLD_SIZE"]) == ("true", "2"), env
    headless = wait_for(
        lambda: cluster.kubectl("get", "service", leader, "-n", namespace, "-o", "json", check=False).stdout,
        30,
        "the group's headless Service",
    )
    assert json.loads(headless)["spec"]["clusterIP"] == "None"
    # Requests reach the leader only, through the model's own Service.
    selector = cluster.get("service", "llm", "-n", namespace)["spec"]["selector"]
    assert selector.get(f"{GROUP}/worker-index") == "0", selector

    # Scaled by whole groups through the model's scale subresource, as KEDA's HPA scales it. The
    # fleet has two nodes with EFA: the second group cannot be placed, and the status says so.
    cluster.kubectl("scale", "inferentiamodel", "llm", "-n", namespace, "--replicas=2")
    wait_for(lambda: cluster.get("leaderworkerset", "llm", "-n", namespace)["spec"]["replicas"] == 2, 60, "two groups asked of LWS")
    wait_for(lambda: condition(model(), "Scheduled").get("reason") == "Unschedulable", 90, "the second group unschedulable")
    # Scheduled is read from the pods, the counts from the LeaderWorkerSet's own status, which its
    # controller moves on its own time: wait for the counts rather than read them once.
    wait_for(lambda: counts(model()) == (2, 1), 60, "two groups counted, one ready")
    assert condition(model(), "Ready")["status"] == "False"
    cluster.kubectl("scale", "inferentiamodel", "llm", "-n", namespace, "--replicas=1")
    wait_for(lambda: condition(model(), "Ready").get("status") == "True" and len(pods(cluster, namespace)) == 2, 120, "back to one group")

    # A worker's container restarted: LWS makes its whole group again, leader included, and the
    # model is Ready again.
    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods(cluster, namespace)}
    [leader] = [n for n in before if not n.endswith("-1")]
    restart_container(cluster, namespace, "llm-0-1")

    def recreated() -> bool:
        now = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods(cluster, namespace)}
        return leader in now and now[leader] != before[leader]

    wait_for(recreated, 120, "the lost worker's whole group made again")
    wait_for(lambda: condition(model(), "Ready").get("status") == "True", 120, "the model Ready again")

    # compute.topologyKey: the group's pods only where their group's pods are, by the label's
    # value. The two nodes share one value of EKS's layer-3 label: the group rolls out onto them.
    key = "topology.k8s.aws/network-node-layer-3"
    try:
        for node in nodes:
            cluster.kubectl("label", "node", node, f"{key}=nn-test-0", "--overwrite")
        patch = {"spec": {"compute": {"topologyKey": key}}}
        cluster.kubectl("patch", "inferentiamodel", "llm", "-n", namespace, "--type=merge", "-p", json.dumps(patch))
        wait_for(
            lambda: "podAffinity" in str(cluster.get("leaderworkerset", "llm", "-n", namespace)["spec"]), 60, "the affinity in the group"
        )

        # The rollout is over when both pods of the group are the new template's, and Ready.
        def placed_by_topology() -> bool:
            members = pods(cluster, namespace)
            return (
                condition(model(), "Ready").get("status") == "True"
                and len(members) == 2
                and all("podAffinity" in str(p["spec"].get("affinity")) for p in members)
            )

        wait_for(placed_by_topology, 120, "placed by topology")
        # Two values, one node each: a group made again cannot be placed whole.
        cluster.kubectl("label", "node", sorted(nodes)[1], f"{key}=nn-test-1", "--overwrite")
        restart_container(cluster, namespace, "llm-0-1")

        # One read for reason and message: while LWS makes the group again, the condition may
        # pass through Pending ("no serving pod has been placed yet") between two reads.
        def unschedulable_by_affinity() -> bool:
            scheduled = condition(model(), "Scheduled")
            return scheduled.get("reason") == "Unschedulable" and "affinity" in scheduled.get("message", "")

        wait_for(unschedulable_by_affinity, 120, "the group unschedulable, for its affinity")
    finally:
        for node in nodes:
            cluster.kubectl("label", "node", node, f"{key}-", check=False)

    # Back on one node: a Deployment serves, and the group goes.
    patch = {"spec": {"compute": {"nodes": 1, "topologyKey": None}}}
    cluster.kubectl("patch", "inferentiamodel", "llm", "-n", namespace, "--type=merge", "-p", json.dumps(patch))
    wait_for(lambda: cluster.get("deployments", "-n", namespace)["items"], 60, "the Deployment")
    wait_for(lambda: not cluster.get("leaderworkersets", "-n", namespace)["items"], 60, "the LeaderWorkerSet deleted")
    wait_for(lambda: condition(model(), "Ready").get("status") == "True", 120, "Ready on one node")


# A stand-in for the leaders' vLLM gauges: kwok's pods serve nothing, so a pod on the real node
# exports the series the ScaledObject's query reads, with the model's label, at the value the
# test writes. vLLM's own names (https://docs.vllm.ai/en/latest/serving/metrics.html).
EXPORTER = """
import http.server, pathlib
VALUE = pathlib.Path('/gauges/in-flight')
class Gauges(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        value = VALUE.read_text() if VALUE.exists() else '0'
        body = ('# TYPE vllm:num_requests_running gauge\\n'
                'vllm:num_requests_running{inferentia_dev_model="llm"} ' + value + '\\n').encode()
        self.send_response(200)
        self.send_header('Content-Type', 'text/plain; version=0.0.4')
        self.end_headers()
        self.wfile.write(body)
http.server.HTTPServer(('', 9400), Gauges).serve_forever()
"""


def in_flight_exporter(namespace: str) -> dict:
    import realnode  # cluster/, on the path once kit is imported

    spec = {
        "containers": [{
            "name": "gauges", "image": DEFAULT_OPERATOR_IMAGE, "imagePullPolicy": "IfNotPresent",
            "command": ["python3", "-c", EXPORTER], "ports": [{"containerPort": 9400}],
            "volumeMounts": [{"name": "gauges", "mountPath": "/gauges"}],
            "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}},
        }],
        "volumes": [{"name": "gauges", "emptyDir": {}}],
        # The real node is a Neuron node too: its taint, as the real node's namespaces add it.
        "tolerations": [{"key": "aws.amazon.com/neuron", "operator": "Exists", "effect": "NoSchedule"}],
    }  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "gauges",
            "namespace": namespace,
            "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "9400", "prometheus.io/path": "/metrics"},
        },
        "spec": realnode.pin_to_real_node(spec),
    }


def test_keda_scales_a_two_node_model_by_whole_groups(lws, operator, namespace, autoscaling_engines):
    # KEDA's HPA sets the model's replicas through its scale subresource; the operator turns
    # them into LeaderWorkerSet groups. Its query reads the leaders' vLLM gauges, here exported
    # by a pod of the test's (above): KEDA, its HPA and Prometheus are the real ones.
    cluster = lws
    cluster.kubectl("apply", "-f", "-", input=json.dumps(in_flight_exporter(namespace)))
    if cluster.kubectl("wait", "--for=condition=Ready", "pod/gauges", "-n", namespace, "--timeout=90s", check=False).returncode:
        raise AssertionError(cluster.kubectl("describe", "pod", "gauges", "-n", namespace, check=False).stdout[-3000:])

    def write_in_flight(value: int) -> None:
        script = f"open('/gauges/in-flight', 'w').write('{value}')"
        cluster.kubectl("exec", "-n", namespace, "gauges", "--", "python3", "-c", script)

    write_in_flight(0)
    autoscaling = {
        "minReplicas": 1, "maxReplicas": 2, "windowSeconds": 0,
        "scaleUpStabilizationSeconds": 0, "scaleDownStabilizationSeconds": 0,
    }  # fmt: skip
    spec = make_spec(**TWO_NODES, autoscaling=autoscaling)
    cluster.kubectl("apply", "-f", "-", input=json.dumps(make_model("llm", namespace, spec)))

    def model() -> dict:
        return cluster.get("inferentiamodel", "llm", "-n", namespace)

    def groups() -> int:
        return cluster.get("leaderworkerset", "llm", "-n", namespace)["spec"]["replicas"]

    wait_for(lambda: condition(model(), "Ready").get("status") == "True", 180, "the model Ready as one group")
    wait_for(lambda: condition(model(), "Autoscaling").get("reason") == "ScaledObjectReady", 120, "KEDA to take the ScaledObject")
    [trigger] = cluster.get("scaledobject", "llm", "-n", namespace)["spec"]["triggers"]
    threshold = int(trigger["metadata"]["threshold"])
    assert threshold == 4  # one process, vLLM batches of 4: one group's parallelism
    assert groups() == 1

    # Twice one group's parallelism in flight: KEDA asks for two groups, the operator makes them.
    write_in_flight(2 * threshold)
    wait_for(lambda: groups() == 2, 180, "KEDA to scale the model to two groups")
    assert model()["spec"]["replicas"] == 2
    hpa = cluster.get("hpa", "-n", namespace)["items"]
    assert [h["spec"]["scaleTargetRef"]["kind"] for h in hpa] == ["InferentiaModel"]
    # The fleet has EFA nodes for one group only: the second is asked for, counted and not ready.
    wait_for(lambda: model()["status"].get("replicas") == 2, 60, "two groups counted")
    assert model()["status"]["readyReplicas"] == 1

    # Nothing in flight: back to one group, which serves throughout.
    write_in_flight(0)
    wait_for(lambda: groups() == 1, 180, "KEDA to scale the model back to one group")
    wait_for(lambda: condition(model(), "Ready").get("status") == "True", 120, "Ready as one group again")


def test_an_inference_pool_selects_each_groups_leader_alone(lws, operator, namespace):
    cluster = lws
    cluster.install_inference_extension()
    spec = make_spec(**TWO_NODES, routing={"inferencePool": {}})
    cluster.kubectl("apply", "-f", "-", input=json.dumps(make_model("llm", namespace, spec)))
    wait_for(lambda: condition(cluster.get("inferentiamodel", "llm", "-n", namespace), "Ready").get("status") == "True", 180, "Ready")
    wait_for(lambda: cluster.kubectl("get", "inferencepool", "llm", "-n", namespace, check=False).returncode == 0, 60, "the InferencePool")
    pool = cluster.get("inferencepool", "llm", "-n", namespace)
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]
    # The API server's own selection by the pool's labels: of the group's two pods, its leader.
    selector = ",".join(f"{k}={v}" for k, v in pool["spec"]["selector"]["matchLabels"].items())
    picked = cluster.get("pods", "-n", namespace, "-l", selector)["items"]
    assert [p["metadata"]["labels"][f"{GROUP}/worker-index"] for p in picked] == ["0"], picked
    assert len(pods(cluster, namespace)) == 2
