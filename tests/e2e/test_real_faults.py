"""Faults on the real node, with traffic: requests flow through the model's Service the
whole time, the model's status is read every second, and each pod is asked directly, so a
fault's cost is measured three ways: what clients saw, how long until they were served
again, and whether the status told the truth meanwhile.

The status is true at an instant when ``Ready=True`` exactly when every replica serves:
each pod answers when asked directly, and the requests through the Service in the last
second were all answered. Kubernetes needs time to notice (readiness probes every 5 s,
three failures), so the figure is the longest stretch in which the two disagreed, against
a goal. Each test records its row; the session writes them to build/fault-report.json and
``python cluster/fault_table.py`` prints the table docs/faults.md shows.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kit import LOCAL_IMAGE, wait_for
from test_real_node import apply, serving_pods, standin_spec, wait_ready, why_not_ready

pytestmark = [pytest.mark.faults, pytest.mark.usefixtures("operator")]

REPORT = Path(__file__).resolve().parents[2] / "build" / "fault-report.json"
STATUS_LAG_GOAL = 20.0  # readiness probes: every 5 s, 3 failures; then the operator's reconcile

# The faults, each with its goal: what a platform team may expect of a model of two replicas.
FAULTS = {
    "kill -9 of a serving process": "the pod restarts itself; clients through the Service keep being answered by the other replica",
    "kill -9 of the batching front end": "the container restarts; clients keep being answered by the other replica",
    "a pod's model processes paused for 5 s, then resumed": (
        "nothing restarts; requests the paused pod cannot answer in its latency budget are shed; served again within 2 s of the resume"
    ),
    "a Neuron hardware error reported on the node": (
        "status names each replica within 20 s; nothing is evicted while no other node can take it; no request fails"
    ),
    "containerd restarted": "running pods keep running: no request fails",
    "kubelet stopped for 60 s": "the node goes NotReady and the status says so; served again within 60 s of the kubelet's return",
    "API server down for 30 s": "serving goes on: no request fails",
    "object store unreachable while a new pod fetches": "the new pod retries and the status says why; nothing half-fetched is served",
    "object store unreachable while a new pod fetches, node cache in place": (
        "as without the cache: the marker is the store's, so the fetch waits for it; then the files come from the node"
    ),
    "the operator's pod deleted (installed by Helm)": "serving goes on: no request fails, and nothing is created twice",
}


@dataclass
class FaultRow:
    fault: str
    goal: str
    sent: int = 0
    failed: int = 0
    lasted_s: float = 0.0  # from the fault until it was undone (0: a kill, undone by Kubernetes)
    recovered_s: float = 0.0  # from the fault until the last failed request
    served_again_s: float = 0.0  # from the fault's end until the last failed request
    status_lag_s: float = 0.0  # the longest the status disagreed with what was served
    status_unreadable_s: float = 0.0  # the API server did not answer
    status_said: list[str] = field(default_factory=list)  # Ready's reasons and messages while not Ready
    met: bool = False


RESULTS: list[FaultRow] = []


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    if RESULTS:
        REPORT.parent.mkdir(exist_ok=True)
        old = json.loads(REPORT.read_text()) if REPORT.exists() else {}
        rows = {r["fault"]: r for r in old.get("rows", [])}
        rows.update({r.fault: asdict(r) for r in RESULTS})
        stamp = time.strftime("%Y-%m-%d", time.gmtime())
        REPORT.write_text(json.dumps({"date": stamp, "rows": [rows[f] for f in FAULTS if f in rows]}, indent=1))


class Watch:
    """Requests through the Service, direct asks of each pod, and the model's status, in
    threads, each sample stamped with time.monotonic()."""

    def __init__(self, cluster, namespace: str, name: str, body: Any = (1, 2), answered: Callable[[Any], bool] | None = None):
        """``body``: what every request sends; ``answered``: whether a reply is right (the
        stand-in's echo of the input, by default)."""
        self.cluster, self.namespace, self.name = cluster, namespace, name
        self.body = json.dumps(list(body)).encode()
        self.answered = answered or (lambda reply: reply["input"] == [1, 2])
        svc = cluster.get("service", name, "-n", namespace)
        port = next(p["port"] for p in svc["spec"]["ports"] if p["name"] == "batch")
        self.url = f"http://{svc['spec']['clusterIP']}:{port}/predict"
        self.pod_port = port
        self.requests: list[tuple[float, bool]] = []
        self.direct: list[tuple[float, int]] = []  # pods that answered directly
        self.status: list[tuple[float, str | None, str, str]] = []  # Ready's status (None: unreadable), reason, message
        self.desired = cluster.get("inferentiamodel", name, "-n", namespace)["spec"]["replicas"]
        self.pod_ips: list[str] = [p["status"]["podIP"] for p in serving_pods(cluster, namespace, name)]
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=t, daemon=True) for t in (self._traffic, self._ask_pods, self._read_status)]

    def __enter__(self) -> Watch:
        for t in self._threads:
            t.start()
        time.sleep(3)  # a baseline before the fault
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(10)

    def _ok(self, url: str) -> bool:
        request = urllib.request.Request(url, self.body, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=2) as r:
                return r.status == 200 and bool(self.answered(json.loads(r.read())))
        except (OSError, ValueError, KeyError, TypeError, urllib.error.HTTPError):
            return False

    def _traffic(self) -> None:
        while not self._stop.is_set():
            self.requests.append((time.monotonic(), self._ok(self.url)))
            time.sleep(0.1)

    def _ask_pods(self) -> None:
        while not self._stop.is_set():
            ips = list(self.pod_ips)
            self.direct.append((time.monotonic(), sum(self._ok(f"http://{ip}:{self.pod_port}/predict") for ip in ips)))
            time.sleep(0.5)

    def _read_status(self) -> None:
        while not self._stop.is_set():
            at = time.monotonic()
            got = self.cluster.kubectl(
                "get", "inferentiamodel", self.name, "-n", self.namespace, "-o", "json", "--request-timeout=2s", check=False
            )
            if got.returncode:
                self.status.append((at, None, "", ""))
            else:
                conds = json.loads(got.stdout).get("status", {}).get("conditions") or []
                ready = next((c for c in conds if c["type"] == "Ready"), {})
                self.status.append((at, ready.get("status"), ready.get("reason", ""), ready.get("message", "")))
                pods = self.cluster.kubectl(
                    "get",
                    "pods",
                    "-n",
                    self.namespace,
                    "-l",
                    f"inferentia.dev/model={self.name}",
                    "-o",
                    "json",
                    "--request-timeout=2s",
                    check=False,
                )
                if pods.returncode == 0:
                    ips = [
                        p["status"].get("podIP") for p in json.loads(pods.stdout)["items"] if p["metadata"].get("deletionTimestamp") is None
                    ]
                    self.pod_ips = [ip for ip in ips if ip]
            time.sleep(max(0.0, 1.0 - (time.monotonic() - at)))

    # --- figures ------------------------------------------------------------------------

    def serving_at(self, t: float) -> bool:
        """Every replica answered directly, and every request through the Service in the second before t."""
        direct = [n for at, n in self.direct if at <= t]
        recent = [ok for at, ok in self.requests if t - 1.0 <= at <= t]
        return bool(direct) and direct[-1] >= self.desired and all(recent)

    def row(self, fault: str, since: float, ended: float | None = None) -> FaultRow:
        """The figures from ``since`` (the fault) and ``ended`` (when it was undone)."""
        row = FaultRow(fault, FAULTS[fault])
        ended = since if ended is None else ended
        row.lasted_s = round(ended - since, 1)
        during = [(at, ok) for at, ok in self.requests if at >= since]
        row.sent, row.failed = len(during), sum(1 for _, ok in during if not ok)
        last_failure = max((at for at, ok in during if not ok), default=since)
        row.recovered_s = round(last_failure - since, 1)
        row.served_again_s = round(max(0.0, last_failure - ended), 1)
        lag, start, unreadable, previous = 0.0, None, 0.0, None
        for at, ready, reason, message in self.status:
            if previous is not None and ready is None:
                unreadable += at - previous
            previous = at
            if ready is None:
                continue  # no status to judge: counted as unreadable
            if ready != "True" and reason:
                said = f"{reason}: {message}"
                if said not in row.status_said:
                    row.status_said.append(said)
            if (ready == "True") != self.serving_at(at):
                start = at if start is None else start
                lag = max(lag, at - start)
            else:
                start = None
        row.status_lag_s, row.status_unreadable_s = round(lag, 1), round(unreadable, 1)
        return row


def pids_in_pod(pod_uid: str, container_cmd: str) -> list[int]:
    """Host PIDs of a pod's processes whose command line contains ``container_cmd``, found
    by the pod's cgroup (the kubelet names it after the pod's UID)."""
    marks = (pod_uid, pod_uid.replace("-", "_"))
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cgroup = Path(f"/proc/{entry}/cgroup").read_text()
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(m in cgroup for m in marks) and container_cmd.encode() in b" ".join(argv):
            found.append(int(entry))
    return found


SPEC = {"replicas": 2, "processesPerReplica": 2, "serving.batching": {"maxBatchSize": 4, "maxLatencyMs": 200}}


@pytest.fixture
def served(real_node, real_namespace):
    """A model of two replicas of two processes each, behind the batching front end, Ready."""
    apply(real_node, real_namespace, "faulted", standin_spec(**SPEC))
    wait_ready(real_node, real_namespace, "faulted")
    return real_node, real_namespace


def record(row: FaultRow, met: bool) -> FaultRow:
    row.met = met
    RESULTS.append(row)
    return row


def wait_all_ready(cluster, namespace: str, timeout: float = 150) -> None:
    wait_ready(cluster, namespace, "faulted", timeout=timeout)


def kill_9_in_a_pod(served, command: str, container: str, fault: str) -> FaultRow:
    """kill -9 of the first process of ``command`` (not a shell) in one serving pod, with
    traffic flowing, until ``container`` has restarted and the model is Ready again."""
    cluster, ns = served
    pod = serving_pods(cluster, ns, "faulted")[0]
    with Watch(cluster, ns, "faulted") as watch:
        since = time.monotonic()
        found = [p for p in pids_in_pod(pod["metadata"]["uid"], command) if not _is_shell(p)]
        assert found, f"no {command} process found in the pod"
        os.kill(found[0], 9)
        wait_for(lambda: _restarts(cluster, ns, pod["metadata"]["name"], container) >= 1, 60, f"the {container} container to restart")
        wait_all_ready(cluster, ns)
        time.sleep(5)
    row = watch.row(fault, since)
    assert row.sent > 0
    record(row, row.status_lag_s <= STATUS_LAG_GOAL and row.recovered_s <= 60)
    return row


def test_kill_9_of_a_serving_process(served):
    row = kill_9_in_a_pod(served, "neuron-serve", "serve", "kill -9 of a serving process")
    assert row.status_lag_s <= STATUS_LAG_GOAL, row


def test_kill_9_of_the_batching_front_end(served):
    row = kill_9_in_a_pod(served, "inferentia-operator", "batcher", "kill -9 of the batching front end")
    assert row.status_lag_s <= STATUS_LAG_GOAL, row


def test_a_pods_model_processes_paused_and_resumed_under_load(served):
    """A slow batch, a GC pause or a runtime hiccup, as SIGSTOP and SIGCONT of the model processes
    of one pod while traffic flows: the front end sheds what it cannot answer within its budget,
    and once the processes are back it learns so from a probe batch and serves again at once,
    with no container restarted (its estimate used to stay over the budget for good)."""
    fault = "a pod's model processes paused for 5 s, then resumed"
    cluster, ns = served
    pod = serving_pods(cluster, ns, "faulted")[0]
    before = _all_restarts(pod)
    found = [p for p in pids_in_pod(pod["metadata"]["uid"], "neuron-serve") if not _is_shell(p)]
    assert len(found) >= 2, f"the pod's two model processes were not found: {found}"
    with Watch(cluster, ns, "faulted") as watch:  # traffic first: the front end learns the model's pace
        since = time.monotonic()
        for pid in found:
            os.kill(pid, signal.SIGSTOP)
        time.sleep(5)
        for pid in found:
            os.kill(pid, signal.SIGCONT)
        ended = time.monotonic()
        time.sleep(10)
    row = watch.row(fault, since, ended)
    after = _all_restarts(cluster.get("pod", pod["metadata"]["name"], "-n", ns))
    assert row.sent > 0
    record(row, row.served_again_s <= 2.0 and after == before and row.status_lag_s <= STATUS_LAG_GOAL)
    assert after == before, f"a container restarted: {before} -> {after}"
    assert row.served_again_s <= 2.0, row


def test_a_neuron_hardware_error_on_the_node_is_named_and_nothing_is_evicted_without_another_node(served):
    """AWS's node problem detector sets NeuronHealth=True (reason NeuronHasError_<error>) on a node
    whose Neuron driver logs a hardware error. Both replicas run on the one real node, and it is
    cordoned, so a replacement could not come back there: but no other node could take one
    either, so nothing is evicted, the model keeps serving, and its status names every replica."""
    fault = "a Neuron hardware error reported on the node"
    cluster, ns = served
    import realnode

    node = realnode.NODE_NAME
    pods = {p["metadata"]["name"] for p in serving_pods(cluster, ns, "faulted")}

    def set_health(status: str, reason: str) -> None:
        condition = {"type": "NeuronHealth", "status": status, "reason": reason, "message": f"{reason} (set by the fault suite)"}
        cluster.kubectl(
            "patch", "node", node, "--subresource=status", "--type=strategic", "-p", json.dumps({"status": {"conditions": [condition]}})
        )

    def named() -> bool:
        said = next(
            (
                c
                for c in cluster.get("inferentiamodel", "faulted", "-n", ns)["status"].get("conditions") or []
                if c["type"] == "DeviceFault"
            ),
            {},
        )
        return said.get("status") == "True" and all(f"pod {p} on node {node}" in said.get("message", "") for p in pods)

    with Watch(cluster, ns, "faulted") as watch:
        since = time.monotonic()
        try:
            set_health("True", "NeuronHasError_DMA_ERROR")
            cluster.kubectl("cordon", node)
            wait_for(named, 20, "the model's status to name both replicas")
            named_after = time.monotonic() - since
            time.sleep(15)  # long enough for an eviction to show
            after = {p["metadata"]["name"] for p in serving_pods(cluster, ns, "faulted")}
        finally:
            cluster.kubectl("uncordon", node)
            set_health("False", "NeuronHasNoError")
        ended = time.monotonic()
        wait_for(lambda: not named(), 30, "DeviceFault to go")
    row = watch.row(fault, since, ended)
    record(row, row.failed == 0 and after == pods and named_after <= 20)
    assert after == pods, f"a replica was evicted with nowhere to go: {pods} -> {after}"
    assert row.failed == 0, row


def test_containerd_restarted_leaves_running_pods_running(served):
    cluster, ns = served
    before = {p["metadata"]["name"]: _all_restarts(p) for p in serving_pods(cluster, ns, "faulted")}
    with Watch(cluster, ns, "faulted") as watch:
        since = time.monotonic()
        cluster.local.stop_component("containerd")
        time.sleep(5)
        cluster.local.start_component("containerd")
        ended = time.monotonic()
        time.sleep(20)  # the kubelet reconnects and relists
    after = {p["metadata"]["name"]: _all_restarts(p) for p in serving_pods(cluster, ns, "faulted")}
    row = watch.row("containerd restarted", since, ended)
    record(row, row.failed == 0 and after == before)
    assert after == before, "a container restarted or a pod was replaced"
    assert row.failed == 0, row


def test_kubelet_stopped_for_a_minute(served):
    cluster, ns = served
    import realnode

    node = realnode.NODE_NAME
    with Watch(cluster, ns, "faulted") as watch:
        since = time.monotonic()
        cluster.local.stop_component("kubelet")
        try:
            wait_for(lambda: not _node_ready(cluster, node), 120, "the node to go NotReady")
            time.sleep(max(0.0, 60 - (time.monotonic() - since)))
        finally:
            cluster.local.start_component("kubelet")
        ended = time.monotonic()
        wait_for(lambda: _node_ready(cluster, node), 120, "the node Ready again")
        wait_all_ready(cluster, ns, timeout=180)
        time.sleep(5)
    row = watch.row("kubelet stopped for 60 s", since, ended)
    said_unready = any("ReplicasUnavailable" in s or "RollingOut" in s for s in row.status_said)
    record(row, said_unready and row.served_again_s <= 60 and row.status_lag_s <= STATUS_LAG_GOAL)
    assert said_unready, row
    assert row.status_lag_s <= STATUS_LAG_GOAL, row


def test_the_api_server_down_while_traffic_flows(served):
    cluster, ns = served
    with Watch(cluster, ns, "faulted") as watch:
        since = time.monotonic()
        cluster.local.stop_component("kube-apiserver")
        time.sleep(30)
        cluster.local.start_component("kube-apiserver")
        ended = time.monotonic()
        time.sleep(10)
    row = watch.row("API server down for 30 s", since, ended)
    record(row, row.failed == 0)
    # The controllers' watches come back after the outage with a back-off: the next test's
    # namespace needs its ServiceAccount, so wait until a new namespace gets one again.
    probe = f"after-outage-{ns[-8:]}"
    cluster.kubectl("create", "namespace", probe)
    try:
        wait_for(lambda: cluster.kubectl("get", "sa", "default", "-n", probe, check=False).returncode == 0, 180, "controllers back")
    finally:
        cluster.kubectl("delete", "namespace", probe, "--wait=false", check=False)
    assert row.status_unreadable_s >= 20, row  # the outage happened
    assert row.failed == 0, row


@pytest.mark.parametrize("node_cache", [False, True], ids=["store", "node-cache"])
def test_the_object_store_unreachable_while_a_new_pod_fetches(real_node, real_namespace, operator, tmp_path, request, node_cache):
    """A real network (compiled by the compile Job into the object store) scaled from one
    replica to two while pods cannot reach the store: the new pod's fetch fails and is
    retried, the status quotes the failure, and once the store is back the new pod serves
    answers equal to the network's own, so nothing half-fetched was served. With the node cache
    in place (the operator run with it, the first replica having filled it) the same holds: the
    cache is never the authority, the store's marker is; once it is readable, the new pod's files
    come from the node."""
    from kit import OperatorProcess
    from test_real_node import close, expected_answers, torch_spec, upload_reference_models
    from test_real_node_cache import MODEL_CACHE_BYTES, cache_metric, start_node_cache

    import realnode

    cluster, ns = real_node, real_namespace
    fault = "object store unreachable while a new pod fetches" + (", node cache in place" if node_cache else "")
    if node_cache:
        _, pod_url, cache = start_node_cache(cluster, ns, MODEL_CACHE_BYTES, request)
        operator.stop()  # this test's operator knows of the cache; the session's waits
        cached = OperatorProcess(
            operator.kubeconfig, tmp_path / "operator.log", peering="e2e-fault-cache",
            extra_args=("--node-cache-url", cache, "--node-cache-namespace", ns),
        )  # fmt: skip
        request.addfinalizer(operator.start)
        request.addfinalizer(cached.stop)
        cached.start()
    bucket = upload_reference_models(cluster, ns, tmp_path)
    spec = torch_spec(bucket, "conv.pt", replicas=1)
    apply(cluster, ns, "faulted", spec)
    wait_all_ready(cluster, ns, timeout=400)
    [expected] = expected_answers(tmp_path, "conv.pt", [[1.0, 2.0]])
    hits = cache_metric(pod_url, "inferentia_node_cache_hits_total") if node_cache else 0.0
    if node_cache:
        assert cache_metric(pod_url, "inferentia_node_cache_stored_total") >= 1  # the first replica filled it
    port = cluster.local.object_store().rsplit(":", 1)[1]
    chain = realnode.FORWARD_CHAIN + "-FAULT"
    block = ["INPUT", "-i", realnode.BRIDGE, "-p", "tcp", "--dport", port, "-j", chain]
    subprocess.run(["iptables", "-N", chain], check=True)
    subprocess.run(["iptables", "-A", chain, "-j", "REJECT", "--reject-with", "icmp-host-unreachable"], check=True)
    subprocess.run(["iptables", "-I", *block], check=True)
    try:
        with Watch(cluster, ns, "faulted", body=[1.0, 2.0], answered=lambda reply: close(reply, expected)) as watch:
            watch.desired = 2
            since = time.monotonic()
            apply(cluster, ns, "faulted", torch_spec(bucket, "conv.pt", replicas=2))

            def status_says_why() -> bool:
                status = cluster.get("inferentiamodel", "faulted", "-n", ns)["status"]
                ready = next(c for c in status["conditions"] if c["type"] == "Ready")
                # The new pod is counted as fetching, the other as ready: a scale-up never compiles.
                counts = status.get("pods") or {}
                return (
                    ready["status"] == "False"
                    and "fetch-artifacts failed" in ready["message"]
                    and (counts.get("fetching"), counts.get("ready")) == (1, 1)
                )

            try:
                wait_for(status_says_why, 180, "the status to quote the failed fetch")
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{why_not_ready(cluster, ns, 'faulted')}") from None
            subprocess.run(["iptables", "-D", *block], check=True)
            ended = time.monotonic()
            wait_all_ready(cluster, ns, timeout=300)
            time.sleep(5)
    finally:
        subprocess.run(["iptables", "-D", *block], check=False, capture_output=True)
        subprocess.run(["iptables", "-F", chain], check=False)
        subprocess.run(["iptables", "-X", chain], check=False)
    row = watch.row(fault, since, ended)
    from_the_node = not node_cache or cache_metric(pod_url, "inferentia_node_cache_hits_total") > hits
    record(row, row.failed == 0 and any("fetch-artifacts failed" in s for s in row.status_said) and from_the_node)
    assert row.failed == 0, row
    assert from_the_node, "with the cache in place, the new pod's files came from the store, not the node"
    assert len(serving_pods(cluster, ns, "faulted")) == 2
    assert watch.direct[-1][1] == 2  # both pods, asked directly, answer as the network does


def test_the_operators_pod_deleted_under_load(real_node, real_namespace):
    """The operator as users install it (helm install --wait), its pod deleted while requests
    flow: the Deployment brings a new one, which resumes without creating anything twice."""
    from test_real_node import CHART, names, ready_pods, real_node_namespace

    cluster, ns = real_node, real_namespace
    release_ns = real_node_namespace(cluster, f"op-faults-{ns[-6:]}", "pod-security.kubernetes.io/enforce=restricted")
    helm = [cluster.tool("helm"), "-n", release_ns]
    install = subprocess.run(
        [*helm, "install", "op", str(CHART), *LOCAL_IMAGE, "--set", f"watchNamespaces={{{ns}}}", "--set", f"peeringName=op-{release_ns}",
         "--wait", "--timeout", "180s"],
        capture_output=True, text=True, env=cluster.env, timeout=240,
    )  # fmt: skip
    try:
        assert install.returncode == 0, install.stderr
        apply(cluster, ns, "faulted", standin_spec(**SPEC))
        wait_all_ready(cluster, ns)
        children = {kind: names(cluster, kind, ns) for kind in ("deployments", "services", "configmaps", "replicasets")}
        [op_pod] = cluster.get("pods", "-n", release_ns, "-l", "app.kubernetes.io/name=inferentia-operator")["items"]
        with Watch(cluster, ns, "faulted") as watch:
            since = time.monotonic()
            cluster.kubectl("delete", "pod", "-n", release_ns, op_pod["metadata"]["name"], "--wait=true")
            wait_for(lambda: len(ready_pods(cluster, release_ns)) == 1, 120, "a new operator pod Ready")
            time.sleep(10)
        row = watch.row("the operator's pod deleted (installed by Helm)", since)
        same = {kind: names(cluster, kind, ns) for kind in children} == children
        record(row, row.failed == 0 and same and row.status_lag_s <= STATUS_LAG_GOAL)
        assert same and row.failed == 0, row
    finally:
        subprocess.run([*helm, "uninstall", "op", "--wait", "--timeout", "60s"], capture_output=True, env=cluster.env, timeout=90)
        cluster.kubectl("delete", "namespace", release_ns, "--wait=false", check=False)


# --- helpers ----------------------------------------------------------------------------------


def _is_shell(pid: int) -> bool:
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return True
    return os.path.basename(argv0) in (b"sh", b"bash", b"dash")


def _restarts(cluster, namespace: str, pod: str, container: str) -> int:
    got = cluster.get("pod", pod, "-n", namespace)
    return next((c["restartCount"] for c in got["status"].get("containerStatuses") or [] if c["name"] == container), 0)


def _all_restarts(pod: dict) -> dict[str, int]:
    return {c["name"]: c["restartCount"] for c in pod["status"].get("containerStatuses") or []}


def _node_ready(cluster, node: str) -> bool:
    conds = cluster.get("node", node)["status"]["conditions"]
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)
