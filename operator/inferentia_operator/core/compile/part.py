"""Compile: where the model's artefact comes from, with one compile per key.

The operator does not read the store (it holds no storage credentials: those are each
namespace's, or its models' cloud identity). It knows an artefact is complete because a
compile Job that uploads it completed: the upload writes the completion marker last, and the
Job completes only when the upload exits 0. Each such completion is recorded
(:func:`compile.job.compile_record`), so a model with the same key, or one deleted and created
again, starts from the artefact with no Job. A Job that failed is never recorded. While
another model's Job compiles the key, the model waits for it; the Job is named after the
artefact, so two models reconciled at once cannot start two.

Only what the operator made counts (core/proof.py): a record or a completed Job without the
operator's proof is no cache hit, and a Job under the key's name without it is reported
(CompileJobUnverified), never waited for, and never written over.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from inferentia_operator.core import api
from inferentia_operator.core.compile.facts import (
    CompileFacts,
    compile_pod_trouble,
    compile_reported,
    compiled_condition,
    share,
    with_neuron_share,
)
from inferentia_operator.core.compile.facts import revision as hub_revision
from inferentia_operator.core.compile.job import compile_job, compile_record
from inferentia_operator.core.names import (
    COMPILE_INPUTS_ANNOTATION,
    COMPILE_RECORD_COMPONENT,
    COMPONENT_LABEL,
    FIELD_MANAGER,
    MANAGED_BY_LABEL,
)
from inferentia_operator.core.objects import Obj
from inferentia_operator.core.observed import Observed, compile_failure, job_state
from inferentia_operator.core.ownership import WritePolicy, is_compile_job_of_ours, is_ours
from inferentia_operator.core.pod.artefact import (
    compile_hash,
    compile_inputs,
    compiled_uri,
    job_output_uri,
    served_uri,
)
from inferentia_operator.core.pod.jobs import newest_earlier_success
from inferentia_operator.core.pod.model import Model
from inferentia_operator.core.pod.part import Part, ref
from inferentia_operator.core.proof import Prover
from inferentia_operator.core.settings import Settings


@dataclass(frozen=True)
class CompilePart(Part):
    facts: CompileFacts | None = None
    # The record of a completed compile to create: nobody's child, so not among ``children``.
    record: dict[str, Any] | None = None

    @property
    def compiled(self) -> bool:
        return self.facts is None or self.facts.condition.status == "True"


# The compile Job is proved right after its create (the proof names its UID: core/proof.py),
# and its name is its artefact's, the same for every model with the same compile inputs: a model
# whose create finds it taken by another model's compile Job waits for that one.
JOB_POLICY = WritePolicy(prove=True, shared=True)


def compile_part(model: Model, observed: Observed, settings: Settings) -> CompilePart:
    body = compile_job(model)
    if body is None:
        return CompilePart(facts=CompileFacts(compiled_condition(False, None, None, "")))
    prover = settings.prover
    name, uri, key = Obj(body).name, compiled_uri(model), compile_hash(model)
    changed = tuple(changed_compile_inputs(observed, prover, name, compile_inputs(model), uri))
    # The Jobs of this artefact: under the key's name, or (made by an operator that named
    # them after their model) under another; this model's own first, as the overlay has them.
    jobs = {Obj(j).name: j for j in [*observed.compile_jobs.get(uri, ()), *observed.all("Job")] if job_output_uri(j) == uri}
    made = {n: j for n, j in jobs.items() if prover.made_job(j, uri)}
    live = jobs.get(name)
    ours = name in made and is_ours(live, Obj(observed.model))
    complete = sorted((j for j in made.values() if job_state(j).phase == "Complete"), key=lambda j: j is not live)
    known = trusted_record(observed.compile_records.get(uri), uri, prover)
    reported = compile_reported(Obj(complete[0]).name, observed.pods) if complete else {}
    ran, commit = share(reported.get("neuronPlacementPercent")), hub_revision(reported.get("hubRevision"))
    record = compile_record(model, complete[0], prover, ran, commit) if complete and known is None else None
    recorded = (known if known is not None else record or {}).get("data") or {}
    on_neuron = ran if ran is not None else share(recorded.get("neuronPlacementPercent"))
    revision = commit or hub_revision(recorded.get("hubRevision"))

    def facts(condition: api.Condition, hit: bool | None = False) -> CompileFacts:
        compiled = condition.status == "True"
        done = on_neuron if compiled else None
        condition = with_neuron_share(condition, done)
        return CompileFacts(
            condition, job=name if not hit else None, uri=uri, key=key, hit=hit, changed=changed, on_neuron=done,
            revision=revision if compiled else None,
        )  # fmt: skip

    if ours:
        failure = compile_failure(name, observed.pods)
        trouble = compile_pod_trouble(name, live, observed.pods, observed.job_events.get(name or "", ()))
        condition = compiled_condition(True, name, live, uri, changed, failure, key=key, trouble=trouble)
        return CompilePart((body,), facts=facts(condition), record=record, policies={ref(body): JOB_POLICY})
    hit = _record_data(known) if known is not None else record["data"] if record is not None else None
    if hit is not None:
        return CompilePart(facts=facts(compiled_condition(True, None, None, uri, key=key, hit=hit), hit=True), record=record)
    if live is not None and name not in made and is_compile_job_of_ours(live):
        # Looks like the operator's, but it cannot show it made it: someone with rights in
        # the namespace did, or the operator stopped between its create and its proof.
        condition = compiled_condition(True, name, live, uri, changed, key=key, unverified=True)
        return CompilePart(facts=facts(condition, hit=None))
    if live is not None and is_compile_job_of_ours(live):
        # Another model's Job compiles this key (or failed to): this one waits for it.
        by = (Obj(live).controller or {}).get("name", "")
        return CompilePart(facts=facts(compiled_condition(True, name, live, uri, changed, key=key, compiled_by=by), hit=None))
    condition = compiled_condition(True, name, None, uri, changed, key=key)
    return CompilePart((body,), facts=facts(condition), policies={ref(body): JOB_POLICY})


def trusted_record(records: list[dict[str, Any]] | None, uri: str, prover: Prover) -> dict[str, Any] | None:
    """The operator's record of a completed compile of ``uri``, among the ConfigMaps that say
    they are one: only a record carrying the operator's proof counts."""
    for record in records or ():
        obj = Obj(record)
        if obj.labels.get(MANAGED_BY_LABEL) == FIELD_MANAGER and obj.labels.get(COMPONENT_LABEL) == COMPILE_RECORD_COMPONENT:
            if prover.made_record(record, uri):
                return record
    return None


def _record_data(record: Mapping[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in (record.get("data") or {}).items()}


def changed_compile_inputs(observed: Observed, prover: Prover, current: str | None, inputs: dict[str, Any], uri: str) -> list[str]:
    """The compile inputs that differ from those of the model's previous artefact: the newest
    earlier compile Job of the model that succeeded, else the record of the artefact its
    Deployment serves now (a model that started from a cache hit ran no Job)."""
    earlier = newest_earlier_success(observed, prover, current)
    if earlier is not None:
        said = earlier.annotations.get(COMPILE_INPUTS_ANNOTATION, "")
    else:
        served = served_uri(observed.own("Deployment"))
        record = trusted_record(observed.compile_records.get(served), served, prover) if served and served != uri else None
        said = Obj(record).annotations.get(COMPILE_INPUTS_ANNOTATION, "")
    try:
        before = json.loads(said)
    except ValueError:
        return []  # nothing earlier, or a Job of an operator that did not record its inputs
    if not isinstance(before, dict):
        return []
    return sorted(k for k in inputs.keys() | before.keys() if inputs.get(k) != before.get(k))
