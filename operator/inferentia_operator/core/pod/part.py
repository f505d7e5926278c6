"""The decision in parts, one per concern: each a pure function of the model, what was
observed and the operator's settings (:mod:`..decide` composes them).

A part names every child it owns in the converged state (``children``), which of them it
holds back for now (``held``: the Deployment until its artefact is compiled, the holder until
its upstream Service exists), what it deletes, and how a child is written where that differs
from the rule (``policies``: core/ownership.py; decide() gathers every part's). ``render``
prints every child of every part with nothing observed; a reconcile writes those not held, so
the two agree once a model has converged (tests/test_render_agrees.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from inferentia_operator.core.ownership import WritePolicy

ChildRef = tuple[str, str]  # (kind, name)


@dataclass(frozen=True)
class Part:
    children: tuple[dict[str, Any], ...] = ()
    held: frozenset[ChildRef] = frozenset()
    delete: tuple[ChildRef, ...] = ()
    # How a child of this part is written where that differs from the rule, by (kind, name):
    # decide() passes every part's to the act step. Keyword-only, so that a part's own fields
    # keep their places after ``delete``.
    policies: Mapping[ChildRef, WritePolicy] = field(default_factory=dict, kw_only=True)

    def to_write(self) -> list[dict[str, Any]]:
        return [c for c in self.children if (c["kind"], c["metadata"]["name"]) not in self.held]


def ref(body: dict[str, Any]) -> ChildRef:
    return body["kind"], body["metadata"]["name"]
