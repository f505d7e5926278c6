"""Replicas bigger than a node (spec.compute.nodes): validated for each family's limits, planned
as one tensor-parallel model across the nodes, and rendered as a LeaderWorkerSet whose leader
serves and whose workers hold the other ranks, as vLLM on NxD Inference runs across Trn1 nodes
(vllm-project/vllm examples/neuron/multi_node: launch_script.py and worker.py)."""

import json

import pytest

from inferentia_operator.core import status
from inferentia_operator.core.decide import rendered
from inferentia_operator.core.names import PLAN_HASH_ANNOTATION, TRAFFIC_LABEL
from inferentia_operator.core.parsing import parse_spec
from inferentia_operator.core.pod.meta import labels, selector
from inferentia_operator.core.pod.model import plan_hash
from inferentia_operator.core.projection import project_pod
from inferentia_operator.core.serving.runtime import multi_node_command
from specs import DROP
from test_decide import SETTINGS, Observed, built, decide, live, model_body

# A Llama on two trn1.32xlarge: 16 chips, 32 NeuronCores a node, 64 ranks in all.
TWO_NODES = {
    "model.uri": "s3://models/llama-3.1-70b/", "model.architecture": "transformer", "model.precision": "bf16",
    "compute.family": "trn1", "compute.inf": 16, "compute.nodes": 2, "compute.cpu": "8", "compute.memory": "64Gi",
    "compile.buckets": [[4096]], "serving.runtime": "vllm", "serving.port": 8000, "serving.batching": {"maxBatchSize": 4},
}  # fmt: skip


def errors_of(**overrides):
    from specs import make_spec

    _, found = parse_spec(make_spec(**{**TWO_NODES, **overrides}))
    return [str(f) for f in found if f.severity == "error"]


def test_two_whole_trn1_nodes_are_valid():
    assert errors_of() == []


@pytest.mark.parametrize(
    ("family", "inf"),
    [("inf1", 16), ("inf2", 12), ("trn2", 16), ("trn3", 16)],
)
def test_only_trn1_spans_nodes_and_the_refusal_says_where_it_can(family, inf):
    """vLLM's multi-node serving on Neuron is documented for NxD Inference on Trn1 only; the
    vLLM Neuron plugin (trn2, trn3) documents none, and inf1/inf2 have no EFA."""
    found = errors_of(**{"compute.family": family, "compute.inf": inf})
    assert any(
        line.startswith("spec.compute.nodes: 2 needs a family whose replicas can span nodes")
        and f"family is {family}" in line
        and "valid values: trn1" in line
        for line in found
    ), found


def test_a_replica_spans_whole_nodes():
    found = errors_of(**{"compute.inf": 8})
    assert any(
        line.startswith("spec.compute.inf: 8 chips a node") and "takes whole nodes" in line and "valid value on trn1: 16" in line
        for line in found
    ), found
    found = errors_of(**{"compute.inf": DROP, "compute.cores": 32})
    assert any(line.startswith("spec.compute.inf:") and "whole nodes" in line for line in found), found


@pytest.mark.parametrize(
    ("overrides", "field", "words"),
    [
        ({"processesPerReplica": 2}, "spec.processesPerReplica", "one serving process a node"),
        ({"serving.runtime": DROP, "serving.batching": DROP}, "spec.serving.runtime", "valid value with nodes above 1: vllm"),
        ({"compile.image": "example.com/neuron:1"}, "spec.compile.image", "each node compiles its own ranks at start"),
        ({"compute.allocation": "dra"}, "spec.compute.allocation", "valid value with nodes above 1: devicePlugin"),
        (
            {"autoscaling": {"minReplicas": 0, "maxReplicas": 2}},
            "spec.autoscaling.minReplicas",
            "valid values with nodes above 1: at least 1",
        ),
    ],
)
def test_what_a_multi_node_replica_cannot_have_yet_is_named(overrides, field, words):
    found = errors_of(**overrides)
    assert any(line.startswith(field + ":") and words in line for line in found), found


def test_a_group_is_routed_to_by_its_leader_in_an_inference_pool():
    """An InferencePool selects the pods that answer: a group's leader, as the Service does. Its
    workers hold ranks and serve no API, so the picker neither scrapes nor picks them."""
    from inferentia_operator.core.routing.part import routing_part

    body = model_body(**TWO_NODES, routing={"inferencePool": {}})
    assert errors_of(routing={"inferencePool": {}}) == []
    m = built(body)
    [pool] = [c for c in routing_part(m, Observed(body), SETTINGS).children if c["kind"] == "InferencePool"]
    assert pool["spec"]["selector"]["matchLabels"] == {
        **selector(m),
        TRAFFIC_LABEL: "on",
        "leaderworkerset.sigs.k8s.io/worker-index": "0",
    }
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]  # one vLLM a group, at the leader's serving port
    service = next(c for c in rendered(m, SETTINGS) if c["kind"] == "Service" and c["metadata"]["name"] == "m")
    assert service["spec"]["selector"] == pool["spec"]["selector"]["matchLabels"]


def test_the_nodes_bound():
    found = errors_of(**{"compute.nodes": 0})
    assert any(line.startswith("spec.compute.nodes: 0 is too small") for line in found), found
    assert errors_of(**{"compute.nodes": 1, "compute.inf": 8}) == []


def test_the_plan_is_one_tensor_parallel_model_across_the_nodes():
    m = built(model_body(**TWO_NODES))
    p = m.plan
    assert (p.nodes, p.total_cores, p.group_size, p.groups) == (2, 32, 32, 1)
    assert p.tensor_parallel_size == 64  # 32 ranks a node, 2 nodes
    # trn1.32xlarge has 8 EFA devices, trn1n.32xlarge 16: a pod asks what every allowed type has.
    assert p.instance_types == ["trn1.32xlarge", "trn1n.32xlarge"]
    assert p.efa_devices == 8
    assert p.resources.limits["vpc.amazonaws.com/efa"] == "8"
    trn1n = built(model_body(**TWO_NODES, **{"compute.instanceTypes": ["trn1n.32xlarge"]}))
    assert trn1n.plan.efa_devices == 16


def lws_of(m):
    return next(c for c in rendered(m, SETTINGS) if c["kind"] == "LeaderWorkerSet")


def test_render_writes_a_leaderworkerset_in_place_of_the_deployment():
    m = built(model_body(replicas=3, **TWO_NODES))
    kinds = [c["kind"] for c in rendered(m, SETTINGS)]
    assert "Deployment" not in kinds and kinds.count("LeaderWorkerSet") == 1
    lws = lws_of(m)
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1" and lws["metadata"]["name"] == "m"
    spec = lws["spec"]
    assert spec["replicas"] == 3  # groups, not pods
    template = spec["leaderWorkerTemplate"]
    assert template["size"] == 2
    # A lost pod brings its whole group back: the ranks start together or not at all.
    assert template["restartPolicy"] == "RecreateGroupOnPodRestart"
    leader, worker = template["leaderTemplate"], template["workerTemplate"]
    for pod in (leader, worker):
        assert pod["metadata"]["annotations"][PLAN_HASH_ANNOTATION] == plan_hash(m.plan)
        c = pod["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in c["env"]}
        # vLLM's multi-node launcher's environment (launch_script.py), and EFA's (multi_node_launcher.sh).
        assert (env["ENABLE_NEURON_MULTI_NODE"], env["WORLD_SIZE"], env["NEURON_LOCAL_TP"]) == ("true", "2", "32")
        assert env["VLLM_NEURON_FRAMEWORK"] == "neuronx-distributed-inference"
        assert (env["FI_PROVIDER"], env["FI_EFA_USE_DEVICE_RDMA"], env["FI_EFA_FORK_SAFE"]) == ("efa", "1", "1")
        assert c["resources"]["limits"]["aws.amazon.com/neuron"] == "16" and c["resources"]["limits"]["vpc.amazonaws.com/efa"] == "8"
    # The leader serves and is probed; a worker only holds its ranks, so nothing probes it over HTTP.
    assert "readinessProbe" in leader["spec"]["containers"][0] and leader["spec"]["containers"][0]["ports"]
    assert "readinessProbe" not in worker["spec"]["containers"][0] and "ports" not in worker["spec"]["containers"][0]
    # Prometheus scrapes the leader's vLLM, the one that serves.
    assert leader["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert not any(k.startswith("prometheus.io/") for k in worker["metadata"]["annotations"])
    # The Service sends requests to leaders only.
    service = next(c for c in rendered(m, SETTINGS) if c["kind"] == "Service" and c["metadata"]["name"] == "m")
    assert service["spec"]["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"


def test_each_group_is_found_by_a_headless_service_of_its_own_not_the_models_service():
    """LWS's shared headless Service takes the set's name, which the model's own Service already
    has: LWS then creates none (CreateHeadlessServiceIfNotExists, v0.8.0) and LWS_LEADER_ADDRESS
    resolves nowhere, as the real two-node test showed. With UniquePerReplica each group's leader
    gets a headless Service named after itself (<model>-<group>), and the leader's address is
    <model>-<group>.<model>-<group>.<namespace>."""
    m = built(model_body(**TWO_NODES))
    assert lws_of(m)["spec"]["networkConfig"] == {"subdomainPolicy": "UniquePerReplica"}
    service = next(c for c in rendered(m, SETTINGS) if c["kind"] == "Service" and c["metadata"]["name"] == "m")
    assert service["spec"].get("clusterIP") != "None"


def test_each_pod_takes_its_rank_and_the_leaders_address_from_leaderworkerset():
    """Ranks from LWS_WORKER_INDEX and the root communicator at LWS_LEADER_ADDRESS, which LWS's
    pod webhook sets; the override config as vLLM's launcher builds it (start_rank_id = rank
    times the local ranks)."""
    import subprocess

    m = built(model_body(**TWO_NODES))
    template = lws_of(m)["spec"]["leaderWorkerTemplate"]
    for pod, rank in ((template["leaderTemplate"], 0), (template["workerTemplate"], 1)):
        c = pod["spec"]["containers"][0]
        script_args = multi_node_command(m)
        assert c["args"] == script_args
        shell, dash_c, script, *rest = script_args
        # Run the script with an echo for python3: what each rank would start.
        out = subprocess.run(
            [shell, dash_c, script.replace("exec python3", "exec echo python3"), *rest],
            env={"PATH": "/usr/bin:/bin", "PORT": "8000", "LWS_WORKER_INDEX": str(rank), "LWS_LEADER_ADDRESS": "m-0.m.ns", "INFERENTIA_PLAN_DIR": "/plan"},
            capture_output=True, text=True, check=True,
        ).stdout.split()  # fmt: skip
        config = json.loads(out[out.index("--override-neuron-config") + 1])
        assert config == {"world_size": 64, "tp_degree": 32, "local_ranks_size": 32, "start_rank_id": 32 * rank}
        if rank == 0:
            assert out[:4] == ["python3", "-m", "vllm.entrypoints.openai.api_server", "--port"]
        else:
            assert out[:2] == ["python3", "/plan/vllm_worker.py"]
        assert "--tensor-parallel-size" not in out and out[out.index("--served-model-name") + 1] == "s3://models/llama-3.1-70b/"


def test_the_status_counts_groups_and_a_group_with_a_lost_worker_is_not_ready():
    body = model_body(replicas=1, **TWO_NODES)
    m = built(body)
    lws = lws_of(m)
    ready = live(lws, replicas=1, readyReplicas=1, updatedReplicas=1, conditions=[{"type": "Available", "status": "True"}])
    ready["metadata"]["generation"] = 1
    ready["status"]["observedGeneration"] = 1
    seen = Observed(body, others=[ready, *[live(c) for c in rendered(m, SETTINGS) if c["kind"] in ("ConfigMap", "Service")]])
    report = decide(seen, "2026-11-26T00:00:00Z").report
    assert (report.status.replicas, report.status.ready_replicas) == (1, 1)
    assert {c.type: c.status for c in report.status.conditions}["Ready"] == "True"

    lost = live(lws, replicas=1, readyReplicas=0, updatedReplicas=1, conditions=[{"type": "Available", "status": "False"}])
    lost["metadata"]["generation"] = 1
    lost["status"]["observedGeneration"] = 1
    worker = {
        "kind": "Pod", "metadata": {"name": "m-0-1", "labels": {**labels(m, "serving"), "leaderworkerset.sigs.k8s.io/worker-index": "1"}},
        "spec": {}, "status": {"conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Initialized", "status": "True"},
        {"type": "Ready", "status": "False"}], "containerStatuses": [{"name": "serve", "ready": False,
        "state": {"waiting": {"reason": "CrashLoopBackOff"}}, "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": "NEURON_RT_ROOT_COMM_ID unreachable"}}}]},
    }  # fmt: skip
    seen = Observed(
        body, others=[lost, *[live(c) for c in rendered(m, SETTINGS) if c["kind"] in ("ConfigMap", "Service")]], pods=[project_pod(worker)]
    )
    report = decide(seen, "2026-11-26T00:00:00Z").report
    conditions = {c.type: c for c in report.status.conditions}
    assert report.status.ready_replicas == 0 and conditions["Ready"].status == "False"
    # Which pod of which group, and its last words.
    assert "pod m-0-1 (worker 1 of its group): serve failed: NEURON_RT_ROOT_COMM_ID unreachable" in conditions["Ready"].message


def test_turning_nodes_back_to_one_deletes_the_groups_and_the_other_way_round():
    multi = model_body(**TWO_NODES)
    lws = live(lws_of(built(multi)))
    single = model_body(**{**TWO_NODES, "compute.nodes": 1})
    deployment = live(next(c for c in rendered(built(single), SETTINGS) if c["kind"] == "Deployment"))
    assert ("LeaderWorkerSet", "m") in decide(Observed(single, others=[lws]), "t").delete
    assert ("Deployment", "m") in decide(Observed(multi, deployment=deployment), "t").delete


def test_an_lws_someone_else_owns_is_never_written():
    body = model_body(**TWO_NODES)
    foreign = live(lws_of(built(body)))
    foreign["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "other", "controller": True}]
    decision = decide(Observed(body, others=[foreign]), "t")
    assert not [b for b in decision.apply if b["kind"] == "LeaderWorkerSet"]
    # nor deleted when the model goes back to one node: clean-up takes only its own
    single = model_body(**{**TWO_NODES, "compute.nodes": 1})
    assert ("LeaderWorkerSet", "m") not in decide(Observed(single, others=[foreign]), "t").delete
    assert ("LeaderWorkerSet", "m") not in decision.delete
    assert status.Conflict("LeaderWorkerSet", "m", "controlled by ConfigMap x") in decision.basis.conflicts


def test_without_leaderworkerset_the_status_says_to_install_it():
    """The cluster serves no LeaderWorkerSets (the write answered 404, and the kind is not asked
    again until the next resync): Ready says what to install, as KEDA's absence is said."""
    body = model_body(**TWO_NODES)
    seen = Observed(body)
    seen = type(seen)(seen.model, seen.children, unserved=frozenset({"LeaderWorkerSet"}), settings=SETTINGS)
    conditions = {c.type: c for c in decide(seen, "t").report.status.conditions}
    assert conditions["Ready"].reason == "LeaderWorkerSetNotInstalled"
    assert "install LeaderWorkerSet" in conditions["Ready"].message and conditions["Stalled"].status == "False"


def test_a_topology_key_keeps_each_group_on_one_part_of_the_network():
    """EKS labels each node with its place in the network (topology.k8s.aws/network-node-layer-1
    to -3, https://docs.aws.amazon.com/eks/latest/userguide/ml-workload-topology.html): every pod
    of a group goes where its group's pods are, by its own group-key."""
    key = "topology.k8s.aws/network-node-layer-3"
    m = built(model_body(**TWO_NODES, **{"compute.topologyKey": key}))
    template = lws_of(m)["spec"]["leaderWorkerTemplate"]
    for pod in (template["leaderTemplate"], template["workerTemplate"]):
        [term] = pod["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term == {
            "labelSelector": {"matchLabels": {"leaderworkerset.sigs.k8s.io/name": "m"}},
            "matchLabelKeys": ["leaderworkerset.sigs.k8s.io/group-key"], "topologyKey": key,
        }  # fmt: skip
    assert "podAffinity" not in lws_of(built(model_body(**TWO_NODES)))["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["affinity"]
    assert any(
        line.startswith("spec.compute.topologyKey: 'a b' is not a label key") for line in errors_of(**{"compute.topologyKey": "a b"})
    )
    assert any(
        line.startswith("spec.compute.topologyKey: keeps the pods of a replica across nodes together, and nodes is 1")
        for line in errors_of(**{"compute.nodes": 1, "compute.inf": 8, "compute.topologyKey": key})
    )
