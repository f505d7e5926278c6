"""What a check says about a spec: a finding names the field path, the value given and what would be valid."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class Finding:
    """One problem with a spec. Errors block planning; warnings do not."""

    path: str
    message: str
    severity: Literal["error", "warning"] = "error"

    def __str__(self) -> str:
        prefix = "warning: " if self.severity == "warning" else ""
        return f"{prefix}{self.path}: {self.message}"


def errors(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == "error"]


def format_list(values: list[Any]) -> str:
    return ", ".join(str(v) for v in values)


def _joined(values: list[Any], conjunction: str) -> str:
    words = [str(v) for v in values]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + f" {conjunction} " + words[-1]


def or_list(values: list[Any]) -> str:
    return _joined(values, "or")


def and_list(values: list[Any]) -> str:
    return _joined(values, "and")
