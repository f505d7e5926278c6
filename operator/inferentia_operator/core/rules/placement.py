"""Where a replica can run: the instance types it names, and the CPU and memory they leave to pods."""

from __future__ import annotations

import re

from inferentia_operator.core.api import InferentiaModelSpec
from inferentia_operator.core.catalogue import Family, host_fits
from inferentia_operator.core.cel import (
    C_CHIPS,
    C_LNC_OK,
    C_ONE_REQUEST,
    CEL_ALLOC_CPU,
    CEL_ALLOC_MEMORY,
    CEL_HOST_TEXT,
    CEL_LARGE_ENOUGH_TEXT,
    CEL_MAX,
    CEL_TYPE_CHIPS,
    CEL_TYPES,
    CEL_TYPES_TEXT,
    FAMILY_LIST,
    HOST_TEXT,
    CrossFieldRule,
    literal,
)
from inferentia_operator.core.cores import (
    chips_needed,
    lnc_of,
)
from inferentia_operator.core.drift import quantity
from inferentia_operator.core.findings import Finding, format_list
from inferentia_operator.core.rules.child_values import QUANTITY_GRAMMAR

# instanceTypes: every entry belongs to the family, and one of them holds a replica.
_listed_known = f"self.instanceTypes.all(t, t in {CEL_TYPES}[self.family])"
UNKNOWN_INSTANCE_TYPE = CrossFieldRule(
    "spec.compute.instanceTypes",
    "spec.compute",
    "'%s' is not one of the %s instance types; valid values are %s",
    f"!has(self.instanceTypes) || {_listed_known}",
    (
        f"self.instanceTypes.filter(t, !(t in {CEL_TYPES}[self.family]))[0]",
        "self.family",
        f"{CEL_TYPES_TEXT}[self.family]",
    ),
)
SMALL_INSTANCE_TYPES = CrossFieldRule(
    "spec.compute.instanceTypes",
    "spec.compute",
    "none of the listed instance types has %d chips; %s types with at least %d chips: %s",
    f"!has(self.instanceTypes) || !{_listed_known} || !({C_ONE_REQUEST}) || !({C_LNC_OK}) || {C_CHIPS} > {CEL_MAX}[self.family]"
    f" || self.instanceTypes.exists(t, {CEL_TYPE_CHIPS}[t] >= {C_CHIPS})",
    (C_CHIPS, "self.family", C_CHIPS, f"{CEL_LARGE_ENOUGH_TEXT}[self.family][{C_CHIPS}]"),
)


def _check_instance_types(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    listed = spec.compute.instance_types
    if listed is None:
        return []
    unknown = [t for t in listed if t not in fam.instance_chips]
    if unknown:
        return [UNKNOWN_INSTANCE_TYPE.finding(unknown[0], fam.name, format_list(list(fam.instance_chips)))]
    if not spec.compute.one_request or lnc_of(spec, fam) not in fam.lnc_values:
        return []  # no chip count to compare (LNC_VALUE and ONE_REQUEST say why)
    inf = chips_needed(spec, fam)
    if inf > fam.max_chips or any(fam.instance_chips[t] >= inf for t in listed):
        return []
    large_enough = [t for t, chips in fam.instance_chips.items() if chips >= inf]
    return [SMALL_INSTANCE_TYPES.finding(inf, fam.name, inf, format_list(large_enough))]


# The replica's CPU and memory must fit what some allowed instance type with the chips
# leaves to pods (catalogue.HOSTS); checked only where the other compute rules hold.
_CPU, _MEMORY = "string(self.cpu)", "string(self.memory)"


CHIPS_TEXT = {n: "1 chip" if n == 1 else f"{n} chips" for n in range(1, max(f.max_chips for f in FAMILY_LIST) + 1)}
_TYPES_CONSIDERED = f"(has(self.instanceTypes) ? self.instanceTypes : {CEL_TYPES}[self.family])"
HOST_FITS = CrossFieldRule(
    "spec.compute",
    "spec.compute",
    "a replica asks for %s CPU and %s of memory, more than any %s instance type with %s leaves to pods after "
    "system reservations; valid values fit one of %s",
    f"!isQuantity({_CPU}) || {_CPU}.startsWith('-') || !isQuantity({_MEMORY}) || {_MEMORY}.startsWith('-')"
    f" || !({C_ONE_REQUEST}) || !({C_LNC_OK}) || {C_CHIPS} > {CEL_MAX}[self.family] || (has(self.instanceTypes) && !{_listed_known})"
    f" || (has(self.instanceTypes) && !self.instanceTypes.exists(t, {CEL_TYPE_CHIPS}[t] >= {C_CHIPS}))"
    f" || {_TYPES_CONSIDERED}.exists(t, {CEL_TYPE_CHIPS}[t] >= {C_CHIPS}"
    f" && quantity({_CPU}).compareTo(quantity({CEL_ALLOC_CPU}[t])) <= 0"
    f" && quantity({_MEMORY}).compareTo(quantity({CEL_ALLOC_MEMORY}[t])) <= 0)",
    # "N chips" from a literal map: string(int) concatenation trips the CRD cost estimator
    # (kubernetes#124234); the rule only fails where inf is at most a family's largest.
    (_CPU, _MEMORY, "self.family", f"{literal(CHIPS_TEXT)}[{C_CHIPS}]", f"{CEL_HOST_TEXT}[self.family]"),
)


def _check_host_fits(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    c = spec.compute
    cpu, memory = quantity(c.cpu), quantity(c.memory)
    if not (re.fullmatch(QUANTITY_GRAMMAR, c.cpu) and re.fullmatch(QUANTITY_GRAMMAR, c.memory)) or cpu is None or memory is None:
        return []
    if not c.one_request or lnc_of(spec, fam) not in fam.lnc_values:
        return []
    chips = chips_needed(spec, fam)
    if chips > fam.max_chips:
        return []
    if c.instance_types and any(t not in fam.instance_chips for t in c.instance_types):
        return []
    considered = c.instance_types or list(fam.instance_chips)
    with_chips = [t for t in considered if fam.instance_chips[t] >= chips]
    if not with_chips or any(host_fits(t, float(cpu) * 1000, float(memory)) for t in with_chips):
        return []
    return [HOST_FITS.finding(c.cpu, c.memory, fam.name, CHIPS_TEXT[chips], HOST_TEXT[fam.name])]


RULES: list[CrossFieldRule] = [
    UNKNOWN_INSTANCE_TYPE,
    SMALL_INSTANCE_TYPES,
    HOST_FITS,
]
CHECKS = (_check_instance_types, _check_host_fits)
