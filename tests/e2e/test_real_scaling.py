"""Scaling real pods on the real node: a scale-down under load loses no request, and a
model cycled down and up gets the NeuronCores the kubelet granted each new pod, never cores
a process of an old pod still holds."""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request

import pytest
from kit import wait_for
from test_real_node import apply, granted_cores, process_envs, routed, serving_pods, standin_spec, wait_ready, why_not_ready

pytestmark = pytest.mark.usefixtures("operator")

BATCHED = {"processesPerReplica": 2, "serving.batching": {"maxBatchSize": 4, "maxLatencyMs": 2000}}


class Load:
    """Clients sending through the Service, each a request at a time, a new connection each:
    here the batching front end's echo of [client, request]; a subclass asks for something else
    (``body``, ``answered``) within its own ``timeout``."""

    timeout = 10.0  # one request's

    def __init__(self, url: str, clients: int = 4):
        self.url, self.results = url, []  # (time, status or error)
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(clients)]

    def body(self, i: int, n: int) -> bytes:
        return json.dumps([i, n]).encode()

    def answered(self, answer: dict, i: int, n: int) -> bool:
        return answer["input"] == [i, n]

    def _client(self, i: int) -> None:
        n = 0
        while not self._stop.is_set():
            request = urllib.request.Request(self.url, self.body(i, n), {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as r:
                    ok = r.status == 200 and self.answered(json.loads(r.read()), i, n)
                    self.results.append((time.monotonic(), 200 if ok else "wrong answer"))
            except urllib.error.HTTPError as exc:
                self.results.append((time.monotonic(), exc.code))
            except OSError as exc:
                # The reason too (refused, reset, timed out): which step of a pod's going failed.
                self.results.append((time.monotonic(), f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"))
            n += 1

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(self.timeout + 5)

    def failures(self) -> list:
        return [r for r in self.results if r[1] != 200]


def test_a_scale_down_under_load_loses_no_request(real_node, real_namespace):
    """Three replicas under load scaled to one: each pod that goes stops taking new requests
    (its endpoints drain while the preStop hook holds it), finishes those it holds, then exits."""
    cluster, ns = real_node, real_namespace
    apply(cluster, ns, "shrink", standin_spec(replicas=3, **BATCHED))
    wait_ready(cluster, ns, "shrink", timeout=200)
    svc = cluster.get("service", "shrink", "-n", ns)
    routed(svc["spec"]["clusterIP"], svc["spec"]["ports"][0]["port"])
    url = f"http://{svc['spec']['clusterIP']}:{svc['spec']['ports'][0]['port']}/predict"
    with Load(url) as load:
        time.sleep(3)
        assert load.results and not load.failures(), load.failures()[:5]
        apply(cluster, ns, "shrink", standin_spec(replicas=1, **BATCHED))

        def one_pod_left() -> bool:
            pods = cluster.get("pods", "-n", ns, "-l", "inferentia.dev/model=shrink")["items"]
            return len(pods) == 1

        try:
            wait_for(one_pod_left, 180, "the two pods scaled away to be gone")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{why_not_ready(cluster, ns, 'shrink')}") from None
        time.sleep(3)
    sent, failed = len(load.results), load.failures()
    assert sent > 50, sent
    assert not failed, f"{len(failed)} of {sent} requests failed during the scale-down: {failed[:10]}"


# make test cycles 3 times, make test-faults (INFERENTIA_REAL_FAULTS=1) 10 times, each about 18 s.
SCALE_CYCLES = 10 if os.environ.get("INFERENTIA_REAL_FAULTS") == "1" else 3


@pytest.mark.faults
@pytest.mark.parametrize("cycles", [SCALE_CYCLES])
def test_a_model_cycled_down_and_up_gets_the_cores_the_kubelet_granted_every_time(real_node, real_namespace, cycles):
    """aws-neuron-sdk#1338: inf2 pods scaled down and up again failed in nrt_allocate_neuron_cores
    because the old process still held the cores. The runtime stand-in holds its cores as the
    driver does (a second process cannot open a core a live one holds), so an overlap would fail
    the new pod here."""
    cluster, ns = real_node, real_namespace
    spec = standin_spec(**{"compute.inf": 1})
    apply(cluster, ns, "cycled", spec)
    wait_ready(cluster, ns, "cycled")
    for cycle in range(cycles):
        apply(cluster, ns, "cycled", {**spec, "replicas": 0})
        wait_for(lambda: not cluster.get("pods", "-n", ns, "-l", "inferentia.dev/model=cycled")["items"], 120, "the pod gone")
        apply(cluster, ns, "cycled", {**spec, "replicas": 1})
        wait_ready(cluster, ns, "cycled", timeout=120)
        [pod] = serving_pods(cluster, ns, "cycled")
        restarts = [c["restartCount"] for c in pod["status"]["containerStatuses"]]
        assert restarts == [0], (cycle, restarts, why_not_ready(cluster, ns, "cycled"))  # no allocation failure, no retry
        [proc] = process_envs(cluster, ns, pod["metadata"]["name"])
        assert cores(proc["NEURON_RT_VISIBLE_CORES"]) == granted_cores(cluster, pod), (cycle, proc)


def cores(visible: str) -> list[int]:
    """NEURON_RT_VISIBLE_CORES (``4``, ``4-5``, ``4,5``) as a list of core indices."""
    out: list[int] = []
    for part in visible.split(","):
        first, _, last = part.partition("-")
        out += range(int(first), int(last or first) + 1)
    return out
