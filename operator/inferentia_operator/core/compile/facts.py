"""What the compile part concluded (:class:`CompileFacts`), and how it reads its compile Job:
why the Job's pod is not running, what the compile program reported, and the Compiled condition."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inferentia_operator.core import api
from inferentia_operator.core.conditions import cond
from inferentia_operator.core.names import JOB_NAME_LABEL
from inferentia_operator.core.objects import Obj
from inferentia_operator.core.observed import job_state
from inferentia_operator.core.projection import FAILURE_MESSAGE_CHARS


@dataclass(frozen=True)
class CompileFacts:
    """What the compile part concluded (compile/part.py)."""

    condition: api.Condition  # Compiled
    job: str | None = None  # the compile Job that makes the artefact, unless it came from the cache
    uri: str | None = None  # the artefact's, when something compiles ahead of serving
    key: str | None = None
    hit: bool | None = None  # the artefact came from a record of an earlier compile
    changed: tuple[str, ...] = ()  # the compile inputs that differ from the last artefact's
    on_neuron: float | None = None  # the share of its operators that runs on Neuron, once compiled
    revision: str | None = None  # the Hub commit the artefact keeps and the replicas serve, once compiled


def compile_pod_trouble(
    job_name: str | None, job: Mapping[str, Any] | None, pods: Sequence[Mapping[str, Any]], events: Sequence[Mapping[str, Any]] = ()
) -> tuple[str, str] | None:
    """Why a running compile Job's pod is not running, as (reason, message), or None: its pod
    cannot be created (the Job controller's FailedCreate event, the one place Kubernetes says so:
    a missing ServiceAccount, a quota, an admission webhook), or it cannot be scheduled (the
    scheduler's PodScheduled condition). A Job that has pods and created them says nothing."""
    if job is None or job_state(job).finished:
        return None
    mine = [p for p in map(Obj, pods) if p.labels.get(JOB_NAME_LABEL) == job_name and not p.deleting]
    uid = Obj(job).uid
    if not mine:
        said = [e for e in events if e.get("reason") == "FailedCreate" and (not uid or e.get("uid") == uid)]
        if said:
            return "FailedCreate", str(said[-1].get("message") or "")  # cut as it was cached (project_job_event)
        return None
    for p in mine:
        placed = p.condition("PodScheduled")
        if placed.get("status") == "False" and placed.get("reason") == "Unschedulable":
            return "Unschedulable", str(placed.get("message") or "")[-FAILURE_MESSAGE_CHARS:]
    return None


def compile_reported(job_name: str | None, pods: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What the compile program of the Job's pod reported: one JSON object, the last line of the
    compile step's termination message (programs/neuron_compile.py, programs/hub_snapshot.py), or
    {}. The step runs the user's image: its fields are checked by whoever reads them."""
    for p in pods:
        if Obj(p).labels.get(JOB_NAME_LABEL) != job_name:
            continue
        for said in Obj(p).status.get("reports") or []:
            if said.get("container") == "compile":
                try:
                    found = json.loads(str(said.get("message")).strip().splitlines()[-1], parse_constant=lambda _: None)
                except (ValueError, IndexError):
                    return {}
                return found if isinstance(found, dict) else {}
    return {}


HUB_COMMIT = re.compile(r"[0-9a-f]{40}")


def revision(value: Any) -> str | None:
    """A Hub commit (40 hexadecimal digits), as the compile program reports it and a record keeps it, or None."""
    return value if isinstance(value, str) and HUB_COMMIT.fullmatch(value) else None


def share(value: Any) -> float | None:
    """``value`` as a percentage from 0 to 100 (a number, or its text as a record keeps it), or None."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 100:
        return None
    return round(float(value), 2)


def with_neuron_share(condition: api.Condition, on_neuron: float | None) -> api.Condition:
    """Below 100%, the Compiled condition says that the rest runs on the CPU: the Cortex docs
    advise near 100% placement, since an operator left on the CPU limits the instance's throughput."""
    if on_neuron is None or on_neuron >= 100:
        return condition
    note = f"{on_neuron}% of the model's operators run on Neuron; the rest run on the CPU, which limits throughput"
    return condition.model_copy(update={"message": f"{condition.message}; {note}" if condition.message else note})


def compiled_condition(
    job_required: bool,
    job_name: str | None,
    job: Mapping[str, Any] | None,
    uri: str,
    changed: Sequence[str] = (),
    failure: str = "",
    *,
    key: str = "",
    compiled_by: str = "",
    hit: Mapping[str, str] | None = None,
    unverified: bool = False,
    trouble: tuple[str, str] | None = None,
) -> api.Condition:
    """The Compiled condition. ``changed``: the compile inputs that differ from the last
    successful compile's, named in the message while a new compile runs; ``failure``: what the
    failed compile step said; ``compiled_by``: the model whose Job compiles this key, when it
    is another model's; ``hit``: the record of a finished compile of this key (job, model,
    completed), when the model starts from it and runs no Job; ``unverified``: the Job under
    the key's name carries no proof that the operator made it (core/proof.py); ``trouble``: why
    the running Job's pod is not running (:func:`compile_pod_trouble`)."""
    if not job_required:
        return cond("Compiled", "True", "CompiledAtLoad", "no compile image: the serving pods compile at load time with the planned flags")
    if hit is not None:
        by = f" of model {hit['model']}" if hit.get("model") else ""
        when = f" at {hit['completed']}" if hit.get("completed") else ""
        return cond(
            "Compiled", "True", "CacheHit",
            f"cache hit: Job {hit.get('job') or '?'}{by} compiled key {key} to {uri}{when}; no compile Job runs, "
            "the serving pods fetch the artefact and load it without compiling",
        )  # fmt: skip
    if unverified:
        return cond(
            "Compiled", "False", "CompileJobUnverified",
            f"Job {job_name} has the name of this model's compile Job but no proof that the operator made it "
            "(annotation inferentia.dev/proof), so it is neither waited for nor trusted as a compile; delete it, "
            "and the operator creates its own",
        )  # fmt: skip
    whose = f" (of model {compiled_by}, which has the same compile inputs)" if compiled_by else ""
    state = job_state(job)
    if state.phase == "Complete":
        return cond(
            "Compiled", "True", "Compiled",
            f"Job {job_name} compiled key {key} to {uri}; the serving pods fetch it and load it without compiling",
        )  # fmt: skip
    if state.phase == "Failed":
        said = f"; {failure}" if failure else ""
        return cond("Compiled", "False", "CompileFailed", f"Job {job_name}{whose} failed: {state.why or 'no reason given'}{said}")
    if trouble is not None:
        reason, said = trouble
        what = "cannot create its pod" if reason == "FailedCreate" else "has a pod no node can take"
        # A Job's template is never written again: a new spec.compile.placement (or
        # serviceAccountName) reaches a new Job only.
        return cond(
            "Compiled", "False", reason,
            f"Job {job_name}{whose} {what}: {said or 'no reason given'} (the Job keeps the placement and ServiceAccount "
            "it was made with: delete it for a changed spec to apply)",
        )  # fmt: skip
    why = f" ({', '.join(changed)} changed since the last compile)" if changed else ""
    return cond("Compiled", "False", "Compiling", f"Job {job_name}{whose} is compiling key {key} for the new plan{why}")
