"""Clean-up: what earlier plans left, once nothing uses it. A plan ConfigMap goes when no
running pod, unfinished Job or the Deployment mounts it; compile Jobs of earlier plans go,
less the newest that succeeded (kept for a rollback to reuse); and a model whose replicas
changed shape (spec.compute.nodes to or from 1) loses its workload of the other shape, a
Deployment or a LeaderWorkerSet (never someone else's object of that name)."""

from __future__ import annotations

from collections.abc import Mapping

from inferentia_operator.core.names import COMPILE_RECORD_COMPONENT, COMPONENT_LABEL, FILL_COMPONENT, GROUP_KIND
from inferentia_operator.core.objects import Obj
from inferentia_operator.core.observed import Observed, job_state
from inferentia_operator.core.ownership import is_ours
from inferentia_operator.core.pod.artefact import compile_job_name
from inferentia_operator.core.pod.jobs import newest_earlier_success
from inferentia_operator.core.pod.model import Model, plan_configmap_name
from inferentia_operator.core.pod.part import ChildRef, Part
from inferentia_operator.core.pod.pools import ROLES, pool_name
from inferentia_operator.core.settings import Settings


def cleanup_part(model: Model, observed: Observed, settings: Settings) -> Part:
    current = compile_job_name(model) if model.spec.compile.image is not None else None
    kept = newest_earlier_success(observed, settings.prover, current)
    keep = {current, kept.name if kept is not None else None}
    # Fill Jobs are the fill-ahead part's to keep or delete (fill_ahead/part.py).
    compile_jobs = [Obj(j).name for j in observed.all("Job") if Obj(j).labels.get(COMPONENT_LABEL) != FILL_COMPONENT]
    jobs = [("Job", name) for name in compile_jobs if name is not None and name not in keep]
    # The current plan's, and each prefill and decode pool's, before any pod mounts them.
    in_use = _plan_configmaps_in_use(model, observed) | {plan_configmap_name(m) for m in (model, *model.pools)}
    plans = [c for c in map(Obj, observed.all("ConfigMap")) if c.labels.get(COMPONENT_LABEL) != COMPILE_RECORD_COMPONENT]
    unused = [("ConfigMap", c.name) for c in plans if c.name is not None and c.name not in in_use]
    return Part(delete=(*jobs, *unused, *_other_shape(model, observed)))


def _other_shape(model: Model, observed: Observed) -> tuple[ChildRef, ...]:
    other = "Deployment" if model.plan.nodes else GROUP_KIND
    return ((other, model.name),) if is_ours(observed.own(other), model) else ()


def _plan_configmaps_in_use(model: Model, observed: Observed) -> set[str]:
    """Plan ConfigMaps that a running pod, an unfinished Job, the Deployment (or
    LeaderWorkerSet) of the model or a prefill or decode pool's Deployment still mounts (a
    finished pod or Job never reads its plan again). A pool's Deployment counts while it is live,
    pools or not: one held back for its compile, or one not yet deleted after the pools went."""
    group = Obj(observed.own(GROUP_KIND)).spec.get("leaderWorkerTemplate")
    group = group if isinstance(group, Mapping) else {}
    templates = [Obj(observed.own("Deployment")).spec.get("template"), group.get("leaderTemplate"), group.get("workerTemplate")]
    templates += [Obj(observed.live("Deployment", pool_name(model, role))).spec.get("template") for role in ROLES]
    templates += [Obj(j).spec.get("template") for j in observed.all("Job") if not job_state(j).finished]
    volumes = [v for t in templates for v in Obj(t).spec.get("volumes") or ()]
    running = [p for p in map(Obj, observed.pods) if p.status.get("phase") not in ("Succeeded", "Failed")]
    volumes += [v for p in running for v in p.spec.get("volumes") or ()]
    return {v["configMap"]["name"] for v in volumes if isinstance(v.get("configMap"), dict) and "name" in v["configMap"]}
