"""The arithmetic of cores, groups and memory that the rules and the planner share."""

from __future__ import annotations

from .api import InferentiaModelSpec
from .catalogue import Family, bucket_budget_per_core


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def round_half_up_div(numerator: int, denominator: int) -> int:
    """round(numerator / denominator) with halves rounded up, in integers (as the CEL rule computes it)."""
    return (2 * numerator + denominator) // (2 * denominator)


def bytes_per_weight(precision: str) -> int:
    return 4 if precision == "fp32" else 2


def lnc_of(spec: InferentiaModelSpec, family: Family) -> int:
    """The spec's logical NeuronCore configuration, or the family's default."""
    return spec.compute.lnc if spec.compute.lnc is not None else family.default_lnc


def replica_cores(spec: InferentiaModelSpec, family: Family) -> int:
    """The replica's NeuronCores, in logical cores."""
    return family.cores_per_chip(lnc_of(spec, family)) * spec.compute.inf


def group_size_of(spec: InferentiaModelSpec, family: Family) -> int | None:
    """The cores of one group, or None when the spec has no valid group size to check against."""
    lnc, cores = lnc_of(spec, family), replica_cores(spec, family)
    if spec.compute.inf > family.max_chips or lnc not in family.lnc_values or cores % spec.processes_per_replica:
        return None
    return cores // spec.processes_per_replica


def max_buckets_per_group(family: Family, lnc: int, group_size: int, weights: int) -> int:
    """The bucketing note's round(10^9 / weights) bucketed models per NeuronCore (scaled for non-inf1 cores)."""
    return group_size * round_half_up_div(bucket_budget_per_core(family, lnc), weights)


def tensor_parallel_processes(family: Family, cores: int) -> list[int]:
    """The processesPerReplica values whose groups the family's runtime can run tensor parallel."""
    return [d for d in divisors(cores) if family.tensor_parallel_ok(cores // d)]
