"""A replica across two real nodes, of a model bigger than one of them: the real node and a second one started for this test
(LocalCluster.add_real_node: its own kubelet, containerd, bridge and device-plugin stand-in,
with EFA devices), both trn1.32xlarge, with LeaderWorkerSet's controller and the cluster's DNS.
The group's leader runs vLLM's server and its worker the operator's worker program, on the vLLM
and Neuron runtime stand-ins (cluster/node/standins: the worker reaches the leader's root
communicator at LWS_LEADER_ADDRESS, and the leader serves once it has): the group answers
through its leader, with both nodes in every step, and a worker killed takes its group with it
until LeaderWorkerSet has made it again."""

from __future__ import annotations

import os
import time

import pytest
from kit import condition, wait_for
from test_real_faults import _is_shell, pids_in_pod
from test_real_node import apply, cluster_ip_request, reshape, standin_spec

from images import standin_image

pytestmark = pytest.mark.usefixtures("operator")

TRN1 = "trn1.32xlarge"
# The stand-in of AWS's vLLM image whose vLLM serves one model across nodes: only vLLM's V0
# Neuron worker does (cluster/images.py).
VLLM_V0_IMAGE = standin_image("public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:0.9.1-neuronx-py311-sdk2.26.1-ubuntu22.04")


@pytest.fixture
def two_trn1_nodes(real_node):
    if real_node.local is None:
        pytest.skip("a second real node is the local cluster's (LocalCluster.add_real_node)")
    if real_node.kubectl("get", "crd", "leaderworkersets.leaderworkerset.x-k8s.io", check=False).returncode:
        pytest.skip("no LeaderWorkerSet CRD on this cluster (the local cluster runs LWS's controller: cluster/leaderworkerset.py)")
    reshape(real_node, TRN1)
    try:
        second = real_node.local.add_real_node(TRN1)
        yield real_node, second
    finally:
        real_node.local.remove_real_node()
        reshape(real_node, "inf2.24xlarge")


def group_pods(cluster, namespace: str) -> list[dict]:
    found = cluster.get("pods", "-n", namespace, "-l", "leaderworkerset.sigs.k8s.io/name=llm")["items"]
    return sorted(
        (p for p in found if p["metadata"].get("deletionTimestamp") is None),
        key=lambda p: p["metadata"]["labels"].get("leaderworkerset.sigs.k8s.io/worker-index", ""),
    )


def ready(cluster, namespace: str) -> bool:
    model = cluster.get("inferentiamodel", "llm", "-n", namespace)
    return condition(model, "Ready").get("status") == "True" and model["status"].get("readyReplicas") == 1


def what_the_pods_said(cluster, namespace: str) -> str:
    said = []
    for pod in group_pods(cluster, namespace):
        name = pod["metadata"]["name"]
        logs = cluster.kubectl("logs", name, "-n", namespace, "--tail=20", check=False)
        said.append(f"{name} on {pod['spec'].get('nodeName')}: {pod['status'].get('containerStatuses')}\n{logs.stdout}{logs.stderr}")
    return "\n".join(said)


def wait_ready(cluster, namespace: str) -> None:
    try:
        wait_for(lambda: ready(cluster, namespace), 240, "the two-node group to be Ready", interval=1)
    except AssertionError as exc:
        model = cluster.get("inferentiamodel", "llm", "-n", namespace)
        raise AssertionError(f"{exc}: {model.get('status')}\n{what_the_pods_said(cluster, namespace)}") from None


def test_a_two_node_group_answers_through_its_leader_and_a_killed_worker_brings_it_back(two_trn1_nodes, real_namespace):
    cluster, second = two_trn1_nodes
    import realnode

    for node in (realnode.NODE_NAME, second):
        allocatable = cluster.get("node", node)["status"]["allocatable"]
        assert allocatable.get("vpc.amazonaws.com/efa") == "8", (node, allocatable)
    # A model bigger than one node: 810 GB of bf16 weights, 25 GB a NeuronCore over one node's 32
    # (16 GiB each), 12.7 GB over the group's 64. The runtime stand-in counts the weights its
    # checkpoint stands for and fails to allocate them on fewer cores, as the runtime does.
    spec = standin_spec(**{
        "model.uri": "meta-llama/Llama-3.1-405B-Instruct", "model.weights": 405_000_000_000, "model.precision": "bf16",
        "model.architecture": "transformer", "compute.family": "trn1", "compute.inf": 16, "compute.nodes": 2,
        "compute.instanceTypes": [TRN1], "serving.image": VLLM_V0_IMAGE, "serving.runtime": "vllm",
        "serving.batching": {"maxBatchSize": 4}, "serving.env": [{"name": "HF_TOKEN", "value": "standin-token"}],
    })  # fmt: skip
    spec["serving"].pop("args")
    apply(cluster, real_namespace, "llm", spec)
    wait_ready(cluster, real_namespace)

    leader, worker = group_pods(cluster, real_namespace)
    # One pod a node, each with the node's every chip and its EFA devices.
    assert {leader["spec"]["nodeName"], worker["spec"]["nodeName"]} == {realnode.NODE_NAME, second}
    answer = cluster_ip_request(cluster, real_namespace, "llm", "/v1/completions", {"prompt": "Trainium"})
    text = answer["choices"][0]["text"]
    # Through the leader's server, and every step on both nodes' ranks (the pods' host names).
    assert f"[node 0 {leader['metadata']['name']} cores 0-31] [node 1 {worker['metadata']['name']} cores 0-31]" in text, text

    # The worker's rank killed: LeaderWorkerSet makes the whole group again
    # (RecreateGroupOnPodRestart), and the model is Ready once more, answering from both nodes.
    found = [p for p in pids_in_pod(worker["metadata"]["uid"], "vllm_worker.py") if not _is_shell(p)]
    assert found, "no worker process found in the worker's pod"
    os.kill(found[0], 9)
    seen: list[str] = []

    def recreated() -> bool:
        model = cluster.get("inferentiamodel", "llm", "-n", real_namespace)
        ready_condition = next((c for c in model["status"].get("conditions", []) if c["type"] == "Ready"), {})
        if ready_condition.get("status") != "True":
            seen.append(ready_condition.get("message", ""))
        pods = group_pods(cluster, real_namespace)
        uids = {p["metadata"]["uid"] for p in pods}
        return len(pods) == 2 and leader["metadata"]["uid"] not in uids and ready(cluster, real_namespace)

    started = time.monotonic()
    try:
        wait_for(recreated, 240, "the group made again and Ready", interval=0.5)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{what_the_pods_said(cluster, real_namespace)}") from None
    assert seen, "the model never said it was not Ready while its group was made again"
    leader, worker = group_pods(cluster, real_namespace)
    answer = cluster_ip_request(cluster, real_namespace, "llm", "/v1/completions", {"prompt": "again"})
    assert f"[node 1 {worker['metadata']['name']} cores 0-31]" in answer["choices"][0]["text"], answer
    print(f"group back in {time.monotonic() - started:.1f} s; Ready said meanwhile: {sorted(set(seen))}")
