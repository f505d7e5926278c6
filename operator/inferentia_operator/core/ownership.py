"""Whose an object is: the one test the operator applies before writing over any object, and
the write policies by which a part says how one of its children is written where that differs
from the rule."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from . import api
from .names import COMPONENT_LABEL, FIELD_MANAGER, MANAGED_BY_LABEL, MODEL_LABEL
from .objects import Obj


def foreign_owner(live: Mapping[str, Any], uid: str | None, model: str | None) -> str | None:
    """Who, other than this model, owns ``live``, as a phrase; None when it is the model's to
    write. Another controller owns it, or it has no controller and does not carry this model's
    labels either (an object of someone else's with the child's name). A child of this model
    whose owner reference someone removed still has its labels, and is taken back."""
    obj = Obj(live)
    controller = obj.controller
    if controller is None:
        if obj.labels.get(MANAGED_BY_LABEL) == FIELD_MANAGER and obj.labels.get(MODEL_LABEL) == model:
            return None
        return "not managed by this model (it has no controller)"
    if controller.get("uid") != uid:
        return f"controlled by {controller.get('kind')} {controller.get('name')}"
    return None


class Owner(Protocol):
    """A model as an owner: a Model (core/pod/model.py) or the model's object (objects.Obj)."""

    @property
    def uid(self) -> str | None: ...

    @property
    def name(self) -> str | None: ...


def is_ours(live: Mapping[str, Any] | None, model: Owner) -> bool:
    """``live`` exists and is ``model``'s to write: nobody else owns it (foreign_owner)."""
    return live is not None and foreign_owner(live, model.uid, model.name) is None


def is_compile_job_of_ours(live: Mapping[str, Any]) -> bool:
    """A compile Job the operator made for some model: compile Jobs are named after their
    artefact, so a model finding one under its Job's name shares it rather than competing."""
    return _of_a_model(live, "compile")


def same_component_of_ours(live: Mapping[str, Any], body: Mapping[str, Any]) -> bool:
    """``live`` is a child the operator made for some model (this one or another), of the same
    component as ``body``: under a name a part marked ``shared`` (:class:`WritePolicy`), the
    one child of every model that has it."""
    component = Obj(body).labels.get(COMPONENT_LABEL)
    return component is not None and _of_a_model(live, component)


def _of_a_model(live: Mapping[str, Any], component: str) -> bool:
    obj = Obj(live)
    return (
        obj.labels.get(MANAGED_BY_LABEL) == FIELD_MANAGER
        and obj.labels.get(COMPONENT_LABEL) == component
        and (obj.controller or {}).get("kind") == api.KIND
    )


@dataclass(frozen=True)
class WritePolicy:
    """How the act step writes a child, where that differs from the rule (a create where the
    caches hold nothing, else an apply of what is the model's, a NameConflict where the name is
    someone else's). The part that builds the child decides it, the decision carries it by the
    child's (kind, name) (``Decision.policies``), and the shell carries it out knowing no child
    by its component (nor by its kind, but that ``prove`` is a Job's)."""

    # After the create, the operator's proof that it made the child (core/proof.py), added from
    # the create's answer: the proof names the child's UID, which exists only from then on.
    # For Jobs only (the proof covers a Job's output URI: shell/act.py prove_job); decide()
    # refuses it on any other kind.
    prove: bool = False
    # The name is the same for every model with the same child (a compile Job is named after its
    # artefact): where a create finds it taken by such a child the operator made for another
    # model (same_component_of_ours), the model waits for that one, and it is no NameConflict.
    shared: bool = False


# The rule, for a child no part gives a policy: created where the caches hold nothing, else
# applied where it is the model's, a NameConflict where the name is someone else's.
CREATE_THEN_APPLY = WritePolicy()
