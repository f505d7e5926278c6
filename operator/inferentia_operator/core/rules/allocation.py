"""Devices from AWS's Neuron DRA driver (spec.compute.allocation: dra)."""

from __future__ import annotations

from inferentia_operator.core.api import InferentiaModelSpec
from inferentia_operator.core.catalogue import Family
from inferentia_operator.core.cel import (
    CEL_FAMILY,
    FAMILY_LIST,
    CrossFieldRule,
    literal,
)
from inferentia_operator.core.findings import Finding

# Devices from AWS's Neuron DRA driver (spec.compute.allocation: dra; catalogue.DRA_DRIVER for
# the sources): it runs on Trainium and Inferentia2 nodes, hands out whole devices, and holds a
# claim to connected devices only where it publishes device groups (Trainium's grid).
CEL_DRA = "has(self.compute.allocation) && self.compute.allocation == 'dra'"
DRA_FAMILY = CrossFieldRule(
    "spec.compute.allocation",
    "spec",
    "dra does not run on %s: AWS's Neuron DRA driver runs on Trainium and Inferentia2 nodes; valid values on %s are devicePlugin",
    f"!({CEL_DRA}) || {CEL_FAMILY} in {literal([f.name for f in FAMILY_LIST if f.dra_groups is not None])}",
    (CEL_FAMILY, CEL_FAMILY),
)
DRA_CORES = CrossFieldRule(
    "spec.compute.cores",
    "spec",
    "%d NeuronCores cannot be claimed with allocation dra: AWS's Neuron DRA driver hands out whole Neuron devices; "
    "use compute.inf, or allocation devicePlugin for NeuronCores",
    f"!({CEL_DRA}) || !has(self.compute.cores)",
    ("self.compute.cores",),
)
DRA_CONNECTED = CrossFieldRule(
    "spec.compute.inf",
    "spec",
    "%d devices cannot be claimed connected on %s with allocation dra: the Neuron DRA driver publishes connected-device "
    "groups only for Trainium's grid topology; valid values with dra on %s are 1",
    f"!({CEL_DRA}) || !has(self.compute.inf) || self.compute.inf <= 1"
    f" || {CEL_FAMILY} in {literal([f.name for f in FAMILY_LIST if f.dra_groups])}",
    ("self.compute.inf", CEL_FAMILY, CEL_FAMILY),
)


def _check_allocation(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    # Three independent rules, as the API server runs them: a spec may break all three.
    if spec.compute.allocation != "dra":
        return []
    found = []
    if fam.dra_groups is None:
        found.append(DRA_FAMILY.finding(fam.name, fam.name))
    if spec.compute.cores is not None:
        found.append(DRA_CORES.finding(spec.compute.cores))
    inf = spec.compute.inf or 0
    if inf > 1 and not fam.dra_groups:
        found.append(DRA_CONNECTED.finding(inf, fam.name, fam.name))
    return found


RULES: list[CrossFieldRule] = [
    DRA_FAMILY,
    DRA_CORES,
    DRA_CONNECTED,
]
CHECKS = (_check_allocation,)
