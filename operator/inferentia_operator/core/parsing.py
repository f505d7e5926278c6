"""Parsing a spec: pydantic's errors translated into findings with the user's field paths,
then every cross-field rule of :mod:`rules`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from .api import InferentiaModelSpec
from .findings import Finding
from .rules import check_spec

_UNION_TAGS = {"int", "str", "bool", "float", "list", "dict", "none"}
# The API server stores every integer of the CRD as int64 (its type: integer) and refuses a
# larger one, whatever the field's own bounds.
INT64_MAX = 2**63 - 1


def _beyond_int64(value: Any, path: str) -> list[Finding]:
    """Integers the API server cannot hold, anywhere in the spec, as findings."""
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        if -INT64_MAX - 1 <= value <= INT64_MAX:
            return []
        return [Finding(path, f"{value} is too large; valid values are whole numbers of at most {INT64_MAX} (int64)")]
    if isinstance(value, dict):
        return [f for k, v in value.items() for f in _beyond_int64(v, f"{path}.{k}")]
    if isinstance(value, list):
        return [f for i, v in enumerate(value) for f in _beyond_int64(v, f"{path}[{i}]")]
    return []


def _path(loc: tuple[Any, ...], root: str) -> str:
    path = root
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in _UNION_TAGS or any(c in str(part) for c in "[]()-"):
            continue  # pydantic names the union member it tried; users never wrote it
        else:
            path += f".{part}"
    return path


def shown(value: Any) -> str:
    """A value as the user wrote it in YAML, never as Python spells it (None, True, NoneType)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return "this value"


def _describe_error(error: Mapping[str, Any]) -> str:
    kind, raw, ctx = error["type"], error.get("input"), error.get("ctx") or {}
    value = shown(raw)
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return "is not a field of this object; check its spelling (kubectl explain inferentiamodel.spec lists the fields)"
    if kind in {"int_type", "int_from_float", "int_parsing"}:
        return f"{value} is not a whole number; valid values are whole numbers"
    if kind == "bool_type":
        return f"{value} is not valid; valid values are true, false"
    if kind == "greater_than_equal":
        return f"{value} is too small; valid values are at least {ctx['ge']}"
    if kind == "less_than_equal":
        return f"{value} is too large; valid values are at most {ctx['le']}"
    if kind == "literal_error":
        expected = ctx.get("expected", "").replace("'", "").replace(" or ", ", ")
        return f"{value} is not valid; valid values are {expected}"
    if kind in {"too_short", "string_too_short"}:
        return "must not be empty"
    if kind in {"too_long", "string_too_long"}:
        limit = ctx.get("max_length")
        return f"is too long; at most {limit} {'items' if kind == 'too_long' else 'characters'}"
    if kind == "string_pattern_mismatch":
        return f"{value} does not match the pattern {ctx.get('pattern')}"
    if kind in {"dict_type", "model_type", "model_attributes_type"}:
        return f"{value} is not valid; a mapping of fields is needed"
    if kind == "list_type":
        return f"{value} is not valid; a list is needed"
    if kind in {"string_type", "string_sub_type"}:
        return f"{value} is not valid; a string is needed"
    if kind == "value_error":
        return f"{value} is not valid: {ctx.get('error')}"
    return f"{value} is not valid: {error['msg']}"


def parse_spec(raw: Any, root: str = "spec") -> tuple[InferentiaModelSpec | None, list[Finding]]:
    """Parses and checks a spec: (the spec or None, every finding)."""
    if not isinstance(raw, dict):
        return None, [Finding(root, f"must be a mapping of fields, not {shown(raw)}")]
    huge = _beyond_int64(raw, root)
    if huge:
        return None, huge
    try:
        spec = InferentiaModelSpec.model_validate(raw)
    except ValidationError as exc:
        seen: dict[str, Finding] = {}
        for error in exc.errors():
            path = _path(error["loc"], root)
            # A union reports one error per member; the first says enough.
            seen.setdefault(path, Finding(path, _describe_error(error)))
        return None, list(seen.values())
    return spec, check_spec(spec)
