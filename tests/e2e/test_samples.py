"""Every sample in manifests/samples/ goes Ready on the real node and answers, with the test
images standing in for the AWS images it names. What differs from a sample as written, and
why, is in cluster/samples.py; the real node takes the instance type each sample needs
(inf2.24xlarge, inf1.6xlarge, trn2.48xlarge), one shape at a time."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from test_real_node import (
    TORCH_PYTHON,
    ask_concurrently,
    close,
    cluster_ip_request,
    reshape,
    routed,
    serve_get,
    serving_pods,
    standin_state,
    store_client,
    wait_ready,
)

from inferentia_operator.core.names import COMPONENT_LABEL, MODEL_LABEL, POOL_LABEL
from inferentia_operator.core.pod.meta import labels_string
from samples import SHAPE, image_input, make_buckets, put_model, run_here, store_secret, store_uris, token_secret

pytestmark = pytest.mark.usefixtures("operator")

SAMPLES = Path(__file__).resolve().parents[2] / "manifests" / "samples"
REFERENCE = Path(__file__).resolve().parents[1] / "models" / "reference.py"


def samples() -> list[Path]:
    """By family, so that the node changes shape as few times as it can: inf2 first, the shape the
    other modules leave it in (and node_shape leaves it in after)."""
    docs = {p: yaml.safe_load(p.read_text()) for p in sorted(SAMPLES.glob("*.yaml"))}

    def family(p: Path) -> str:
        return docs[p]["spec"]["compute"].get("family", "inf1")

    return sorted(docs, key=lambda p: (family(p) != "inf2", family(p), p.name))


@pytest.fixture(scope="module")
def node_shape(real_node):
    """Reshapes the real node on demand; leaves it an inf2.24xlarge, as the other modules expect."""
    import realnode

    def shape(instance_type: str) -> None:
        label = real_node.get("node", realnode.NODE_NAME)["metadata"]["labels"]["node.kubernetes.io/instance-type"]
        if label != instance_type:
            reshape(real_node, instance_type)

    yield shape
    shape("inf2.24xlarge")


@pytest.mark.parametrize("path", samples(), ids=lambda p: p.stem)
def test_every_sample_goes_ready_on_the_real_node_and_answers(path, node_shape, real_node, real_namespace, tmp_path):
    doc = run_here(yaml.safe_load(path.read_text()), real_namespace)
    spec, name = doc["spec"], doc["metadata"]["name"]
    node_shape(SHAPE[spec["compute"].get("family", "inf1")])
    uri = spec["model"]["uri"]
    if store_uris(doc):
        real_node.kubectl("apply", "-f", "-", input=json.dumps(store_secret(real_namespace, real_node.node.object_store())))
        make_buckets(store_client(real_node), doc)
    if uri.startswith("s3://"):
        subprocess.run([TORCH_PYTHON, str(REFERENCE), "build", str(tmp_path / "models")], check=True)
        network, dtype, inputs = put_model(store_client(real_node), uri, tmp_path / "models")
    if any(e.get("valueFrom", {}).get("secretKeyRef") for e in spec["serving"].get("env", [])):
        real_node.kubectl("apply", "-f", "-", input=json.dumps(token_secret(real_namespace)))
    real_node.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))
    wait_ready(real_node, real_namespace, name, timeout=400)
    assert serving_pods(real_node, real_namespace, name)
    if spec.get("compile", {}).get("image") and spec["serving"].get("runtime") != "vllm":
        # The compile program's report, through the compile step's termination message: every
        # operator of the tests' networks compiles (torch-neuron's partitioner report on inf1).
        status = real_node.get("inferentiamodel", name, "-n", real_namespace)["status"]
        assert status.get("neuronPlacementPercent") == 100.0, status

    if spec["serving"].get("runtime") == "vllm":
        # Compiled by the operator's program in the sample's image: every replica loads it, none compiles.
        [pod, *_] = serving_pods(real_node, real_namespace, name)
        found = standin_state(real_node, real_namespace, pod)
        assert found["loaded"] in ("compiled", "compile-cache"), found
        if not uri.startswith(("s3://", "https://", "/")):
            # A Hub id: read once, by the compile; the replica read it offline from the artefact, at the commit status pins.
            status = real_node.get("inferentiamodel", name, "-n", real_namespace)["status"]
            assert found["checkpoint"].endswith(f"/snapshots/{status['hubRevision']}"), (found, status)
            assert found["checkpoint"].startswith("/var/lib/inferentia/compiled/hf-hub/"), found
        try:
            answer = cluster_ip_request(real_node, real_namespace, name, "/v1/completions", {"prompt": "Neuron"})
        except AssertionError as unanswered:
            raise AssertionError(f"{unanswered}\n{pod_logs(real_node, real_namespace)}") from None
        assert answer["object"] == "text_completion"
        if spec.get("disaggregation"):
            assert_the_kv_moved_from_prefill_to_decode(real_node, real_namespace, name)
        return
    inputs = inputs if inputs is not None else [image_input()]
    svc = real_node.get("service", name, "-n", real_namespace)
    ip, port = svc["spec"]["clusterIP"], svc["spec"]["ports"][0]["port"]
    url = f"http://{ip}:{port}/"
    routed(ip, port)
    if spec["serving"].get("batching"):
        # The front end takes one input a request and batches them.
        answers = ask_concurrently(url, inputs)
    else:
        # The model server itself: a list of inputs a request.
        answers = [
            (code, json.dumps(json.loads(text)[0]) if code == 200 else text) for code, text in ask_concurrently(url, [[x] for x in inputs])
        ]
    assert [code for code, _ in answers] == [200] * len(inputs), answers
    expected = subprocess.run(
        [TORCH_PYTHON, str(REFERENCE), "predict", str(tmp_path / "models" / network), dtype],
        input=json.dumps(inputs), capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert close([json.loads(text) for _, text in answers], json.loads(expected.stdout))


def pool_metric(cluster, namespace: str, pod: dict, metric: str) -> float:
    """A metric's value as the pool's vLLM server exposes it on its /metrics, read in the pod."""
    text = serve_get(cluster, namespace, pod, "/metrics")
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(metric)]
    assert values, f"{metric} not in {pod['metadata']['name']}'s /metrics:\n{text[:2000]}"
    return sum(values)


def assert_the_kv_moved_from_prefill_to_decode(cluster, namespace: str, name: str) -> None:
    """Both pools ready in status, and the request's KV cache read by the decode pool from the
    prefill pool (NIXL's bytes transferred, which vLLM counts on the side that reads: the
    decode server's vllm:nixl_bytes_transferred histogram)."""
    status = cluster.get("inferentiamodel", name, "-n", namespace)["status"]
    for role in ("prefill", "decode"):
        pool = status["pools"][role]
        assert pool["readyReplicas"] == pool["replicas"] >= 1, status["pools"]
    pods = cluster.get("pods", "-n", namespace, "-l", labels_string({MODEL_LABEL: name, COMPONENT_LABEL: "serving", POOL_LABEL: "decode"}))[
        "items"
    ]
    assert pods, cluster.kubectl("get", "pods", "-n", namespace, "--show-labels").stdout
    # Every pool pod was placed with its share of the trn2.48xlarge's EFA devices, one a chip, which
    # the device plugin stand-in advertises as AWS's EFA device plugin would.
    every = cluster.get("pods", "-n", namespace, "-l", labels_string({MODEL_LABEL: name, COMPONENT_LABEL: "serving"}))["items"]
    for pod in every:
        [serve] = [c for c in pod["spec"]["containers"] if c["name"] == "serve"]
        limits = serve["resources"]["limits"]
        assert limits["vpc.amazonaws.com/efa"] == limits["aws.amazon.com/neuron"], (pod["metadata"]["name"], limits)
    # The decode pool's Service picked one of its pods for the request.
    moved = sum(pool_metric(cluster, namespace, pod, "vllm:nixl_bytes_transferred_sum") for pod in pods)
    assert moved > 0, pod_logs(cluster, namespace)


def pod_logs(cluster, namespace: str) -> str:
    """Every pod's containers' last lines, for a model that went Ready and did not answer."""
    out = []
    for pod in cluster.get("pods", "-n", namespace)["items"]:
        for container in pod["spec"]["containers"]:
            logs = cluster.kubectl("logs", "-n", namespace, pod["metadata"]["name"], "-c", container["name"], "--tail", "30", check=False)
            out.append(f"--- {pod['metadata']['name']}/{container['name']} ({pod['status'].get('podIP')}):\n{logs.stdout}{logs.stderr}")
    return "\n".join(out)
