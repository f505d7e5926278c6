"""The reconcile core at scale, against the bare API: prints one table of ratios.

    make benchmark-scale                 # N = 1000
    make benchmark-scale N=100           # or: python cluster/benchmark_scale.py --models 100

Each phase runs on a fresh local control plane whose simulated fleet has room for
every model (capacity never limits), with models of ``inf: 1``, one replica and no
compile image:

- **floor**: a plain client creates each model's ConfigMap, Service and Deployment
  itself (the operator's own builders, without owner) and waits for every Deployment
  to be available. The time, and the CPU the API server and etcd spend, are the floor.
- **operator**: the same number of InferentiaModels, created the same way, until every
  one is Ready. Requests per model while converging are counted in the API server's
  audit log (reads and writes of the operator's user); the operator's RSS is read from
  /proc.
- **at rest**: requests per minute over ``--rest-seconds`` with every model Ready,
  apart from kopf's peering keep-alives.
- **restart**: the operator killed and started again over the N unchanged models:
  seconds until its queue is empty and no reconcile has run for 3 s, and its writes.
- **stream**: models created at 10 and then 20 a second; the latency from each create
  to its Deployment's existence, p50 and p99, beside the floor's at the same rate (on the
  floor's cluster, the model created and then its children by the same client at once: the
  API server's and the watch's own latency at that rate, with no controller in between).

``--creates K`` measures instead what creating a model's Service and Deployment costs the API
server and etcd, by a plain POST (the operator's create, ``Kube.create``) and by a server-side
apply (``Kube.apply``), in alternating rounds of K models on one control plane: the CPU from
the first write until every Deployment of the round is available, less the idle rate.

``--memory`` runs instead only the operator, with Python's tracemalloc on
(cluster/operator_memory.py), and prints the lines whose live objects hold its memory after
converging and at the end: which caches grow; with the allocators beneath, pymalloc's arenas
and glibc's heaps, and how much of each is in use (``--untraced`` for pymalloc's, which
reports nothing while traced).

Last, where the API server's work went: watch events it sent by kind (each counted once per
watcher, so a watch's fan-out shows) with their bytes, and requests by verb and kind, from
its own /metrics, per model while converging, the operator's run beside the floor's.

Every figure is printed beside the goal it is measured against. The machine is shared
and small, so times are ratios against the floor measured in the same run.
"""

from __future__ import annotations

import argparse
import calendar
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

import localcluster
import runtime_venv
from inferentia_operator.core.api import InferentiaModelSpec
from inferentia_operator.core.planner import plan
from inferentia_operator.core.pod.model import Model
from inferentia_operator.core.serving.deployment import serving_deployment
from inferentia_operator.core.serving.service import plan_configmap, service
from inferentia_operator.shell.kube import Kube
from inferentia_operator.shell.transport import Transport
from ports import free_port

OPERATOR_USER = "benchmark-operator"
NAMESPACE = "default"
CLIENT_THREADS = 4
# The operator's requests, reads included; everyone's writes.
AUDIT_POLICY = f"""apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    users: [{OPERATOR_USER}]
  - level: None
"""
SPEC = {
    "model": {"uri": "s3://models/bench/", "framework": "pytorch"},
    "compute": {"inf": 1, "cpu": "100m", "memory": "128Mi"},
    "serving": {"image": "example.com/serve:1"},
}


def fleet(path: Path, models: int) -> Path:
    """inf1.24xlarge nodes (16 chips) for every model, with room to spare, and one plain node."""
    nodes = math.ceil(models * 1.1 / 16) + 1
    base = yaml.safe_load(localcluster.FLEET.read_text())
    base["nodes"] = [{"instanceType": "inf1.24xlarge", "count": nodes}, {"instanceType": "m5.xlarge", "count": 1}]
    path.write_text(yaml.safe_dump(base))
    return path


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


CONTROL_PLANE = ("kube-apiserver", "etcd")  # the components the floor is measured on


def control_plane_cpu(cluster: localcluster.LocalCluster) -> float:
    pids = cluster.recorded()["pids"]
    return sum(cpu_seconds(pids[name]) for name in CONTROL_PLANE)


def idle_cpu_per_second(cluster: localcluster.LocalCluster, seconds: float = 5.0) -> float:
    """The API server's and etcd's CPU a second with nothing asked of them (leases, the
    controllers' resyncs): what a pause in a measurement costs."""
    before = control_plane_cpu(cluster)
    time.sleep(seconds)
    return (control_plane_cpu(cluster) - before) / seconds


def other_components_cpu(cluster: localcluster.LocalCluster) -> float:
    """CPU seconds of the cluster's other processes (controller-manager, scheduler, kwok, ...)."""
    total = 0.0
    for name, pid in cluster.recorded()["pids"].items():
        if name not in CONTROL_PLANE and Path(f"/proc/{pid}/stat").exists():
            total += cpu_seconds(pid)
    return total


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy, over all its CPUs (from /proc/stat)."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in Path("/proc/stat").read_text().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def client(cluster: localcluster.LocalCluster) -> Kube:
    """The operator's own client (shell/transport.py), with the cluster's admin kubeconfig."""
    os.environ["KUBECONFIG"] = str(cluster.kubeconfig)  # where kopf's kubeconfig login reads it
    return Kube(Transport(pool_size=CLIENT_THREADS))


def model_body(name: str) -> dict:
    return {
        "apiVersion": "inferentia.dev/v1alpha1",
        "kind": "InferentiaModel",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": SPEC,
    }


def children_of(name: str) -> list[dict]:
    spec = InferentiaModelSpec.model_validate(SPEC)
    m = Model(name, NAMESPACE, "bench", spec, plan(spec))
    objects = [plan_configmap(m), service(m), serving_deployment(m)]
    for o in objects:
        o["metadata"].pop("ownerReferences")
    return objects


def create_all(kube: Kube, bodies: list[dict]) -> None:
    with ThreadPoolExecutor(CLIENT_THREADS) as pool:
        list(pool.map(kube.create_if_missing, bodies))


def wait_until(predicate, timeout: float, interval: float = 1.0) -> float:
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise TimeoutError("timed out")
        time.sleep(interval)
    return time.monotonic()


def available_deployments(kube: Kube, prefix: str = "") -> int:
    return sum(
        1
        for d in kube.list("Deployment", NAMESPACE, "")
        if d["metadata"]["name"].startswith(prefix) and (d.get("status") or {}).get("availableReplicas") == 1
    )


def ready_models(kube: Kube) -> int:
    def ready(m):
        return any(c["type"] == "Ready" and c["status"] == "True" for c in (m.get("status") or {}).get("conditions") or [])

    return sum(1 for m in kube.list("InferentiaModel", NAMESPACE, "") if ready(m))


def floor(models: int, workdir: Path, rates: list[int], stream_seconds: int) -> dict:
    extra = sum(rates) * stream_seconds
    cluster = localcluster.LocalCluster(
        workdir / "floor", fleet_file=fleet(workdir / "floor-fleet.yaml", models + extra), die_with_parent=True
    )
    cluster.up()
    try:
        cluster.install_crds()
        kube = client(cluster)
        served0, cpu0, started = served(cluster), control_plane_cpu(cluster), time.monotonic()
        create_all(kube, [o for i in range(models) for o in children_of(f"m-{i}")])
        done = wait_until(lambda: available_deployments(kube) >= models, timeout=models * 3 + 120)
        out: dict = {"seconds": done - started, "cpu": control_plane_cpu(cluster) - cpu0, "streams": {}}
        out["served"] = difference(served(cluster), served0)
        # What the users' own creates cost, with no controller: the same models, each validated
        # against the CRD's schema and CEL rules and stored. Part of the operator's run, not of
        # the floor; printed apart, to attribute the difference.
        idle = idle_cpu_per_second(cluster)
        cpu1, t1 = control_plane_cpu(cluster), time.monotonic()
        create_all(kube, [model_body(f"m-{i}") for i in range(models)])
        time.sleep(2)  # the watch fan-out of the last creates
        out["models_cpu"] = control_plane_cpu(cluster) - cpu1 - idle * (time.monotonic() - t1)
        for rate in rates:
            # The stream's floor: each model created, then at once its children by the same
            # client, as a controller with no reaction time and no logic would: create ->
            # Deployment is then only the API server's and the watch's own latency, at this rate.
            cpu0, other0, busy0, t0 = control_plane_cpu(cluster), other_components_cpu(cluster), machine_busy_seconds(), time.monotonic()
            latencies = stream(kube, rate, stream_seconds, prefix=f"s{rate}-", children_too=True)
            wall = time.monotonic() - t0
            out["streams"][rate] = (percentile(latencies, 50), percentile(latencies, 99))
            # The machine the floor left over at this rate: what the operator's run has to fit
            # its own CPU and its extra writes into.
            out.setdefault("stream_load", {})[rate] = (
                (control_plane_cpu(cluster) - cpu0) / wall,
                (other_components_cpu(cluster) - other0) / wall,
                (machine_busy_seconds() - busy0) / wall,
            )
        return out
    finally:
        cluster.down()


class Operator:
    def __init__(
        self,
        cluster: localcluster.LocalCluster,
        log: Path,
        memory_dump: Path | None = None,
        trace: bool = True,
        workers: int | None = None,
        python: Path | None = None,
        standalone: bool = False,
    ):
        self.standalone = standalone  # no peering object is left behind for the next operator to wait out
        self.cluster, self.log, self.memory_dump, self.trace = cluster, log, memory_dump, trace
        # The runtime dependencies alone, as in the operator's image (cluster/runtime_venv.py).
        self.python = python or runtime_venv.python()
        self.workers = workers  # the operator's --workers; None: its default
        self.kubeconfig = cluster.user_kubeconfig(OPERATOR_USER, groups=("system:masters",))
        self.metrics_port = free_port()
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        program = [str(Path(__file__).parent / "operator_memory.py")] if self.memory_dump else ["-m", "inferentia_operator"]
        dump = (
            {"INFERENTIA_MEMORY_DUMP": str(self.memory_dump), "INFERENTIA_MEMORY_TRACE": "1" if self.trace else "0"}
            if self.memory_dump
            else {}
        )
        self.proc = subprocess.Popen(
            [
                str(self.python), *program, "run", "--liveness", "", "--metrics-port", str(self.metrics_port),
                *(["--workers", str(self.workers)] if self.workers else []), *(["--standalone"] if self.standalone else []),
            ],
            env={**runtime_venv.env(), "KUBECONFIG": str(self.kubeconfig), **dump},
            stdout=open(self.log, "ab"), stderr=subprocess.STDOUT,
        )  # fmt: skip

    def stop(self) -> None:
        if self.proc:
            self.proc.kill()
            self.proc.wait()

    def allocations(self) -> list[tuple[int, int, str]]:
        """With --memory: the live allocations by line, largest first ("total" first of all)."""
        assert self.proc is not None and self.memory_dump is not None
        self.memory_dump.unlink(missing_ok=True)
        self.proc.send_signal(signal.SIGUSR1)
        wait_until(self.memory_dump.exists, timeout=300)
        rows = []
        for line in self.memory_dump.read_text().splitlines():
            size, count, where = line.split(" ", 2)
            rows.append((int(size), int(count), where))
        return rows

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            lines = r.read().decode().splitlines()
        return {k: float(v) for k, _, v in (line.rpartition(" ") for line in lines if line and not line.startswith("#"))}

    def reconciles(self) -> float:
        return sum(v for k, v in self.metrics().items() if k.startswith("inferentia_operator_reconciles_total{"))

    def wait_idle(self, quiet: float = 3.0, timeout: float = 600) -> float:
        """Seconds until the queue is empty and no reconcile has run for ``quiet`` seconds."""
        started = time.monotonic()
        last, last_change = None, time.monotonic()
        while time.monotonic() - started < timeout:
            try:
                m = self.metrics()
            except OSError:
                time.sleep(0.2)
                continue
            count = sum(v for k, v in m.items() if k.startswith("inferentia_operator_reconciles_total{"))
            if count != last:
                last, last_change = count, time.monotonic()
            elif m.get("inferentia_operator_queue_depth", 0) == 0 and time.monotonic() - last_change >= quiet and count > 0:
                return last_change - started
            time.sleep(0.2)
        raise TimeoutError("the operator did not go idle")


def audited(cluster: localcluster.LocalCluster, since: float, until: float | None = None) -> list[dict]:
    """The operator's requests between two wall-clock times, peering keep-alives excluded."""
    out = []
    for line in cluster.audit_log.read_text().splitlines():
        e = json.loads(line)
        if e.get("stage") not in ("ResponseComplete", "ResponseStarted") or e.get("user", {}).get("username") != OPERATOR_USER:
            continue
        if e.get("verb") == "watch" and e["stage"] == "ResponseComplete":
            continue  # a watch counts once, when it starts
        if e["stage"] == "ResponseStarted" and e.get("verb") != "watch":
            continue
        at = calendar.timegm(time.strptime(e["stageTimestamp"][:19], "%Y-%m-%dT%H:%M:%S"))
        if at < since or (until is not None and at > until):
            continue
        if "kopfpeerings" in (e.get("objectRef") or {}).get("resource", ""):
            continue
        out.append(e)
    return out


def served(cluster: localcluster.LocalCluster) -> dict[str, float]:
    """What the API server has sent and answered so far, from its own /metrics: watch events
    sent to watchers (``events <resource>``, counted once per watcher, so a kind's fan-out shows)
    and their bytes (``bytes <resource>``), and requests by verb and resource
    (``<verb> <resource>``), everyone's."""
    text = cluster.kubectl("get", "--raw", "/metrics")
    out: dict[str, float] = {}
    for line in text.splitlines():
        name, _, rest = line.partition("{")
        if name not in ("apiserver_watch_events_total", "apiserver_watch_events_sizes_sum", "apiserver_request_total"):
            continue
        labels_text, _, value = rest.rpartition("} ")
        labels = dict(re.findall(r'(\w+)="([^"]*)"', labels_text))
        what = labels.get("resource") or labels.get("kind") or "?"
        if labels.get("subresource"):
            what += "/" + labels["subresource"]
        if name == "apiserver_request_total":
            if labels.get("verb") == "WATCH":
                continue  # a watch's events are counted above
            key = f"{labels.get('verb', '?').lower()} {what}"
        else:
            key = ("events " if name == "apiserver_watch_events_total" else "bytes ") + what
        out[key] = out.get(key, 0.0) + float(value)
    return out


def difference(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0) > 0}


def attribution(op: dict[str, float], base: dict[str, float], n: int, top: int = 10) -> str:
    """Where the operator's run made the API server work more than the floor's, per model:
    the watch events it sent by kind with their bytes, then the requests by verb and kind,
    each largest difference first."""

    def per_model(d: dict[str, float], k: str) -> float:
        return d.get(k, 0.0) / n

    kinds = {k.split(" ", 1)[1] for k in (*op, *base) if k.startswith("events ")}
    kinds_by = sorted(kinds, key=lambda r: -abs(per_model(op, "bytes " + r) - per_model(base, "bytes " + r)))
    lines = ["| watch events sent, per model | operator | floor | kB, operator | kB, floor |", "|---|---|---|---|---|"]
    for r in kinds_by[:top]:
        e, b = "events " + r, "bytes " + r
        lines.append(
            f"| {r} | {per_model(op, e):.1f} | {per_model(base, e):.1f} | {per_model(op, b) / 1024:.1f} | {per_model(base, b) / 1024:.1f} |"
        )
    requests = {k for k in (*op, *base) if not k.startswith(("events ", "bytes "))}
    by = sorted(requests, key=lambda k: -abs(per_model(op, k) - per_model(base, k)))
    lines += ["", "| requests, per model | operator | floor | operator / floor |", "|---|---|---|---|"]
    # Every client's, the controllers' and the kubelets' with the operator's: what the API server
    # and etcd answered in each run, to set beside their CPU.
    for name, verbs in (("every client's writes", WRITE_VERBS), ("every client's reads", READ_VERBS)):
        o, b = (sum(per_model(d, k) for k in requests if k.split(" ", 1)[0] in verbs) for d in (op, base))
        lines.append(f"| {name} | {o:.2f} | {b:.2f} | {o / b:.2f}x |" if b else f"| {name} | {o:.2f} | {b:.2f} | — |")
    lines += [f"| {k} | {per_model(op, k):.2f} | {per_model(base, k):.2f} | |" for k in by[:top]]
    return "\n".join(lines)


# apiserver_request_total's verbs (watches are left out of served()'s requests).
READ_VERBS = frozenset({"get", "list"})
WRITE_VERBS = frozenset({"post", "put", "patch", "apply", "delete", "deletecollection"})


def split(requests: list[dict]) -> tuple[int, int]:
    reads = sum(1 for e in requests if e["verb"] in ("get", "list", "watch"))
    return reads, len(requests) - reads


def writes_by_kind(requests: list[dict]) -> dict[str, int]:
    """The writes, counted by verb and resource ("patch inferentiamodels/status")."""
    counts: dict[str, int] = {}
    for e in requests:
        if e["verb"] in ("get", "list", "watch"):
            continue
        ref = e.get("objectRef") or {}
        what = f"{e['verb']} {ref.get('resource', '?')}" + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        counts[what] = counts.get(what, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def follow_added(list_call: Any, stream_call: Any, namespace: str, added: Any, stop: threading.Event) -> int:
    """Calls ``added(name)`` once for every object created in ``namespace`` from now until
    ``stop``, through a watch that survives the server closing it (urllib3's "Response ended
    prematurely") or expiring its resourceVersion (410): it lists again, reports what the list
    holds that was not seen, and resumes from the list's resourceVersion, as client-go's
    reflector does. Returns how many times it had to."""
    seen: set[str] = set()

    def note(name: str) -> None:
        if name not in seen:
            seen.add(name)
            added(name)

    version = list_call(namespace, limit=1).metadata.resource_version
    restarts = 0
    while not stop.is_set():
        try:
            for event in stream_call(list_call, namespace, resource_version=version, timeout_seconds=300):
                version = event["object"].metadata.resource_version
                if event["type"] == "ADDED":
                    note(event["object"].metadata.name)
                if stop.is_set():
                    return restarts
        except Exception:  # noqa: BLE001 - a closed or expired watch: list, then watch again
            restarts += 1
            listed = list_call(namespace)
            for item in listed.items:
                note(item.metadata.name)
            version = listed.metadata.resource_version
    return restarts


def stream(kube: Kube, rate: int, seconds: int, prefix: str, children_too: bool = False) -> list[float]:
    """Creates ``rate`` models a second (``children_too``: and then, from the same client, each
    one's children, the floor's way); returns each one's create -> Deployment latency.

    Deployments are seen through a watch, as a controller would see them: polling a list
    of 1,000 Deployments every few milliseconds would load the API server the operator
    shares two cores with, and be measured as the operator's delay."""
    from kubernetes import client as k8s
    from kubernetes import config
    from kubernetes import watch as k8s_watch

    created: dict[str, float] = {}
    seen: dict[str, float] = {}
    # The official client's watch, with the same kubeconfig as ``kube`` (see client()).
    apps = k8s.AppsV1Api(config.new_client_from_config(os.environ["KUBECONFIG"]))
    deployments, stop = k8s_watch.Watch(), threading.Event()

    def added(name: str) -> None:
        if name.startswith(prefix):
            seen[name] = time.monotonic()

    restarts: list[int] = []
    watcher = threading.Thread(
        target=lambda: restarts.append(follow_added(apps.list_namespaced_deployment, deployments.stream, NAMESPACE, added, stop)),
        daemon=True,
    )
    watcher.start()
    pool = ThreadPoolExecutor(CLIENT_THREADS)
    started = time.monotonic()
    for i in range(rate * seconds):
        due = started + i / rate
        time.sleep(max(0.0, due - time.monotonic()))
        name = f"{prefix}{i}"

        def create(name=name):
            kube.create_if_missing(model_body(name))
            created[name] = time.monotonic()
            for child in children_of(name) if children_too else []:
                kube.create_if_missing(child)

        pool.submit(create)
    pool.shutdown(wait=True)
    wait_until(lambda: all(n in seen for n in created), timeout=300, interval=0.2)
    stop.set()
    deployments.stop()
    watcher.join(timeout=10)
    if restarts and restarts[0]:
        print(f"  the Deployment watch was closed {restarts[0]} times; listed again and resumed each time", file=sys.stderr)
    return sorted(seen[n] - created[n] for n in created)


def bucket_quantile(after: dict[str, float], before: dict[str, float], histogram: str, labels: str, q: float) -> float:
    """The ``q`` quantile of what a Prometheus histogram observed between two scrapes, as the
    upper bound of the bucket it falls in (as histogram_quantile would, without interpolating).
    ``labels``: the series' labels before ``le``, e.g. 'lane="urgent",'."""
    prefix = f"{histogram}_bucket{{{labels}le="
    buckets = sorted(
        (float(k[len(prefix) :].strip('"}')), after[k] - before.get(k, 0.0)) for k in after if k.startswith(prefix)
    )  # fmt: skip
    total = buckets[-1][1] if buckets else 0.0
    return next((le for le, n in buckets if total and n >= q * total), 0.0)


def gc_paused(after: dict[str, float], before: dict[str, float]) -> tuple[float, float, float]:
    """Between two scrapes: the operator's seconds in garbage collection (every generation),
    its full collections, and the longest one's bucket bound (the quantile 1.0)."""
    name = "inferentia_operator_gc_pause_seconds"
    total = sum(v - before.get(k, 0.0) for k, v in after.items() if k.startswith(f"{name}_sum"))
    full = after.get(f'{name}_count{{generation="2"}}', 0.0) - before.get(f'{name}_count{{generation="2"}}', 0.0)
    return total, full, bucket_quantile(after, before, name, 'generation="2",', 1.0)


def percentile(values: list[float], p: float) -> float:
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


class QueueDepth:
    """The operator's work-queue depth, sampled from /metrics until stopped: its maximum."""

    def __init__(self, operator: Operator) -> None:
        self.operator, self.most, self._stop = operator, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.25):
            try:
                self.most = max(self.most, self.operator.metrics().get("inferentia_operator_queue_depth", 0.0))
            except OSError:
                pass

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.most


def start_profile(operator: Operator, profile: Path | None, rate: int) -> subprocess.Popen | None:
    """py-spy sampling the operator's Python stacks, as collapsed stacks, while a stream runs."""
    if profile is None:
        return None
    profile.mkdir(parents=True, exist_ok=True)
    assert operator.proc is not None
    command = [
        str(Path(sys.executable).parent / "py-spy"),
        "record",
        "--pid",
        str(operator.proc.pid),
        "--format",
        "raw",
        "--rate",
        "50",
        "--nonblocking",
    ]
    return subprocess.Popen(
        [*command, "--output", str(profile / f"stream-{rate}.txt")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def stop_profile(profiler: subprocess.Popen | None) -> None:
    if profiler is not None:
        profiler.send_signal(2)  # SIGINT: py-spy writes what it sampled
        profiler.wait(timeout=60)


def summarize(raw: Path, top: int = 12) -> None:
    """The functions the operator spent its samples in: by their own time and with callees."""
    own: dict[str, int] = {}
    total: dict[str, int] = {}
    samples = 0
    for line in raw.read_text().splitlines() if raw.exists() else []:
        stack, _, count = line.rpartition(" ")
        frames, n = stack.split(";"), int(count)
        samples += n
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for frame in set(frames):
            total[frame] = total.get(frame, 0) + n
    if not samples:
        print(f"  (no samples in {raw})")
        return
    print(f"  py-spy, {samples} samples; own time:")
    for frame, n in sorted(own.items(), key=lambda kv: -kv[1])[:top]:
        print(f"    {n / samples:6.1%}  {frame}")
    print("  with callees (the operator's own code):")
    ours = {f: n for f, n in total.items() if "inferentia_operator" in f}
    for frame, n in sorted(ours.items(), key=lambda kv: -kv[1])[:top]:
        print(f"    {n / samples:6.1%}  {frame}")


def with_operator(
    models: int,
    workdir: Path,
    rest_seconds: int,
    rates: list[int],
    stream_seconds: int,
    profile: Path | None = None,
    workers: int | None = None,
) -> dict:
    extra = sum(rates) * stream_seconds
    cluster = localcluster.LocalCluster(
        workdir / "operator", fleet_file=fleet(workdir / "fleet.yaml", models + extra), die_with_parent=True, audit_policy=AUDIT_POLICY
    )
    cluster.up()
    operator = Operator(cluster, workdir / "operator.log", workers=workers)
    out: dict = {}
    try:
        cluster.install_crds()
        kube = client(cluster)
        # At start, idle with no model: the operator on its runtime dependencies (as in its image),
        # and on the project's virtualenv, which also holds the tests' Kubernetes client.
        for name, python in (("rss_mb_start_project_venv", Path(sys.executable)), ("rss_mb_start", operator.python)):
            starting = Operator(cluster, workdir / f"{name}.log", python=python, standalone=True)
            starting.start()
            wait_until(lambda s=starting: _answers(s), timeout=60, interval=0.2)
            time.sleep(5)  # its watches listed (nothing to reconcile)
            out[name] = rss_mb(starting.proc.pid)
            starting.stop()
        operator.start()
        wait_until(lambda: _answers(operator), timeout=60, interval=0.2)
        time.sleep(2)
        served0, cpu0, started, wall0 = served(cluster), control_plane_cpu(cluster), time.monotonic(), time.time()
        create_all(kube, [model_body(f"m-{i}") for i in range(models)])
        done = wait_until(lambda: ready_models(kube) >= models, timeout=models * 3 + 120)
        out["seconds"], out["cpu"] = done - started, control_plane_cpu(cluster) - cpu0
        out["served"] = difference(served(cluster), served0)
        operator.wait_idle()
        time.sleep(1)
        converging = audited(cluster, wall0 - 1, time.time())
        out["reads"], out["writes"] = split(converging)
        out["writes_by_kind"] = writes_by_kind(converging)
        out["rss_mb"] = rss_mb(operator.proc.pid)
        out["frozen"] = operator.metrics().get("inferentia_operator_gc_frozen_objects", 0.0)

        rest0 = time.time()
        time.sleep(rest_seconds)
        reads, writes = split(audited(cluster, rest0, time.time()))
        out["rss_mb_rested"] = rss_mb(operator.proc.pid)
        out["rest_per_minute"] = (reads + writes) * 60 / rest_seconds

        operator.stop()
        restart0 = time.time()
        operator.start()
        out["restart_idle_s"] = operator.wait_idle()
        out["rss_mb_restart"] = rss_mb(operator.proc.pid)  # a new process, which listed everything at once
        out["restart_reads"], out["restart_writes"] = split(audited(cluster, restart0, time.time()))

        out["streams"], out["stream_load"] = {}, {}
        for rate in rates:
            profiler = start_profile(operator, profile, rate)
            depth = QueueDepth(operator)
            cpu_op0, cpu_cp0, t0 = cpu_seconds(operator.proc.pid), control_plane_cpu(cluster), time.monotonic()
            other0, busy0, metrics0 = other_components_cpu(cluster), machine_busy_seconds(), operator.metrics()
            latencies = stream(kube, rate, stream_seconds, prefix=f"s{rate}-")
            wall, metrics1 = time.monotonic() - t0, operator.metrics()
            # Where a new model's time went inside the operator: its wait in the queue's urgent
            # lane, and how long reconciles took (every lane's).
            out.setdefault("stream_inside", {})[rate] = (
                bucket_quantile(metrics1, metrics0, "inferentia_operator_queue_wait_seconds", 'lane="urgent",', 0.5),
                bucket_quantile(metrics1, metrics0, "inferentia_operator_queue_wait_seconds", 'lane="urgent",', 0.99),
                bucket_quantile(metrics1, metrics0, "inferentia_operator_reconcile_duration_seconds", "", 0.5),
                bucket_quantile(metrics1, metrics0, "inferentia_operator_reconcile_duration_seconds", "", 0.99),
                *gc_paused(metrics1, metrics0),
            )
            # The reconciles that finished during the stream, by result: the streamed models' (their
            # creates, their children's and pods' events, coalesced) and any resync's in between.
            # A model's last ones come once its pods are up, which may be after the stream.
            out.setdefault("stream_reconciles", {})[rate] = {
                result: metrics1.get(f'inferentia_operator_reconciles_total{{result="{result}"}}', 0.0)
                - metrics0.get(f'inferentia_operator_reconciles_total{{result="{result}"}}', 0.0)
                for result in ("noop", "changed", "failed")
            }
            out["stream_load"][rate] = (
                (cpu_seconds(operator.proc.pid) - cpu_op0) / wall,
                (control_plane_cpu(cluster) - cpu_cp0) / wall,
                depth.stop(),
                (other_components_cpu(cluster) - other0) / wall,
                (machine_busy_seconds() - busy0) / wall,
            )
            stop_profile(profiler)
            out["streams"][rate] = (percentile(latencies, 50), percentile(latencies, 99))
        operator.wait_idle()  # as after converging: the RSS of the operator at rest with every model
        out["rss_mb_end"] = rss_mb(operator.proc.pid)
        out["frozen_end"] = operator.metrics().get("inferentia_operator_gc_frozen_objects", 0.0)
        return out
    finally:
        operator.stop()
        cluster.down()


def create_cost(per_round: int, rounds: int, workdir: Path) -> dict[str, list[tuple[float, float]]]:
    """(CPU seconds, seconds to write) of each round, by how its children were created."""
    cluster = localcluster.LocalCluster(
        workdir / "creates", fleet_file=fleet(workdir / "creates-fleet.yaml", per_round * rounds), die_with_parent=True
    )
    cluster.up()
    out: dict[str, list[tuple[float, float]]] = {"POST": [], "server-side apply": []}
    try:
        kube = client(cluster)
        for r in range(rounds):
            how = list(out)[r % 2]
            prefix = f"r{r}-"
            bodies = [o for i in range(per_round) for o in children_of(f"{prefix}{i}")[1:]]  # the Service, the Deployment
            write = kube.create if how == "POST" else kube.apply
            idle = idle_cpu_per_second(cluster)
            cpu0, started = control_plane_cpu(cluster), time.monotonic()
            with ThreadPoolExecutor(CLIENT_THREADS) as pool:
                assert all(o is not None for o in pool.map(write, bodies)), "a name was taken"
            wrote = time.monotonic()
            wait_until(lambda p=prefix: available_deployments(kube, p) >= per_round, timeout=per_round + 120)
            time.sleep(3)  # the controllers' last writes
            out[how].append((control_plane_cpu(cluster) - cpu0 - idle * (time.monotonic() - started), wrote - started))
            print(f"round {r + 1} of {rounds}, {how}: {out[how][-1][0]:.1f} s CPU, {out[how][-1][1]:.1f} s to write", flush=True)
        return out
    finally:
        cluster.down()


def memory_run(models: int, workdir: Path, rates: list[int], stream_seconds: int, trace: bool = True) -> dict:
    """--memory: the operator with tracemalloc on (cluster/operator_memory.py), its live
    allocations by line after converging on ``models`` and after the streams; no other figure,
    since tracing slows the operator several times over."""
    extra = sum(rates) * stream_seconds
    cluster = localcluster.LocalCluster(workdir / "memory", fleet_file=fleet(workdir / "fleet.yaml", models + extra), die_with_parent=True)
    cluster.up()
    operator = Operator(cluster, workdir / "operator.log", memory_dump=workdir / "allocations.txt", trace=trace)
    try:
        cluster.install_crds()
        kube = client(cluster)
        operator.start()
        wait_until(lambda: _answers(operator), timeout=120, interval=0.5)
        create_all(kube, [model_body(f"m-{i}") for i in range(models)])
        wait_until(lambda: ready_models(kube) >= models, timeout=models * 10 + 300)
        operator.wait_idle(timeout=1800)
        out = {"converged": operator.allocations(), "rss_mb": rss_mb(operator.proc.pid)}
        # Printed at once as well: tracing may make the streams' part long.
        print(f"after converging on {models:,} models, RSS {out['rss_mb']:.0f} MB:", file=sys.stderr)
        for size, count, where in out["converged"][:16]:
            print(f"  {size / 2**20:7.1f} MB {count:9,} {where}", file=sys.stderr, flush=True)
        for rate in rates:
            stream(kube, rate, stream_seconds, prefix=f"s{rate}-")
        wait_until(lambda: ready_models(kube) >= models + extra, timeout=extra * 10 + 300)
        operator.wait_idle(timeout=1800)
        out["end"], out["rss_mb_end"], out["models_end"] = operator.allocations(), rss_mb(operator.proc.pid), models + extra
        return out
    finally:
        operator.stop()
        cluster.down()


def memory_table(run: dict, models: int, top: int = 15) -> str:
    """The lines whose live objects hold the most at the end, beside what they held after converging."""

    def by_site(rows: list[tuple[int, int, str]]) -> dict[str, tuple[int, int]]:
        return {where: (size, count) for size, count, where in rows}

    first, end = by_site(run["converged"]), by_site(run["end"])

    def short(where: str) -> str:
        for marker in ("site-packages/", "/operator/", "/lib/python3"):
            if marker in where:
                return where.split(marker, 1)[1] if marker != "/lib/python3" else "python3" + where.split(marker, 1)[1]
        return where

    lines = [
        f"| allocated at | MB at {models:,} | MB at {run['models_end']:,} | objects at {run['models_end']:,} |",
        "|---|---|---|---|",
    ]
    total0, total1 = first.get("total", (0, 0)), end.get("total", (0, 0))
    lines.append(f"| all traced | {total0[0] / 2**20:.1f} | {total1[0] / 2**20:.1f} | {total1[1]:,} |")
    # The allocators beneath (operator_memory.py): size, and in use (or free) in the count's place.
    for label, second in (("pymalloc arenas", "in use"), ("glibc heaps", "free"), ("glibc mmapped", "")):
        key = next((w for w in end if w.startswith(f"[{label}")), None)
        if key is not None:
            (a0, b0), (a1, b1) = first.get(key, (0, 0)), end[key]
            detail = f" ({second} {b0 / 2**20:.1f} / {b1 / 2**20:.1f})" if second else ""
            lines.append(f"| {label}{detail} | {a0 / 2**20:.1f} | {a1 / 2**20:.1f} | |")
    for where, (size, count) in sorted(
        ((w, v) for w, v in end.items() if w != "total" and not w.startswith("[")), key=lambda kv: -kv[1][0]
    )[:top]:
        lines.append(f"| `{short(where)}` | {first.get(where, (0, 0))[0] / 2**20:.1f} | {size / 2**20:.1f} | {count:,} |")
    return "\n".join(lines)


def _answers(operator: Operator) -> bool:
    try:
        operator.metrics()
        return True
    except OSError:
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=1000)
    parser.add_argument("--rest-seconds", type=int, default=180)
    parser.add_argument("--stream-seconds", type=int, default=30)
    parser.add_argument("--rates", default="10,20")
    parser.add_argument("--workers", type=int, help="the operator's --workers (default: its own default)")
    parser.add_argument("--profile", type=Path, help="write py-spy profiles of the operator during each stream here, and summarise them")
    parser.add_argument(
        "--untraced", action="store_true",
        help="with --memory: no tracemalloc, only what pymalloc's arenas and glibc's heaps hold (pymalloc reports nothing while traced)",
    )  # fmt: skip
    parser.add_argument(
        "--memory", action="store_true",
        help="instead: which lines' live objects hold the operator's memory, after converging and at the end (tracemalloc; no other figure)",
    )  # fmt: skip
    parser.add_argument(
        "--creates", type=int, metavar="K", help="instead: a Service and Deployment created by POST against by apply, in rounds of K models"
    )
    parser.add_argument("--rounds", type=int, default=8, help="with --creates: rounds, alternating, the first of each way a warm-up")
    args = parser.parse_args()
    rates = [int(r) for r in args.rates.split(",") if r]
    localcluster.bin_dir()
    n = args.models
    if args.creates:
        with tempfile.TemporaryDirectory() as tmp:
            rounds = create_cost(args.creates, args.rounds, Path(tmp))
        print(
            f"\n{args.creates} models a round, {args.rounds} rounds ({time.strftime('%Y-%m-%d')}, "
            f"python cluster/benchmark_scale.py --creates {args.creates} --rounds {args.rounds}); the first round of each way left out\n"
        )
        print("| created by | API server + etcd CPU a model | seconds to write a round |")
        print("|---|---|---|")
        for how, measured in rounds.items():
            kept = measured[1:]
            cpu = [c / args.creates * 1000 for c, _ in kept]
            print(
                f"| {how} | {statistics.mean(cpu):.1f} ms (rounds: {', '.join(f'{c:.1f}' for c in cpu)}) | {statistics.mean(w for _, w in kept):.1f} s |"
            )
        return 0
    if args.memory:
        with tempfile.TemporaryDirectory() as tmp:
            run = memory_run(n, Path(tmp), rates, args.stream_seconds, trace=not args.untraced)
        print(
            f"\nN = {n} models, then {run['models_end']:,} ({time.strftime('%Y-%m-%d')}, "
            f"python cluster/benchmark_scale.py --models {n} --memory{' --untraced' if args.untraced else ''})"
        )
        print(f"operator RSS{'' if args.untraced else ' under tracemalloc'}: {run['rss_mb']:.0f} MB, then {run['rss_mb_end']:.0f} MB\n")
        print(memory_table(run, n))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        base = floor(n, workdir, rates, args.stream_seconds)
        op = with_operator(n, workdir, args.rest_seconds, rates, args.stream_seconds, args.profile, args.workers)

    def row(what, value, goal, ok):
        print(f"| {what} | {value} | {goal} | {'met' if ok else 'NOT met'} |")

    print(f"\nN = {n} models, {os.cpu_count()} CPUs ({time.strftime('%Y-%m-%d')})\n")
    print("| measure | figure | goal | |")
    print("|---|---|---|---|")
    ratio = op["seconds"] / base["seconds"]
    row(
        "convergence, operator / bare-API floor",
        f"{op['seconds']:.1f} s / {base['seconds']:.1f} s = {ratio:.2f}x",
        "≤ 1.25x",
        ratio <= 1.25,
    )
    cpu_ratio = op["cpu"] / base["cpu"]
    row(
        "API server + etcd CPU while converging",
        f"{op['cpu']:.1f} s / {base['cpu']:.1f} s = {cpu_ratio:.2f}x",
        "≤ 1.1x",
        cpu_ratio <= 1.1,
    )
    print(f"| (of the operator's run: the {n:,} models' own creates, measured apart with no controller) | {base['models_cpu']:.1f} s | | |")
    reads, writes = op["reads"] / n, op["writes"] / n
    row(
        "requests per model while converging", f"{reads:.2f} reads, {writes:.2f} writes", "≤ 1 read, ≤ 5 writes", reads <= 1 and writes <= 5
    )
    row("requests per minute at rest (peering excluded)", f"{op['rest_per_minute']:.1f}", "0", op["rest_per_minute"] == 0)
    total = n + sum(rates) * args.stream_seconds
    print(
        f"| (operator RSS at start with no model: {op['rss_mb_start']:.0f} MB on its runtime dependencies, as in its image; "
        f"{op['rss_mb_start_project_venv']:.0f} MB on the project's virtualenv, with the Kubernetes client kopf loads) | | | |"
    )
    row(
        f"operator RSS after converging on {n:,} / on {total:,} models (after the restart: {op['rss_mb_restart']:.0f} MB)",
        f"{op['rss_mb']:.0f} MB / {op['rss_mb_end']:.0f} MB",
        "≤ 150 MB at 1,000 / ≤ 250 MB at 1,900",
        op["rss_mb"] <= 150 and op["rss_mb_end"] <= 250,
    )
    row(
        "restart over unchanged models: time to idle, writes",
        f"{op['restart_idle_s']:.1f} s, {op['restart_writes']} writes ({op['restart_reads']} reads)", "0 writes", op["restart_writes"] == 0,
    )  # fmt: skip
    for rate, (p50, p99) in op["streams"].items():
        floor_p50, floor_p99 = base["streams"][rate]
        row(
            f"create → Deployment at {rate}/s, operator / floor",
            f"p50 {p50 * 1000:.0f} / {floor_p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} / {floor_p99 * 1000:.0f} ms = {p99 / floor_p99:.2f}x",
            "p99 ≤ 1.5x the floor's",
            p99 <= 1.5 * floor_p99,
        )
    for rate, (operator_cpu, control_plane, depth, others, machine) in op["stream_load"].items():
        print(
            f"\nduring the stream at {rate}/s: operator {operator_cpu:.2f} CPUs, API server + etcd {control_plane:.2f} CPUs, "
            f"the cluster's other components {others:.2f} CPUs; the whole machine busy {machine:.2f} of {os.cpu_count()} CPUs; "
            f"work queue at most {depth:.0f} deep"
        )
        floor_control_plane, floor_others, floor_machine = base["stream_load"][rate]
        print(
            f"  the floor's stream at {rate}/s: API server + etcd {floor_control_plane:.2f} CPUs, the cluster's other components "
            f"{floor_others:.2f} CPUs; the whole machine busy {floor_machine:.2f} of {os.cpu_count()} CPUs"
        )
        wait50, wait99, took50, took99, gc_seconds, gc_full, gc_longest = op["stream_inside"][rate]
        print(
            f"  inside the operator (bucket bounds): a new model's wait in the queue p50 ≤ {wait50 * 1000:.0f} ms, "
            f"p99 ≤ {wait99 * 1000:.0f} ms; a reconcile took p50 ≤ {took50 * 1000:.0f} ms, p99 ≤ {took99 * 1000:.0f} ms; "
            f"garbage collection {gc_seconds:.2f} s in all, {gc_full:.0f} full collections, the longest ≤ {gc_longest * 1000:.0f} ms"
        )
        streamed = rate * args.stream_seconds
        print(
            "  reconciles during the stream, per model streamed (a model's later ones, its Ready among them, may fall after it): "
            + ", ".join(f"{result} {count / streamed:.2f}" for result, count in op["stream_reconciles"][rate].items())
        )
        if args.profile:
            summarize(args.profile / f"stream-{rate}.txt")
    print(
        f"\nobjects frozen out of the collector's full collections after converging: {op['frozen']:,.0f};"
        f" at the end: {op['frozen_end']:,.0f}"
    )
    print(
        f"operator RSS after converging, then after the rest of {args.rest_seconds:.0f} s: {op['rss_mb']:.0f} MB, then {op['rss_mb_rested']:.0f} MB"
    )
    print("\nwrites per model while converging: " + ", ".join(f"{what} {k / n:.2f}" for what, k in op["writes_by_kind"].items()))
    print("\nwhat the API server sent and answered while converging (its /metrics; the floor's up to its Deployments available):\n")
    print(attribution(op["served"], base["served"], n))
    return 0


if __name__ == "__main__":
    sys.exit(main())
