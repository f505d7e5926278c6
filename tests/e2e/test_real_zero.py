"""Scale to zero on the real node: a model with autoscaling.minReplicas 0 goes to zero after
its idle period, its Service then points at the holder, a request sent at zero is held
(never refused) until KEDA has started a replica, and is answered by it; then the model
goes back to zero. The start never compiles: the model fetches its compiled artefact."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest
from kit import wait_for
from test_real_node import apply, object_store, serving_pods, standin_spec, wait_ready, why_not_ready

pytestmark = pytest.mark.usefixtures("operator")

IDLE_SECONDS = 10


def zero_spec(bucket: str) -> dict:
    spec = standin_spec(
        **{
            "model.uri": f"s3://{bucket}/llama/",
            "compile.image": "neuron-compile-standin:0.1.0",
            "compile.storageSecret": "store",
            "compile.cpu": "200m",
            "compile.memory": "512Mi",
            "serving.runtime": "vllm",
            "autoscaling": {
                "minReplicas": 0,
                "maxReplicas": 1,
                "targetInFlight": 1,
                "windowSeconds": 0,
                "scaleUpStabilizationSeconds": 0,
                "scaleDownStabilizationSeconds": 0,
                "idleSeconds": IDLE_SECONDS,
                "holdSeconds": 240,
            },
        }
    )
    spec["serving"].pop("args")
    return spec


def condition(model: dict, type_: str) -> dict:
    return next((c for c in model.get("status", {}).get("conditions") or [] if c["type"] == type_), {})


def test_a_model_at_zero_holds_its_first_request_answers_it_and_goes_back_to_zero(real_node, real_namespace):
    cluster, ns = real_node, real_namespace
    bucket = object_store(cluster, ns)
    apply(cluster, ns, "zero", zero_spec(bucket))

    def model() -> dict:
        return cluster.get("inferentiamodel", "zero", "-n", ns)

    def at_zero() -> bool:
        m = model()
        ready = condition(m, "Ready")
        return m["spec"].get("replicas") == 0 and ready.get("reason") == "ScaledToZero" and not serving_pods(cluster, ns, "zero")

    try:
        wait_ready(cluster, ns, "zero", timeout=240)
        wait_for(at_zero, 180, "the idle model to go to zero")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{why_not_ready(cluster, ns, 'zero')}") from None
    assert condition(model(), "Ready")["status"] == "True"
    assert model()["status"]["pods"] == {"pending": 0, "fetching": 0, "loading": 0, "ready": 0}
    svc = cluster.get("service", "zero", "-n", ns)
    assert svc["spec"]["selector"]["app.kubernetes.io/component"] == "holder", svc["spec"]["selector"]

    # A request at zero: held, not refused, and answered by the replica it starts.
    url = f"http://{svc['spec']['clusterIP']}:{svc['spec']['ports'][0]['port']}/v1/completions"
    started = time.monotonic()
    body = json.dumps({"model": "zero", "prompt": "hello"}).encode()
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as answer:
        assert answer.status == 200
        text = json.loads(answer.read())["choices"][0]["text"]
    took = time.monotonic() - started
    assert text.endswith("hello"), text
    print(f"first request at zero answered in {took:.1f} s")
    # Warm: the Service points at the replica again, and the replica fetched, never compiled.
    wait_for(
        lambda: cluster.get("service", "zero", "-n", ns)["spec"]["selector"]["app.kubernetes.io/component"] == "serving",
        60, "the Service to point at the replica",
    )  # fmt: skip
    [pod] = serving_pods(cluster, ns, "zero")
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["fetch-artifacts"]
    # Idle again: back to zero.
    wait_for(at_zero, 120, "the model to go back to zero")
