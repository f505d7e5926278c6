"""The one way to check and plan a model, for the reconcile, the manifest reader and the CLI.

Each rule runs once per model: the name and namespace, the schema and the cross-field
rules (:func:`parsing.parse_spec`), the plan, and the size of what the plan renders.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .api import InferentiaModelSpec
from .findings import Finding, errors
from .names import DEFAULT_OPERATOR_IMAGE, DEVICE_PLUGIN
from .parsing import parse_spec
from .planner import plan
from .pod.model import Model, plan_size_findings
from .rules import check_name, check_namespace
from .rules.scheduling import check_family_named, check_scheduler


@dataclass(frozen=True)
class CheckedModel:
    """A model as written, with everything wrong with it, and its plan when nothing is."""

    spec: InferentiaModelSpec | None  # None when the spec does not parse
    findings: list[Finding]
    model: Model | None  # the planned model; None while any finding is an error

    @property
    def errors(self) -> list[Finding]:
        return errors(self.findings)


def check_model(
    name: Any,
    namespace: Any,
    raw_spec: Any,
    *,
    uid: str = "",
    operator_image: str = DEFAULT_OPERATOR_IMAGE,
    allocation: str = DEVICE_PLUGIN,
    scheduler_name: str | None = None,
) -> CheckedModel:
    """Checks and plans one model. ``namespace`` None means the default namespace;
    ``allocation``: the operator's default for spec.compute.allocation, which the rules and
    the plan then see as if the model had said it; ``scheduler_name``: the serving pods'
    scheduler (None where unknown), for the warning of :func:`rules.scheduling.check_scheduler`."""
    findings = check_name(name) + check_namespace(namespace)
    spec, spec_findings = parse_spec(with_allocation(raw_spec, allocation))
    if spec is not None and not errors(spec_findings):
        spec_findings = [*spec_findings, *check_family_named(raw_spec)]
    findings += spec_findings
    if spec is None or errors(findings):
        return CheckedModel(spec, findings, None)
    planned = Model(name, namespace or "default", uid, spec, plan(spec, checked=spec_findings), operator_image)
    # Not in the plan's warnings: they are in the plan the pods mount, and a change of the
    # operator's scheduler would then roll every model's pods.
    findings += check_scheduler(spec, scheduler_name) + plan_size_findings(planned)
    return CheckedModel(spec, findings, None if errors(findings) else planned)


def with_allocation(raw_spec: Any, allocation: str) -> Any:
    """The spec with the operator's default allocation where it names none (a copy; the
    model as written is never changed)."""
    if allocation == DEVICE_PLUGIN or not isinstance(raw_spec, dict) or not isinstance(raw_spec.get("compute"), dict):
        return raw_spec
    if "allocation" in raw_spec["compute"]:
        return raw_spec
    return {**raw_spec, "compute": {**raw_spec["compute"], "allocation": allocation}}
