"""Autoscaling on the real node with the engines users run: Prometheus scrapes the batching
front end's request gauges from the pods' prometheus.io annotations, and KEDA scales the
InferentiaModel through its scale subresource on a Prometheus query of them, with the
ScaledObject the operator writes for spec.autoscaling. The operator follows spec.replicas,
and a scale-down drains (docs/serving-pod.md), so nothing fails."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from kit import condition, ready_now, wait_for
from test_real_node import apply, serving_pods, standin_spec, wait_ready, why_not_ready
from test_real_scaling import Load

pytestmark = pytest.mark.usefixtures("operator")


def prometheus_query(base: str, query: str) -> float | None:
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    with urllib.request.urlopen(url, timeout=5) as r:
        result = json.loads(r.read())["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def documented_autoscaling() -> dict:
    """The spec.autoscaling that docs/autoscaling.md shows first."""
    import re

    import yaml

    doc = (Path(__file__).resolve().parents[2] / "docs" / "autoscaling.md").read_text()
    block = re.findall(r"```yaml\n(.*?)```", doc, flags=re.S)[0]
    return yaml.safe_load(block)["spec"]["autoscaling"]


def test_keda_scales_a_model_to_three_under_load_and_back_to_one_losing_nothing(real_node, real_namespace, autoscaling_engines):
    cluster, ns, prometheus = real_node, real_namespace, autoscaling_engines
    autoscaling = documented_autoscaling()
    assert (autoscaling["minReplicas"], autoscaling["maxReplicas"]) == (1, 3)
    spec = standin_spec(
        processesPerReplica=2,
        autoscaling=autoscaling,
        **{
            "serving.batching": {"maxBatchSize": 2, "maxLatencyMs": 5000},
            # Each call takes 0.5 s, so that requests are in flight long enough to count.
            "serving.env": [{"name": "NEURON_STANDIN_CALL_SECONDS", "value": "0.5"}],
        },
    )
    apply(cluster, ns, "auto", spec)
    wait_ready(cluster, ns, "auto")
    # The operator wrote the ScaledObject, KEDA took it up, and the model says so.
    wait_for(
        lambda: condition(cluster.get("inferentiamodel", "auto", "-n", ns), "Autoscaling").get("reason") == "ScaledObjectReady",
        90, "Autoscaling=True ScaledObjectReady",
    )  # fmt: skip
    scaled_object = cluster.get("scaledobject", "auto", "-n", ns)
    assert scaled_object["metadata"]["ownerReferences"][0]["name"] == "auto"
    [trigger] = scaled_object["spec"]["triggers"]
    query = trigger["metadata"]["query"]
    assert trigger["metadata"]["serverAddress"] == prometheus and trigger["metadata"]["threshold"] == "2"
    # Its query reads the gauges Prometheus scrapes from the pods.
    wait_for(lambda: prometheus_query(prometheus, query) is not None, 60, "Prometheus to scrape the front end's gauges")
    svc = cluster.get("service", "auto", "-n", ns)
    url = f"http://{svc['spec']['clusterIP']}:{svc['spec']['ports'][0]['port']}/predict"

    def replicas() -> int:
        return cluster.get("inferentiamodel", "auto", "-n", ns)["spec"]["replicas"]

    with Load(url, clients=8) as load:
        try:
            wait_for(lambda: replicas() >= 2, 240, "KEDA to start scaling the model up")
        except AssertionError as exc:
            hpa = cluster.kubectl("get", "hpa", "-n", ns, "-o", "yaml", check=False).stdout[-3000:]
            so = cluster.kubectl("get", "scaledobject", "auto", "-n", ns, "-o", "yaml", check=False).stdout[-3000:]
            raise AssertionError(f"{exc}\n{hpa}\n{so}\n{why_not_ready(cluster, ns, 'auto')}") from None
        # A spec change during the scale-up, applied as a GitOps tool would (a manifest without
        # replicas): the update rolls out, and the autoscaler's count is neither reset nor lost.
        old_pods = {p["metadata"]["name"] for p in cluster.get("pods", "-n", ns, "-l", "inferentia.dev/model=auto")["items"]}
        changed = {**spec, "serving": {**spec["serving"], "env": [*spec["serving"]["env"], {"name": "GENERATION", "value": "2"}]}}
        apply(cluster, ns, "auto", changed)

        def rolled() -> bool:
            model = cluster.get("inferentiamodel", "auto", "-n", ns)
            seen = model["status"].get("observedGeneration", 0) >= model["metadata"]["generation"]
            at_three = model["spec"]["replicas"] == 3 and model["status"].get("readyReplicas") == 3
            return seen and at_three and ready_now(model)

        try:
            wait_for(rolled, 300, "the update to roll out over 3 replicas")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{why_not_ready(cluster, ns, 'auto')}") from None
        assert replicas() == 3
        pods = serving_pods(cluster, ns, "auto")
        assert len(pods) == 3 and not old_pods & {p["metadata"]["name"] for p in pods}, "the update did not roll"
        status = cluster.get("inferentiamodel", "auto", "-n", ns)["status"]
        assert status["pods"] == {"pending": 0, "fetching": 0, "loading": 0, "ready": 3}, status["pods"]
        assert status["autoscaling"]["desiredReplicas"] == 3, status["autoscaling"]
    busy = len(load.results)
    assert not load.failures(), load.failures()[:10]
    # Idle: back to one, every pod that goes drained first.
    with Load(url, clients=1) as trickle:
        wait_for(lambda: replicas() == 1, 240, "KEDA to scale the model back to 1")
        wait_for(lambda: len(cluster.get("pods", "-n", ns, "-l", "inferentia.dev/model=auto")["items"]) == 1, 120, "the pods to go")
        time.sleep(3)
    assert not trickle.failures(), trickle.failures()[:10]
    assert busy > 100 and len(trickle.results) > 10
