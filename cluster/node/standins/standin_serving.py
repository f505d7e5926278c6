"""What the stand-ins' vLLM servers share (neuron_standin.serve, vllm_disagg.serve): a handler
that answers JSON and Prometheus text and logs nothing, vLLM's scheduler gauges as its /metrics
writes them, and its scheduler's sequences over the server's data-parallel ranks.

Only the standard library: the stand-ins import it, it imports none of them."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any


class JsonHandler(BaseHTTPRequestHandler):
    def _json(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _metrics(self, text: str) -> None:
        """Prometheus's text exposition format, as vLLM's /metrics answers."""
        data = text.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def model_label(model: str) -> str:
    """The label vLLM's metrics carry the served model's name in."""
    return f"model_name={json.dumps(model)}"


def scheduler_gauges(label: str, running: int, waiting: int) -> list[str]:
    """vLLM's scheduler gauges, as its /metrics writes them (vLLM docs, "Production Metrics"):
    requests being run, and requests waiting to be (past --max-num-seqs)."""
    return [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{{{label}}} {running}",
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
        "# TYPE vllm:num_requests_waiting gauge", f"vllm:num_requests_waiting{{{label}}} {waiting}",
    ]  # fmt: skip


class Sequences:
    """vLLM's scheduler in one respect: at most ``max_num_seqs`` requests run at once, and the
    rest wait their turn (vLLM's engine arguments: "--max-num-seqs: Maximum number of sequences
    per iteration"). Its /metrics reports both, as vllm:num_requests_running and
    vllm:num_requests_waiting, which the Gateway API Inference Extension's endpoint picker ranks
    replicas by. No limit (None): every request runs at once, and none waits."""

    def __init__(self, max_num_seqs: int | None) -> None:
        self.slots = threading.BoundedSemaphore(max_num_seqs) if max_num_seqs else None
        self.lock = threading.Lock()
        self.running = 0
        self.waiting = 0

    def __enter__(self) -> Sequences:
        with self.lock:
            self.waiting += 1
        if self.slots is not None:
            self.slots.acquire()
        with self.lock:
            self.waiting -= 1
            self.running += 1
        return self

    def __exit__(self, *_: object) -> None:
        with self.lock:
            self.running -= 1
        if self.slots is not None:
            self.slots.release()


class Ranks:
    """A server's data-parallel ranks (one unless --data-parallel-size): each a replica of the model
    on its TP group of cores with its own scheduler, so its own ``max_num_seqs`` ("Each DP rank (a
    group of TP ranks) serves requests independently", the plugin's data-parallelism design page).
    A request goes to the rank with the fewest requests assigned, as vLLM's front end balances its
    DP engines by their load. ``running`` and ``waiting`` are the server's, over its ranks."""

    def __init__(self, max_num_seqs: int | None, groups: list[list[int]]) -> None:
        self.groups = groups
        self.ranks = [Sequences(max_num_seqs) for _ in groups]
        self.assigned = [0] * len(groups)
        self.lock = threading.Lock()

    @contextlib.contextmanager
    def rank(self) -> Iterator[tuple[int, Sequences]]:
        with self.lock:
            r = min(range(len(self.ranks)), key=lambda k: self.assigned[k])
            self.assigned[r] += 1
        try:
            with self.ranks[r] as sequences:
                yield r, sequences
        finally:
            with self.lock:
                self.assigned[r] -= 1

    @property
    def running(self) -> int:
        return sum(s.running for s in self.ranks)

    @property
    def waiting(self) -> int:
        return sum(s.waiting for s in self.ranks)


def rank_groups(found: dict) -> list[list[int]]:
    """The cores of each DP rank: the TP groups runtime_checks made, else all the visible cores."""
    return found.get("dataParallel", {}).get("groups") or [found["cores"]]


class Histogram:
    """A Prometheus histogram in the text format, as prometheus_client writes one (cumulative
    buckets, then +Inf, count and sum)."""

    def __init__(self, name: str, help_: str, buckets: tuple[float, ...]) -> None:
        self.name, self.help, self.buckets = name, help_, buckets
        self.counts = [0] * len(buckets)
        self.count, self.sum = 0, 0.0

    def observe(self, value: float) -> None:
        self.count += 1
        self.sum += value
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1

    def text(self, label: str) -> str:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        lines += [f'{self.name}_bucket{{le="{b}",{label}}} {c}' for b, c in zip(self.buckets, self.counts, strict=True)]
        lines += [f'{self.name}_bucket{{le="+Inf",{label}}} {self.count}', f"{self.name}_count{{{label}}} {self.count}",
                  f"{self.name}_sum{{{label}}} {self.sum}"]  # fmt: skip
        return "\n".join(lines) + "\n"
