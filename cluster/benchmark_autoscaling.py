"""Autoscaling against fixed replicas, on the real node: what each costs and what clients see.

    make benchmark-autoscaling      # or: python cluster/benchmark_autoscaling.py --peak-rps 16

One load profile (idle, a ramp, a plateau, a burst, idle again), sent open-loop (each
request at its scheduled time, whatever the answers before it, so a queue shows in the
latency), against the same model three ways on the local cluster's real node: fixed at
the peak's replicas, fixed at one replica, and with spec.autoscaling between them (KEDA
and Prometheus, as in docs/autoscaling.md). The model is the Neuron stand-in behind the
batching front end: 2 processes, batches of 2, 0.5 s a batch, so one replica answers about
8 requests a second.

Printed, one row per way: replica-seconds (serving pods that existed, summed each second:
the cost) and its ratio to fixed-at-peak, p50 and p99 latency of the answered requests,
requests answered, 503 sheds (the front end refuses what it cannot answer within its
budget), other failures, and for autoscaling the seconds from the start of the ramp until
the peak's replicas were ready.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

import localcluster
import realnode
from images import STANDIN_IMAGE

PEAK_REPLICAS = 3
NAMESPACE = "bench-autoscaling"
# Seconds of each phase, and its request rate as a fraction of the peak (from, to).
PROFILE = [("idle", 30, 0.05, 0.05), ("ramp", 45, 0.05, 1.0), ("plateau", 45, 1.0, 1.0), ("burst", 15, 1.5, 1.5), ("idle", 90, 0.05, 0.05)]
AUTOSCALING = {
    "minReplicas": 1,
    "maxReplicas": PEAK_REPLICAS,
    "targetInFlight": 3,
    "windowSeconds": 0,
    "scaleUpStabilizationSeconds": 0,
    "scaleDownStabilizationSeconds": 20,
}


def spec(**extra: Any) -> dict[str, Any]:
    return {
        "model": {"uri": "s3://models/bench/", "framework": "pytorch"},
        "compute": {"family": "inf2", "inf": 1, "instanceTypes": [realnode.INSTANCE_TYPE], "cpu": "100m", "memory": "256Mi"},
        "processesPerReplica": 2,
        "serving": {
            "image": STANDIN_IMAGE,
            "args": ["neuron-serve"],
            "batching": {"maxBatchSize": 2, "maxLatencyMs": 5000},
            "env": [{"name": "NEURON_STANDIN_CALL_SECONDS", "value": "0.5"}],
        },
        **extra,
    }


def rate_at(t: float, peak: float) -> float:
    start = 0.0
    for _, seconds, a, b in PROFILE:
        if t < start + seconds:
            return peak * (a + (b - a) * (t - start) / seconds)
        start += seconds
    return 0.0


class Sampler(threading.Thread):
    """The model's serving pods and ready replicas, once a second."""

    def __init__(self, cluster: localcluster.LocalCluster, name: str):
        super().__init__(daemon=True)
        self.cluster, self.name, self.samples, self.stop = cluster, name, [], threading.Event()

    def run(self) -> None:
        while not self.stop.wait(1.0):
            try:
                model = json.loads(self.cluster.kubectl("get", "inferentiamodel", self.name, "-n", NAMESPACE, "-o", "json"))
            except localcluster.ClusterError:
                continue
            s = model.get("status", {})
            self.samples.append((time.monotonic(), s.get("replicas", 0), s.get("readyReplicas", 0)))


def send(url: str, scheduled: float, i: int) -> tuple[float, int | str]:
    """One request; its latency counts from when it was due, not from when a thread was free."""
    body = json.dumps([i]).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, body, {"Content-Type": "application/json"}), timeout=30) as r:
            r.read()
            outcome: int | str = r.status
    except urllib.error.HTTPError as exc:
        outcome = exc.code
    except OSError as exc:
        outcome = type(exc).__name__
    return time.monotonic() - scheduled, outcome


def run_profile(url: str, peak: float) -> tuple[list[tuple[float, int | str]], float]:
    total = sum(p[1] for p in PROFILE)
    started = time.monotonic()
    futures, i, due = [], 0, 0.0
    with ThreadPoolExecutor(max_workers=256) as pool:
        while due < total:
            rate = max(rate_at(due, peak), 0.1)
            wait = started + due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            futures.append(pool.submit(send, url, started + due, i))
            i += 1
            due += 1.0 / rate
    return [f.result() for f in futures], started


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else (values[0] if values else float("nan"))


def measure(cluster: localcluster.LocalCluster, way: str, extra: dict[str, Any], peak: float) -> dict[str, Any]:
    name = "bench-" + way.replace(" ", "-")
    model = {"apiVersion": "inferentia.dev/v1alpha1", "kind": "InferentiaModel", "metadata": {"name": name, "namespace": NAMESPACE}}
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump({**model, "spec": spec(**extra)}))
    cluster.kubectl("wait", "-n", NAMESPACE, f"inferentiamodel/{name}", "--for=condition=Ready", "--timeout=300s")
    if "autoscaling" in extra:
        cluster.kubectl("wait", "-n", NAMESPACE, f"inferentiamodel/{name}", "--for=jsonpath={.status.conditions[?(@.type=='Autoscaling')].status}=True", "--timeout=120s")  # fmt: skip
    svc = json.loads(cluster.kubectl("get", "service", name, "-n", NAMESPACE, "-o", "json"))
    url = f"http://{svc['spec']['clusterIP']}:{svc['spec']['ports'][0]['port']}/predict"
    sampler = Sampler(cluster, name)
    sampler.start()
    results, started = run_profile(url, peak)
    sampler.stop.set()
    sampler.join()
    cluster.kubectl("delete", "inferentiamodel", name, "-n", NAMESPACE, "--wait=true", "--timeout=120s")
    end = started + sum(p[1] for p in PROFILE)
    pods = [(t, n) for t, n, _ in sampler.samples if started <= t <= end]
    replica_seconds = sum(n for _, n in pods) * (end - started) / max(len(pods), 1)
    ramp_start = started + PROFILE[0][1]
    followed = next((t - ramp_start for t, _, ready in sampler.samples if t >= ramp_start and ready >= PEAK_REPLICAS), None)
    answered = [latency for latency, outcome in results if outcome == 200]
    return {
        "way": way,
        "replica_seconds": replica_seconds,
        "p50_ms": percentile(answered, 50) * 1000,
        "p99_ms": percentile(answered, 99) * 1000,
        "answered": len(answered),
        "shed_503": sum(1 for _, o in results if o == 503),
        "failed": sum(1 for _, o in results if o not in (200, 503)),
        "followed_s": followed,
    }


def table(rows: list[dict[str, Any]]) -> str:
    base = rows[0]["replica_seconds"]
    lines = [
        "| way | replica-seconds | of fixed at peak | p50 ms | p99 ms | answered | 503 shed | failed | ramp followed in |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        followed = "—" if r["followed_s"] is None else f"{r['followed_s']:.0f} s"
        lines.append(
            f"| {r['way']} | {r['replica_seconds']:.0f} | {r['replica_seconds'] / base:.0%} | {r['p50_ms']:.0f} | {r['p99_ms']:.0f} "
            f"| {r['answered']} | {r['shed_503']} | {r['failed']} | {followed} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peak-rps", type=float, default=16.0, help="the plateau's requests a second (the burst is 1.5 times it)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-autoscaling-") as tmp:
        cluster = localcluster.LocalCluster(Path(tmp) / "cluster", die_with_parent=True, real_node=True)
        operator = None
        try:
            cluster.up(timeout=300)
            if cluster.real_node is None or not cluster.prometheus():
                print(f"needs the real node and its autoscaling engines: {cluster.real_node_skipped}", file=sys.stderr)
                return 1
            cluster.install_crds()
            import subprocess

            operator = subprocess.Popen(
                [sys.executable, "-m", "inferentia_operator", "run", "--standalone", "--liveness", "", "--metrics-port", "0",
                 "--resync-seconds", "10", "--prometheus-address", str(cluster.prometheus())],
                env={"KUBECONFIG": str(cluster.kubeconfig), "PATH": "/usr/bin:/bin"},
                stdout=open(Path(tmp) / "operator.log", "ab"), stderr=subprocess.STDOUT,
            )  # fmt: skip
            namespace = {"apiVersion": "v1", "kind": "Namespace"}
            namespace["metadata"] = {"name": NAMESPACE, "annotations": realnode.REAL_NODE_NAMESPACE_ANNOTATIONS}
            cluster.kubectl("apply", "-f", "-", input=json.dumps(namespace))
            time.sleep(2)  # the namespace's default ServiceAccount
            rows = []
            for way, extra in (
                ("fixed at peak", {"replicas": PEAK_REPLICAS}),
                ("fixed at one", {"replicas": 1}),
                ("autoscaling", {"autoscaling": AUTOSCALING}),
            ):
                print(f"{way}: {sum(p[1] for p in PROFILE)} s of load, peak {args.peak_rps:g} requests/s", file=sys.stderr, flush=True)
                rows.append(measure(cluster, way, extra, args.peak_rps))
        finally:
            if operator is not None:
                operator.terminate()
                operator.wait(15)
            cluster.down()
    print(f"{time.strftime('%Y-%m-%d')}, python cluster/benchmark_autoscaling.py --peak-rps {args.peak_rps:g}")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
