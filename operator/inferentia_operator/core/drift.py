"""Is what the operator would apply already live? Pure comparison, so steady state writes nothing.

Server-side apply of an unchanged object is still a write request; the operator
compares first. ``applied(desired, live)`` holds when every field of ``desired``
has the same value in ``live``: fields others own (an annotation a user added,
defaults the API server filled in) are not the operator's business.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

_SUFFIXES = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": 1,
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
}  # fmt: skip
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([a-zA-Z]*)$")


def quantity(value: Any) -> Decimal | None:
    """A Kubernetes quantity as a number ("1Gi" == "1024Mi"), or None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return Decimal(str(value))
    if not isinstance(value, str):
        return None
    match = _QUANTITY.fullmatch(value)
    if not match or match.group(2) not in _SUFFIXES:
        try:
            return Decimal(value) if re.fullmatch(r"^[+-]?[0-9.]+[eE][+-]?[0-9]+$", value) else None
        except InvalidOperation:
            return None
    try:
        return Decimal(match.group(1)) * Decimal(str(_SUFFIXES[match.group(2)]))
    except InvalidOperation:
        return None


_OMITTED_WHEN_EMPTY: tuple[Any, ...] = ("", [], {})


def applied(desired: Any, live: Any, path: tuple[str, ...] = ()) -> bool:
    if isinstance(desired, dict):
        return isinstance(live, dict) and all(
            # The API server drops empty strings and collections (omitempty): absent is equal.
            (applied(v, live[k], path + (k,)) if k in live else v in _OMITTED_WHEN_EMPTY)
            for k, v in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(live, list) and len(desired) == len(live) and all(applied(d, lv, path) for d, lv in zip(desired, live, strict=True))
        )
    if desired == live:
        return True
    # The API server canonicalises resource quantities: compare them as numbers.
    if len(path) >= 2 and path[-2] in ("requests", "limits"):
        a, b = quantity(desired), quantity(live)
        return a is not None and a == b
    return False
