"""Validation: the cross-field rules every InferentiaModel spec must satisfy, one module a
concern.

Each finding names the field path, the value given and what would be valid. Every rule
that CEL can express is one :class:`~inferentia_operator.core.cel.CrossFieldRule` (its
message template and the CEL the CRD carries), with its Python check beside it in the
module of its concern, so ``kubectl apply``, validate and the operator refuse the same
input with the same message. Two rules have no CEL twin: static weights and the KV cache
(:mod:`.memory` says why). docs/design.md, "Validation", says why the CLI keeps Python
twins rather than running the CEL, and which tests hold the two together. Parsing
(pydantic's errors) is in :mod:`..parsing`.

A new rule goes into its concern's module: the CrossFieldRule, its check beside it, and an
entry in that module's RULES and CHECKS.
"""

from __future__ import annotations

from inferentia_operator.core.api import InferentiaModelSpec
from inferentia_operator.core.catalogue import FAMILIES
from inferentia_operator.core.cel import CrossFieldRule
from inferentia_operator.core.findings import Finding

from . import (
    advice,
    allocation,
    autoscaling,
    child_values,
    groups,
    memory,
    nodes,
    placement,
    programs,
    request,
    routing,
    scheduling,
    sizing,
)
from .identity import NAME, check_name, check_namespace
from .memory import KV_FIT, NODES_KV_FIT, STATIC_WEIGHTS_TOO_LARGE

# In this order in the CRD: each node's rules keep their order across releases.
CEL_RULES: list[CrossFieldRule] = [
    NAME,
    *request.RULES,
    *placement.RULES,
    *groups.RULES,
    *allocation.RULES,
    *programs.RULES,
    *memory.RULES,
    *child_values.RULES,
    *autoscaling.RULES,
    *routing.RULES,
    *nodes.RULES,
    *scheduling.RULES,
]

# The order findings are printed in: the children's values first (a quantity that does not
# parse is named before any rule that would use it), advice last.
_CHECKS = (
    *child_values.CHECKS,
    *request.CHECKS,
    *placement.CHECKS,
    *groups.CHECKS,
    *allocation.CHECKS,
    *programs.CHECKS,
    *memory.CHECKS,
    *autoscaling.CHECKS,
    *routing.CHECKS,
    *nodes.CHECKS,
    *scheduling.CHECKS,
    *sizing.CHECKS,
    *advice.CHECKS,
)


def check_spec(spec: InferentiaModelSpec) -> list[Finding]:
    """Every cross-field finding for a spec that parsed."""
    family = FAMILIES[spec.compute.family]
    return [finding for check in _CHECKS for finding in check(spec, family)]


__all__ = ["CEL_RULES", "KV_FIT", "NAME", "NODES_KV_FIT", "STATIC_WEIGHTS_TOO_LARGE", "check_name", "check_namespace", "check_spec"]
