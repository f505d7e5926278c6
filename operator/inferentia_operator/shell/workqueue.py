"""A coalescing work queue of model keys, in the manner of client-go's workqueue.

- A key is queued at most once: a burst of events for one model (its pods starting,
  its ReplicaSet scaling) becomes one reconcile, run against the latest cached state.
- A key is never reconciled by two workers at once: added while it is being worked on,
  it is marked dirty and queued again when the worker is done.
- Two lanes: a model that was created or whose spec changed goes ahead of reconciles
  triggered only by its children's status, so a new model never waits behind a queue
  of others' no-op reconciles; and a worker that takes only the urgent lane
  (``get(urgent_only=True)``) keeps one from waiting for a worker busy with those.
- Failed keys come back after a per-key exponential backoff.

Everything runs on the operator's event loop (kopf's), so no locks are needed.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    def __init__(self, base_delay: float = 1.0, max_delay: float = 300.0, observe_wait: Callable[[str, float], None] | None = None):
        """``observe_wait(lane, seconds)``: how long each key waited, from the moment it was
        queued until a worker took it ("urgent" or "normal"), as client-go's
        workqueue_queue_duration_seconds."""
        self._observe_wait = observe_wait
        self._since: dict[K, float] = {}
        self._urgent: deque[K] = deque()
        self._normal: deque[K] = deque()
        self._queued: set[K] = set()
        self._active: set[K] = set()
        self._dirty: dict[K, bool] = {}  # key -> urgent
        self._failures: dict[K, int] = {}
        self._wakeup = asyncio.Event()
        self.base_delay, self.max_delay = base_delay, max_delay

    def __len__(self) -> int:
        return len(self._urgent) + len(self._normal)

    def add(self, key: K, urgent: bool = False) -> None:
        if key in self._active:
            self._dirty[key] = self._dirty.get(key, False) or urgent
            return
        if key in self._queued:
            if urgent and key in self._normal:
                self._normal.remove(key)  # O(n), but only when a queued key turns urgent
                self._urgent.append(key)
            return
        self._queued.add(key)
        self._since[key] = time.monotonic()
        (self._urgent if urgent else self._normal).append(key)
        self._wakeup.set()

    async def get(self, urgent_only: bool = False) -> K:
        """The next key, urgent ones first; ``urgent_only``: wait for an urgent one."""
        while not (self._urgent or (self._normal and not urgent_only)):
            self._wakeup.clear()
            await self._wakeup.wait()
        lane = "urgent" if self._urgent else "normal"
        key = (self._urgent or self._normal).popleft()
        self._queued.discard(key)
        self._active.add(key)
        since = self._since.pop(key, None)
        if self._observe_wait is not None and since is not None:
            self._observe_wait(lane, time.monotonic() - since)
        return key

    def done(self, key: K) -> None:
        """The worker finished ``key``; if it was added meanwhile, it goes back in the queue."""
        self._active.discard(key)
        if key in self._dirty:
            self.add(key, self._dirty.pop(key))

    def forget(self, key: K) -> None:
        """The key succeeded: its next failure starts the backoff afresh."""
        self._failures.pop(key, None)

    def retry_delay(self, key: K) -> float:
        """Records a failure of ``key`` and returns how long to wait before retrying it."""
        n = self._failures.get(key, 0)
        self._failures[key] = n + 1
        return float(min(self.max_delay, self.base_delay * 2**n))

    def add_after(self, key: K, delay: float) -> None:
        asyncio.get_running_loop().call_later(delay, self.add, key)
