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
entry in that module's RULES and CHECKS. A new module joins MODULES, below, once: every module
has both RULES and CHECKS (an empty tuple where it has none), and the CRD's rules and the
order findings are printed in both come from that one list.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from inferentia_operator.core.api import InferentiaModelSpec
from inferentia_operator.core.catalogue import FAMILIES, Family
from inferentia_operator.core.cel import CrossFieldRule
from inferentia_operator.core.findings import Finding

from . import (
    advice,
    allocation,
    autoscaling,
    child_values,
    disaggregation,
    groups,
    identity,
    memory,
    nodes,
    placement,
    programs,
    request,
    routing,
    scheduling,
    sizing,
    speculation,
)
from .identity import NAME, check_name, check_namespace
from .memory import KV_FIT, NODES_KV_FIT, STATIC_WEIGHTS_TOO_LARGE
from .speculation import TOKENS_PAST_MAX_MODEL_LEN

Check = Callable[[InferentiaModelSpec, Family], list[Finding]]


class RuleModule(Protocol):
    """A module of rules, one concern: its CrossFieldRules (their CEL in the CRD) and its checks
    (validate's and the operator's, the rules' Python twins and the rules CEL cannot express)."""

    @property
    def RULES(self) -> Sequence[CrossFieldRule]: ...

    @property
    def CHECKS(self) -> Sequence[Check]: ...


# Every module of rules, in the order of their rules in the CRD: each schema node's rules keep
# their order across releases, so a new module goes last but for the warnings (sizing, advice),
# which have no rule in the CRD and are checked last.
MODULES: tuple[RuleModule, ...] = (
    identity,
    request,
    placement,
    groups,
    allocation,
    programs,
    memory,
    child_values,
    autoscaling,
    routing,
    nodes,
    scheduling,
    speculation,
    disaggregation,
    sizing,
    advice,
)

CEL_RULES: list[CrossFieldRule] = [rule for module in MODULES for rule in module.RULES]

# The order findings are printed in: the modules' own, but for the children's values, which come
# first (a quantity that does not parse is named before any rule that would use it). That one is
# the exception, not the CRD's order: child_values' rules share schema nodes (spec, spec.compute,
# spec.compile) with the rules of the modules above it in MODULES, so moving it up the list would
# reorder their rules in the CRD.
CHECKED_FIRST = child_values
_CHECKS: tuple[Check, ...] = (
    *CHECKED_FIRST.CHECKS,
    *(check for module in MODULES if module is not CHECKED_FIRST for check in module.CHECKS),
)


def check_spec(spec: InferentiaModelSpec) -> list[Finding]:
    """Every cross-field finding for a spec that parsed."""
    family = FAMILIES[spec.compute.family]
    found = [finding for check in _CHECKS for finding in check(spec, family)]
    # Prefill and decode pools on chips of their own are checked again at their size.
    return found + disaggregation.pool_spec_findings(spec, family, check_spec)


__all__ = [
    "CEL_RULES",
    "KV_FIT",
    "NAME",
    "NODES_KV_FIT",
    "STATIC_WEIGHTS_TOO_LARGE",
    "TOKENS_PAST_MAX_MODEL_LEN",
    "check_name",
    "check_namespace",
    "check_spec",
]
