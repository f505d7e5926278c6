"""Scale to zero on the real node: a model with autoscaling.minReplicas 0 goes to zero after
its idle period, its Service then points at the holder, a request sent at zero is held
(never refused) until KEDA has started a replica, and is answered by it; then the model
goes back to zero. The start never compiles: the model fetches its compiled artefact."""

from __future__ import annotations

import json
import os
import re
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from kit import condition, wait_for
from test_real_node import apply, granted_cores, process_envs, serving_pods, standin_state, store_client, wait_ready, why_not_ready
from test_real_scaling import cores

from autoscaling import SCRAPE_SECONDS, set_scrape_interval
from benchmark_autoscaling import phases
from samples import make_buckets, run_here, store_secret, token_secret

pytestmark = pytest.mark.usefixtures("operator")

IDLE_SECONDS = 10


SAMPLE = Path(__file__).resolve().parents[2] / "manifests" / "samples" / "llama-inf2-vllm.yaml"


def zero_spec(cluster, namespace: str) -> dict:
    """The vLLM inf2 sample, compiled by the operator's NxD Inference program in (the stand-in of)
    AWS's vLLM image, as it runs here (cluster/samples.py), with the one change this test makes:
    autoscaling to zero, quickly."""
    doc = run_here(yaml.safe_load(SAMPLE.read_text()), namespace)
    cluster.kubectl(
        "apply", "-f", "-", input=yaml.safe_dump_all([store_secret(namespace, cluster.node.object_store()), token_secret(namespace)])
    )
    make_buckets(store_client(cluster), doc)
    doc["spec"]["autoscaling"] = {
        "minReplicas": 0,
        "maxReplicas": 1,
        "targetInFlight": 1,
        "windowSeconds": 0,
        "scaleUpStabilizationSeconds": 0,
        "scaleDownStabilizationSeconds": 0,
        "idleSeconds": IDLE_SECONDS,
        "holdSeconds": 240,
    }
    return doc["spec"]


def holder_gauge(cluster, namespace: str, model: str, name: str) -> float:
    """A gauge of the model's holder, from its /metrics at the pod's address (as Prometheus reads it)."""
    [pod] = cluster.get("pods", "-n", namespace, "-l", f"inferentia.dev/model={model},app.kubernetes.io/component=holder")["items"]
    port = pod["metadata"]["annotations"]["prometheus.io/port"]
    with urllib.request.urlopen(f"http://{pod['status']['podIP']}:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def ask(url: str, prompt: str) -> str:
    body = json.dumps({"model": "zero", "prompt": prompt}).encode()
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as answer:
        assert answer.status == 200
        return json.loads(answer.read())["choices"][0]["text"]


def test_a_model_at_zero_holds_its_first_request_answers_it_and_goes_back_to_zero(real_node, real_namespace, autoscaling_engines):
    cluster, ns = real_node, real_namespace
    apply(cluster, ns, "zero", zero_spec(cluster, ns))

    def model() -> dict:
        return cluster.get("inferentiamodel", "zero", "-n", ns)

    def at_zero() -> bool:
        m = model()
        ready = condition(m, "Ready")
        # No serving pod at all, not even one still draining after the scale-down.
        pods = cluster.get("pods", "-n", ns, "-l", "inferentia.dev/model=zero,app.kubernetes.io/component=serving")["items"]
        return m["spec"].get("replicas") == 0 and ready.get("reason") == "ScaledToZero" and not pods

    try:
        wait_ready(cluster, ns, "zero", timeout=240)
        wait_for(at_zero, 180, "the idle model to go to zero")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{why_not_ready(cluster, ns, 'zero')}") from None
    assert condition(model(), "Ready")["status"] == "True"
    assert model()["status"]["pods"] == {"pending": 0, "fetching": 0, "loading": 0, "ready": 0}
    svc = cluster.get("service", "zero", "-n", ns)
    assert svc["spec"]["selector"]["app.kubernetes.io/component"] == "holder", svc["spec"]["selector"]
    if cluster.local is not None:  # the operator runs with --keda-namespace keda here, as the chart does
        # The API server took the holder's NetworkPolicy: only KEDA's namespace reaches its scaler.
        policy = cluster.get("networkpolicy", "zero-holder", "-n", ns)
        scaler = policy["spec"]["ingress"][1]
        assert scaler["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "keda"}}}], policy

    # KEDA holds a StreamIsActive open on the holder's external scaler (the ScaledObject's
    # external-push trigger): the held request below reaches KEDA at once, not after a scrape.
    wait_for(lambda: holder_gauge(cluster, ns, "zero", "inferentia_hold_scaler_streams") >= 1, 90, "KEDA's stream to the holder")
    triggers = [t["type"] for t in cluster.get("scaledobject", "zero", "-n", ns)["spec"]["triggers"]]
    assert triggers == ["prometheus", "external-push"], triggers

    # A request at zero: held, not refused, and answered by the replica it starts. Prometheus
    # now scrapes once an hour, so only the holder's push can start that replica in time.
    url = f"http://{svc['spec']['clusterIP']}:{svc['spec']['ports'][0]['port']}/v1/completions"
    local = cluster.local
    if local is not None:
        set_scrape_interval(local.state, local.recorded()["pids"]["prometheus"], autoscaling_engines, 3600)
    try:
        sent = time.time()
        text = ask(url, "hello")
        answered = time.time()
    finally:
        if local is not None:
            set_scrape_interval(local.state, local.recorded()["pids"]["prometheus"], autoscaling_engines, SCRAPE_SECONDS)
    assert text.endswith("hello"), text
    [pod] = serving_pods(cluster, ns, "zero")
    split = phases(pod, sent, answered)
    print(f"first request at zero: {split.pop('total'):.1f} s: " + ", ".join(f"{k} {v:.0f} s" for k, v in split.items()))
    # The replica existed within seconds of the request, a scrape being up to an hour away.
    assert split["until the pod exists"] <= 10, split
    # Warm: the Service points at the replica again, and the replica fetched, never compiled.
    wait_for(
        lambda: cluster.get("service", "zero", "-n", ns)["spec"]["selector"]["app.kubernetes.io/component"] == "serving",
        60, "the Service to point at the replica",
    )  # fmt: skip
    [pod] = serving_pods(cluster, ns, "zero")
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["fetch-artifacts"]
    # vLLM loaded what the operator's NxD Inference program compiled, and compiled nothing itself.
    found = standin_state(cluster, ns, pod)
    assert (found["runtime"], found["loaded"], found["artefact"]["target"]) == ("neuronx-distributed-inference", "compiled", "inf2"), found
    # Idle again: back to zero.
    wait_for(at_zero, 120, "the model to go back to zero")


# make test runs 3 cycles, make test-faults (INFERENTIA_REAL_FAULTS=1) 20, each about 20 s;
# INFERENTIA_ZERO_CYCLES sets another count.
CYCLES = int(os.environ.get("INFERENTIA_ZERO_CYCLES", "20" if os.environ.get("INFERENTIA_REAL_FAULTS") == "1" else "3"))


@pytest.mark.faults
def test_a_model_cycled_through_zero_loses_no_request_and_gets_its_cores_every_time(real_node, real_namespace, autoscaling_engines):
    """aws-neuron-sdk#1338, through zero: each request of a trickle arrives at zero, is held,
    and is answered by a new replica, whose process holds exactly the cores the kubelet
    granted it, with no failed start (the runtime stand-in refuses cores a live process holds)."""
    cluster, ns = real_node, real_namespace
    spec = zero_spec(cluster, ns)
    spec["autoscaling"]["idleSeconds"] = 1
    apply(cluster, ns, "cycled", spec)
    wait_ready(cluster, ns, "cycled", timeout=240)
    svc = cluster.get("service", "cycled", "-n", ns)
    url = f"http://{svc['spec']['clusterIP']}:{svc['spec']['ports'][0]['port']}/v1/completions"

    def at_zero() -> bool:
        holder = cluster.get("service", "cycled", "-n", ns)["spec"]["selector"]["app.kubernetes.io/component"] == "holder"
        return (
            holder and not cluster.get("pods", "-n", ns, "-l", "inferentia.dev/model=cycled,app.kubernetes.io/component=serving")["items"]
        )

    took = []
    for cycle in range(CYCLES):
        try:
            wait_for(at_zero, 120, f"cycle {cycle}: the model at zero")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{why_not_ready(cluster, ns, 'cycled')}") from None
        started = time.monotonic()
        assert ask(url, f"cycle {cycle}").endswith(f"cycle {cycle}")
        took.append(time.monotonic() - started)
        [pod] = serving_pods(cluster, ns, "cycled")
        restarts = [c["restartCount"] for c in pod["status"]["containerStatuses"]]
        assert restarts == [0], (cycle, restarts, why_not_ready(cluster, ns, "cycled"))
        [proc] = process_envs(cluster, ns, pod["metadata"]["name"])
        assert cores(proc["NEURON_RT_VISIBLE_CORES"]) == granted_cores(cluster, pod), (cycle, proc)
    took.sort()
    print(
        f"{CYCLES} starts from zero, first request answered in: min {took[0]:.1f} s, median {took[len(took) // 2]:.1f} s, max {took[-1]:.1f} s"
    )
