"""The adaptive dispatcher: when to send a batch, of what, to which process. Pure, with the
clock passed in, so every decision is unit-tested with a fake clock.

The design follows BentoML's adaptive batching (https://docs.bentoml.com/en/latest/guides/adaptive-batching.html, and its "CORK" dispatcher):
the dispatcher learns how long a batch of n takes on a process (a least-squares line,
latency = fixed + per_item * n, over recent batches) and holds the oldest request only
while it can still finish within ``max_latency``: waiting for one more request is worth
it while the next is expected sooner than serving it alone would take, and the expected
gap plus the larger batch still fits the budget. Once the stream goes quiet (a burst
has ended), the expected gap grows with the quiet and what is queued goes.
A request that cannot finish in time is answered 503 at once, never queued past the
budget. Each process runs one batch at a time (a NeuronCore Group executes one model
invocation at once), and work goes to the least-loaded free process.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Request:
    arrived: float
    bucket: tuple[int, ...] | None  # the padded shape, None without buckets
    payload: Any
    id: int = field(default_factory=itertools.count().__next__)


@dataclass(frozen=True)
class Dispatch:
    process: int
    requests: list[Request]


@dataclass(frozen=True)
class Reject:
    request: Request
    retry_after: float  # seconds


class LatencyModel:
    """latency(n) = fixed + per_item * n, fitted to the last ``window`` batches."""

    def __init__(self, fixed: float = 0.0, per_item: float = 0.0, window: int = 64):
        self.fixed, self.per_item = fixed, per_item
        self.samples: deque[tuple[int, float]] = deque(maxlen=window)

    def observe(self, n: int, seconds: float) -> None:
        self.samples.append((n, seconds))
        sizes = {s for s, _ in self.samples}
        if len(sizes) < 2:
            # One batch size seen so far: all of it is fixed cost, as far as we know.
            self.fixed = sum(t for _, t in self.samples) / len(self.samples) - self.per_item * n
            return
        count = len(self.samples)
        mean_n = sum(s for s, _ in self.samples) / count
        mean_t = sum(t for _, t in self.samples) / count
        var = sum((s - mean_n) ** 2 for s, _ in self.samples)
        cov = sum((s - mean_n) * (t - mean_t) for s, t in self.samples)
        self.per_item = max(0.0, cov / var)
        self.fixed = max(0.0, mean_t - self.per_item * mean_n)

    def __call__(self, n: int) -> float:
        return self.fixed + self.per_item * n


class Dispatcher:
    # A share of the budget kept for what the fitted batch latency does not see: the front
    # end's own HTTP handling of the request and the answer.
    HEADROOM = 0.05

    def __init__(self, processes: int, max_batch: int, max_latency: float, inflight_per_process: int = 1):
        self.max_batch = max_batch
        self.max_latency = max_latency * (1 - self.HEADROOM)
        self.capacity = inflight_per_process
        self.inflight = [0] * processes
        self.models = [LatencyModel() for _ in range(processes)]
        self.queues: dict[tuple[int, ...] | None, deque[Request]] = {}
        self._arrivals: deque[float] = deque(maxlen=64)

    # --- inputs --------------------------------------------------------------------------

    def arrive(self, request: Request) -> Reject | None:
        """Admits a request, or rejects it at once when the queue ahead of it cannot drain in time."""
        self._arrivals.append(request.arrived)
        queue = self.queues.setdefault(request.bucket, deque())
        ahead = len(queue)
        processes = len(self.inflight) * self.capacity
        batches_ahead = ahead // self.max_batch
        model = self._best_model()
        # Whole batches ahead of it run in parallel on the processes; then its own.
        expected = (batches_ahead // processes) * model(self.max_batch) + model(min(ahead % self.max_batch + 1, self.max_batch))
        if expected > self.max_latency:
            return Reject(request, retry_after=max(0.001, expected - self.max_latency))
        queue.append(request)
        return None

    def done(self, process: int, n: int, seconds: float) -> None:
        self.inflight[process] -= 1
        self.models[process].observe(n, seconds)

    # --- the decision ----------------------------------------------------------------------

    def _best_model(self) -> LatencyModel:
        return min(self.models, key=lambda m: m(self.max_batch))

    def _mean_gap(self) -> float:
        """The mean time between recent arrivals."""
        if len(self._arrivals) < 2:
            return float("inf")
        span = self._arrivals[-1] - self._arrivals[0]
        return span / (len(self._arrivals) - 1) if span > 0 else 0.0

    def _arrival_gap(self, now: float) -> float:
        """The expected time to the next arrival: the recent mean gap, or longer once the
        stream has been quiet for longer than that (a burst that has ended brings no more)."""
        if not self._arrivals:
            return float("inf")
        return max(self._mean_gap(), now - self._arrivals[-1])

    def decide(self, now: float) -> tuple[list[Dispatch | Reject], float | None]:
        """The batches to send now and the requests to refuse, and when to decide again
        (None: only on the next arrival or completion)."""
        actions: list[Dispatch | Reject] = []
        wake: float | None = None
        # The bucket whose oldest request has waited longest goes first.
        for queue in sorted(self.queues.values(), key=lambda q: q[0].arrived if q else float("inf")):
            # Refuse what can no longer finish in time even alone on a free process.
            while queue and now - queue[0].arrived + self._best_model()(1) > self.max_latency:
                request = queue.popleft()
                actions.append(Reject(request, retry_after=self._best_model()(self.max_batch)))
            while queue:
                free = [p for p in range(len(self.inflight)) if self.inflight[p] < self.capacity]
                if not free:
                    break
                process = min(free, key=lambda p: (self.inflight[p], self.models[p](self.max_batch)))
                model = self.models[process]
                n = min(len(queue), self.max_batch)
                waited = now - queue[0].arrived
                if n < self.max_batch:
                    # Hold for one more request while it is expected soon enough that the
                    # oldest, in the bigger batch, still finishes within the budget; look
                    # again once that arrival is overdue, or at the last moment.
                    # Waiting is worth it only while the next request is expected sooner
                    # than serving it alone later would take (its own fixed cost).
                    gap = self._arrival_gap(now)
                    if gap <= model(1) and waited + gap + model(n + 1) <= self.max_latency:
                        deadline = queue[0].arrived + self.max_latency - model(n + 1)
                        recheck = min(deadline, now + max(self._mean_gap(), 0.001))
                        wake = recheck if wake is None else min(wake, recheck)
                        break
                batch = [queue.popleft() for _ in range(n)]
                self.inflight[process] += 1
                actions.append(Dispatch(process, batch))
        self.queues = {b: q for b, q in self.queues.items() if q}
        return actions, wake

    @property
    def queued(self) -> int:
        return sum(len(q) for q in self.queues.values())
