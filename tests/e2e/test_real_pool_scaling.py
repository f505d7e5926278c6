"""Each prefill and decode pool scaling on its own signal on the real node: the trn2
disaggregated sample as it runs here (cluster/samples.py), each pool with its own autoscaling.
Prometheus scrapes the pools' vLLM servers (the stand-in's /metrics, vLLM's gauge names) from
the pods' prometheus.io annotations, and KEDA scales each pool's Deployment through the
ScaledObject the operator writes for it: the prefill pool on its prompt queue
(vllm:num_requests_waiting), the decode pool on its running sequences and KV-cache use. Long
prompts with one token to generate queue at the prefill servers and scale the prefill pool alone;
short prompts with long answers fill the decode servers' batches and scale the decode pool alone.

The stand-in's timing (cluster/node/standins/vllm_disagg.py): a prefill of p prompt tokens takes
NEURON_STANDIN_TOKEN_SECONDS * p / 10, a decode step NEURON_STANDIN_TOKEN_SECONDS (more with a
batch). Its gauges are its scheduler's queues, as vLLM's are: a server prefills one prompt at a
time, which is running, and the prompts behind it wait; at most --max-num-seqs
(serving.batching.maxBatchSize, 4 in the sample) requests run at once, the rest waiting, and a
decode server's request reading its KV waits too."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import yaml
from kit import condition, wait_for
from test_real_autoscaling import prometheus_query
from test_real_node import apply, reshape, routed, store_client, wait_ready, why_not_ready
from test_real_scaling import Load

from samples import make_buckets, run_here, store_secret, token_secret

pytestmark = pytest.mark.usefixtures("operator")

SAMPLE = Path(__file__).resolve().parents[2] / "manifests" / "samples" / "trn2-disaggregated.yaml"
TOKEN_SECONDS = 0.2
# Short windows, so that each pool follows its load within a minute and goes back within two.
QUICK = {"windowSeconds": 10, "scaleUpStabilizationSeconds": 0, "scaleDownStabilizationSeconds": 0}


@pytest.fixture
def trn2(real_node):
    """The real node as a trn2.48xlarge, where the vLLM Neuron plugin's pools run, for this test,
    then an inf2.24xlarge again (the shape the other modules expect)."""
    reshape(real_node, "trn2.48xlarge")
    try:
        yield real_node
    finally:
        reshape(real_node, "inf2.24xlarge")


def pools_spec(cluster, namespace: str) -> dict:
    doc = run_here(yaml.safe_load(SAMPLE.read_text()), namespace)
    cluster.kubectl(
        "apply", "-f", "-", input=yaml.safe_dump_all([store_secret(namespace, cluster.node.object_store()), token_secret(namespace)])
    )
    make_buckets(store_client(cluster), doc)
    spec = doc["spec"]
    spec["serving"]["env"] = [*spec["serving"].get("env", []), {"name": "NEURON_STANDIN_TOKEN_SECONDS", "value": str(TOKEN_SECONDS)}]
    spec["disaggregation"] = {
        "prefill": {"autoscaling": {"maxReplicas": 2, "targetWaiting": 2, **QUICK}},
        "decode": {"autoscaling": {"maxReplicas": 2, "targetRunning": 2, "targetKvCachePercent": 80, **QUICK}},
    }
    return spec


class Completions(Load):
    """Clients asking the model's Service for completions, each a request at a time."""

    timeout = 120.0

    def __init__(self, url: str, clients: int, prompt: str, max_tokens: int):
        super().__init__(url, clients)
        self._body = json.dumps({"prompt": prompt, "max_tokens": max_tokens}).encode()

    def body(self, i: int, n: int) -> bytes:
        return self._body

    def answered(self, answer: dict, i: int, n: int) -> bool:
        return answer["object"] == "text_completion"


def test_the_prefill_pool_scales_on_its_prompt_queue_and_the_decode_pool_on_its_batch_each_alone(trn2, real_namespace, autoscaling_engines):
    cluster, ns, prometheus = trn2, real_namespace, autoscaling_engines
    apply(cluster, ns, "pd", pools_spec(cluster, ns))
    wait_ready(cluster, ns, "pd", timeout=400)
    wait_for(
        lambda: condition(cluster.get("inferentiamodel", "pd", "-n", ns), "Autoscaling").get("reason") == "ScaledObjectReady",
        120, "Autoscaling=True ScaledObjectReady",
    )  # fmt: skip
    pools = cluster.get("inferentiamodel", "pd", "-n", ns)["status"]["pools"]
    for role in ("prefill", "decode"):
        scaled_object = cluster.get("scaledobject", f"pd-{role}", "-n", ns)
        assert scaled_object["metadata"]["ownerReferences"][0]["name"] == "pd"
        assert scaled_object["spec"]["scaleTargetRef"]["kind"] == "Deployment"
        assert scaled_object["spec"]["scaleTargetRef"]["name"] == f"pd-{role}"
        assert pools[role]["autoscaling"]["scaledObject"] == f"pd-{role}", pools
        assert pools[role]["desiredReplicas"] == 1, pools
    # Each query reads the gauges Prometheus scrapes from that pool's servers.
    queries = {role: pools[role]["autoscaling"]["queries"] for role in ("prefill", "decode")}
    assert [q.split("{")[0] for q in queries["prefill"]] == ["sum(avg_over_time(vllm:num_requests_waiting"], queries
    for query in (*queries["prefill"], *queries["decode"]):
        wait_for(lambda q=query: prometheus_query(prometheus, q) is not None, 60, f"Prometheus to scrape {query}")
    svc = cluster.get("service", "pd", "-n", ns)
    ip, port = svc["spec"]["clusterIP"], svc["spec"]["ports"][0]["port"]
    routed(ip, port)
    url = f"http://{ip}:{port}/v1/completions"

    def replicas(role: str) -> int:
        return cluster.get("deployment", f"pd-{role}", "-n", ns)["spec"]["replicas"]

    def scaled(role: str, want: int, what: str) -> None:
        try:
            wait_for(lambda: replicas(role) == want, 300, what)
        except AssertionError as exc:
            hpa = cluster.kubectl("get", "hpa", "-n", ns, "-o", "yaml", check=False).stdout[-4000:]
            raise AssertionError(f"{exc}\n{hpa}\n{why_not_ready(cluster, ns, 'pd')}") from None

    # Long prompts, one token each: a prefill takes 200 / 10 * 0.2 = 4 s, and a prefill server
    # runs one at a time (its token made, the request is done), so of 12 clients 1 runs and 11
    # wait there, about 5 a replica even at 2 replicas, over the target 2; the decode servers
    # each read a prompt's KV and run its token's step, and stay at 1.
    with Completions(url, clients=12, prompt=" ".join(["Trainium"] * 200), max_tokens=1) as prompts:
        scaled("prefill", 2, "KEDA to scale the prefill pool up on its queue")
        assert replicas("decode") == 1
        wait_for(lambda: cluster.get("inferentiamodel", "pd", "-n", ns)["status"]["pools"]["prefill"]["desiredReplicas"] == 2, 60,
                 "status.pools.prefill.desiredReplicas 2")  # fmt: skip
        time.sleep(10)  # the new prefill server answers its share
        assert replicas("decode") == 1
    # As many answers as clients at least (how many more depends on how soon KEDA scaled), none failed.
    assert len(prompts.results) >= 12 and not prompts.failures(), (len(prompts.results), prompts.failures()[:10])
    # Idle: the prefill pool goes back to its minimum (its replica drained first), and status
    # follows the HorizontalPodAutoscaler down as it followed it up.
    scaled("prefill", 1, "KEDA to scale the prefill pool back to 1")

    def desired() -> tuple[int, int]:
        pools = cluster.get("inferentiamodel", "pd", "-n", ns)["status"]["pools"]
        return pools["prefill"]["desiredReplicas"], pools["decode"]["desiredReplicas"]

    wait_for(lambda: desired() == (1, 1), 60, "status.pools to show both pools at 1")

    # Short prompts, long answers: a prefill takes 0.02 s, a completion 100 decode steps of at
    # least 0.2 s; 8 clients keep 4 sequences running in the one decode server (--max-num-seqs 4;
    # the other 4 wait), 4 running a replica, over the target 2; a prompt hardly waits at the prefill
    # server (0.02 s a prefill against a completion's 20 s and more), which stays at 1.
    with Completions(url, clients=8, prompt="Trainium", max_tokens=100) as answers:
        scaled("decode", 2, "KEDA to scale the decode pool up on its running sequences")
        assert replicas("prefill") == 1
        time.sleep(10)
        assert replicas("prefill") == 1
    # Every client answered (a completion here takes about 30 s), and none failed. The decode
    # pool's way back down is the prefill pool's above, which is not waited for twice: the
    # real-node run is make test's longest part.
    assert len(answers.results) >= 8 and not answers.failures(), answers.failures()[:10]
    # The plugin's own metrics reach Prometheus from both pools' servers: each query
    # docs/serving-pod.md shows answers for this model.
    for query in documented_plugin_queries(ns, "pd"):
        assert prometheus_query(prometheus, query) is not None, query


def documented_plugin_queries(namespace: str, model: str) -> list[str]:
    """The PromQL block of docs/serving-pod.md's "The plugin's own metrics", for ``model`` in
    ``namespace``: one query a line, a line starting with "  /" continuing the one before."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "serving-pod.md").read_text()
    (block,) = re.findall(r"```promql\n(.*?)```", doc, flags=re.S)
    queries: list[str] = []
    for line in block.splitlines():
        if line.startswith("  /"):
            queries[-1] += " " + line.strip()
        elif line and not line.startswith("#"):
            queries.append(line)
    assert len(queries) == 7 and all("vllm_neuron:" in q for q in queries), queries
    return [q.replace('namespace="models"', f'namespace="{namespace}"').replace('inferentia_dev_model="llama"', f'inferentia_dev_model="{model}"')
            for q in queries]  # fmt: skip
