"""The operator with Python's tracemalloc on, for benchmark_scale.py --memory: on SIGUSR1 it
writes the memory its live objects hold, by the line that allocated it, to the file named by
INFERENTIA_MEMORY_DUMP, and what the two allocators beneath hold: pymalloc's arenas (objects
of up to 512 bytes; sys._debugmallocstats) and glibc's heaps (everything larger and every C
library's buffers; malloc_info(3)), each with how much of it is in use. Only for measuring: tracing every allocation slows the operator
several times over, so no other figure is taken from such a run.

    python cluster/operator_memory.py run --liveness '' ...     # as python -m inferentia_operator
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
import runpy
import signal
import sys
import tempfile
import tracemalloc
import xml.etree.ElementTree as ET
from types import FrameType

TOP = 30


def _captured_stderr(call) -> str:
    with tempfile.TemporaryFile(mode="w+") as tmp:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            call()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        return tmp.read()


def pymalloc() -> tuple[int, int]:
    """Bytes of pymalloc's arenas, and of them in blocks in use."""
    text = _captured_stderr(sys._debugmallocstats)  # noqa: SLF001 - the only way CPython reports its arenas

    def figure(label: str) -> int:
        found = re.search(rf"# {label}\s*=\s*([\d,]+)", text)
        return int(found.group(1).replace(",", "")) if found else 0

    return figure("arenas allocated current") * 1024 * 1024, figure("bytes in allocated blocks")


def glibc() -> tuple[int, int, int]:
    """Bytes of glibc's arenas (every one, not only the main), of them free, and mmapped chunks."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.fopen.restype = ctypes.c_void_p
    with tempfile.NamedTemporaryFile(suffix=".xml") as tmp:
        handle = libc.fopen(tmp.name.encode(), b"w")
        libc.malloc_info(0, ctypes.c_void_p(handle))
        libc.fclose(ctypes.c_void_p(handle))
        root = ET.parse(tmp.name).getroot()
    totals = {t.get("type"): int(t.get("size") or 0) for t in root.findall("total")}
    systems = {t.get("type"): int(t.get("size") or 0) for t in root.findall("system")}
    return systems.get("current", 0), totals.get("fast", 0) + totals.get("rest", 0), totals.get("mmap", 0)


def dump(_signum: int, _frame: FrameType | None) -> None:
    if tracemalloc.is_tracing():
        snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
        stats = snapshot.statistics("lineno")
    else:
        stats = []
    path = os.environ["INFERENTIA_MEMORY_DUMP"]
    with open(path + ".part", "w") as out:
        out.write(f"{sum(s.size for s in stats)} {sum(s.count for s in stats)} total\n")
        arenas, used = pymalloc()
        heaps, free, mapped = glibc()
        out.write(f"{arenas} {used} [pymalloc arenas, in use]\n{heaps} {free} [glibc heaps, free]\n{mapped} 0 [glibc mmapped]\n")
        for s in stats[:TOP]:
            frame = s.traceback[0]
            out.write(f"{s.size} {s.count} {frame.filename}:{frame.lineno}\n")
    os.replace(path + ".part", path)


if __name__ == "__main__":
    # INFERENTIA_MEMORY_TRACE=0: no tracing, only the allocators' figures (pymalloc reports
    # nothing while tracemalloc's hooks stand in front of it).
    if os.environ.get("INFERENTIA_MEMORY_TRACE", "1") == "1":
        tracemalloc.start(1)
    signal.signal(signal.SIGUSR1, dump)
    sys.argv = ["inferentia_operator", *sys.argv[1:]]
    runpy.run_module("inferentia_operator", run_name="__main__", alter_sys=True)
