"""Warnings only: a spec that sizes its pods below what the model needs (:mod:`..sizing`).
Each names the computed value. Nothing is warned of a model whose weights are unknown: the
need would be a guess."""

from __future__ import annotations

from decimal import Decimal

from inferentia_operator.core import sizing
from inferentia_operator.core.api import InferentiaModelSpec
from inferentia_operator.core.catalogue import Family
from inferentia_operator.core.cores import group_size_of, replica_cores, weights_bytes
from inferentia_operator.core.drift import quantity
from inferentia_operator.core.findings import Finding


def _gb(size: int) -> str:
    return f"{size / 1e9:.1f} GB" if size >= 10**9 else f"{size / 1e6:.0f} MB"


def _gi(size: int) -> str:
    return f"{sizing.gib(size)}Gi"


def _less(path: str, given: str | int, need: str, why: str, advice: str = "") -> Finding:
    return Finding(path, f"{given} is less than the {need} {why}; use at least {need}{advice}", "warning")


def _below(given: str | None, need: int | Decimal) -> bool:
    value = quantity(given) if given is not None else None
    return value is not None and value < need


def _check_sizes(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    weights = weights_bytes(spec)
    group = group_size_of(spec, fam)
    if weights is None or group is None:
        return []
    groups = replica_cores(spec, fam) // group
    processes = f"{groups} process{'es' if groups > 1 else ''}"
    of_weights = f"{_gb(weights)} of {spec.model.precision} weights"
    found = []
    memory = sizing.replica_memory_bytes(spec, fam, groups)
    if memory is not None and _below(spec.compute.memory, memory):
        if spec.compute.nodes > 1:
            # sizing.replica_memory_bytes: a pod a node, each loading its own ranks' share.
            nodes = spec.compute.nodes
            why = f"each of a replica's {nodes} pods needs to load its node's share of the weights ({of_weights} over {nodes} nodes)"
            found.append(_less("spec.compute.memory", spec.compute.memory, _gi(memory), why))
        elif sizing.compiles_in_pod(spec):
            compile_need = _gi(sizing.compile_memory_bytes(spec, fam))
            why = (
                f"a replica of this model needs to compile in the pod ({processes} x {compile_need}: twice its {of_weights}, at least 8Gi)"
            )
            found.append(_less("spec.compute.memory", spec.compute.memory, _gi(memory), why, ", or set compile.image"))
        else:
            why = f"a replica of this model needs to load it ({processes} x {of_weights}, which pass through host memory on their way to the device)"
            found.append(_less("spec.compute.memory", spec.compute.memory, _gi(memory), why))
    per_compile = quantity(sizing.compile_cpu(spec, fam))
    if sizing.compiles_in_pod(spec) and per_compile is not None:
        cpu = groups * per_compile  # a quantity (500m is half a CPU), never an int() of its text
        if _below(spec.compute.cpu, cpu):
            why = f"a replica needs to compile in the pod ({processes} x {sizing.compile_cpu(spec, fam)}, a compile Job's CPU)"
            found.append(_less("spec.compute.cpu", spec.compute.cpu, f"{cpu.normalize():f}", why, ", or set compile.image"))
    home = sizing.home_bytes(spec)
    if _below(spec.serving.home_size, home):
        why = "this model's pods write under HOME (its download from the Hugging Face Hub, and a compile at start), with room"
        found.append(_less("spec.serving.homeSize", str(spec.serving.home_size), _gi(home), why, ", or leave it unset"))
    if spec.compile.image is not None:
        compile_memory = sizing.compile_memory_bytes(spec, fam)
        if _below(spec.compile.memory, compile_memory):
            why = f"a compile of this model needs (twice its {of_weights}, at least 8Gi)"
            found.append(_less("spec.compile.memory", str(spec.compile.memory), _gi(compile_memory), why))
    startup = sizing.startup_seconds(spec)
    given = spec.serving.startup_seconds
    if given is not None and given < startup:
        why = "seconds this model's pods may need to start (loading, the download at 100 MiB/s, and a compile at start)"
        found.append(_less("spec.serving.startupSeconds", given, str(startup), why, ", or leave it unset"))
    return found


RULES = ()  # warnings only: nothing for the CRD to refuse
CHECKS = (_check_sizes,)
__all__ = ["CHECKS", "RULES"]
