"""Routing by queue against the Service's random spread, on the real node: p99 and the share of
requests that queued, on the same uneven load.

    make benchmark-routing       # or: python cluster/benchmark_routing.py --rates 8,11 --seconds 60

One vLLM model (the demo's, compiled into the local object store) of two replicas with
spec.routing.inferencePool; each replica is the vLLM stand-in running --max-num-seqs 2 requests
at once and queueing the rest (vllm:num_requests_waiting), and each completion takes 0.1 s per
requested token. The load is uneven the way an LLM's is: most completions are short (1 token,
0.1 s), one in ten is long (20 tokens, 2 s), sent open-loop at each of --rates a second (each request at
its scheduled time, whatever the answers before it), the same seeded sequence both ways:

- **the Service's random spread**: every request to the model's Service (kube-proxy picks a
  replica at random);
- **the endpoint picker**: for every request, the Gateway API Inference Extension's own picker
  (v1.1.0, built from its Go module, with the operator's configuration) is asked over its
  ext_proc API as a gateway's data plane asks it, and the request goes to the pod it names.
  The ask is counted in the latency: a gateway pays it too. No gateway data plane runs here
  (cluster/endpointpicker.py says why): this script is the part of one that routes.

Printed, one row a way and rate: requests answered, p50 and p99 latency, p99 of the wait (the
time beyond the request's own), and the share that queued (waited more than 0.25 s), then
the picker's figures against the random spread's.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import boto3
import yaml

import localcluster
import realnode
from endpointpicker import EndpointPicker
from inferentia_operator.core.routing.pool import PICKER_CONFIG
from samples import store_secret

NAMESPACE = "bench-routing"
MODEL = "routed"
TOKEN_SECONDS = 0.1
SHORT, LONG, LONG_SHARE = 1, 20, 0.1
QUEUED_AFTER = 0.25  # seconds beyond a request's own time that count it as queued


def model_doc() -> dict[str, Any]:
    doc = yaml.safe_load((localcluster.HERE / "demo-zero.yaml").read_text())
    doc["metadata"] = {"name": MODEL, "namespace": NAMESPACE}
    spec = doc["spec"]
    del spec["autoscaling"]
    spec["replicas"] = 2
    spec["compile"]["outputUri"] = "s3://bench-routing/compiled/"
    spec["serving"]["batching"] = {"maxBatchSize": 2}  # vLLM's --max-num-seqs
    spec["serving"]["env"] = [{"name": "NEURON_STANDIN_TOKEN_SECONDS", "value": str(TOKEN_SECONDS)}]
    spec["routing"] = {"inferencePool": {}}
    return doc


def schedule(rate: float, seconds: float, seed: int) -> list[tuple[float, int]]:
    """(when, max_tokens) of each request: Poisson arrivals, one in ten long."""
    rng, at, out = random.Random(seed), 0.0, []
    while True:
        at += rng.expovariate(rate)
        if at >= seconds:
            return out
        out.append((at, LONG if rng.random() < LONG_SHARE else SHORT))


def completion(tokens: int) -> dict[str, Any]:
    # A new prompt each time: the picker's prefix-cache scorer favours where a prompt went before.
    return {"model": MODEL, "prompt": f"bench {uuid.uuid4()}", "max_tokens": tokens}


def post(url: str, body: dict[str, Any]) -> int | str:
    data = json.dumps(body).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data, {"Content-Type": "application/json"}), timeout=60) as r:
            r.read()
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError as exc:
        return type(exc).__name__


def run(plan: list[tuple[float, int]], route: Any) -> list[tuple[float, int, int | str]]:
    """Each request at its time through ``route(body) -> outcome``: (latency, tokens, outcome),
    its latency from when it was due."""
    results: list[tuple[float, int, int | str]] = []
    lock = threading.Lock()

    def one(due: float, tokens: int) -> None:
        outcome = route(completion(tokens))
        with lock:
            results.append((time.monotonic() - due, tokens, outcome))

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=128) as pool:
        for at, tokens in plan:
            wait = started + at - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            pool.submit(one, started + at, tokens)
    return results


def row(way: str, rate: float, results: list[tuple[float, int, int | str]]) -> dict[str, Any]:
    answered = [(latency, tokens) for latency, tokens, outcome in results if outcome == 200]
    latencies = sorted(latency for latency, _ in answered)
    # What a request spent beyond its own time: the wait a routing decision can save.
    waits = sorted(max(latency - tokens * TOKEN_SECONDS, 0.0) for latency, tokens in answered)
    queued = sum(1 for wait in waits if wait > QUEUED_AFTER)
    return {
        "way": way, "rate": rate, "answered": len(answered), "failed": len(results) - len(answered),
        "p50": statistics.median(latencies), "p99": statistics.quantiles(latencies, n=100)[98],
        "wait_p99": statistics.quantiles(waits, n=100)[98], "queued": queued / max(len(answered), 1),
    }  # fmt: skip


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| requests/s | way | answered | failed | p50 ms | p99 ms | p99 wait ms | queued |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['rate']:g} | {r['way']} | {r['answered']} | {r['failed']} | {r['p50'] * 1000:.0f} | {r['p99'] * 1000:.0f} "
            f"| {r['wait_p99'] * 1000:.0f} | {r['queued']:.1%} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="8,11", help="requests a second, one load each (two replicas hold about 13 at this mix)")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long each way's load lasts")
    parser.add_argument("--seed", type=int, default=42, help="the seeded request sequence, the same both ways")
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",") if r]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-routing-") as tmp:
        cluster = localcluster.LocalCluster(Path(tmp) / "cluster", die_with_parent=True, real_node=True)
        operator, picker = None, None
        try:
            cluster.up(timeout=300)
            if cluster.real_node is None:
                print(f"needs the real node: {cluster.real_node_skipped}", file=sys.stderr)
                return 1
            cluster.install_crds()
            localcluster.install_inference_extension(cluster.kubectl)
            operator = subprocess.Popen(
                [sys.executable, "-m", "inferentia_operator", "run", "--standalone", "--liveness", "", "--metrics-port", "0"],
                env={"KUBECONFIG": str(cluster.kubeconfig), "PATH": "/usr/bin:/bin"},
                stdout=open(Path(tmp) / "operator.log", "ab"), stderr=subprocess.STDOUT,
            )  # fmt: skip
            namespace: dict[str, Any] = {"apiVersion": "v1", "kind": "Namespace"}
            namespace["metadata"] = {"name": NAMESPACE, "annotations": realnode.REAL_NODE_NAMESPACE_ANNOTATIONS}
            cluster.kubectl("apply", "-f", "-", input=json.dumps(namespace))
            endpoint = cluster.object_store()
            store = boto3.client(
                "s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="local", aws_secret_access_key="local"
            )
            store.create_bucket(Bucket="bench-routing")
            time.sleep(2)  # the namespace's default ServiceAccount
            cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(store_secret(NAMESPACE, endpoint)))
            cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(model_doc()))
            cluster.kubectl("wait", "-n", NAMESPACE, f"inferentiamodel/{MODEL}", "--for=condition=Ready", "--timeout=600s")
            svc = json.loads(cluster.kubectl("get", "service", MODEL, "-n", NAMESPACE, "-o", "json"))
            service = f"http://{svc['spec']['clusterIP']}:{svc['spec']['ports'][0]['port']}/v1/completions"
            picker = EndpointPicker(localcluster.bin_dir(), cluster.kubeconfig, MODEL, NAMESPACE, Path(tmp) / "epp.log", PICKER_CONFIG)
            picker.start()
            picker.wait_ready(completion(SHORT))
            post(service, completion(SHORT))  # both replicas warm

            def picked(body: dict[str, Any]) -> int | str:
                assert picker is not None
                chosen = picker.pick(body)
                return "NoEndpoint" if chosen is None else post(f"http://{chosen}/v1/completions", body)

            for rate in rates:
                plan = schedule(rate, args.seconds, args.seed)
                print(f"{len(plan)} requests over {args.seconds:g} s at {rate:g}/s, each way", file=sys.stderr, flush=True)
                rows.append(row("the Service's random spread", rate, run(plan, lambda body: post(service, body))))
                time.sleep(5)  # every queue empty
                rows.append(row("the endpoint picker, by queue", rate, run(plan, picked)))
                time.sleep(5)
        finally:
            if picker is not None:
                picker.stop()
            if operator is not None:
                operator.terminate()
                operator.wait(15)
            cluster.down()
    print(
        f"{time.strftime('%Y-%m-%d')}, python cluster/benchmark_routing.py --rates {args.rates} --seconds {args.seconds:g} --seed {args.seed}"
    )
    print(table(rows))
    for base, routed in zip(rows[::2], rows[1::2], strict=True):
        print(
            f"\nat {base['rate']:g}/s: the picker's p99 {routed['p99'] / base['p99']:.2f}x the random spread's, its p99 wait "
            f"{routed['wait_p99'] * 1000:.0f} against {base['wait_p99'] * 1000:.0f} ms; queued {routed['queued']:.1%} against {base['queued']:.1%}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
