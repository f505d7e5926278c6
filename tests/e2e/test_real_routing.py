"""Routing by queue on the real node: a vLLM model of two replicas with spec.routing.inferencePool,
its InferencePool written by the operator, and the Gateway API Inference Extension's own
endpoint picker (v1.1.0, built from its Go module) run against it and driven through its
ext_proc API as a gateway's data plane drives it. The replicas are the vLLM stand-in, which
runs --max-num-seqs requests at once and reports the rest as vllm:num_requests_waiting, as
vLLM does; the picker reads that from each pod's own /metrics."""

from __future__ import annotations

import json
import threading
import urllib.request
import uuid

import pytest
from kit import wait_for
from test_real_node import apply, serving_pods, wait_ready

from endpointpicker import EndpointPicker
from inferentia_operator.core.routing.pool import PICKER_CONFIG

pytestmark = pytest.mark.usefixtures("operator")


def waiting(endpoint: str) -> float:
    with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=5) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith("vllm:num_requests_waiting"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def load(endpoint: str, requests: int) -> list[threading.Thread]:
    """``requests`` completions in flight at ``endpoint``, straight to the pod."""

    def one() -> None:
        body = json.dumps({"model": "m", "prompt": "busy", "max_tokens": 1}).encode()
        urllib.request.urlopen(
            urllib.request.Request(f"http://{endpoint}/v1/completions", body, {"Content-Type": "application/json"}), timeout=60
        ).read()

    threads = [threading.Thread(target=one, daemon=True) for _ in range(requests)]
    for t in threads:
        t.start()
    return threads


def test_the_endpoint_picker_sends_each_request_to_the_replica_with_the_shorter_queue(real_node, real_namespace, tmp_path, request):
    from test_real_zero import zero_spec

    cluster, ns = real_node, real_namespace
    cluster.install_inference_extension()
    spec = zero_spec(cluster, ns)
    del spec["autoscaling"]
    spec["replicas"] = 2
    spec["serving"]["batching"] = {"maxBatchSize": 1}  # vLLM's --max-num-seqs: one at a time, the rest wait
    # Each completion takes 4 s, so that a queue stands long enough to be read (beside the
    # sample's own variables: its Hugging Face token).
    spec["serving"]["env"] = [*spec["serving"].get("env", []), {"name": "NEURON_STANDIN_CALL_SECONDS", "value": "4"}]
    spec["routing"] = {"inferencePool": {}}
    apply(cluster, ns, "routed", spec)
    wait_ready(cluster, ns, "routed", timeout=400)
    wait_for(lambda: cluster.kubectl("get", "inferencepool", "routed", "-n", ns, check=False).returncode == 0, 60, "the InferencePool")
    [port] = [p["number"] for p in cluster.get("inferencepool", "routed", "-n", ns)["spec"]["targetPorts"]]
    endpoints = sorted(f"{p['status']['podIP']}:{port}" for p in serving_pods(cluster, ns, "routed"))
    assert len(endpoints) == 2, endpoints

    picker = EndpointPicker(cluster.bin_dir, cluster.kubeconfig, "routed", ns, tmp_path / "epp.log", PICKER_CONFIG)
    request.addfinalizer(picker.stop)
    picker.start()

    def body() -> dict:
        # A new prompt each time: the picker's prefix-cache scorer favours where a prompt went before.
        return {"model": "m", "prompt": f"hello {uuid.uuid4()}", "max_tokens": 1}

    assert picker.wait_ready(body()) in endpoints
    for busy, idle in (endpoints, endpoints[::-1]):
        # One running, four waiting: 4 s a call, the queue stands about 16 s, long enough for
        # the picks below on a busy machine (with two waiting it once emptied during them).
        threads = load(busy, 5)
        wait_for(lambda busy=busy: waiting(busy) >= 2, 30, f"{busy} to report two waiting")
        # The picker reads each endpoint's metrics every 50 ms (--refresh-metrics-interval); a
        # tie it breaks at random, so one pick of the idle replica could be chance: five in a row.
        wait_for(lambda idle=idle: all(picker.pick(body()) == idle for _ in range(5)), 10, f"the picker to choose {idle}")
        assert waiting(busy) >= 1  # the queue still stands while the picks are counted
        picks = [picker.pick(body()) for _ in range(10)]
        assert waiting(busy) >= 1, "the queue emptied while the picks were made: they tell nothing"
        assert picks == [idle] * 10, (busy, picks)
        for t in threads:
            t.join(60)
        wait_for(lambda busy=busy: waiting(busy) == 0, 30, f"{busy}'s queue to empty")
    # A request that is not an OpenAI completion is refused by the picker, as rules/routing.py says.
    assert picker.pick({"inputs": [[1.0, 2.0]]}) is None
