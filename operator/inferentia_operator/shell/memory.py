"""Giving memory back: the operator's heap after a burst of work.

A burst (hundreds of models created at once) makes every API thread allocate answers at the
same moment. glibc's malloc gives each thread its own arena, up to eight per core, and frees
into them without returning pages to the system, so the process keeps the burst's high-water
mark for good: 370 MB measured at 1,900 models where the live objects were 93 MB
(docs/benchmarks.md). Two glibc calls bound that (mallopt(3), malloc_trim(3)):

- at start, at most ``ARENAS`` arenas (what ``MALLOC_ARENA_MAX`` sets, which would need the
  environment before the process starts, and so a wrapper in every way the operator is run);
- once the work queue has drained after a burst, ``malloc_trim(0)``: free pages of every
  arena are given back (glibc 2.8 and later release whole free pages inside the heap too).

Measured at 1,900 models (docs/benchmarks.md), trimming lowered the benchmark's end from 370
to 309 MB. What it cannot reach is pymalloc's: Python's small objects live in 1 MiB arenas
that go back to the system only when wholly empty, and a burst leaves them partly used. The
restart's burst was kopf holding every listed object until every kind was listed, which
``wiring.slim`` now cuts down as each is indexed.

Elsewhere than glibc (musl, macOS) both are skipped: the memory is then the allocator's to manage.

Python's own collector is the other cost of a large heap: a full collection walks every
tracked object while no thread runs, which at 1,000 models took up to 2.5 s, six times a
minute during a stream of 10 new models a second (docs/benchmarks.md). Two settings bound it:

- young collections every ``YOUNG_THRESHOLD`` allocations, not CPython's 700, so that a watch
  event's parsed body, alive for the few milliseconds it waits in kopf's queues, dies before a
  collection promotes it to the older generations, whose growth is what sets off a full one
  (measured only together with the next);
- when the queue drains after a burst, what is unreachable is collected and what is alive
  (the caches of every model) frozen (gc.freeze): later collections, that one's included,
  walk only what came since the last freeze. Frozen objects still die by reference count;
  what freezing gives up is the cycle detection of objects alive at that moment, for at most
  ``THAW_SECONDS``: then everything is let back in and collected once. Freezing without
  collecting first froze the cycles already unreachable for good (562 MB where
  317 MB was usual).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import time
from collections.abc import Callable
from typing import Any

from . import metrics

ARENAS = 2
YOUNG_THRESHOLD = 10_000
# How long an object frozen while alive can be held after it died in a reference cycle.
THAW_SECONDS = 300.0
M_ARENA_MAX = -8  # glibc's malloc.h
# Trim after at least this many reconciles since the last trim, and no more often than this.
TRIM_AFTER_RECONCILES = 200
TRIM_INTERVAL_SECONDS = 10.0
# How often the settle loop asks whether a settle is due: a drained burst waits at most this.
SETTLE_POLL_SECONDS = 1.0


def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


_LIBC = _glibc()


def limit_arenas(arenas: int = ARENAS) -> bool:
    """Caps glibc's malloc arenas; True if it did. Call before the API threads start."""
    return bool(_LIBC is not None and _LIBC.mallopt(M_ARENA_MAX, arenas) == 1)


def trim() -> bool:
    """Returns free heap pages to the system; True if glibc released any."""
    return bool(_LIBC is not None and _LIBC.malloc_trim(0) == 1)


def tune_collector() -> None:
    """Young collections less often (see the module's docstring); the older generations' own
    thresholds stay CPython's."""
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)


class Settler:
    """What a drained queue does, and when: after enough work, and not too often, heap pages
    go back to the system (``trim``) and what survived the burst is frozen (``freeze_survivors``),
    with a thaw at most every ``thaw_after`` seconds. One object keeps all three clocks, so
    that each reconciler (and each test) has its own. The workers only count
    (``reconciled``); the settle loop (Reconciler.settle_when_due) asks ``due`` every ``poll``
    seconds, so the decision is made in one place."""

    def __init__(
        self,
        after: int = TRIM_AFTER_RECONCILES,
        interval: float = TRIM_INTERVAL_SECONDS,
        thaw_after: float = THAW_SECONDS,
        poll: float = SETTLE_POLL_SECONDS,
    ) -> None:
        self.after, self.interval, self.thaw_after, self.poll = after, interval, thaw_after, poll
        self._since = 0
        self._last_settle = self._last_thaw = time.monotonic()

    def reconciled(self) -> None:
        """Counts one reconcile."""
        self._since += 1

    def due(self, queue_empty: bool) -> bool:
        """True when the caller should trim and freeze now: the queue is empty after enough
        reconciles, and the last settle is at least ``interval`` old. Asked every ``poll``
        seconds, so that a burst's last drain, if it came too soon after a settle mid-burst,
        is settled all the same once the interval has passed."""
        if not queue_empty or self._since < self.after or time.monotonic() - self._last_settle < self.interval:
            return False
        self._since, self._last_settle = 0, time.monotonic()
        return True

    def freeze_survivors(self) -> int:
        """After a burst has drained: the garbage collected, then what is alive leaves the full
        collections. Once every ``thaw_after`` seconds the frozen objects are let back in first,
        so that the one collection then walks everything: an object frozen while alive that
        died in a reference cycle is held at most that long. Returns how many are frozen in all.

        This runs on the event loop: a collection holds the GIL whichever thread runs it, so
        moving it to the executor would stop the same threads for the same time."""
        if time.monotonic() - self._last_thaw >= self.thaw_after:
            gc.unfreeze()
            self._last_thaw = time.monotonic()
        gc.collect()
        gc.freeze()
        frozen = gc.get_freeze_count()
        metrics.GC_FROZEN_OBJECTS.set(frozen)
        return frozen


_timing: list[Callable[[str, dict[str, Any]], None]] = []


def time_collections(observe: Callable[[int, float], None]) -> None:
    """Calls ``observe(generation, seconds)`` after each of Python's garbage collections
    (gc.callbacks): the pause every thread of the operator waits through."""
    stop_timing_collections()
    started = 0.0

    def callback(phase: str, info: dict[str, Any]) -> None:
        nonlocal started
        if phase == "start":
            started = time.perf_counter()
        else:
            observe(int(info["generation"]), time.perf_counter() - started)

    gc.callbacks.append(callback)
    _timing.append(callback)


def stop_timing_collections() -> None:
    while _timing:
        gc.callbacks.remove(_timing.pop())
