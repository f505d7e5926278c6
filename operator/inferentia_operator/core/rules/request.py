"""The replica's request: whole chips (inf) or NeuronCores (cores), of a size the family can place."""

from __future__ import annotations

from inferentia_operator.core.api import InferentiaModelSpec
from inferentia_operator.core.catalogue import Family
from inferentia_operator.core.cel import (
    C_LNC,
    C_ONE_REQUEST,
    CEL_CORE_COUNTS_TEXT,
    CEL_LARGEST,
    CEL_MAX,
    CEL_MAX_CORES,
    FAMILY_LIST,
    CrossFieldRule,
    literal,
)
from inferentia_operator.core.cores import (
    core_request_counts,
    lnc_of,
)
from inferentia_operator.core.findings import Finding, format_list, or_list

# A replica asks for whole chips (inf, aws.amazon.com/neuron) or for NeuronCores (cores,
# aws.amazon.com/neuroncore): exactly one of the two.
ONE_REQUEST = CrossFieldRule(
    "spec.compute",
    "spec.compute",
    "set exactly one of inf (whole Neuron chips) and cores (NeuronCores): %s",
    C_ONE_REQUEST,
    ("has(self.inf) ? 'both are set' : 'neither is set'",),
)


def _check_one_request(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    if spec.compute.one_request:
        return []
    return [ONE_REQUEST.finding("both are set" if spec.compute.inf is not None else "neither is set")]


def _fits_largest(field: str, unit: str, most: str, applies: str = "") -> CrossFieldRule:
    """A request of ``field`` (inf or cores) fits the family's largest instance type, which has
    ``most`` (a CEL map by family) of them; ``applies``: a CEL condition under which it is checked."""
    return CrossFieldRule(
        f"spec.compute.{field}",
        "spec.compute",
        f"%d {unit} do not fit any %s instance: the largest, %s, has %d; valid values are 1 to %d",
        f"!has(self.{field}) || {applies}self.{field} <= {most}[self.family]",
        (f"self.{field}", "self.family", f"{CEL_LARGEST}[self.family]", f"{most}[self.family]", f"{most}[self.family]"),
    )


# Rule 2: inf fits the family's largest instance type.
FITS_FAMILY = _fits_largest("inf", "chips", CEL_MAX)


def _check_fits_family(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    name, most = fam.largest_instance
    if spec.compute.inf is None or spec.compute.inf <= most:
        return []
    return [FITS_FAMILY.finding(spec.compute.inf, fam.name, name, most, most)]


# Rule 7: platforms that restrict the device count of one container (trn1).
ALLOWED_CHIPS_TEMPLATE = "%s containers may use only %s chips, got %d; valid values are %s"


ALLOWED_CHIPS = {
    f.name: CrossFieldRule(
        "spec.compute.inf",
        "spec.compute",
        ALLOWED_CHIPS_TEMPLATE,
        f"self.family != {literal(f.name)} || !has(self.inf) || self.inf in {literal(list(f.allowed_chip_counts))}",
        (
            literal(f.name),
            literal(or_list(list(f.allowed_chip_counts))),
            "self.inf",
            literal(format_list(list(f.allowed_chip_counts))),
        ),
    )
    for f in FAMILY_LIST
    if f.allowed_chip_counts
}


def _check_allowed_chip_counts(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    allowed, inf = fam.allowed_chip_counts, spec.compute.inf
    if allowed is None or inf is None or inf in allowed:
        return []
    return [ALLOWED_CHIPS[fam.name].finding(fam.name, or_list(list(allowed)), inf, format_list(list(allowed)))]


# cores: only at LNC 1 (cores.core_request_counts says why), at most one instance's
# cores, and on platforms that restrict the devices of a container (trn1) one chip's
# cores or whole chips in the allowed shapes.
CORES_LNC = CrossFieldRule(
    "spec.compute.cores",
    "spec.compute",
    "NeuronCore requests are planned at lnc 1 only, and this %s replica has lnc %d: how the Neuron device plugin "
    "counts aws.amazon.com/neuroncore under a logical NeuronCore configuration is not documented; valid values are "
    "cores with lnc: 1, or whole chips with inf",
    f"!has(self.cores) || {C_LNC} == 1",
    ("self.family", C_LNC),
)


CORES_FIT = _fits_largest("cores", "NeuronCores", CEL_MAX_CORES, applies=f"{C_LNC} != 1 || ")
CORES_SHAPE = {
    f.name: CrossFieldRule(
        "spec.compute.cores",
        "spec.compute",
        f"{f.name} containers may use one chip's NeuronCores or whole chips in groups of "
        f"{or_list(list(f.allowed_chip_counts or ()))} (the Neuron scheduler extension), got %d NeuronCores; valid values are %s",
        f"self.family != {literal(f.name)} || !has(self.cores) || {C_LNC} != 1 || self.cores > {CEL_MAX_CORES}[self.family]"
        f" || self.cores in {literal(core_request_counts(f, 1))}",
        ("self.cores", f"{CEL_CORE_COUNTS_TEXT}[self.family]"),
    )
    for f in FAMILY_LIST
    if f.allowed_chip_counts
}


def _check_core_request(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    cores, lnc = spec.compute.cores, lnc_of(spec, fam)
    if cores is None:
        return []
    if lnc != 1:
        return [CORES_LNC.finding(fam.name, lnc)]
    most = fam.cores_per_chip(1) * fam.max_chips
    if cores > most:
        return [CORES_FIT.finding(cores, fam.name, fam.largest_instance[0], most, most)]
    if fam.name in CORES_SHAPE and cores not in core_request_counts(fam, 1):
        return [CORES_SHAPE[fam.name].finding(cores, format_list(core_request_counts(fam, 1)))]
    return []


RULES: list[CrossFieldRule] = [
    ONE_REQUEST,
    FITS_FAMILY,
    *ALLOWED_CHIPS.values(),
    CORES_LNC,
    CORES_FIT,
    *CORES_SHAPE.values(),
]
CHECKS = (_check_one_request, _check_fits_family, _check_allowed_chip_counts, _check_core_request)
