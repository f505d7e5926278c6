"""The CRD's CEL rules as the API server runs them, for a CEL interpreter outside it: each rule
with the path of its node, the node a rule sees in a spec, and the Kubernetes library functions
the rules call (the quantity library's isQuantity, quantity, isInteger, asInteger and compareTo,
and the strings library's format and replace: https://kubernetes.io/docs/reference/using-api/cel/).
The quantity functions follow the grammar in Kubernetes' API reference
(https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/quantity/), not the
operator's own parser. Used by tests/test_rules_cel.py and cluster/benchmark_cel.py; it
imports no CEL library, so each brings its own.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

from inferentia_operator.core.crd import crd

# <signedNumber><suffix>: binary SI, decimal SI (n and u included, as ParseQuantity takes
# them) or a decimal exponent.
_QUANTITY = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$")
_SUFFIX = {
    **{s: Decimal(1024) ** (i + 1) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
    **{s: Decimal(10) ** e for s, e in (("n", -9), ("u", -6), ("m", -3), ("k", 3), ("M", 6), ("G", 9), ("T", 12), ("P", 15), ("E", 18))},
}


def _amount(text: str) -> Decimal:
    match = _QUANTITY.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a quantity")
    number, suffix = match.groups()
    if suffix is None:
        return Decimal(number)
    if suffix in _SUFFIX:
        return Decimal(number) * _SUFFIX[suffix]
    return Decimal(number) * Decimal(10) ** int(suffix[1:])  # an exponent: e3, E-2


def _is_quantity(text: str) -> bool:
    try:
        _amount(text)
    except (ValueError, InvalidOperation):
        return False
    return True


def _compare(a: str, b: str) -> int:
    x, y = _amount(a), _amount(b)
    return (x > y) - (x < y)


KUBERNETES_LIBRARY = {
    "isQuantity": _is_quantity,
    "quantity": lambda text: text,  # a quantity travels as its text; the methods parse it
    "isInteger": lambda q: _amount(q) == _amount(q).to_integral_value(),
    "asInteger": lambda q: int(_amount(q)),
    "compareTo": _compare,
    "format": lambda template, args: template % tuple(args),
    "replace": lambda text, old, new: text.replace(old, new),
}


def spec_rules() -> list[tuple[tuple[str, ...], str, str]]:
    """Every CEL rule under spec in the generated CRD: (the path of its node, rule, messageExpression)."""
    found: list[tuple[tuple[str, ...], str, str]] = []

    def walk(node: dict[str, Any], path: tuple[str, ...]) -> None:
        for rule in node.get("x-kubernetes-validations", []):
            found.append((path, rule["rule"], rule["messageExpression"]))
        for name, child in node.get("properties", {}).items():
            walk(child, (*path, name))

    walk(crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"], ())
    return found


def node_at(spec: dict[str, Any], path: tuple[str, ...]) -> Any:
    """The node a rule at ``path`` sees, or None where it is absent (the API server then runs no rule there)."""
    node: Any = spec
    for name in path:
        node = node.get(name) if isinstance(node, dict) else None
    return node
