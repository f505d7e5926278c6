"""The model's name and namespace: what its children can carry."""

from __future__ import annotations

import json
import re
from typing import Any

from inferentia_operator.core.cel import (
    CrossFieldRule,
)
from inferentia_operator.core.findings import Finding

# The model's name is carried by its children: the Service (a DNS-1035 label) and the
# Job "<name>-compile-<10 hex>" (at most 63 characters).
NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
MAX_NAME_LENGTH = 45
NAME = CrossFieldRule(
    "metadata.name",
    "",
    f"'%s' is not valid; use at most {MAX_NAME_LENGTH} lower-case letters, digits and '-', "
    "starting with a letter and ending with a letter or digit",
    f"size(self.metadata.name) <= {MAX_NAME_LENGTH} && self.metadata.name.matches({json.dumps(NAME_PATTERN)})",
    ("self.metadata.name",),
)


def check_name(name: Any) -> list[Finding]:
    if not isinstance(name, str) or not name:
        return [Finding("metadata.name", "is required")]
    if len(name) > MAX_NAME_LENGTH or not re.fullmatch(NAME_PATTERN, name):
        return [NAME.finding(name)]
    return []


# A namespace is a DNS-1123 label: the API server refuses any other, so validate does too.
NAMESPACE_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


def check_namespace(namespace: Any) -> list[Finding]:
    if namespace is None:
        return []
    if not isinstance(namespace, str) or len(namespace) > 63 or not re.fullmatch(NAMESPACE_PATTERN, namespace):
        shown = namespace if isinstance(namespace, str) else "a non-string"
        return [
            Finding(
                "metadata.namespace",
                f"'{shown}' is not a valid namespace; valid namespaces are at most 63 lower-case letters, digits and '-', "
                "starting and ending with a letter or digit",
            )
        ]
    return []


RULES: list[CrossFieldRule] = [
    NAME,
]
# No check of the spec: the name and namespace are checked apart (check_name, check_namespace),
# since they are not the spec's.
CHECKS = ()
