"""The decision in parts, one per concern: each a pure function of the model, what was
observed and the operator's settings (:mod:`..decide` composes them).

A part names every child it owns in the converged state (``children``), which of them it
holds back for now (``held``: the Deployment until its artefact is compiled, the holder until
its upstream Service exists), and what it deletes. ``render`` prints every child of every part
with nothing observed; a reconcile writes those not held, so the two agree once a model has
converged (tests/test_render_agrees.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ChildRef = tuple[str, str]  # (kind, name)


@dataclass(frozen=True)
class Part:
    children: tuple[dict[str, Any], ...] = ()
    held: frozenset[ChildRef] = frozenset()
    delete: tuple[ChildRef, ...] = ()

    def to_write(self) -> list[dict[str, Any]]:
        return [c for c in self.children if (c["kind"], c["metadata"]["name"]) not in self.held]


def ref(body: dict[str, Any]) -> ChildRef:
    return body["kind"], body["metadata"]["name"]
