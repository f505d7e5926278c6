"""Autoscaling against fixed replicas, on the real node: what each costs and what clients see.

    make benchmark-autoscaling      # or: python cluster/benchmark_autoscaling.py --peak-rps 16

One load profile (idle, a ramp, a plateau, a burst, idle again), sent open-loop (each
request at its scheduled time, whatever the answers before it, so a queue shows in the
latency), against the same model four ways on the local cluster's real node: fixed at
the peak's replicas, fixed at one replica, and with spec.autoscaling between them (KEDA
and Prometheus, as in docs/autoscaling.md) twice: with headroom (a target of 3 requests in
flight a replica, a 20 s scale-down window) and at the replica's own parallelism (4, 10 s).
The model is the Neuron stand-in behind the batching front end: 2 processes, batches of 2,
0.5 s a batch, so one replica answers about 8 requests a second.

Printed, one row per way: replica-seconds (serving pods that existed, draining ones
included, summed each second: the cost) and its ratio to fixed-at-peak, p50 and p99 latency
of the answered requests, requests answered, 503 sheds (the front end refuses what it cannot
answer within its budget), other failures, and for autoscaling the seconds from the start of
the ramp until the peak's replicas were ready. A second table splits each way's
replica-seconds by phase of the profile.

Then scale to zero, on a sparse profile: one request every --zero-gap seconds, sent at the
same moment to two vLLM-preset models compiled into the local object store
(cluster/demo-zero.yaml): one with autoscaling.minReplicas 0, which goes to zero after its
idle period, and one that never goes below one replica. Printed, one row each: replica-seconds
and their ratio, how many requests arrived while the model was at zero, and the time from
sending a request to its answer (p50, max). Last, the warm path: with the model at one
replica, the same requests straight to its replicas, through its Service (which points at
the replicas once they are ready), and through the holder pod, each one's p50 and p99 and
the p50 added against straight to the replicas.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
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
from autoscaling import set_scrape_interval
from images import STANDIN_IMAGE
from samples import store_secret

PEAK_REPLICAS = 3
NAMESPACE = "bench-autoscaling"
MODEL = "inferentia.dev/model"
SERVING = "app.kubernetes.io/component=serving"
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
# The same, at the replica's own parallelism (targetInFlight left out: 2 processes x batches of
# 2, core/autoscaling.target_in_flight) and a shorter scale-down window: a replica that starts
# in seconds needs less headroom, and a replica taken away too soon comes back in seconds.
AT_PARALLELISM = {k: v for k, v in AUTOSCALING.items() if k != "targetInFlight"} | {"scaleDownStabilizationSeconds": 10}


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
    """Each model's serving pods (draining ones too: they hold their devices until gone) and
    ready ones, once a second: ``samples[model]`` is a list of (time, pods, ready)."""

    def __init__(self, cluster: localcluster.LocalCluster):
        super().__init__(daemon=True)
        self.cluster, self.stop = cluster, threading.Event()
        self.samples: dict[str, list[tuple[float, int, int]]] = {}
        self.times: list[float] = []

    def run(self) -> None:
        while not self.stop.wait(1.0):
            try:
                pods = json.loads(self.cluster.kubectl("get", "pods", "-n", NAMESPACE, "-l", SERVING, "-o", "json"))["items"]
            except localcluster.ClusterError:
                continue
            now = time.monotonic()
            self.times.append(now)
            counts: dict[str, list[int]] = {}
            for pod in pods:
                ready = any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))
                count = counts.setdefault(pod["metadata"]["labels"][MODEL], [0, 0])
                count[0], count[1] = count[0] + 1, count[1] + int(ready)
            for name, (n, n_ready) in counts.items():
                self.samples.setdefault(name, []).append((now, n, n_ready))

    def replica_seconds(self, name: str, start: float, end: float) -> float:
        """Serving pods summed over the samples in [start, end], scaled to its length."""
        ticks = [t for t in self.times if start <= t <= end]
        pods = sum(n for t, n, _ in self.samples.get(name, []) if start <= t <= end)
        return pods * (end - start) / max(len(ticks), 1)


def send(url: str, scheduled: float, i: int, body: bytes | None = None, timeout: float = 30) -> tuple[float, int | str]:
    """One request; its latency counts from when it was due, not from when a thread was free."""
    body = body or json.dumps([i]).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, body, {"Content-Type": "application/json"}), timeout=timeout) as r:
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


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else (values[0] if values else float("nan"))


def apply_ready(cluster: localcluster.LocalCluster, doc: dict[str, Any], autoscaled: bool) -> str:
    """Applies the model ``doc`` and waits for it to be Ready (and scaled by KEDA); returns its name."""
    name: str = doc["metadata"]["name"]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))
    cluster.kubectl("wait", "-n", NAMESPACE, f"inferentiamodel/{name}", "--for=condition=Ready", "--timeout=300s")
    if autoscaled:
        cluster.kubectl("wait", "-n", NAMESPACE, f"inferentiamodel/{name}", "--for=jsonpath={.status.conditions[?(@.type=='Autoscaling')].status}=True", "--timeout=120s")  # fmt: skip
    return name


def service_url(cluster: localcluster.LocalCluster, service: str, path: str) -> str:
    svc = json.loads(cluster.kubectl("get", "service", service, "-n", NAMESPACE, "-o", "json"))
    return f"http://{svc['spec']['clusterIP']}:{svc['spec']['ports'][0]['port']}{path}"


def measure(cluster: localcluster.LocalCluster, way: str, extra: dict[str, Any], peak: float) -> dict[str, Any]:
    model: dict[str, Any] = {"apiVersion": "inferentia.dev/v1alpha1", "kind": "InferentiaModel"}
    model["metadata"] = {"name": ("bench-" + "-".join(re.findall("[a-z0-9]+", way)))[:45].rstrip("-"), "namespace": NAMESPACE}
    name = apply_ready(cluster, {**model, "spec": spec(**extra)}, autoscaled="autoscaling" in extra)
    url = service_url(cluster, name, "/predict")
    sampler = Sampler(cluster)
    sampler.start()
    results, started = run_profile(url, peak)
    sampler.stop.set()
    sampler.join()
    cluster.kubectl("delete", "inferentiamodel", name, "-n", NAMESPACE, "--wait=true", "--timeout=120s")
    end = started + sum(p[1] for p in PROFILE)
    replica_seconds = sampler.replica_seconds(name, started, end)
    by_phase, at = [], started
    for _, seconds, _, _ in PROFILE:
        by_phase.append(sampler.replica_seconds(name, at, at + seconds))
        at += seconds
    ramp_start = started + PROFILE[0][1]
    followed = next((t - ramp_start for t, _, ready in sampler.samples.get(name, []) if t >= ramp_start and ready >= PEAK_REPLICAS), None)
    answered = [latency for latency, outcome in results if outcome == 200]
    return {
        "way": way,
        "replica_seconds": replica_seconds,
        "by_phase": by_phase,
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


def phase_seconds_table(rows: list[dict[str, Any]]) -> str:
    """Where each way's replica-seconds went: one column a phase of the profile, each with its
    length and its rate; the replicas a phase needs, and what the last phase pays for the burst
    before it (the scale-down window, then each replica's drain), show there."""
    heads = [f"{what} {seconds} s, {a * 100:g}{'' if a == b else f'-{b * 100:g}'}% of peak" for what, seconds, a, b in PROFILE]
    lines = [f"| way | {' | '.join(heads)} |", "|---|" + "---|" * len(PROFILE)]
    for r in rows:
        lines.append(f"| {r['way']} | " + " | ".join(f"{v:.0f}" for v in r["by_phase"]) + " |")
    return "\n".join(lines)


ZERO_MODEL, ALWAYS_MODEL = "bench-from-zero", "bench-never-below-one"


def zero_models() -> list[dict[str, Any]]:
    """The demo's scale-to-zero model, and the same model never below one replica."""
    doc = yaml.safe_load((localcluster.HERE / "demo-zero.yaml").read_text())
    doc["metadata"] |= {"name": ZERO_MODEL, "namespace": NAMESPACE}
    doc["spec"]["compile"]["outputUri"] = "s3://bench-zero/compiled/"
    always = copy.deepcopy(doc)
    always["metadata"]["name"] = ALWAYS_MODEL
    always["spec"]["autoscaling"]["minReplicas"] = 1
    return [doc, always]


def at_zero(cluster: localcluster.LocalCluster, name: str) -> bool:
    """No serving pod left, draining ones included, and the Service at the holder."""
    selector = json.loads(cluster.kubectl("get", "service", name, "-n", NAMESPACE, "-o", "json"))["spec"]["selector"]
    pods = cluster.kubectl("get", "pods", "-n", NAMESPACE, "-l", f"{MODEL}={name},{SERVING}", "-o", "name").strip()
    return selector.get("app.kubernetes.io/component") == "holder" and not pods


def until(check: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {seconds:.0f} s waiting for {what}")
        time.sleep(1)


def completion(prompt: str) -> bytes:
    return json.dumps({"model": "bench", "prompt": prompt}).encode()


def prepare_zero(cluster: localcluster.LocalCluster) -> None:
    """Both zero models Ready, compiled into the local object store."""
    import boto3

    endpoint = cluster.object_store()
    if endpoint is None:
        raise RuntimeError("the local object store is not running")
    store = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="local", aws_secret_access_key="local")
    store.create_bucket(Bucket="bench-zero")
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(store_secret(NAMESPACE, endpoint)))
    for doc in zero_models():
        apply_ready(cluster, doc, autoscaled=True)


def store_client(cluster: localcluster.LocalCluster) -> Any:
    import boto3

    return boto3.client(
        "s3", endpoint_url=cluster.object_store(), region_name="us-east-1", aws_access_key_id="local", aws_secret_access_key="local"
    )


PADDING = "benchmark-padding.bin"


def pad_artefact(cluster: localcluster.LocalCluster, gib: float) -> None:
    """The compiled artefact of the model that scales to zero, made ``gib`` GiB larger by files
    of random bytes (a real model's weights do not compress either), at most 1 GiB each (as
    sharded weights are, and the local store serves one large object at a fraction of its rate
    for smaller ones: 929 MB of one of 4 GiB in about 8.5 min, 1 GiB in 80 s), each named in its
    completion marker with its size and SHA-256 as the upload would name it; the server loads
    what it loaded before and ignores them, and every fetch reads and checks them."""
    import hashlib
    import os

    store = store_client(cluster)
    keys = [o["Key"] for o in store.list_objects_v2(Bucket="bench-zero", Prefix="compiled/").get("Contents", [])]
    [marker_key] = [k for k in keys if k.endswith("/_INFERENTIA_COMPLETE")]
    prefix = marker_key.rsplit("/", 1)[0] + "/"
    marker = json.loads(store.get_object(Bucket="bench-zero", Key=marker_key)["Body"].read())
    total, part = int(gib * (1 << 30)), 0
    while total > 0:
        size, name = min(total, 1 << 30), f"{PADDING}.{part}"
        with tempfile.NamedTemporaryFile() as padding:
            digest, left = hashlib.sha256(), size
            while left:
                block = os.urandom(min(left, 1 << 24))
                digest.update(block)
                padding.write(block)
                left -= len(block)
            padding.flush()
            store.upload_file(padding.name, "bench-zero", prefix + name)
        marker["files"][name] = {"size": size, "sha256": digest.hexdigest()}
        total, part = total - size, part + 1
    store.put_object(Bucket="bench-zero", Key=marker_key, Body=json.dumps(marker, sort_keys=True).encode())


def start_node_cache(cluster: localcluster.LocalCluster, views: bool = False) -> str:
    """The chart's node cache (nodeCache.enabled) on the real node, in the benchmark's namespace;
    its Service's URL by cluster IP for the operator's --node-cache-url. With ``views``, its node
    plugin too (nodeCache.views.enabled), its store beside the real node's kubelet directory."""
    import subprocess

    kubelet = cluster.kubelet_dir() if views else ""
    view_flags = (
        ["--set", "nodeCache.views.enabled=true", "--set", f"nodeCache.views.kubeletDir={kubelet}",
         "--set", f"nodeCache.views.hostDir={kubelet.rstrip('/').rpartition('/')[0]}/bench-node-cache"]
        if views else []
    )  # fmt: skip
    out = subprocess.run(
        [str(localcluster.bin_dir() / "helm"), "template", "inferentia-operator", str(localcluster.HERE.parent / "charts" / "inferentia-operator"),
         "--namespace", NAMESPACE, "--set", "image.repository=inferentia-operator", "--set", "nodeCache.enabled=true",
         "--set", f"nodeCache.maxBytes={8 << 30}", *view_flags],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    docs = realnode.node_cache_on_real_node([d for d in yaml.safe_load_all(out) if d])
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    cluster.kubectl("rollout", "status", "-n", NAMESPACE, "daemonset/inferentia-operator-node-cache", "--timeout=180s")
    ip = json.loads(cluster.kubectl("get", "service", "inferentia-operator-node-cache", "-n", NAMESPACE, "-o", "json"))["spec"]["clusterIP"]
    return f"http://{ip}:8080"


def measure_zero(cluster: localcluster.LocalCluster, cycles: int, gap: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The sparse profile against both models at once, then the warm path of the one that
    scales to zero; returns the rows of both tables."""
    prepare_zero(cluster)
    urls = {name: service_url(cluster, name, "/v1/completions") for name in (ZERO_MODEL, ALWAYS_MODEL)}
    until(lambda: at_zero(cluster, ZERO_MODEL), 300, f"{ZERO_MODEL} to go to zero")
    sampler = Sampler(cluster)
    sampler.start()
    results: dict[str, list[tuple[float, int | str]]] = {ZERO_MODEL: [], ALWAYS_MODEL: []}
    arrived_at_zero = 0
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=2) as pool:
        for i in range(cycles):
            due = started + i * gap
            time.sleep(max(due - time.monotonic(), 0))
            arrived_at_zero += at_zero(cluster, ZERO_MODEL)
            due = time.monotonic()
            sent = {name: pool.submit(send, url, due, i, completion(f"cycle {i}"), 300) for name, url in urls.items()}
            for name, future in sent.items():
                results[name].append(future.result())
            print(f"  cycle {i}: the model that scales to zero answered in {results[ZERO_MODEL][-1][0]:.1f} s", file=sys.stderr, flush=True)
    end = started + cycles * gap
    time.sleep(max(end - time.monotonic(), 0))
    sampler.stop.set()
    sampler.join()
    never_below_one = sampler.replica_seconds(ALWAYS_MODEL, started, end)
    rows = []
    for name, way in ((ALWAYS_MODEL, "never below one"), (ZERO_MODEL, "from zero")):
        answered = sorted(latency for latency, outcome in results[name] if outcome == 200)
        replica_seconds = sampler.replica_seconds(name, started, end)
        rows.append({
            "way": way, "replica_seconds": replica_seconds, "of_base": replica_seconds / never_below_one, "requests": cycles,
            "at_zero": arrived_at_zero if name == ZERO_MODEL else 0, "p50_s": percentile(answered, 50), "max_s": max(answered, default=float("nan")),
            "failed": sum(1 for _, o in results[name] if o != 200),
        })  # fmt: skip
    return rows, warm_path(cluster)


def warm_path(cluster: localcluster.LocalCluster, rounds: int = 300) -> list[dict[str, Any]]:
    """The model that scales to zero, kept at one replica (its idle period raised), asked the
    same request round-robin straight at its replicas, through its Service, and through its
    holder pod."""
    patch = {"spec": {"autoscaling": {"idleSeconds": 3600}}}
    cluster.kubectl("patch", "inferentiamodel", ZERO_MODEL, "-n", NAMESPACE, "--type=merge", "-p", json.dumps(patch))
    service = service_url(cluster, ZERO_MODEL, "/v1/completions")
    send(service, time.monotonic(), 0, completion("wake"), 300)
    # Pointing at the serving pods, the Service is past zero.
    until(lambda: json.loads(cluster.kubectl("get", "service", ZERO_MODEL, "-n", NAMESPACE, "-o", "json"))["spec"]["selector"]["app.kubernetes.io/component"] == "serving", 120, "the Service to point at the replica")  # fmt: skip
    holder = json.loads(cluster.kubectl("get", "pods", "-n", NAMESPACE, "-l", f"{MODEL}={ZERO_MODEL},app.kubernetes.io/component=holder", "-o", "json"))["items"][0]  # fmt: skip
    port = service.split(":")[2].split("/")[0]
    paths = {
        "straight to the replicas": service_url(cluster, ZERO_MODEL + "-replicas", "/v1/completions"),
        "through the model's Service": service,
        "through the holder": f"http://{holder['status']['podIP']}:{port}/v1/completions",
    }
    latencies: dict[str, list[float]] = {path: [] for path in paths}
    failed = dict.fromkeys(paths, 0)
    for i in range(rounds):
        for path, url in paths.items():
            latency, outcome = send(url, time.monotonic(), i, completion(f"warm {i}"))
            if outcome == 200:
                latencies[path].append(latency)
            else:
                failed[path] += 1
    base = percentile(latencies["straight to the replicas"], 50)
    return [
        {"path": path, "p50_ms": percentile(v, 50) * 1000, "p99_ms": percentile(v, 99) * 1000, "added_ms": (percentile(v, 50) - base) * 1000,
         "answered": len(v), "failed": failed[path]}
        for path, v in latencies.items()
    ]  # fmt: skip


PHASES = ("until the pod exists", "scheduled", "fetching", "loading", "answered")
# The starts from zero --ways starts can time, by the name --start-ways takes.
START_WAYS = ("polled-store", "pushed-store", "pushed-cache", "polled-cache", "pushed-view")


def phases(pod: dict[str, Any], sent: float, answered: float) -> dict[str, float]:
    """A start from zero split where the pod's own record splits it (to the second, as
    Kubernetes records it): until the pod exists (the demand reaching KEDA, KEDA, the operator,
    the Deployment), scheduled, its init container's fetch, loading until ready, and the held
    request forwarded and answered. Wall-clock times: ``sent`` and ``answered`` are time.time()."""
    import datetime

    def at(stamp: str) -> float:
        return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()

    conds = {c["type"]: at(c["lastTransitionTime"]) for c in pod["status"]["conditions"]}
    marks = [at(pod["metadata"]["creationTimestamp"]), conds["PodScheduled"], conds["Initialized"], conds["Ready"], answered]
    out, last = {}, sent
    for name, t in zip(PHASES, marks, strict=True):
        out[name] = max(t - last, 0.0)
        last = max(t, last)
    out["total"] = answered - sent
    return out


def hold_seconds(artefact_gib: float) -> int:
    """How long the holder holds a start's request: the local store reads about 80 s a GiB
    (docs/benchmarks.md), and a request the holder gives up on is no start measured."""
    return 300 + int(150 * artefact_gib)


def measure_starts(cluster: localcluster.LocalCluster, starts: int, hold: int = 300) -> list[dict[str, float]]:
    """``starts`` starts from zero of the model that scales to zero, each split by phase."""
    url = service_url(cluster, ZERO_MODEL, "/v1/completions")
    out = []
    for i in range(starts):
        until(lambda: at_zero(cluster, ZERO_MODEL), 600, f"{ZERO_MODEL} to go to zero")
        sent = time.time()
        _, outcome = send(url, time.monotonic(), i, completion(f"start {i}"), hold + 30)
        answered = time.time()
        pods = json.loads(cluster.kubectl("get", "pods", "-n", NAMESPACE, "-l", f"{MODEL}={ZERO_MODEL},{SERVING}", "-o", "json"))["items"]
        if outcome != 200 or len(pods) != 1:
            raise RuntimeError(f"start {i}: answer {outcome}, {len(pods)} serving pods")
        out.append(phases(pods[0], sent, answered))
        print(f"  start {i}: {out[-1]['total']:.1f} s", file=sys.stderr, flush=True)
    return out


def patch_autoscaling(cluster: localcluster.LocalCluster, **fields: int) -> None:
    patch = {"spec": {"autoscaling": fields}}
    cluster.kubectl("patch", "inferentiamodel", ZERO_MODEL, "-n", NAMESPACE, "--type=merge", "-p", json.dumps(patch))


def ready_pods(cluster: localcluster.LocalCluster) -> list[dict[str, Any]]:
    pods = json.loads(cluster.kubectl("get", "pods", "-n", NAMESPACE, "-l", f"{MODEL}={ZERO_MODEL},{SERVING}", "-o", "json"))["items"]
    return [
        p for p in pods
        if p["metadata"].get("deletionTimestamp") is None and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
    ]  # fmt: skip


def measure_scale_up(cluster: localcluster.LocalCluster, rounds: int) -> list[dict[str, float]]:
    """``rounds`` scale-ups of the warm model from 1 to 3 replicas, each new replica split by
    phase from the moment its minimum is raised to 3 (the demand between 1 and max reaches KEDA
    through Prometheus either way); then back to zero, as the starts need it."""
    out = []
    for i in range(rounds):
        patch_autoscaling(cluster, minReplicas=1, maxReplicas=3)
        until(lambda: len(ready_pods(cluster)) == 1, 300, f"{ZERO_MODEL} at one ready replica")
        time.sleep(5)
        warm = {p["metadata"]["name"] for p in ready_pods(cluster)}
        sent = time.time()
        patch_autoscaling(cluster, minReplicas=3, maxReplicas=3)
        until(lambda: len(ready_pods(cluster)) == 3, 600, f"{ZERO_MODEL} at three ready replicas")
        done = time.time()
        for pod in ready_pods(cluster):
            if pod["metadata"]["name"] not in warm:
                ready = phases(pod, sent, done)
                ready["total"] = ready["until the pod exists"] + ready["scheduled"] + ready["fetching"] + ready["loading"]
                out.append(ready)
        print(f"  scale-up {i}: 1 to 3 in {done - sent:.1f} s", file=sys.stderr, flush=True)
        patch_autoscaling(cluster, minReplicas=0, maxReplicas=1)
        until(lambda: at_zero(cluster, ZERO_MODEL), 600, f"{ZERO_MODEL} back to zero")
    return out


def phase_table(heading: str, counted: str, total: str, names: tuple[str, ...], ways: dict[str, list[dict[str, float]]]) -> str:
    """One row a way: how many were timed, the median total against the first way's, and each
    phase's median."""
    lines = [f"| {heading} | {counted} | {total} p50 | {' | '.join(names)} (p50 each) |", "|---|---|---|" + "---|" * len(names)]
    base = statistics.median(r["total"] for r in next(iter(ways.values())))
    for way, rows in ways.items():
        middle = statistics.median(r["total"] for r in rows)
        cells = " | ".join(f"{statistics.median(r[name] for r in rows):.0f} s" for name in names)
        lines.append(f"| {way} | {len(rows)} | {middle:.1f} s ({middle / base:.2f}x) | {cells} |")
    return "\n".join(lines)


def start_table(ways: dict[str, list[dict[str, float]]], scrape: int) -> str:
    return phase_table(f"start from zero, Prometheus scraping every {scrape} s", "starts", "total", PHASES, ways)


def scale_table(ways: dict[str, list[dict[str, float]]]) -> str:
    # A new replica answers nothing itself: its phases end when it is ready.
    return phase_table("a new replica of a warm model, 1 to 3", "replicas", "until ready", PHASES[:4], ways)


def zero_tables(rows: list[dict[str, Any]], warm: list[dict[str, Any]]) -> str:
    lines = [
        "| way | replica-seconds | of never below one | requests | arrived at zero | request to answer p50 | max | failed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['way']} | {r['replica_seconds']:.0f} | {r['of_base']:.0%} | {r['requests']} | {r['at_zero']} | {r['p50_s']:.2f} s "
            f"| {r['max_s']:.2f} s | {r['failed']} |"
        )
    lines += ["", "| warm path | p50 ms | p99 ms | p50 added | answered | failed |", "|---|---|---|---|---|---|"]
    for w in warm:
        lines.append(f"| {w['path']} | {w['p50_ms']:.2f} | {w['p99_ms']:.2f} | {w['added_ms']:+.2f} ms | {w['answered']} | {w['failed']} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peak-rps", type=float, default=16.0, help="the plateau's requests a second (the burst is 1.5 times it)")
    parser.add_argument("--zero-cycles", type=int, default=10, help="requests of the sparse profile, each after the model went to zero")
    parser.add_argument("--zero-gap", type=float, default=60.0, help="seconds between the sparse profile's requests")
    parser.add_argument(
        "--ways", choices=("all", "fixed", "zero", "starts"), default="all",
        help="fixed: the first four ways only; zero: scale to zero only; starts: starts from zero by phase, with and without "
        "the pushed activation, Prometheus scraping every --scrape-seconds",
    )  # fmt: skip
    parser.add_argument("--starts", type=int, default=3, help="starts from zero of each way (--ways starts)")
    parser.add_argument("--scrape-seconds", type=int, default=30, help="Prometheus's scrape interval for --ways starts")
    parser.add_argument(
        "--artefact-gib", type=float, default=1.0,
        help="--ways starts: the compiled artefact made this many GiB larger, so that its fetch shows (0: as compiled)",
    )  # fmt: skip
    parser.add_argument(
        "--scale-ups", type=int, default=2, help="--ways starts: scale-ups of the warm model from 1 to 3, with and without the node cache"
    )
    parser.add_argument(
        "--start-ways", default=",".join(START_WAYS[:4]),
        help=f"--ways starts: which, of {', '.join(START_WAYS)} (pushed-view: the node cache's views, the operator's "
        "--node-views; with it, the node cache runs with its plugin for every cached way, its store on the node's disk)",
    )  # fmt: skip
    parser.add_argument("--no-store-scale-ups", action="store_true", help="--ways starts: no scale-ups that read the store (the slowest)")
    args = parser.parse_args()
    chosen = args.start_ways.split(",")
    if unknown := set(chosen) - set(START_WAYS):
        parser.error(f"--start-ways: {', '.join(sorted(unknown))} not among {', '.join(START_WAYS)}")
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

            def start_operator(*flags: str) -> subprocess.Popen[bytes]:
                return subprocess.Popen(
                    [sys.executable, "-m", "inferentia_operator", "run", "--standalone", "--liveness", "", "--metrics-port", "0",
                     "--resync-seconds", "10", "--prometheus-address", str(cluster.prometheus()), *flags],
                    env={"KUBECONFIG": str(cluster.kubeconfig), "PATH": "/usr/bin:/bin"},
                    stdout=open(Path(tmp) / "operator.log", "ab"), stderr=subprocess.STDOUT,
                )  # fmt: skip

            operator = start_operator()
            namespace: dict[str, Any] = {"apiVersion": "v1", "kind": "Namespace"}
            namespace["metadata"] = {"name": NAMESPACE, "annotations": realnode.REAL_NODE_NAMESPACE_ANNOTATIONS}
            cluster.kubectl("apply", "-f", "-", input=json.dumps(namespace))
            time.sleep(2)  # the namespace's default ServiceAccount
            rows: list[dict[str, Any]] = []
            zero: list[dict[str, Any]] = []
            warm: list[dict[str, Any]] = []
            starts: dict[str, list[dict[str, float]]] = {}
            scale_ups: dict[str, list[dict[str, float]]] = {}
            if args.ways == "starts":
                set_scrape_interval(cluster.state, cluster.recorded()["pids"]["prometheus"], str(cluster.prometheus()), args.scrape_seconds)
                prepare_zero(cluster)
                if args.artefact_gib:
                    pad_artefact(cluster, args.artefact_gib)
                hold = hold_seconds(args.artefact_gib)
                patch_autoscaling(cluster, holdSeconds=hold)
                cache_url, primed = "", False
                viewing = "pushed-view" in chosen
                for key, way, flags, cached in (
                    ("polled-store", "KEDA polls Prometheus (--no-push-activation), the store", ("--no-push-activation",), False),
                    ("pushed-store", "pushed by the holder, the store", (), False),
                    ("pushed-cache", "pushed by the holder, the node cache", (), True),
                    ("polled-cache", "KEDA polls Prometheus (--no-push-activation), the node cache", ("--no-push-activation",), True),
                    ("pushed-view", "pushed by the holder, the node cache's view", ("--node-views",), True),
                ):
                    if key not in chosen:
                        continue
                    if cached and not cache_url:
                        cache_url = start_node_cache(cluster, views=viewing)
                    cache_flags = ("--node-cache-url", cache_url, "--node-cache-namespace", NAMESPACE) if cached else ()
                    operator.terminate()
                    operator.wait(15)
                    operator = start_operator(*flags, *cache_flags)
                    print(f"{way}: {args.starts} starts from zero", file=sys.stderr, flush=True)
                    time.sleep(15)  # the operator's first reconcile rewrites the ScaledObject's triggers
                    if cached and not primed:
                        measure_starts(cluster, 1, hold)  # the node's first fetch through the cache fills it: not counted
                        primed = True
                    starts[way] = measure_starts(cluster, args.starts, hold)
                    if args.scale_ups and not args.no_store_scale_ups and not cached and "the store" not in scale_ups and flags == ():
                        print(f"the store: {args.scale_ups} scale-ups from 1 to 3", file=sys.stderr, flush=True)
                        scale_ups["the store"] = measure_scale_up(cluster, args.scale_ups)
                    through = "the node cache's view" if key == "pushed-view" else "the node cache"
                    if args.scale_ups and cached and through not in scale_ups:
                        print(f"{through}: {args.scale_ups} scale-ups from 1 to 3", file=sys.stderr, flush=True)
                        scale_ups[through] = measure_scale_up(cluster, args.scale_ups)
            for way, extra in (
                ("fixed at peak", {"replicas": PEAK_REPLICAS}),
                ("fixed at one", {"replicas": 1}),
                ("autoscaling", {"autoscaling": AUTOSCALING}),
                ("autoscaling at the replica's parallelism", {"autoscaling": AT_PARALLELISM}),
            ):
                if args.ways in ("zero", "starts"):
                    break
                print(f"{way}: {sum(p[1] for p in PROFILE)} s of load, peak {args.peak_rps:g} requests/s", file=sys.stderr, flush=True)
                rows.append(measure(cluster, way, extra, args.peak_rps))
            if args.ways in ("all", "zero"):
                print(f"scale to zero: {args.zero_cycles} requests, one every {args.zero_gap:g} s", file=sys.stderr, flush=True)
                zero, warm = measure_zero(cluster, args.zero_cycles, args.zero_gap)
        finally:
            if operator is not None:
                operator.terminate()
                operator.wait(15)
            cluster.down()
    print(
        f"{time.strftime('%Y-%m-%d')}, python cluster/benchmark_autoscaling.py --peak-rps {args.peak_rps:g}"
        f" --zero-cycles {args.zero_cycles} --zero-gap {args.zero_gap:g} --ways {args.ways}"
        + (
            f" --starts {args.starts} --scrape-seconds {args.scrape_seconds} --artefact-gib {args.artefact_gib:g} --scale-ups {args.scale_ups}"
            f" --start-ways {args.start_ways}" + (" --no-store-scale-ups" if args.no_store_scale_ups else "")
            if starts
            else ""
        )
    )
    if starts:
        print(start_table(starts, args.scrape_seconds))
    if scale_ups:
        print()
        print(scale_table(scale_ups))
    if rows:
        print(table(rows))
        print()
        print(phase_seconds_table(rows))
    if zero:
        print(zero_tables(zero, warm))
    return 0


if __name__ == "__main__":
    sys.exit(main())
