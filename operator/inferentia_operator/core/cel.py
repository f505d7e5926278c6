"""The CEL side of the cross-field rules: the rule type, the catalogue as CEL literals, and
CEL expressions over the spec that several rules share.

Each message is one printf-style template: Python renders it with %, and the CRD's CEL
rule renders it with the same template through format(), so the CLI, the operator and
`kubectl apply` print identical text. (format() also keeps the API server's cost
estimator content: it costs string(int) inside a concatenation as unbounded,
kubernetes#124234.)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .catalogue import FAMILIES, HOSTS, bucket_budget_per_core
from .cores import core_request_counts, divisors, tensor_parallel_processes
from .findings import Finding, format_list


@dataclass(frozen=True)
class CrossFieldRule:
    """A rule over several fields, with its message template and its CEL twin."""

    path: str  # the field a finding names, e.g. "spec.processesPerReplica"
    node: str  # the schema node that carries the CEL rule, e.g. "spec"
    template: str
    cel_rule: str
    cel_args: tuple[str, ...]

    def finding(self, *args: Any) -> Finding:
        return Finding(self.path, self.template % args)

    def as_schema(self) -> dict[str, Any]:
        return {
            "rule": self.cel_rule,
            "messageExpression": f"{json.dumps(self.template)}.format([{', '.join(self.cel_args)}])",
            "fieldPath": self.path[len(self.node) :] if self.node else "." + self.path,
            "reason": "FieldValueInvalid",
        }


def literal(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{literal(k)}: {literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    return json.dumps(value)


FAMILY_LIST = list(FAMILIES.values())
NEURON_CC_FAMILIES = [f.name for f in FAMILY_LIST if not f.neuronx]
CEL_PHYSICAL_CORES = literal({f.name: f.physical_cores_per_chip for f in FAMILY_LIST})
CEL_DEFAULT_LNC = literal({f.name: f.default_lnc for f in FAMILY_LIST})
CEL_LNC_VALUES = literal({f.name: list(f.lnc_values) for f in FAMILY_LIST})
CEL_LNC_TEXT = literal({f.name: format_list(sorted(f.lnc_values)) for f in FAMILY_LIST})
CEL_MAX = literal({f.name: f.max_chips for f in FAMILY_LIST})
CEL_LARGEST = literal({f.name: f.largest_instance[0] for f in FAMILY_LIST})
CEL_TYPES = literal({f.name: list(f.instance_chips) for f in FAMILY_LIST})
CEL_TYPES_TEXT = literal({f.name: format_list(list(f.instance_chips)) for f in FAMILY_LIST})
# For every family and chip count: the types with at least that many chips, as text.
CEL_LARGE_ENOUGH_TEXT = literal(
    {
        f.name: {inf: format_list([t for t, c in f.instance_chips.items() if c >= inf]) for inf in range(1, f.max_chips + 1)}
        for f in FAMILY_LIST
    }
)
CEL_TYPE_CHIPS = literal({t: c for f in FAMILY_LIST for t, c in f.instance_chips.items()})
# What each instance type leaves to pods, as quantities, and every family's types as text.
CEL_ALLOC_CPU = literal({t: f"{h.allocatable_millicpu}m" for t, h in HOSTS.items()})
CEL_ALLOC_MEMORY = literal({t: f"{h.allocatable_memory_mib}Mi" for t, h in HOSTS.items()})
HOST_TEXT = {
    f.name: format_list([f"{t} ({HOSTS[t].allocatable_millicpu}m CPU, {HOSTS[t].allocatable_memory_mib}Mi)" for t in f.instance_chips])
    for f in FAMILY_LIST
}
CEL_HOST_TEXT = literal(HOST_TEXT)
CEL_BUCKET_BUDGET = literal({f.name: {lnc: bucket_budget_per_core(f, lnc) for lnc in f.lnc_values} for f in FAMILY_LIST})
# Every core count a valid request gives: whole chips (inf) or cores.
REQUEST_CORE_COUNTS = sorted(
    {f.cores_per_chip(lnc) * inf for f in FAMILY_LIST for lnc in f.lnc_values for inf in range(1, f.max_chips + 1)}
    | {n for f in FAMILY_LIST for lnc in f.lnc_values for n in core_request_counts(f, lnc)}
)
# The valid processesPerReplica of each of them, as text.
CEL_DIVISORS = literal({cores: format_list(divisors(cores)) for cores in REQUEST_CORE_COUNTS})
CEL_CORE_COUNTS_TEXT = literal({f.name: format_list(core_request_counts(f, 1)) for f in FAMILY_LIST})
# One instance's cores at LNC 1, per family: the most a cores request may ask for.
CEL_MAX_CORES = literal({f.name: f.cores_per_chip(1) * f.max_chips for f in FAMILY_LIST})
# Families whose runtime restricts tensor-parallel group sizes (trn1): for every core
# count, the processesPerReplica values whose groups it can run, as text.
TP_RESTRICTED = [f for f in FAMILY_LIST if f.tensor_parallel_sizes is not None]
CEL_TP_PROCESSES_TEXT = literal(
    {f.name: {cores: format_list(tensor_parallel_processes(f, cores)) for cores in REQUEST_CORE_COUNTS} for f in TP_RESTRICTED}
)

# CEL fragments over the spec (self = spec).
CEL_FAMILY, CEL_INF, CEL_PROCESSES, CEL_WEIGHTS = (
    "self.compute.family",
    "self.compute.inf",
    "self.processesPerReplica",
    "self.model.weights",
)
CEL_LNC = f"(has(self.compute.lnc) ? self.compute.lnc : {CEL_DEFAULT_LNC}[{CEL_FAMILY}])"
CEL_HAS_CORES = "has(self.compute.cores)"
CEL_CORES = f"({CEL_HAS_CORES} ? self.compute.cores : {CEL_PHYSICAL_CORES}[{CEL_FAMILY}] / {CEL_LNC} * {CEL_INF})"
# Only where the request is one of inf and cores, of a size the family can place, at an
# LNC it supports, is there a core count to divide (cores.request_ok).
# The core counts a cores request may have (cores.core_request_counts), as arithmetic: the
# API server's cost estimator cannot bound a list looked up in a literal map.
_CEL_SHAPED = " && ".join(
    f"({CEL_FAMILY} != {literal(f.name)} || self.compute.cores <= {f.cores_per_chip(1)}"
    f" || (self.compute.cores % {f.cores_per_chip(1)} == 0 && self.compute.cores / {f.cores_per_chip(1)} in {literal(list(f.allowed_chip_counts or ()))}))"
    for f in FAMILY_LIST
    if f.allowed_chip_counts
)
CEL_CORE_REQUEST_OK = f"({CEL_LNC} == 1 && self.compute.cores <= {CEL_MAX_CORES}[{CEL_FAMILY}] && {_CEL_SHAPED or 'true'})"
CEL_FITS = (
    f"has(self.compute.inf) != {CEL_HAS_CORES} && {CEL_LNC} in {CEL_LNC_VALUES}[{CEL_FAMILY}]"
    f" && ({CEL_HAS_CORES} ? {CEL_CORE_REQUEST_OK} : {CEL_INF} <= {CEL_MAX}[{CEL_FAMILY}])"
)
# The same fragments at the compute node (self = spec.compute).
C_LNC = f"(has(self.lnc) ? self.lnc : {CEL_DEFAULT_LNC}[self.family])"
C_PER_CHIP = f"({CEL_PHYSICAL_CORES}[self.family] / {C_LNC})"
C_ONE_REQUEST = "has(self.inf) != has(self.cores)"
# An LNC the family supports: below it a chip may show no whole core (inf2 at lnc 4), and
# C_CHIPS would divide by zero.
C_LNC_OK = f"{C_LNC} in {CEL_LNC_VALUES}[self.family]"
# The chips an instance needs for one replica (cores.chips_needed); only with C_ONE_REQUEST
# and C_LNC_OK.
C_CHIPS = f"(has(self.cores) ? (self.cores + {C_PER_CHIP} - 1) / {C_PER_CHIP} : self.inf)"
CEL_DIVIDES = f"{CEL_CORES} % {CEL_PROCESSES} == 0"
CEL_GROUP = f"({CEL_CORES} / {CEL_PROCESSES})"
CEL_BUDGET = f"{CEL_BUCKET_BUDGET}[{CEL_FAMILY}][{CEL_LNC}]"
CEL_BUCKET_LIMIT = f"({CEL_GROUP} * ((2 * {CEL_BUDGET} + {CEL_WEIGHTS}) / (2 * {CEL_WEIGHTS})))"  # round_half_up_div in integers
