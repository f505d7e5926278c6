"""A condition as the parts and the report write it (metav1.Condition, without its times)."""

from __future__ import annotations

from typing import Literal

from . import api

Status = Literal["True", "False", "Unknown"]


def cond(type_: str, status: Status, reason: str, message: str = "") -> api.Condition:
    return api.Condition(type=type_, status=status, reason=reason, message=message)
