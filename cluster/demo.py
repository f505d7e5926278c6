"""`make demo`: the operator's main job on the local control plane, in one command.

Brings the local control plane up (simulated Inferentia fleet), installs the CRDs,
starts the operator in the background, applies manifests/samples/*.yaml and
shows the models going from Compiling to Ready. Everything keeps running until
`make cluster-down`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import localcluster

REPO = localcluster.REPO
STATE = localcluster.DEFAULT_STATE
PID_FILE = STATE / "operator.pid"
LOG_FILE = STATE / "logs" / "operator.log"
PEERING = "inferentia-operator"


def kubectl(bins: Path, kubeconfig: Path, *args: str, input: str | None = None) -> str:
    result = subprocess.run(
        [str(bins / "kubectl"), "--kubeconfig", str(kubeconfig), *args], input=input, capture_output=True, text=True
    )
    if result.returncode:
        raise SystemExit(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


def start_operator(kubeconfig: Path) -> None:
    stop_operator()
    LOG_FILE.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "inferentia_operator", "run", "--peering", PEERING, "--liveness", ""],
        env={**os.environ, "KUBECONFIG": str(kubeconfig)},
        stdout=open(LOG_FILE, "ab"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    PID_FILE.write_text(str(proc.pid))


def stop_operator() -> None:
    try:
        pid = int(PID_FILE.read_text())
    except (OSError, ValueError):
        return
    try:
        os.killpg(pid, signal.SIGTERM)
        for _ in range(100):
            os.kill(pid, 0)
            time.sleep(0.1)
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    PID_FILE.unlink(missing_ok=True)


def main() -> int:
    if sys.argv[1:] == ["stop"]:
        stop_operator()
        return 0
    started = time.monotonic()
    cluster = localcluster.LocalCluster()
    kubeconfig = cluster.up()
    bins = localcluster.bin_dir()
    print(f"control plane ready ({time.monotonic() - started:.0f}s); simulated nodes:")
    print(kubectl(bins, kubeconfig, "get", "nodes", "-L", "node.kubernetes.io/instance-type", "-L", "aws.amazon.com/neuron"))
    kubectl(bins, kubeconfig, "apply", "--server-side", "-f", str(REPO / "crds"))
    kubectl(bins, kubeconfig, "wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    kubectl(bins, kubeconfig, "apply", "-f", "-", input=f"apiVersion: kopf.dev/v1\nkind: ClusterKopfPeering\nmetadata:\n  name: {PEERING}\n")
    start_operator(kubeconfig)
    print(f"operator started (log: {LOG_FILE.relative_to(REPO)})\n")
    samples = sorted((REPO / "manifests" / "samples").glob("*.yaml"))
    print(kubectl(bins, kubeconfig, "apply", *[a for s in samples for a in ("-f", str(s))]))

    last, deadline = "", time.monotonic() + 180
    while time.monotonic() < deadline:
        table = kubectl(bins, kubeconfig, "get", "inferentiamodels", "-o", "wide")
        if table != last:
            print(table)
            last = table
        rows = table.strip().splitlines()[1:]
        if rows and all(" Ready " in f" {row} " for row in rows):
            break
        time.sleep(1)
    else:
        print(f"not every model became Ready in time; see {LOG_FILE}", file=sys.stderr)
        return 1
    print(kubectl(bins, kubeconfig, "get", "jobs,deployments,pods", "-o", "wide"))
    print(
        f"All samples are Ready ({time.monotonic() - started:.0f}s). Everything keeps running; try:\n"
        f"  export KUBECONFIG={kubeconfig}\n"
        f"  {bins / 'kubectl'} get inferentiamodels\n"
        f"  {bins / 'kubectl'} get inferentiamodel resnet50 -o jsonpath='{{.status.plan}}'\n"
        f"  {bins / 'kubectl'} apply -f manifests/samples/invalid/three-processes-one-chip.yaml   # refused\n"
        "Stop it all with: make cluster-down"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
