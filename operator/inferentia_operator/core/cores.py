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


def core_request_counts(family: Family, lnc: int) -> list[int]:
    """The NeuronCore counts a ``cores`` request may have on the family at this LNC.

    The device plugin hands out single cores as aws.amazon.com/neuroncore, and the Neuron
    scheduler extension places a request of more than one on directly connected cores:
    contiguous on the ring of inf1 and inf2 devices (any count up to an instance's), and
    on trn1's torus only in the device shapes its containers may use, so one chip's cores
    or 1, 4, 8 or 16 whole chips' (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/containers/tutorials/k8s-neuron-scheduler.html).
    Only at LNC 1: how the plugin counts cores under a logical NeuronCore configuration is
    not documented, so trn2 core requests need lnc: 1."""
    if lnc != 1:
        return []
    per = family.cores_per_chip(lnc)
    if family.allowed_chip_counts:
        return sorted(set(range(1, per + 1)) | {per * k for k in family.allowed_chip_counts})
    return list(range(1, per * family.max_chips + 1))


def replica_cores(spec: InferentiaModelSpec, family: Family) -> int:
    """The replica's NeuronCores, in logical cores: its cores request, or its chips' cores."""
    if spec.compute.cores is not None:
        return spec.compute.cores
    return family.cores_per_chip(lnc_of(spec, family)) * (spec.compute.inf or 0)


def chips_needed(spec: InferentiaModelSpec, family: Family) -> int:
    """The chips an instance needs for one replica: its inf, or as many as its cores fill."""
    if spec.compute.cores is not None:
        return -(-spec.compute.cores // family.cores_per_chip(lnc_of(spec, family)))
    return spec.compute.inf or 0


def request_ok(spec: InferentiaModelSpec, family: Family) -> bool:
    """Exactly one of inf and cores, of a size the family can place, at an LNC it supports."""
    compute, lnc = spec.compute, lnc_of(spec, family)
    if not compute.one_request or lnc not in family.lnc_values:
        return False
    if compute.cores is not None:
        return compute.cores in core_request_counts(family, lnc)
    return compute.inf is not None and compute.inf <= family.max_chips


def group_size_of(spec: InferentiaModelSpec, family: Family) -> int | None:
    """The cores of one group, or None when the spec has no valid group size to check against."""
    cores = replica_cores(spec, family)
    if not request_ok(spec, family) or cores % spec.processes_per_replica:
        return None
    return cores // spec.processes_per_replica


def max_buckets_per_group(family: Family, lnc: int, group_size: int, weights: int) -> int:
    """The bucketing note's round(10^9 / weights) bucketed models per NeuronCore (scaled for non-inf1 cores)."""
    return group_size * round_half_up_div(bucket_budget_per_core(family, lnc), weights)


def tensor_parallel_processes(family: Family, cores: int) -> list[int]:
    """The processesPerReplica values whose groups the family's runtime can run tensor parallel."""
    return [d for d in divisors(cores) if family.tensor_parallel_ok(cores // d)]
