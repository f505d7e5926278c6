"""The adaptive dispatcher: when to send a batch, of what, to which process. Pure, with the
clock passed in, so every decision is unit-tested with a fake clock.

It is a batching window that tunes itself. A fixed window (hold the oldest request for
w, or until the batch is full) is what users tune by hand, and the best w depends on the
load, the number of processes and the model's latency curve: measured on this project's
simulation, dispatching at once was best with 8 processes at light load, a window of a
quarter of a call with 4, and half a call with 2 (``cluster/batching_sim.py``). So the
dispatcher keeps the recent arrival times, and every so often replays them through a
fixed-window batcher for each candidate window, with the latency it has fitted for a
batch of n (a least-squares line, latency = fixed + per_item * n, over recent batches,
as in BentoML's adaptive batching:
https://docs.bentoml.com/en/latest/guides/adaptive-batching.html). It then uses the
window whose replay had the lowest p99. That is the window a user would have tuned for
the traffic of the last few seconds, retuned as the traffic changes.

The budget is kept on top of the window: a request that cannot finish within
``max_latency`` is answered 503 at once, never queued past it, and never sent in a batch
that would finish late, judged on when a batch finishes late rather than on average
(``LatencyModel.late``). Each process runs one batch at a time (a NeuronCore Group
executes one model invocation at once), and work goes to the least-loaded free process.

The estimate is learnt only from batches that finish, so a process that once ran slow (a
pause, a hiccup of the runtime) would be estimated slow for ever, and sent nothing to learn
otherwise. So a process whose estimate leaves no request within the budget is *stale*: it
gets no batch but a *probe*, one request alone, at most one at a time and one every
``PROBE_INTERVAL``, which is sent whatever the estimate says. A probe that finishes faster
than the estimate shows the process is back: what was learnt before it is forgotten. While
every process is stale nothing is admitted (``shedding``, which the front end's readiness
reports), and the probe is the last request admitted of any bucket, sent again by the
dispatcher itself and answered to nobody: a replica that left its Service still learns
that its model is back. The states: serving (some process fits the budget), shedding (none
does; probes every PROBE_INTERVAL), and recovering (a probe came back in time; serving again).
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Request:
    arrived: float
    bucket: tuple[int, ...] | None  # the padded shape, None without buckets
    payload: Any
    id: int = field(default_factory=itertools.count().__next__)
    probe: bool = False  # sent alone to a stale process, whatever the estimate says (module docstring)


@dataclass(frozen=True)
class Dispatch:
    process: int
    requests: list[Request]


@dataclass(frozen=True)
class Reject:
    request: Request
    retry_after: float  # seconds


class LatencyModel:
    """latency(n) = fixed + per_item * n, fitted to the last ``window`` batches, and how much
    later than that a batch may finish (``late``).

    The fit is a mean, so about half the batches finish after it: a batch sent when its
    oldest request has just the fitted time left would miss the budget half the time, and
    under overload that is where most batches are sent. So every deadline is judged on
    ``late(n)``: the fit plus the ``SPREAD_QUANTILE`` of how far recent batches ran past it.
    A quantile of the last ``SPREAD_WINDOW`` overruns, not the largest, so that one pause does
    not refuse everything after it; a pause that lasts is the probe's business (``Dispatcher``).
    The 97th, since under overload nearly every batch is sent at that edge: a lower quantile
    left the answered requests' p99 a few ms over the budget on a busy machine.
    """

    SPREAD_QUANTILE = 0.97
    SPREAD_WINDOW = 256

    def __init__(self, fixed: float = 0.0, per_item: float = 0.0, window: int = 64):
        self.fixed, self.per_item = fixed, per_item
        self.spread = 0.0
        self.samples: deque[tuple[int, float]] = deque(maxlen=window)
        self.overruns: deque[float] = deque(maxlen=self.SPREAD_WINDOW)

    def observe(self, n: int, seconds: float) -> None:
        if self.samples:
            # Against the fit the batch was sent on; before anything was learnt there was none,
            # and a first batch's whole time is no overrun (taken as one, a model that takes over
            # half the budget would be estimated over it at worst, and shed for ever).
            self.overruns.append(max(0.0, seconds - self(n)))
        self.samples.append((n, seconds))
        self._fit(n)
        overruns = sorted(self.overruns)
        self.spread = overruns[min(len(overruns) - 1, int(self.SPREAD_QUANTILE * len(overruns)))] if overruns else 0.0

    def _fit(self, n: int) -> None:
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

    def late(self, n: int) -> float:
        """When a batch of n finishes at the latest, as far as recent batches show."""
        return self(n) + self.spread

    def forget(self) -> None:
        """Nothing learnt: what was measured describes a process that is no longer so."""
        self.samples.clear()
        self.overruns.clear()
        self.fixed = self.per_item = self.spread = 0.0


def replay(arrivals: Sequence[float], processes: int, max_batch: int, latency: Callable[[int], float], window: float) -> list[float]:
    """The latencies, in arrival order, that a fixed ``window`` would have given ``arrivals`` (sorted times)
    on ``processes`` identical processes whose batch of n takes ``latency(n)``: a batch
    starts when a process is free and either the oldest queued request has waited
    ``window`` or a full batch has arrived, and takes what has arrived by then."""
    free_at = [float("-inf")] * processes  # a heap of the times each process is next free
    latencies: list[float] = []
    head, count = 0, len(arrivals)
    while head < count:
        full_at = arrivals[min(head + max_batch, count) - 1] if head + max_batch <= count else float("inf")
        start = max(free_at[0], arrivals[head], min(arrivals[head] + window, full_at))
        end = head
        while end < count and end - head < max_batch and arrivals[end] <= start:
            end += 1
        finish = start + latency(end - head)
        heapq.heapreplace(free_at, finish)
        latencies.extend(finish - arrivals[i] for i in range(head, end))
        head = end
    return latencies


def percentile(values: Sequence[float], p: float) -> float:
    """The nearest-rank-below percentile; 0 for no values."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * (len(ordered) - 1)))] if ordered else 0.0


def p99(values: Sequence[float]) -> float:
    return percentile(values, 99)


class Dispatcher:
    # A share of the budget kept for what the fitted batch latency does not see: the front
    # end's own HTTP handling of the request and the answer.
    HEADROOM = 0.05
    # The windows tried, as shares of one request's own latency: from dispatching at once
    # to holding for two calls' worth, about a factor of 1.4 apart (a factor of 2 left the
    # best window between two candidates at 250 to 300/s on the simulation, 2 ms worse).
    CANDIDATES = (0.0, 0.125, 0.1875, 0.25, 0.375, 0.5, 0.75, 1.0, 1.5, 2.0)
    # How much history one replay sees, and how often the window is tuned: often enough to
    # follow a change of load within a second or two at hundreds of requests a second, and
    # seldom enough that the replays cost little: on this project's 2-core test machine ten
    # replays of 1,024 arrivals take about 5 ms when it is quiet (4.6 to 10 ms) and 7 to 22 ms
    # while make test runs, about 20 microseconds per request. A tune runs one replay an
    # arrival (_tune_steps): run at once, the ten held the front end's event loop, and every
    # request in flight waited them out.
    HISTORY = 1024
    RETUNE_EVERY = 256
    # How often a stale process is probed: a model that answers again is served again within
    # about this long of its first answer (plus the probe's own call).
    PROBE_INTERVAL = 0.25

    def __init__(self, processes: int, max_batch: int, max_latency: float, inflight_per_process: int = 1):
        self.max_batch = max_batch
        self.max_latency = max_latency * (1 - self.HEADROOM)
        self.capacity = inflight_per_process
        self.inflight = [0] * processes
        self.models = [LatencyModel() for _ in range(processes)]
        self.queues: dict[tuple[int, ...] | None, deque[Request]] = {}
        self.window = 0.0  # dispatch at once until there is history to tune on
        self._arrivals: deque[float] = deque(maxlen=self.HISTORY)
        self._since_tuned = 0
        self._tuning: Iterator[bool] | None = None  # a tune under way, a candidate's replay an arrival
        self._probing = False  # a probe is waiting for a process or in flight
        self._pending_probe: Request | None = None  # the probe, until a process is free for it
        self._next_probe = float("-inf")
        self._last_admitted: Request | None = None  # what a probe sends when no client does

    @property
    def shedding(self) -> bool:
        """No process's estimate leaves a lone request within the budget: nothing is admitted."""
        return all(self._stale(p) for p in range(len(self.inflight)))

    def _stale(self, process: int) -> bool:
        # On ``late``, as every deadline is: a process that could be sent nothing in time is stale.
        return self.models[process].late(1) > self.max_latency

    def _probe_due(self, now: float) -> bool:
        return not self._probing and now >= self._next_probe and any(self._stale(p) for p in range(len(self.inflight)))

    # --- inputs --------------------------------------------------------------------------

    def arrive(self, request: Request) -> Reject | None:
        """Admits a request, or rejects it at once when the queue ahead of it cannot drain in time."""
        self._arrivals.append(request.arrived)
        self._since_tuned += 1
        # Tuned after 8, 16, 32, ... arrivals at first, so that a new front end leaves
        # dispatching at once within its first few dozen requests; then every RETUNE_EVERY.
        if self._tuning is None and self._since_tuned >= min(self.RETUNE_EVERY, max(8, len(self._arrivals) // 2)):
            self._tuning = self._tune_steps()
        if self._tuning is not None and next(self._tuning, None) is None:
            self._tuning = None
        queue = self.queues.setdefault(request.bucket, deque())
        ahead = len(queue)
        processes = len(self.inflight) * self.capacity
        batches_ahead = ahead // self.max_batch
        model = self._best_model()
        # Whole batches ahead of it run in parallel on the processes; then its own.
        expected = (batches_ahead // processes) * model(self.max_batch) + model.late(min(ahead % self.max_batch + 1, self.max_batch))
        if self._probe_due(request.arrived):
            # A stale process learns only from what it is sent: this request goes to it alone.
            self._start_probe(request)
        elif expected > self.max_latency:
            return Reject(request, retry_after=max(0.001, expected - self.max_latency))
        else:
            queue.append(request)
        self._last_admitted = request
        return None

    def _start_probe(self, request: Request) -> None:
        request.probe, self._probing, self._pending_probe = True, True, request
        self._next_probe = request.arrived + self.PROBE_INTERVAL

    def done(self, process: int, n: int, seconds: float, probe: bool = False, answered: bool = True) -> None:
        """A batch came back after ``seconds``; ``answered``: the process answered it (a process
        that is not listening fails at once, which says nothing of how fast it runs)."""
        self.inflight[process] -= 1
        model = self.models[process]
        if probe:
            self._probing = False
            if answered and seconds < model.late(n):
                model.forget()  # back, faster than it was estimated: what was learnt before is past
        if answered:
            model.observe(n, seconds)

    def tune(self) -> None:
        """Sets the window to the candidate whose replay of the recent arrivals had the lowest
        p99 (the shorter on a tie: it costs the light load less), at once.

        With buckets, the replay sees every bucket's arrivals as one stream, so each
        bucket, batched apart, is held for the window tuned on their sum."""
        for _ in self._tune_steps():
            pass

    def _tune_steps(self) -> Iterator[bool]:
        """tune(), a candidate's replay a step (arrive() runs one step an arrival): on the
        arrivals and the fit of when it began, so the batches that finish meanwhile do not
        change what the candidates are judged on."""
        self._since_tuned = 0
        model = self._best_model()
        if model(1) <= 0 or len(self._arrivals) < 2:
            return  # nothing learnt yet: keep dispatching at once
        arrivals = list(self._arrivals)
        fit = LatencyModel(model.fixed, model.per_item)
        processes = len(self.inflight) * self.capacity
        best: tuple[float, float] | None = None
        for i, share in enumerate(self.CANDIDATES):
            if i:
                yield True
            window = share * fit(1)
            scored = (p99(replay(arrivals, processes, self.max_batch, fit, window)), window)
            best = scored if best is None or scored < best else best
        assert best is not None
        self.window = best[1]

    # --- the decision ----------------------------------------------------------------------

    def _best_model(self) -> LatencyModel:
        return min(self.models, key=lambda m: m(self.max_batch))

    def decide(self, now: float) -> tuple[list[Dispatch | Reject], float | None]:
        """The batches to send now and the requests to refuse, and when to decide again
        (None: only on the next arrival or completion)."""
        actions: list[Dispatch | Reject] = []
        wake: float | None = None
        if self._last_admitted is not None and self.shedding and self._probe_due(now):
            # No client sends anything while the replica is out of its Service: the dispatcher
            # probes with the last request it admitted, answered to nobody.
            last = self._last_admitted
            self._start_probe(Request(now, last.bucket, last.payload))
        probe_to = [p for p in range(len(self.inflight)) if self.inflight[p] < self.capacity]
        if self._pending_probe is not None and probe_to:
            # Alone, to the stalest free process, whatever its estimate says.
            process = max(probe_to, key=lambda p: self.models[p](1))
            self.inflight[process] += 1
            actions.append(Dispatch(process, [self._pending_probe]))
            self._pending_probe = None
        elif self._last_admitted is not None and self.shedding and not self._probing:
            wake = self._next_probe
        if self.shedding:
            # No process is estimated to answer in time: what waits is refused now, not left
            # queued past its budget until a probe comes back.
            for queue in self.queues.values():
                actions.extend(Reject(r, retry_after=self.PROBE_INTERVAL) for r in queue)
            self.queues = {}
        # The bucket whose oldest request has waited longest goes first.
        for queue in sorted(self.queues.values(), key=lambda q: q[0].arrived if q else float("inf")):
            while queue:
                # A stale process gets probes only: a batch sent there would be refused as late.
                free = [p for p in range(len(self.inflight)) if self.inflight[p] < self.capacity and not self._stale(p)]
                if not free:
                    break
                process = min(free, key=lambda p: (self.inflight[p], self.models[p](self.max_batch)))
                model = self.models[process]
                n = min(len(queue), self.max_batch)
                # Refuse what can no longer finish in time in the batch it would join: under
                # overload the oldest go, and the rest still make a full batch.
                while queue and now - queue[0].arrived + model.late(n) > self.max_latency:
                    actions.append(Reject(queue.popleft(), retry_after=model(self.max_batch)))
                    n = min(len(queue), self.max_batch)
                if not queue:
                    break
                if n < self.max_batch:
                    # Hold the oldest for the window, and never so long that it could no
                    # longer finish in a batch one larger.
                    oldest = queue[0].arrived
                    until = min(oldest + self.window, oldest + self.max_latency - model.late(n + 1))
                    if now < until:
                        wake = until if wake is None else min(wake, until)
                        break
                batch = [queue.popleft() for _ in range(n)]
                self.inflight[process] += 1
                actions.append(Dispatch(process, batch))
        self.queues = {b: q for b, q in self.queues.items() if q}
        return actions, wake

    @property
    def queued(self) -> int:
        return sum(len(q) for q in self.queues.values()) + (self._pending_probe is not None)
