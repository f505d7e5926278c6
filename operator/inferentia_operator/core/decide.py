"""The reconcile's decision: from what the caches hold to what to write. Pure, no API client.

``decide(observed, now, settings)`` composes the parts (each feature package's ``part.py``:
compile, autoscaling, scale to zero, device claims, serving, routing, clean-up, device faults,
fill-ahead), each a pure function of the model and what was observed, and holds no feature
logic of its own: the one module that imports every feature package. It returns the children to apply, the
objects to delete, and the basis of the model's status (from :mod:`status`), with the status
and events that basis gives before any write. Where there are writes, the reconciler reports
once more from the same basis, with what the writes found (``status.report``); it never
decides again. An invalid spec leaves every child as it is; an object someone else owns under
a child's name is never written (NameConflict).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from . import api, status
from .cleanup.part import cleanup_part
from .compile.part import CompilePart, compile_part
from .device_claims.part import device_claims_part
from .device_faults.part import DeviceFaultPart, device_fault_part
from .drift import applied
from .fill_ahead.part import FillAheadPart, fill_ahead_part
from .kinds import WRITTEN_ONCE
from .model import CheckedModel, check_model
from .objects import Obj
from .observed import Conflict, Observed
from .ownership import WritePolicy, foreign_owner
from .pod.model import Model
from .pod.part import ChildRef, Part
from .routing.part import RoutingPart, routing_part
from .scale_to_zero.part import ScaleToZeroPart, scale_to_zero_part
from .scaling.part import ScalingPart, scaling_part
from .serving.part import ServingFacts, ServingPart, serving_part
from .settings import DEFAULT_SETTINGS, Settings
from .status import Report, ReportBasis


@dataclass(frozen=True)
class Decision:
    apply: list[dict[str, Any]]  # bodies to server-side apply
    delete: list[tuple[str, str]]  # (kind, name)
    basis: ReportBasis | None  # None: the model is going away, report nothing
    report: Report | None  # the status from basis, before any write
    # The record of a completed compile to create: nobody's child, so not among ``apply``.
    record: dict[str, Any] | None = None
    # Serving pods to evict, (name, uid): on a node whose Neuron devices fail (device_faults/part.py).
    evict: tuple[tuple[str, str], ...] = ()
    # Serving pods whose traffic label to set, (name, uid, value): device_faults/part.py.
    traffic: tuple[tuple[str, str, str], ...] = ()
    # How a child is written where that differs from the rule, by (kind, name), as the part that
    # builds it decided (core/ownership.py), every part's (write_policies): today the compile
    # Job's proof and shared name.
    policies: Mapping[ChildRef, WritePolicy] = field(default_factory=dict)


class Parts(NamedTuple):
    """In the order their children are listed (and printed by ``render``)."""

    serving: ServingPart
    compile: CompilePart
    device_claims: Part
    scaling: ScalingPart
    scale_to_zero: ScaleToZeroPart
    routing: RoutingPart
    cleanup: Part
    device_faults: DeviceFaultPart
    fill_ahead: FillAheadPart


def placed(model: Model, settings: Settings) -> Model:
    """The model with the operator's placement settings: the same object where they change
    nothing, so that what it built once (its plan ConfigMap's content) is not built again."""
    keda = settings.keda_namespace if settings.push_activation else ""
    views = settings.node_views and bool(settings.node_cache_url)
    wanted = (settings.scheduler_name, settings.node_cache_url, settings.node_cache_namespace, keda, views, settings.prometheus_namespace)
    now = (
        model.scheduler_name,
        model.node_cache_url,
        model.node_cache_namespace,
        model.keda_namespace,
        model.node_views,
        model.prometheus_namespace,
    )
    if now == wanted:
        return model
    scheduler_name, node_cache_url, node_cache_namespace, keda_namespace, node_views, prometheus_namespace = wanted
    return replace(
        model,
        scheduler_name=scheduler_name,
        node_cache_url=node_cache_url,
        node_cache_namespace=node_cache_namespace,
        keda_namespace=keda_namespace,
        node_views=node_views,
        prometheus_namespace=prometheus_namespace,
    )


# A model is reconciled many times over one spec: at its create, at each step of its rollout,
# at every resync. Checking and planning it (the spec parsed, the rules, the plan, and its plan
# ConfigMap's content built, serialised and hashed) was a quarter of the operator's busy CPU
# during a stream of 20 creates a second (py-spy, `cluster/benchmark_scale.py --profile`), and
# the same inputs always give the same model, so the latest are kept.
RECENT_MODELS = 256


def checked_model(meta: Obj, spec: Any, settings: Settings) -> CheckedModel:
    """The model checked, planned and placed with the operator's settings, made once for the
    same inputs. Kept under the spec's JSON only where JSON gives the spec back exactly (the
    API server's always does), so that no other spec is ever taken for it."""
    name, namespace, uid = meta.name, meta.namespace, meta.uid or ""
    try:
        text = json.dumps(spec, sort_keys=True, separators=(",", ":"))
        exact = json.loads(text) == spec and isinstance(name, str) and isinstance(namespace, str | None)
    except (TypeError, ValueError, RecursionError):
        exact = False
    return _recent_model(name, namespace, uid, text, settings) if exact else _check_and_place(name, namespace, uid, spec, settings)


@functools.lru_cache(maxsize=RECENT_MODELS)
def _recent_model(name: str, namespace: str | None, uid: str, spec_json: str, settings: Settings) -> CheckedModel:
    return _check_and_place(name, namespace, uid, json.loads(spec_json), settings)


def _check_and_place(name: Any, namespace: Any, uid: str, spec: Any, settings: Settings) -> CheckedModel:
    found = check_model(name, namespace, spec, uid=uid, operator_image=settings.operator_image, allocation=settings.allocation)
    if found.model is None or (model := placed(found.model, settings)) is found.model:
        return found
    return replace(found, model=model)


def parts_of(model: Model, observed: Observed, settings: Settings) -> Parts:
    """Every part of a model's decision, each fed what the parts before it concluded."""
    model = placed(model, settings)
    compiling = compile_part(model, observed, settings)
    scaling = scaling_part(model, observed, settings, has_artefact=compiling.compiled or observed.own("Deployment") is not None)
    zero = scale_to_zero_part(model, observed, scaling)
    serving = serving_part(model, compiling.compiled, zero.replicas, zero.to_holder, observed, scaling.pool_replicas)
    return Parts(
        serving, compiling, device_claims_part(model, observed), scaling, zero, routing_part(model, observed, settings),
        cleanup_part(model, observed, settings), device_fault_part(model, observed), fill_ahead_part(model, observed, compiling.compiled),
    )  # fmt: skip


def decide(observed: Observed, now: str, settings: Settings = DEFAULT_SETTINGS) -> Decision:
    meta = Obj(observed.model)
    if meta.deleting:
        return Decision([], [], None, None)  # going: the garbage collector removes the children
    checked = checked_model(meta, observed.model.get("spec"), settings)
    if checked.model is None:
        # Invalid (a cluster without the CRD's CEL rules, or a rule CEL cannot express):
        # report it, and leave every child exactly as it is.
        basis = _invalid_basis(meta, "; ".join(str(f) for f in checked.errors))
        return Decision([], [], basis, status.report(observed, now, basis))
    parts = parts_of(checked.model, observed, settings)
    to_apply, conflicts = writes(parts, observed, meta.uid, meta.name)
    assert parts.serving.facts is not None
    basis = ReportBasis(
        True, "", parts.serving.facts, parts.compile.facts, parts.scaling.facts, conflicts, parts.routing.facts,
        parts.device_faults.condition, parts.fill_ahead.condition, parts.fill_ahead.jobs(),
    )  # fmt: skip
    deletes = [gone for part in parts for gone in part.delete]
    report = status.report(observed, now, basis)
    return Decision(
        to_apply, deletes, basis, report, parts.compile.record, parts.device_faults.evict, parts.device_faults.traffic,
        write_policies(parts),
    )  # fmt: skip


def write_policies(parts: Sequence[Part]) -> dict[ChildRef, WritePolicy]:
    """Every part's write policies (core/ownership.py), by (kind, name). A child is one part's,
    so two parts never give one; should they give it different ones, that is a bug, not a
    choice to make here. ``prove`` is for Jobs: the proof covers a Job's output URI."""
    policies: dict[ChildRef, WritePolicy] = {}
    for part in parts:
        for child, policy in part.policies.items():
            assert policies.get(child, policy) == policy, f"two parts give {child} different write policies"
            assert not policy.prove or child[0] == "Job", f"{child}: only a Job can be proved (its output URI)"
            policies[child] = policy
    return policies


def writes(
    parts: Sequence[Part], observed: Observed, uid: str | None, name: str | None
) -> tuple[list[dict[str, Any]], tuple[Conflict, ...]]:
    """The children that differ from what is live, and those someone else holds the name of."""
    to_apply: list[dict[str, Any]] = []
    conflicts: list[Conflict] = []
    for body in (body for part in parts for body in part.to_write()):
        kind, child = body["kind"], Obj(body).name
        live = observed.live(kind, child)
        if live is None:
            to_apply.append(body)
        elif (owner := foreign_owner(live, uid, name)) is not None:
            conflicts.append(Conflict(kind, child or "", owner))
        elif kind not in WRITTEN_ONCE and not applied(body, live):
            to_apply.append(body)
    return to_apply, tuple(dict.fromkeys(conflicts))


def rendered(model: Model, settings: Settings = DEFAULT_SETTINGS) -> list[dict[str, Any]]:
    """Every child the operator would create for ``model``, from the same parts as a
    reconcile, with nothing observed: what a converged reconcile has written."""
    body = {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": model.name, "namespace": model.namespace, "uid": model.uid},
    }
    return [child for part in parts_of(model, Observed(body), settings) for child in part.children]


def _invalid_basis(meta: Obj, message: str) -> ReportBasis:
    previous = meta.status
    replicas = meta.spec.get("replicas", 0)
    serving = ServingFacts(replicas if isinstance(replicas, int) else 0, None, _last_plan(previous), previous.get("selector"))
    return ReportBasis(False, message, serving, None, None)


def _last_plan(previous: Mapping[str, Any]) -> api.Plan | None:
    """The plan the status showed before the spec became invalid, if it still reads as one
    (a plan written by an older operator may lack fields this one requires)."""
    try:
        return api.Plan.model_validate(previous["plan"]) if previous.get("plan") else None
    except ValueError:
        return None
