"""Core groups: the LNC, the processes that share the replica's cores evenly, and the group sizes a runtime can run tensor parallel."""

from __future__ import annotations

from inferentia_operator.core.api import InferentiaModelSpec
from inferentia_operator.core.catalogue import Family
from inferentia_operator.core.cel import (
    CEL_CORES,
    CEL_DIVIDES,
    CEL_DIVISORS,
    CEL_FAMILY,
    CEL_FITS,
    CEL_GROUP,
    CEL_INF,
    CEL_LNC_TEXT,
    CEL_LNC_VALUES,
    CEL_PROCESSES,
    CEL_TP_PROCESSES_TEXT,
    TP_RESTRICTED,
    CrossFieldRule,
    literal,
)
from inferentia_operator.core.cores import (
    divisors,
    group_size_of,
    replica_cores,
    request_ok,
    tensor_parallel_processes,
)
from inferentia_operator.core.findings import Finding, format_list

# Logical NeuronCores: trn2 groups 1 or 2 physical cores into a logical one; every other
# family only 1 (NCC_EARG001).
LNC_VALUE = CrossFieldRule(
    "spec.compute.lnc",
    "spec.compute",
    "%d is not supported on %s; valid values are %s",
    f"!has(self.lnc) || self.lnc in {CEL_LNC_VALUES}[self.family]",
    ("self.lnc", "self.family", f"{CEL_LNC_TEXT}[self.family]"),
)


def _check_lnc(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    lnc = spec.compute.lnc
    if lnc is None or lnc in fam.lnc_values:
        return []
    return [LNC_VALUE.finding(lnc, fam.name, format_list(sorted(fam.lnc_values)))]


# Rule 3: the processes share the replica's NeuronCores evenly (an oversized inf is rule 2's).
DIVISIBLE = CrossFieldRule(
    "spec.processesPerReplica",
    "spec",
    "cannot evenly distribute %d %s %s (%d NeuronCores) over %d processes; valid values are %s",
    f"has(self.compute.cores) || !({CEL_FITS}) || {CEL_DIVIDES}",
    (CEL_INF, CEL_FAMILY, f"({CEL_INF} == 1 ? 'chip' : 'chips')", CEL_CORES, CEL_PROCESSES, f"{CEL_DIVISORS}[{CEL_CORES}]"),
)


DIVISIBLE_CORES = CrossFieldRule(
    "spec.processesPerReplica",
    "spec",
    "cannot evenly distribute %d %s NeuronCores over %d processes; valid values are %s",
    f"!has(self.compute.cores) || !({CEL_FITS}) || {CEL_DIVIDES}",
    ("self.compute.cores", CEL_FAMILY, CEL_PROCESSES, f"{CEL_DIVISORS}[{CEL_CORES}]"),
)


def _check_divisibility(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    inf, p = spec.compute.inf, spec.processes_per_replica
    cores = replica_cores(spec, fam)
    if not request_ok(spec, fam) or cores % p == 0:
        return []
    if inf is None:
        return [DIVISIBLE_CORES.finding(cores, fam.name, p, format_list(divisors(cores)))]
    chips = "chip" if inf == 1 else "chips"
    return [DIVISIBLE.finding(inf, fam.name, chips, cores, p, format_list(divisors(cores)))]


# Tensor-parallel groups on trn1: its runtime loads collectives only on 1, 2, 8, 16 or a
# multiple of 32 cores ("Unsupported topology", huggingface/optimum-neuron#619).
TENSOR_PARALLEL_GROUP = {
    f.name: CrossFieldRule(
        "spec.processesPerReplica",
        "spec",
        f"a {f.name} group of %d NeuronCores cannot run one model tensor parallel: the runtime loads collectives "
        f"only on {format_list(list(f.tensor_parallel_sizes or ()))} or a multiple of {f.tensor_parallel_multiple} "
        "cores (huggingface/optimum-neuron#619); valid values for %d NeuronCores are %s",
        f"{CEL_FAMILY} != {literal(f.name)} || !({CEL_FITS} && {CEL_DIVIDES})"
        f" || {CEL_GROUP} in {literal(list(f.tensor_parallel_sizes or ()))} || {CEL_GROUP} % {f.tensor_parallel_multiple} == 0",
        (CEL_GROUP, CEL_CORES, f"{CEL_TP_PROCESSES_TEXT}[{literal(f.name)}][{CEL_CORES}]"),
    )
    for f in TP_RESTRICTED
}


def _check_tensor_parallel(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    group = group_size_of(spec, fam)
    if group is None or fam.name not in TENSOR_PARALLEL_GROUP or fam.tensor_parallel_ok(group):
        return []
    cores = replica_cores(spec, fam)
    valid = format_list(tensor_parallel_processes(fam, cores))
    return [TENSOR_PARALLEL_GROUP[fam.name].finding(group, cores, valid)]


RULES: list[CrossFieldRule] = [
    LNC_VALUE,
    DIVISIBLE,
    DIVISIBLE_CORES,
    *TENSOR_PARALLEL_GROUP.values(),
]
CHECKS = (_check_lnc, _check_divisibility, _check_tensor_parallel)
