"""Batching policies run in simulated time: the dispatcher's own ``arrive``/``decide``/
``done`` calls, driven by a discrete-event loop instead of a clock and HTTP, so a grid of
policies, rates and traffic shapes runs in seconds and gives the same figures every time.

The benchmark (``benchmark_batching.py``) runs the same policies for real on loopback;
the tests use this to check the adaptive rule against the best fixed window at every
rate before the slower real run confirms it.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from inferentia_operator.batching.dispatch import Dispatch, Dispatcher, Reject, Request, percentile


class FixedWindow(Dispatcher):
    """The textbook batcher: hold the oldest request for ``window`` seconds or until the
    batch is full, never refuse anything. A window of 0 sends whatever is queued as soon
    as a process is free."""

    def __init__(self, processes: int, max_batch: int, window: float):
        super().__init__(processes, max_batch, max_latency=float("inf"))
        self.window = window

    def arrive(self, request: Request) -> Reject | None:
        self.queues.setdefault(request.bucket, deque()).append(request)
        return None

    def decide(self, now: float) -> tuple[list[Dispatch | Reject], float | None]:
        actions: list[Dispatch | Reject] = []
        wake = None
        for queue in self.queues.values():
            while queue:
                free = [p for p in range(len(self.inflight)) if self.inflight[p] < self.capacity]
                if not free:
                    break
                n = min(len(queue), self.max_batch)
                due = queue[0].arrived + self.window
                if n < self.max_batch and now < due:
                    wake = due if wake is None else min(wake, due)
                    break
                process = min(free, key=lambda p: self.inflight[p])
                self.inflight[process] += 1
                actions.append(Dispatch(process, [queue.popleft() for _ in range(n)]))
        self.queues = {b: q for b, q in self.queues.items() if q}
        return actions, wake


# --- traffic ---------------------------------------------------------------------------------


def steady(rate: float, seconds: float, rng: random.Random) -> list[float]:
    """Poisson arrivals at ``rate`` a second."""
    times, t = [], rng.expovariate(rate)
    while t < seconds:
        times.append(t)
        t += rng.expovariate(rate)
    return times


def bursty(rate: float, seconds: float, rng: random.Random, on: float = 0.2, off: float = 0.2) -> list[float]:
    """On/off Poisson: exponentially long bursts (mean ``on`` s) of Poisson arrivals,
    separated by exponentially long silences (mean ``off`` s), with ``rate`` the mean over
    both, so a burst runs at rate * (on + off) / on."""
    burst_rate = rate * (on + off) / on
    times: list[float] = []
    t = 0.0
    while t < seconds:
        end = min(seconds, t + rng.expovariate(1 / on))
        t += rng.expovariate(burst_rate)
        while t < end:
            times.append(t)
            t += rng.expovariate(burst_rate)
        t = end + rng.expovariate(1 / off)
    return times


TRAFFIC: dict[str, Callable[[float, float, random.Random], list[float]]] = {"steady": steady, "bursty": bursty}


# --- the run ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    latencies: list[float]  # of the answered requests, sorted
    refused: int
    sent: int
    seconds: float  # from the first arrival to the last answer

    @property
    def answered_per_second(self) -> float:
        return len(self.latencies) / self.seconds if self.seconds > 0 else 0.0

    def pct(self, p: float) -> float:
        return percentile(self.latencies, p)

    def within(self, budget: float) -> float:
        """Requests answered within ``budget`` per second."""
        return sum(1 for x in self.latencies if x <= budget) / self.seconds if self.seconds > 0 else 0.0


def simulate(dispatcher: Dispatcher, arrivals: list[float], batch_seconds: Callable[[int], float], overhead: float = 0.0) -> Result:
    """Runs ``dispatcher`` over the arrival times; a batch of n takes ``batch_seconds(n)`` on a
    process, plus ``overhead`` for the HTTP around it (seen by the client, not the fit)."""
    events: list[tuple[float, int, str, object]] = []
    order = itertools.count()
    for t in arrivals:
        heapq.heappush(events, (t, next(order), "arrive", None))
    latencies: list[float] = []
    refused = 0
    wake_token = 0
    last = arrivals[0] if arrivals else 0.0
    while events:
        now, _, kind, data = heapq.heappop(events)
        last = max(last, now)
        if kind == "arrive":
            reject = dispatcher.arrive(Request(now, None, None))
            refused += reject is not None
        elif kind == "done":
            process, batch, took = data  # type: ignore[misc]
            dispatcher.done(process, len(batch), took, probe=batch[0].probe)  # as the front end calls it
            latencies.extend(now + overhead - r.arrived for r in batch)
            last = max(last, now + overhead)
        elif kind == "wake" and data != wake_token:
            continue  # a wake-up superseded by a later decision
        actions, wake = dispatcher.decide(now)
        for action in actions:
            if isinstance(action, Dispatch):
                took = batch_seconds(len(action.requests))
                heapq.heappush(events, (now + took, next(order), "done", (action.process, action.requests, took)))
            else:
                refused += 1
        wake_token += 1
        if wake is not None:
            heapq.heappush(events, (max(now, wake), next(order), "wake", wake_token))
    first = arrivals[0] if arrivals else 0.0
    return Result(sorted(latencies), refused, len(arrivals), last - first)


WINDOWS = (0.0, 0.005, 0.010, 0.020, 0.040)  # the fixed windows compared, in seconds


def compare(
    processes: int, max_batch: int, budget: float, fixed: float, per_item: float, arrivals: list[float], overhead: float = 0.0015
) -> tuple[Result, dict[float, Result]]:
    """The tuned dispatcher and each fixed window in ``WINDOWS`` on the same arrivals; a batch
    of n takes fixed + per_item * n, up to 3% (one standard deviation) longer at random, as
    a loaded machine adds."""

    def run(dispatcher: Dispatcher) -> Result:
        noise = random.Random(1)
        return simulate(dispatcher, arrivals, lambda n: (fixed + per_item * n) * (1 + abs(noise.gauss(0, 0.03))), overhead)

    tuned = run(Dispatcher(processes, max_batch, budget))
    return tuned, {w: run(FixedWindow(processes, max_batch, w)) for w in WINDOWS}


def goal_met(tuned: Result, fixed: list[Result], budget: float, answered_share: float) -> tuple[Result, float, bool]:
    """The issue's bar for one rate: the tuned dispatcher's p99 at most 10% (or 5 ms) above
    the best fixed window's, and at least ``answered_share`` of the most any fixed window
    answered within ``budget``. Returns the best fixed window, that most, and the verdict."""
    best = min(fixed, key=lambda r: r.pct(99))
    most = max(r.within(budget) for r in fixed)
    ok = tuned.pct(99) <= max(1.1 * best.pct(99), best.pct(99) + 0.005) and tuned.within(budget) >= answered_share * most
    return best, most, ok
