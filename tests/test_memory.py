"""Giving memory back after a burst (shell/memory.py)."""

import time

from inferentia_operator.shell import memory


def test_a_trim_comes_only_once_the_queue_is_empty_after_enough_work_and_not_too_often():
    trimmer = memory.Trimmer(after=3, interval=0.05)
    time.sleep(0.06)
    assert [trimmer.reconciled(queue_empty=False) for _ in range(3)] == [False, False, False]  # still busy
    assert trimmer.reconciled(queue_empty=True)  # drained after 4 reconciles
    assert not any(trimmer.reconciled(queue_empty=True) for _ in range(5))  # too soon after the last
    time.sleep(0.06)
    assert trimmer.reconciled(queue_empty=True)


def rss_mb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) // 1024


def test_on_glibc_a_bursts_freed_heap_goes_back_to_the_system():
    # glibc is what the operator's image (python:3.11-slim, Debian) runs on.
    assert memory.limit_arenas()
    burst = [bytes(2000) + bytes([i % 256]) for i in range(50_000)]  # 100 MB of malloc'd blocks
    pinned = bytes(2000) + b"x"  # above them in the heap: free() alone cannot shrink it
    high = rss_mb()
    del burst
    assert rss_mb() > high - 20  # freed, but kept by malloc
    assert memory.trim()
    assert rss_mb() < high - 80
    assert pinned
