"""Whole chips against NeuronCores: what a mix of small and large models needs, and what fits.

    make benchmark-cores            # or: python cluster/benchmark_cores.py --nodes 6

A mix of models on inf2 (2 NeuronCores a chip): many that need one core, some that need
one chip, a few that need four. Each is planned twice by the operator's own planner and
builders: once asking for whole chips (``inf``, the smallest number that holds its
cores) and once for its cores (``cores``). Then, on a fresh local control plane whose
simulated fleet has ``--nodes`` inf2.24xlarge nodes (6 chips, 12 cores each), the
serving Deployments of each variant are created and kube-scheduler decides: every pod
is either placed or refused with the scheduler's Insufficient message.

Printed: the chips each variant asks for, the chips and nodes that frees, and how many
replicas the same fleet places under each. The simulated nodes count chips and cores
per node, not per device, so what the Neuron scheduler extension adds on a real cluster
(contiguous cores inside a node) is not part of the figure.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

import localcluster
from benchmark_scale import client, create_all
from inferentia_operator.core.model import check_model
from inferentia_operator.core.serving.deployment import serving_deployment

NAMESPACE = "default"
NODE_TYPE = "inf2.24xlarge"
CORES_PER_CHIP = 2
CHIPS_PER_NODE = 6
# (what, NeuronCores one replica needs, how many models), created largest first: the
# default scheduler spreads pods over nodes, so 8-core replicas created last would find
# the free cores scattered two to a node.
MIX = [("large", 8, 3), ("medium", 2, 6), ("small", 1, 24)]


def spec(cores: int, variant: str) -> dict[str, Any]:
    request = {"inf": math.ceil(cores / CORES_PER_CHIP)} if variant == "chips" else {"cores": cores}
    return {
        "model": {"uri": "s3://models/mix/", "framework": "pytorch", "architecture": "transformer"},
        "compute": {"family": "inf2", "instanceTypes": [NODE_TYPE], "cpu": "500m", "memory": "1Gi", **request},
        "processesPerReplica": 1,
        "serving": {"image": "example.com/serve:1"},
    }


def deployments(variant: str) -> list[dict[str, Any]]:
    """The serving Deployments of the mix, from the operator's planner and builders."""
    out = []
    for what, cores, count in MIX:
        for i in range(count):
            checked = check_model(f"{what}-{i}", NAMESPACE, spec(cores, variant), uid="bench")
            assert checked.model is not None, checked.findings
            body = serving_deployment(checked.model)
            body["metadata"].pop("ownerReferences")
            out.append(body)
    return out


def requested(bodies: list[dict[str, Any]], resource: str) -> int:
    return sum(int(b["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"].get(resource, 0)) for b in bodies)


def fleet(path: Path, nodes: int) -> Path:
    base = yaml.safe_load(localcluster.FLEET.read_text())
    base["nodes"] = [{"instanceType": NODE_TYPE, "count": nodes}, {"instanceType": "m5.xlarge", "count": 1}]
    path.write_text(yaml.safe_dump(base))
    return path


def placed(variant: str, nodes: int, workdir: Path) -> tuple[int, int, str]:
    """Replicas the scheduler placed and refused on a fresh fleet, and one refusal's message."""
    cluster = localcluster.LocalCluster(workdir / variant, fleet_file=fleet(workdir / f"{variant}.yaml", nodes), die_with_parent=True)
    cluster.up()
    try:
        kube = client(cluster)
        bodies = deployments(variant)
        create_all(kube, bodies)

        def decided() -> list[dict[str, Any]] | None:
            pods = kube.list("Pod", NAMESPACE, "app.kubernetes.io/component=serving")
            scheduled = [
                next((c for c in (p.get("status") or {}).get("conditions") or [] if c.get("type") == "PodScheduled"), {}) for p in pods
            ]
            if len(pods) < len(bodies) or any(c.get("status") not in ("True", "False") for c in scheduled):
                return None
            return scheduled

        deadline = time.monotonic() + 180
        while (scheduled := decided()) is None:
            if time.monotonic() > deadline:
                raise TimeoutError("the scheduler did not decide every pod")
            time.sleep(1)
        refused = [c for c in scheduled if c.get("status") == "False"]
        return len(scheduled) - len(refused), len(refused), (refused[0].get("message", "") if refused else "")
    finally:
        cluster.down()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=6, help=f"{NODE_TYPE} nodes in the simulated fleet")
    args = parser.parse_args()
    chips_bodies, cores_bodies = deployments("chips"), deployments("cores")
    whole = requested(chips_bodies, "aws.amazon.com/neuron")
    cores = requested(cores_bodies, "aws.amazon.com/neuroncore")
    by_cores = math.ceil(cores / CORES_PER_CHIP)
    replicas = len(chips_bodies)
    mix = ", ".join(f"{n} {what} models of {c} NeuronCore{'s' if c > 1 else ''}" for what, c, n in MIX)
    print(f"mix: {mix} ({replicas} replicas, inf2)")
    print(f"({time.strftime('%Y-%m-%d')}, fleet of {args.nodes} {NODE_TYPE}: {args.nodes * CHIPS_PER_NODE} chips)\n")
    print("| allocation | asks for | chips | nodes of 6 chips | replicas placed | refused |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        results = {variant: placed(variant, args.nodes, Path(tmp)) for variant in ("chips", "cores")}
    for variant, asks, chips in (
        ("whole chips (inf)", f"{whole} aws.amazon.com/neuron", whole),
        ("NeuronCores (cores)", f"{cores} aws.amazon.com/neuroncore", by_cores),
    ):
        ok, refused, _ = results["chips" if variant.startswith("whole") else "cores"]
        print(f"| {variant} | {asks} | {chips} | {math.ceil(chips / CHIPS_PER_NODE)} | {ok} of {replicas} | {refused} |")
    freed = whole - by_cores
    print(f"\nfreed by core allocation: {freed} chips = {freed / whole:.0%} of what whole chips need "
          f"({math.ceil(whole / CHIPS_PER_NODE) - math.ceil(by_cores / CHIPS_PER_NODE)} of {math.ceil(whole / CHIPS_PER_NODE)} nodes)")  # fmt: skip
    for variant, (_, refused, message) in results.items():
        if refused:
            print(f"{variant}: the scheduler refused {refused}: {message[:160]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
