"""Prints the project's performance figures; targets live here, not in timed tests.

    make benchmark            # or: python cluster/benchmark.py [--runs N]

- warm start of the local control plane (binaries cached) to every component ready;
  target: under 15 s;
- time from `kubectl apply` of the samples to every model Ready, operator included;
- the planner's throughput (plans per second), pure Python;
- the decision's: ``decide()`` of each sample as a new model, and of the same models again
  (decisions per second), the pure step of every reconcile.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

import localcluster
from samples import on_simulated_fleet, prerequisites

REPO = localcluster.REPO
WARM_START_TARGET_S = 15.0


def figures(samples: list[float]) -> str:
    return f"min {min(samples):.1f}s  median {statistics.median(samples):.1f}s  max {max(samples):.1f}s  (n={len(samples)})"


def warm_starts(runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as state:
            cluster = localcluster.LocalCluster(Path(state), die_with_parent=True)
            started = time.monotonic()
            cluster.up()
            times.append(time.monotonic() - started)
            cluster.down()
    return times


def samples_label() -> str:
    """What the samples make, counted from manifests/samples/ (never a fixed text beside a measured time)."""
    import yaml

    docs = [yaml.safe_load(p.read_text()) for p in sorted((REPO / "manifests" / "samples").glob("*.yaml"))]
    compiles = sum(1 for d in docs if (d["spec"].get("compile") or {}).get("image"))
    return f"{len(docs)} models, {compiles} compile Jobs"


def samples_to_ready() -> float:
    with tempfile.TemporaryDirectory() as state:
        cluster = localcluster.LocalCluster(Path(state), die_with_parent=True)
        kubeconfig = cluster.up()
        operator = None
        try:
            cluster.install_crds()
            operator = subprocess.Popen(
                [sys.executable, "-m", "inferentia_operator", "run", "--liveness", "", "--metrics-port", "0"],
                env={"KUBECONFIG": str(kubeconfig), "PATH": "/usr/bin:/bin"},
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            time.sleep(2)  # let it log in and start watching
            started = time.monotonic()
            cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(prerequisites("default")))
            docs = [
                on_simulated_fleet(yaml.safe_load(p.read_text()), "default")
                for p in sorted((REPO / "manifests" / "samples").glob("*.yaml"))
            ]
            cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
            cluster.kubectl("wait", "--for=condition=Ready", "inferentiamodel", "--all", "--timeout=120s")
            return time.monotonic() - started
        finally:
            if operator:
                operator.terminate()
                operator.wait()
            cluster.down()


def planner_rate(seconds: float = 2.0) -> float:
    sys.path.insert(0, str(REPO / "operator"))
    from inferentia_operator.core.planner import plan
    from inferentia_operator.manifests import load_models

    specs = [d.spec for d in load_models([str(REPO / "manifests" / "samples")]).models if d.valid]
    count, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        for spec in specs:
            plan(spec)
        count += len(specs)
    return count / seconds


def decide_rate(seconds: float = 2.0, again: bool = False) -> float:
    """decide() of every sample as the API server holds a new model (no child yet): each a
    model not seen before (a UID of its own), or ``again`` the same models over and over, as
    the reconciles of one model's rollout and every resync see it (core/decide.py keeps the
    latest models checked and planned)."""
    sys.path.insert(0, str(REPO / "operator"))
    from inferentia_operator.core.decide import decide
    from inferentia_operator.core.observed import Observed

    bodies = []
    for path in sorted((REPO / "manifests" / "samples").glob("*.yaml")):
        body = yaml.safe_load(path.read_text())
        body["metadata"] |= {"namespace": "default", "generation": 1, "resourceVersion": "1"}
        bodies.append(body)
    count, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        for i, body in enumerate(bodies):
            uid = f"uid-{i}" if again else f"uid-{i}-{count}"
            decide(Observed({**body, "metadata": {**body["metadata"], "uid": uid}}), "2026-11-27T00:00:00Z")
        count += len(bodies)
    return count / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--planner-only", action="store_true",
        help="only the planner and the decision: the best of --runs 2-second runs each over this checkout's samples "
        "(to compare two checkouts in one session)",
    )  # fmt: skip
    args = parser.parse_args()
    runs = args.runs
    if args.planner_only:
        print(f"planner:                   {max(planner_rate() for _ in range(runs)):,.0f} plans/s (best of {runs})")
        print(f"decide, a new model:       {max(decide_rate() for _ in range(runs)):,.0f} decisions/s (best of {runs})")
        print(f"decide, the same again:    {max(decide_rate(again=True) for _ in range(runs)):,.0f} decisions/s (best of {runs})")
        return 0
    localcluster.bin_dir()  # build (or find) the binaries before timing anything
    starts = warm_starts(runs)
    verdict = "meets" if statistics.median(starts) < WARM_START_TARGET_S else "MISSES"
    print(f"control plane warm start:  {figures(starts)}  -> {verdict} the {WARM_START_TARGET_S:.0f}s target")
    print(f"samples apply -> Ready:    {samples_to_ready():.1f}s  ({samples_label()}, operator included)")
    print(f"planner:                   {planner_rate():,.0f} plans/s")
    print(f"decide, a new model:       {decide_rate():,.0f} decisions/s")
    print(f"decide, the same again:    {decide_rate(again=True):,.0f} decisions/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
