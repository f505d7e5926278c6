"""The operator with Python's tracemalloc on, for benchmark_scale.py --memory: on SIGUSR1 it
writes the memory its live objects hold, by the line that allocated it, to the file named by
INFERENTIA_MEMORY_DUMP. Only for measuring: tracing every allocation slows the operator
several times over, so no other figure is taken from such a run.

    python cluster/operator_memory.py run --liveness '' ...     # as python -m inferentia_operator
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import tracemalloc
from types import FrameType

TOP = 30


def dump(_signum: int, _frame: FrameType | None) -> None:
    snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
    stats = snapshot.statistics("lineno")
    path = os.environ["INFERENTIA_MEMORY_DUMP"]
    with open(path + ".part", "w") as out:
        out.write(f"{sum(s.size for s in stats)} {sum(s.count for s in stats)} total\n")
        for s in stats[:TOP]:
            frame = s.traceback[0]
            out.write(f"{s.size} {s.count} {frame.filename}:{frame.lineno}\n")
    os.replace(path + ".part", path)


if __name__ == "__main__":
    tracemalloc.start(1)
    signal.signal(signal.SIGUSR1, dump)
    sys.argv = ["inferentia_operator", *sys.argv[1:]]
    runpy.run_module("inferentia_operator", run_name="__main__", alter_sys=True)
