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
