"""The scale benchmark's Deployment watcher (cluster/benchmark_scale.py, ``follow_added``) keeps
seeing new objects across a watch the server closes or expires, as client-go's reflector does:
it lists again, counts what the list holds that it had not seen, and resumes from the list's
resourceVersion. A fake list and stream stand in for the API server: this is the watcher's own
logic, which the benchmark then runs against the real one."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from urllib3.exceptions import ProtocolError

from benchmark_scale import follow_added


def obj(name: str, rv: str) -> SimpleNamespace:
    return SimpleNamespace(metadata=SimpleNamespace(name=name, resource_version=rv))


class FakeServer:
    """First stream: a, then the connection ends mid-watch; the list then holds a, b (b was
    created while no watch was open); the second stream: c, then the stop."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop, self.streams, self.resumed_from = stop, 0, []

    def list(self, namespace: str, **kwargs):
        items = [obj("a", "5"), obj("b", "7")] if self.streams else []
        return SimpleNamespace(
            items=items if kwargs.get("limit") is None else items[:1],
            metadata=SimpleNamespace(resource_version="7" if self.streams else "1"),
        )

    def stream(self, func, namespace: str, resource_version: str, timeout_seconds: int):
        self.streams += 1
        self.resumed_from.append(resource_version)
        if self.streams == 1:
            yield {"type": "ADDED", "object": obj("a", "5")}
            raise ProtocolError("Response ended prematurely")
        yield {"type": "ADDED", "object": obj("c", "9")}
        self.stop.set()


def test_the_watcher_lists_again_and_resumes_after_the_server_closes_its_watch():
    stop = threading.Event()
    server = FakeServer(stop)
    seen: list[str] = []
    restarts = follow_added(server.list, server.stream, "ns", seen.append, stop)
    assert seen == ["a", "b", "c"]  # b only from the list, each name once
    assert server.resumed_from == ["1", "7"] and restarts == 1


def test_a_histograms_quantile_between_two_scrapes_is_the_bucket_it_falls_in():
    from benchmark_scale import bucket_quantile

    name = "inferentia_operator_queue_wait_seconds"

    def scrape(counts):
        return {f'{name}_bucket{{lane="urgent",le="{le}"}}': n for le, n in zip(("0.01", "0.1", "1.0", "+Inf"), counts, strict=True)}

    before, after = scrape((5, 5, 5, 5)), scrape((95, 103, 105, 105))  # 100 new: 90 ≤ 10 ms, 8 ≤ 100 ms, 2 ≤ 1 s
    assert bucket_quantile(after, before, name, 'lane="urgent",', 0.5) == 0.01
    assert bucket_quantile(after, before, name, 'lane="urgent",', 0.95) == 0.1
    assert bucket_quantile(after, before, name, 'lane="urgent",', 0.99) == 1.0
    assert bucket_quantile(before, before, name, 'lane="urgent",', 0.99) == 0.0  # nothing observed


def test_the_operators_garbage_collection_between_two_scrapes():
    from benchmark_scale import gc_paused

    name = "inferentia_operator_gc_pause_seconds"

    def scrape(full, young_sum, full_sum, buckets):
        out = {
            f'{name}_count{{generation="2"}}': full,
            f'{name}_sum{{generation="0"}}': young_sum,
            f'{name}_sum{{generation="2"}}': full_sum,
        }
        out |= {f'{name}_bucket{{generation="2",le="{le}"}}': n for le, n in zip(("0.1", "0.5", "+Inf"), buckets, strict=True)}
        return out

    before = scrape(3, 1.0, 0.5, (3, 3, 3))
    after = scrape(5, 1.5, 1.2, (4, 5, 5))  # two full collections: one ≤ 100 ms, one ≤ 500 ms
    total, full, longest = gc_paused(after, before)
    assert round(total, 6) == 1.2 and full == 2 and longest == 0.5
    assert gc_paused(before, before) == (0.0, 0.0, 0.0)


def test_the_attribution_counts_every_clients_requests_beside_the_kinds():
    """Every client's reads and writes a model, the controllers' with the operator's, so that a
    run's control-plane CPU can be set beside the requests its API server answered."""
    from benchmark_scale import attribution

    op = {"post deployments": 200.0, "patch inferentiamodels/status": 100.0, "get pods": 50.0, "list pods": 50.0, "events pods": 9.0}
    floor = {"post deployments": 200.0, "get pods": 30.0}
    table = attribution(op, floor, 100)
    rows = {line.split(" | ")[0].lstrip("| "): line for line in table.splitlines()}
    assert rows["every client's writes"] == "| every client's writes | 3.00 | 2.00 | 1.50x |"
    assert rows["every client's reads"] == "| every client's reads | 1.00 | 0.30 | 3.33x |"
