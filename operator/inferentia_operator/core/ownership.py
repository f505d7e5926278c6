"""Whose an object is: the one test the operator applies before writing over any object."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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


def is_compile_job_of_ours(live: Mapping[str, Any]) -> bool:
    """A compile Job the operator made for some model: compile Jobs are named after their
    artefact, so a model finding one under its Job's name shares it rather than competing."""
    obj = Obj(live)
    return (
        obj.labels.get(MANAGED_BY_LABEL) == FIELD_MANAGER
        and obj.labels.get(COMPONENT_LABEL) == "compile"
        and (obj.controller or {}).get("kind") == api.KIND
    )
