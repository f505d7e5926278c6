"""decide(): every branch of a reconcile over observed states, without a cluster."""

from dataclasses import dataclass

import pytest

from inferentia_operator.core import decide as decision
from inferentia_operator.core import status
from inferentia_operator.core.api import InferentiaModelSpec
from inferentia_operator.core.autoscaling import Prometheus
from inferentia_operator.core.compile.job import compile_job, compile_record, compile_record_name
from inferentia_operator.core.device_claims.template import resource_claim_template
from inferentia_operator.core.observed import Conflict, WriteFailure
from inferentia_operator.core.ownership import WritePolicy
from inferentia_operator.core.planner import InvalidSpec, plan
from inferentia_operator.core.pod.artefact import compile_hash, compiled_uri, job_output_uri
from inferentia_operator.core.pod.model import Model, plan_configmap_name, plan_document
from inferentia_operator.core.pod.part import Part
from inferentia_operator.core.proof import PROOF_ANNOTATION, Prover
from inferentia_operator.core.serving.deployment import serving_deployment
from inferentia_operator.core.serving.service import disruption_budget, plan_configmap
from inferentia_operator.core.serving.service import service as service_of
from inferentia_operator.core.settings import Settings
from inferentia_operator.core.status import status_document, status_patch
from specs import DROP, make_spec

NOW = "2026-11-22T10:00:00Z"
UID = "uid-1"
# The operator's key: every Observed here is the operator's view, and every compile Job that
# live() returns is one the operator created and proved (core/proof.py).
PROVER = Prover(b"k" * 32)


SETTINGS = Settings(prover=PROVER)


@dataclass(frozen=True)
class Seen(status.Observed):
    """What the operator observed, and the settings it runs with."""

    settings: Settings = SETTINGS


def Observed(
    model, *, deployment=None, service=None, scaled_object=None, configmaps=(), jobs=(), claim_templates=(), others=(),
    pods=(), scaled_objects_served=True, prometheus: Prometheus | None = None, **views,
) -> Seen:  # fmt: skip
    """The observed state as these tests write it: the model's main objects by name, the rest in
    lists. A model whose Deployment is there has its PodDisruptionBudget too (written with its
    Service), unless ``others`` names one."""
    if deployment is not None and not any(o.get("kind") == "PodDisruptionBudget" for o in others):
        try:
            others = [*others, live(disruption_budget(built(model)))]
        except InvalidSpec:
            pass  # an invalid spec plans nothing: its budget is whatever was written before
    objects = [deployment, service, scaled_object, *configmaps, *jobs, *claim_templates, *others]
    by_kind = status.Observed.of(model, *objects).children
    unserved = frozenset() if scaled_objects_served else frozenset({"ScaledObject"})
    settings = SETTINGS if prometheus is None else Settings(prometheus=prometheus, prover=PROVER)
    return Seen(model, by_kind, pods=pods, unserved=unserved, settings=settings, **views)


def decide(o: Seen, now: str) -> decision.Decision:
    return decision.decide(o, now, o.settings)


def model_body(generation=1, status=None, **overrides):
    return {
        "metadata": {"name": "m", "namespace": "ns", "uid": UID, "generation": generation},
        "spec": make_spec(**overrides),
        "status": status or {},
    }


def built(body) -> Model:
    spec = InferentiaModelSpec.model_validate(body["spec"])
    return Model("m", "ns", UID, spec, plan(spec))


def live(obj, **status):
    """A child as the API server would hold it: what was applied, plus status and metadata; a
    compile Job with the proof the operator adds after creating it."""
    meta = obj["metadata"]
    out = {**obj, "metadata": {**meta, "resourceVersion": "7", "generation": 1, "uid": f"uid-{meta['name']}"}}
    uri = job_output_uri(obj) if obj.get("kind") == "Job" else None
    if uri:
        proof = PROVER.job(meta["namespace"], meta["name"], out["metadata"]["uid"], uri)
        out["metadata"]["annotations"] = {**meta.get("annotations", {}), PROOF_ANNOTATION: proof}
    if status:
        out["status"] = status
    return out


def complete(job):
    return live(job, conditions=[{"type": "Complete", "status": "True"}])


def rolled_out(deployment, replicas=1):
    return live(
        deployment,
        observedGeneration=1, replicas=replicas, readyReplicas=replicas, updatedReplicas=replicas,
        availableReplicas=replicas, conditions=[{"type": "Available", "status": "True"}],
    )  # fmt: skip


def kinds(objects):
    return [o["kind"] for o in objects]


def conds(decision):
    return {c["type"]: c for c in status_document(decision.report.status)["conditions"]}


def test_a_new_model_applies_its_children_and_holds_the_deployment_for_the_compile():
    body = model_body(**{"compile.image": "example.com/compile:1"})
    d = decide(Observed(body), NOW)
    assert kinds(d.apply) == ["ConfigMap", "Service", "PodDisruptionBudget", "Job"]  # no Deployment before the compile
    assert d.delete == []
    c = conds(d)
    assert (c["Compiled"]["status"], c["Compiled"]["reason"]) == ("False", "Compiling")
    assert (c["Ready"]["reason"], c["Reconciling"]["status"], c["Stalled"]["status"]) == ("Compiling", "True", "False")


def a_recompile(new_job_done: bool):
    """A model rolled out with 4 processes, edited to 2: the new plan's compile Job is
    running or done, and the Deployment still has the old plan."""
    old = built(model_body(**{"compile.image": "example.com/compile:1", "processesPerReplica": 4}))
    after = model_body(generation=2, **{"compile.image": "example.com/compile:1", "processesPerReplica": 2})
    new = built(after)
    new_job = compile_job(new)
    o = Observed(
        after,
        deployment=rolled_out(serving_deployment(old)),
        service=live(service_of(new)),
        configmaps=[live(plan_configmap(old)), live(plan_configmap(new))],
        jobs=[complete(compile_job(old)), complete(new_job) if new_job_done else live(new_job)],
    )
    return o, old, new


def test_a_compile_in_progress_holds_the_rollout_and_the_previous_deployment_keeps_serving():
    o, _, _ = a_recompile(new_job_done=False)
    d = decide(o, NOW)
    assert d.apply == []  # nothing to write: the new Job exists, the Deployment must wait
    assert d.delete == []  # the old plan still serves
    assert conds(d)["Ready"]["reason"] == "Compiling"
    # inf1 groups are compiled into the model (neuron-cc's --neuroncore-pipeline-cores), so
    # the compiler's arguments changed: status says so.
    assert "(compilerArgs changed since the last compile)" in conds(d)["Compiled"]["message"]


def test_once_compiled_the_deployment_rolls_and_superseded_plans_go_when_unused():
    o, old, new = a_recompile(new_job_done=True)
    d = decide(o, NOW)
    assert kinds(d.apply) == ["Deployment"]
    assert d.delete == []  # the live Deployment still mounts the old plan
    # The Deployment has rolled: the old plan is unused, and the old compile Job is kept
    # (the newest successful superseded one) so that going back reuses it.
    o = Observed(
        o.model, deployment=rolled_out(serving_deployment(new)), service=o.own("Service"),
        configmaps=o.all("ConfigMap"), jobs=o.all("Job"),
    )  # fmt: skip
    d = decide(o, NOW)
    assert d.apply == []
    assert d.delete == [("ConfigMap", plan_configmap_name(old))]
    assert conds(d)["Ready"]["status"] == "True"


def test_a_superseded_plan_that_a_running_pod_still_mounts_is_kept():
    old = built(model_body(**{"processesPerReplica": 4}))
    after = model_body(generation=2, **{"processesPerReplica": 2})
    new = built(after)
    old_pod = {
        "metadata": {"name": "p", "labels": {"app.kubernetes.io/component": "serving"}},
        "spec": {"volumes": [{"configMap": {"name": plan_configmap_name(old)}}]},
        "status": {"phase": "Running", "conditions": []},
    }
    o = Observed(
        after,
        deployment=rolled_out(serving_deployment(new)),
        service=live(service_of(new)),
        configmaps=[live(plan_configmap(old)), live(plan_configmap(new))],
        pods=[old_pod],
    )
    assert decide(o, NOW).delete == []
    old_pod["status"]["phase"] = "Succeeded"
    assert decide(o, NOW).delete == [("ConfigMap", plan_configmap_name(old))]


def test_superseded_compile_jobs_go_except_the_newest_successful():
    bodies = [model_body(**{"compile.image": "example.com/compile:1", "compile.batchSize": b}) for b in (1, 2, 3)]
    jobs = [compile_job(built(b)) for b in bodies]
    current = model_body(generation=4, **{"compile.image": "example.com/compile:1", "compile.batchSize": 4})
    o = Observed(
        current,
        jobs=[
            {**complete(jobs[0]), "metadata": {**complete(jobs[0])["metadata"], "creationTimestamp": "2026-01-01T00:00:00Z"}},
            {**complete(jobs[1]), "metadata": {**complete(jobs[1])["metadata"], "creationTimestamp": "2026-01-02T00:00:00Z"}},
            live(jobs[2], conditions=[{"type": "Failed", "status": "True"}]),
        ],
    )
    deleted = decide(o, NOW).delete
    assert ("Job", jobs[0]["metadata"]["name"]) in deleted and ("Job", jobs[2]["metadata"]["name"]) in deleted
    assert ("Job", jobs[1]["metadata"]["name"]) not in deleted


def test_an_invalid_edit_leaves_every_child_alone_and_reports_it():
    good = built(model_body())
    bad = model_body(generation=2, processesPerReplica=3, status={"plan": plan_document(good.plan), "selector": "s"})
    o = Observed(bad, deployment=rolled_out(serving_deployment(good)), service=live(service_of(good)))
    d = decide(o, NOW)
    assert d.apply == [] and d.delete == []
    c = conds(d)
    assert (c["Validated"]["status"], c["Ready"]["reason"], c["Stalled"]["status"]) == ("False", "InvalidSpec", "True")
    assert "valid values are 1, 2, 4" in c["Validated"]["message"]
    document = status_document(d.report.status)
    assert document["plan"] == plan_document(good.plan)  # the last valid plan stays visible
    assert document["observedGeneration"] == 2


def test_a_spec_without_a_family_says_so_in_the_models_status_not_only_in_validate():
    """A model left without compute.family is planned for inf1: the warning validate prints is in
    the status the reconcile writes (status.plan.warnings), where kubectl shows it."""
    d = decide(Observed(model_body(**{"compute.family": DROP})), NOW)
    warnings = status_document(d.report.status)["plan"]["warnings"]
    assert [w for w in warnings if "spec.compute.family" in w] == [
        "warning: spec.compute.family: not set, so the model is planned for inf1, the default; valid values are "
        "inf1, inf2, trn1, trn2, trn3: name the family of the nodes it is to run on"
    ]
    assert conds(d)["Validated"]["status"] == "True"  # a warning, not a refusal
    named = decide(Observed(model_body()), NOW)
    assert not [w for w in status_document(named.report.status)["plan"].get("warnings", []) if "spec.compute.family" in w]


def test_a_child_controlled_by_someone_else_is_never_written():
    body = model_body()
    m = built(body)
    foreign = live(service_of(m))
    foreign["metadata"]["ownerReferences"] = [{"kind": "Deployment", "name": "web", "uid": "other", "controller": True}]
    d = decide(Observed(body, service=foreign), NOW)
    assert "Service" not in kinds(d.apply)
    c = conds(d)
    assert (c["Ready"]["reason"], c["Stalled"]["status"]) == ("NameConflict", "True")
    assert "Service m already exists and is controlled by Deployment web" in c["Ready"]["message"]


def after_writes(o: Observed, failures=(), conflicts=()) -> dict:
    """The conditions the reconciler reports after writing: the one decision's basis, with what
    the writes found (a separate, pure step; nothing is decided again)."""
    d = decide(o, NOW)
    report = status.report(o, NOW, d.basis, failures, conflicts)
    return {c["type"]: c for c in status_document(report.status)["conditions"]}


def test_write_failures_end_in_status_with_the_servers_message():
    body = model_body()
    refused = WriteFailure("Deployment", "m", 422, 'Deployment.apps "m" is invalid: quantities must match the regular expression')
    c = after_writes(Observed(body), failures=[refused])
    assert (c["Ready"]["status"], c["Ready"]["reason"]) == ("False", "ApplyFailed")
    assert "422 Deployment.apps" in c["Ready"]["message"] and c["Stalled"]["status"] == "True"
    transient = WriteFailure("Deployment", "m", 503, "the server is currently unable to handle the request")
    c = after_writes(Observed(body), failures=[transient])
    assert (c["Ready"]["reason"], c["Stalled"]["status"], c["Reconciling"]["status"]) == ("ApplyFailed", "False", "True")


def test_a_conflict_found_before_creating_is_reported():
    body = model_body()
    conflict = Conflict("Service", "m", "not managed by this model (it has no controller)")
    c = after_writes(Observed(body), conflicts=[conflict])
    assert c["Ready"]["reason"] == "NameConflict" and "has no controller" in c["Ready"]["message"]


def test_a_steady_model_needs_no_write_and_no_status_patch():
    body = model_body()
    m = built(body)
    o = Observed(
        body,
        deployment=rolled_out(serving_deployment(m)),
        service=live(service_of(m)),
        configmaps=[live(plan_configmap(m))],
    )
    first = decide(o, NOW)
    assert first.apply == [] and first.delete == []
    o.model["status"] = status_document(first.report.status)
    again = decide(o, "2026-11-22T11:00:00Z")  # later: unchanged conditions keep their times
    assert status_patch(o.model["status"], again.report.status) is None


def test_status_patch_nulls_what_is_no_longer_reported_and_keeps_kopfs_stanza():
    body = model_body()
    d = decide(Observed(body), NOW)
    previous = {"kopf": {"progress": {}}, "compiledUri": "s3://old/", "observedGeneration": 0}
    patch = status_patch(previous, d.report.status)
    assert patch["compiledUri"] is None and "kopf" not in patch and patch["observedGeneration"] == 1


def test_a_model_being_deleted_gets_nothing():
    body = model_body()
    body["metadata"]["deletionTimestamp"] = NOW
    d = decide(Observed(body), NOW)
    assert (d.apply, d.delete, d.report) == ([], [], None)


@pytest.mark.parametrize("edit", ["port", "label"])
def test_a_hand_edited_child_of_ours_is_applied_again(edit):
    body = model_body()
    m = built(body)
    service = live(service_of(m))
    if edit == "port":
        service["spec"]["ports"][0]["port"] = 9999
    else:
        del service["metadata"]["labels"]["app.kubernetes.io/managed-by"]
    o = Observed(body, deployment=rolled_out(serving_deployment(m)), service=service, configmaps=[live(plan_configmap(m))])
    assert kinds(decide(o, NOW).apply) == ["Service"]


def test_peering_pause_follows_kopfs_rule():
    import datetime

    from inferentia_operator.shell.runner import peering_paused

    now = datetime.datetime(2026, 11, 22, 10, 0, tzinfo=datetime.UTC)
    alive, dead = "2026-11-22T09:59:30+00:00", "2026-11-22T09:00:00+00:00"

    def peering(*peers):
        return {"status": {f"peer-{i}": {"priority": p, "lifetime": 60, "lastseen": seen} for i, (p, seen) in enumerate(peers)}}

    assert not peering_paused([peering((10, alive))], 10, now)  # only ourselves
    assert peering_paused([peering((10, alive), (20, alive))], 10, now)  # a live peer above us
    assert not peering_paused([peering((10, alive), (20, dead))], 10, now)  # ...gone
    assert not peering_paused([peering((10, alive), (5, alive))], 10, now)  # we are the highest
    assert peering_paused([peering((10, alive), (10, alive))], 10, now)  # kopf pauses both on a tie
    assert not peering_paused([None, {"status": {"x": "garbage"}}], 10, now)


def test_a_replica_started_later_ranks_above_every_replica_started_before_it():
    """A replica restarted after a crash outranks its dead predecessor, whose keep-alive stays
    live for its lifetime: kopf would otherwise keep the new one paused until it ran out."""
    from inferentia_operator.shell.runner import start_priority

    t = 1_795_000_000_000_000_000  # 2026-11-18, in ns
    earlier = [start_priority(t) for _ in range(50)]
    later = [start_priority(t + 1_000_000) for _ in range(50)]  # a millisecond on
    assert max(earlier) < min(later)
    assert len(set(earlier)) > 40  # a tie within one millisecond is a chance in a thousand, not a rule
    assert max(later) < 2**53  # every JSON reader of the peering object's status holds it exactly


def test_a_child_of_ours_whose_owner_reference_was_removed_is_taken_back_but_a_stranger_is_not():
    body = model_body()
    m = built(body)
    orphan = live(service_of(m))
    orphan["metadata"].pop("ownerReferences")
    o = Observed(body, deployment=rolled_out(serving_deployment(m)), service=orphan, configmaps=[live(plan_configmap(m))])
    assert kinds(decide(o, NOW).apply) == ["Service"]  # our labels: re-applied, owner reference and all
    orphan["metadata"]["labels"] = {"team": "admin"}
    d = decide(o, NOW)
    assert d.apply == [] and conds(d)["Ready"]["reason"] == "NameConflict"


# --- one compile per key ------------------------------------------------------------------

COMPILED = {"compile.image": "example.com/compile:1"}


def other_model(name="other", uid="uid-2"):
    """A model of another name with the same compile inputs: its Job is the same Job."""
    spec = InferentiaModelSpec.model_validate(make_spec(**COMPILED))
    return Model(name, "ns", uid, spec, plan(spec))


def by_uri(*objects):
    out: dict = {}
    for obj in objects:
        uri = job_output_uri(obj) if obj["kind"] == "Job" else obj["data"]["uri"]
        out.setdefault(uri, []).append(obj)
    return out


def test_a_completed_compile_of_another_model_is_a_cache_hit_and_gets_recorded():
    body = model_body(**COMPILED)
    m, theirs = built(body), complete(compile_job(other_model()))
    d = decide(Observed(body, compile_jobs=by_uri(theirs)), NOW)
    assert kinds(d.apply) == ["ConfigMap", "Service", "Deployment", "PodDisruptionBudget"]  # no Job of its own
    c = conds(d)["Compiled"]
    assert (c["status"], c["reason"]) == ("True", "CacheHit")
    assert compile_hash(m) in c["message"] and theirs["metadata"]["name"] in c["message"] and "model other" in c["message"]
    doc = status_document(d.report.status)
    assert (doc["compileKey"], doc["compileCacheHit"], doc["compiledUri"]) == (compile_hash(m), True, compiled_uri(m))
    assert "compileJob" not in doc
    # The completion is recorded, for models that come after the Job is gone.
    assert d.record["metadata"]["name"] == compile_record_name(m)
    assert d.record["data"] == {
        "uri": compiled_uri(m),
        "key": compile_hash(m),
        "job": theirs["metadata"]["name"],
        "model": "other",
    }
    assert "ownerReferences" not in d.record["metadata"] and "inferentia.dev/model" not in d.record["metadata"]["labels"]


def test_a_record_alone_is_a_cache_hit_and_is_not_written_again():
    body = model_body(**COMPILED)
    record = live(compile_record(other_model(), complete(compile_job(other_model())), PROVER))
    d = decide(Observed(body, compile_records={compiled_uri(built(body)): [record]}), NOW)
    assert "Job" not in kinds(d.apply) and d.record is None
    assert conds(d)["Compiled"]["reason"] == "CacheHit"


def test_a_record_the_operator_did_not_write_is_not_trusted():
    body = model_body(**COMPILED)
    record = live(compile_record(other_model(), complete(compile_job(other_model())), PROVER))
    del record["metadata"]["labels"]["app.kubernetes.io/managed-by"]
    d = decide(Observed(body, compile_records={compiled_uri(built(body)): [record]}), NOW)
    assert "Job" in kinds(d.apply) and conds(d)["Compiled"]["reason"] == "Compiling"


@pytest.mark.parametrize(
    "forge",
    [
        pytest.param(lambda r: r["metadata"]["annotations"].pop(PROOF_ANNOTATION), id="no proof"),
        pytest.param(lambda r: r["metadata"]["annotations"].update({PROOF_ANNOTATION: "0" * 64}), id="a made-up proof"),
        pytest.param(lambda r: r["metadata"].update(name="any-name"), id="the proof of another record"),
        pytest.param(lambda r: r["metadata"].update(namespace="other"), id="the proof of another namespace"),
    ],
)
def test_a_record_without_the_operators_proof_is_no_cache_hit(forge):
    """Anyone who can create a ConfigMap in the namespace can write one with the operator's
    labels and the artefact's URI; only the proof, made with the operator's key, counts."""
    body = model_body(**COMPILED)
    record = live(compile_record(other_model(), complete(compile_job(other_model())), PROVER))
    forge(record)
    d = decide(Observed(body, compile_records={compiled_uri(built(body)): [record]}), NOW)
    assert "Job" in kinds(d.apply) and conds(d)["Compiled"]["reason"] == "Compiling"


def test_a_forged_record_beside_a_genuine_one_hides_nothing():
    body = model_body(**COMPILED)
    genuine = live(compile_record(other_model(), complete(compile_job(other_model())), PROVER))
    forged = {**genuine, "metadata": {**genuine["metadata"], "name": "forged", "annotations": {}}}
    d = decide(Observed(body, compile_records={compiled_uri(built(body)): [forged, genuine]}), NOW)
    assert conds(d)["Compiled"]["reason"] == "CacheHit"


def test_a_key_the_operator_does_not_hold_vouches_for_nothing():
    body = model_body(**COMPILED)
    record = live(compile_record(other_model(), complete(compile_job(other_model())), Prover(b"x" * 32)))
    d = decide(Observed(body, compile_records={compiled_uri(built(body)): [record]}), NOW)
    assert conds(d)["Compiled"]["reason"] == "Compiling"
    assert Prover().record("ns", "n", "s3://b/") == "" and not Prover().made_record(record, compiled_uri(built(body)))


@pytest.mark.parametrize(
    "forge",
    [
        pytest.param(lambda j: j["metadata"]["annotations"].pop(PROOF_ANNOTATION), id="no proof"),
        pytest.param(lambda j: j["metadata"].update(uid="uid-of-the-forgery"), id="a genuine Job's proof, copied"),
    ],
)
def test_a_completed_job_without_the_operators_proof_is_no_cache_hit_nor_recorded(forge):
    """A Job with the compile labels that ran anything and completed: the operator once wrote a
    genuine record for it. Now it reports it and neither records nor trusts it."""
    body = model_body(**COMPILED)
    theirs = complete(compile_job(other_model()))
    forge(theirs)
    d = decide(Observed(body, compile_jobs=by_uri(theirs)), NOW)
    assert d.record is None and "Job" not in kinds(d.apply) and "Deployment" not in kinds(d.apply)
    c = conds(d)
    assert (c["Compiled"]["reason"], c["Stalled"]["status"], c["Ready"]["reason"]) == (
        "CompileJobUnverified",
        "True",
        "CompileJobUnverified",
    )
    assert theirs["metadata"]["name"] in c["Compiled"]["message"] and "delete it" in c["Compiled"]["message"]


def test_a_forged_job_of_the_artefact_under_another_name_is_ignored():
    body = model_body(**COMPILED)
    forged = complete(compile_job(other_model()))
    forged["metadata"]["name"] = "compile-looks-real"
    forged["metadata"]["annotations"].pop(PROOF_ANNOTATION)
    d = decide(Observed(body, compile_jobs=by_uri(forged)), NOW)
    assert d.record is None and "Job" in kinds(d.apply) and conds(d)["Compiled"]["reason"] == "Compiling"


def test_another_models_compile_in_progress_is_waited_for_not_run_again_nor_a_conflict():
    body = model_body(**COMPILED)
    theirs = live(compile_job(other_model()))
    d = decide(Observed(body, compile_jobs=by_uri(theirs)), NOW)
    assert kinds(d.apply) == ["ConfigMap", "Service", "PodDisruptionBudget"] and d.record is None
    c = conds(d)
    assert (c["Compiled"]["reason"], c["Stalled"]["status"]) == ("Compiling", "False")
    assert "of model other" in c["Compiled"]["message"]
    assert status_document(d.report.status)["compileJob"] == theirs["metadata"]["name"]


def test_a_failed_compile_is_never_recorded():
    body = model_body(**COMPILED)
    m = built(body)
    failed = live(compile_job(m), conditions=[{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}])
    d = decide(Observed(body, jobs=[failed], compile_jobs=by_uri(failed)), NOW)
    assert d.record is None and conds(d)["Compiled"]["reason"] == "CompileFailed"
    # Nor is another model's: this one reports that Job's failure, and runs no second one.
    theirs = live(compile_job(other_model()), conditions=[{"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}])
    d = decide(Observed(body, compile_jobs=by_uri(theirs)), NOW)
    assert d.record is None and "Job" not in kinds(d.apply)
    assert conds(d)["Compiled"]["reason"] == "CompileFailed" and "DeadlineExceeded" in conds(d)["Compiled"]["message"]


def test_the_models_own_completed_compile_is_recorded_and_is_no_cache_hit():
    body = model_body(**COMPILED)
    mine = complete(compile_job(built(body)))
    d = decide(Observed(body, jobs=[mine], compile_jobs=by_uri(mine)), NOW)
    assert conds(d)["Compiled"]["reason"] == "Compiled" and d.record is not None
    assert status_document(d.report.status)["compileCacheHit"] is False


def test_a_record_is_never_deleted_as_a_superseded_plan():
    body = model_body(**COMPILED)
    record = live(compile_record(built(body), complete(compile_job(built(body))), PROVER))
    d = decide(Observed(body, configmaps=[record]), NOW)
    assert ("ConfigMap", record["metadata"]["name"]) not in d.delete


def test_a_cache_hit_after_an_edit_names_the_inputs_that_changed_since_the_served_artefact():
    before = model_body(**COMPILED, **{"compile.batchSize": 1})
    after = model_body(generation=2, **COMPILED, **{"compile.batchSize": 2})
    served = built(before)
    records = {compiled_uri(m): [live(compile_record(m, complete(compile_job(m)), PROVER))] for m in (served, built(after))}
    d = decide(Observed(after, deployment=rolled_out(serving_deployment(served)), compile_records=records), NOW)
    assert conds(d)["Compiled"]["reason"] == "CacheHit"
    assert status_document(d.report.status)["changedCompileInputs"] == ["batchSize"]


def test_a_dra_model_applies_its_claim_template_and_deletes_one_no_pod_template_names():
    body = model_body(**{"compute.family": "trn2", "compute.inf": 4, "compute.allocation": "dra"})
    m = built(body)
    template = resource_claim_template(m)
    d = decide(Observed(body), NOW)
    assert kinds(d.apply) == ["ConfigMap", "Service", "Deployment", "PodDisruptionBudget", "ResourceClaimTemplate"]
    # An edit to one device: a new template; the old one goes once the Deployment names the new.
    after = model_body(generation=2, **{"compute.family": "trn2", "compute.inf": 1, "compute.allocation": "dra"})
    new = built(after)
    old_deployment = rolled_out(serving_deployment(m))
    o = Observed(after, deployment=old_deployment, claim_templates=[live(template)])
    assert ("ResourceClaimTemplate", template["metadata"]["name"]) not in decide(o, NOW).delete
    o = Observed(after, deployment=rolled_out(serving_deployment(new)), claim_templates=[live(template)])
    assert ("ResourceClaimTemplate", template["metadata"]["name"]) in decide(o, NOW).delete


def test_a_model_reconciled_again_over_the_same_inputs_is_checked_and_planned_once(monkeypatch):
    """A model is reconciled at its create, at its rollout's events and at every resync, over
    one spec: it is checked and planned (its plan ConfigMap's content built, serialised and
    hashed) once for the same inputs, and again whenever one that changes the result differs."""
    import copy

    from inferentia_operator.core import model as checking

    planned = []
    planner = checking.plan
    monkeypatch.setattr(checking, "plan", lambda spec, **kw: planned.append(spec) or planner(spec, **kw))

    def body(**overrides):
        out = model_body(**{"compile.extraArgs": ["--opt-level", "2"], **overrides})
        out["metadata"].update(name="memo", namespace="ns-memo", uid="uid-memo")
        return out

    first = decide(Observed(body()), NOW)
    again = decide(Observed(copy.deepcopy(body())), NOW)
    assert len(planned) == 1
    assert again.apply == first.apply and [o["kind"] for o in first.apply] == ["ConfigMap", "Service", "Deployment", "PodDisruptionBudget"]

    other_uid = body()
    other_uid["metadata"]["uid"] = "uid-other"
    decide(Observed(other_uid), NOW)
    assert len(planned) == 2 and decide(Observed(body()), NOW).apply == first.apply and len(planned) == 2

    smaller = decide(Observed(body(**{"compute.cpu": "1"})), NOW)
    assert len(planned) == 3
    deployment = next(o for o in smaller.apply if o["kind"] == "Deployment")
    assert deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "1"

    # The operator's settings are inputs too: its image, and where it places pods.
    placed = decision.decide(Observed(body()), NOW, Settings(prover=PROVER, scheduler_name="my-scheduler"))
    imaged = decision.decide(Observed(body()), NOW, Settings(prover=PROVER, operator_image="example.com/op:2"))
    assert len(planned) == 5
    assert next(o for o in placed.apply if o["kind"] == "Deployment")["spec"]["template"]["spec"]["schedulerName"] == "my-scheduler"
    assert "example.com/op:2" in str(imaged.apply) and "example.com/op:2" not in str(first.apply)

    # A spec that JSON would not give back as it is (a tuple) is checked afresh, never taken
    # for the list it prints as.
    tupled = body()
    tupled["spec"]["compile"]["extraArgs"] = ("--opt-level", "2")
    assert decide(Observed(tupled), NOW).apply == first.apply and len(planned) == 6


def test_every_parts_write_policies_reach_the_decision():
    """A write policy set by any part, not only the compile part's, is carried to the act step;
    two parts giving one child different policies, or ``prove`` on a kind other than Job, is a
    bug that decide refuses."""
    shared, proved = WritePolicy(shared=True), WritePolicy(prove=True, shared=True)
    parts = [Part(policies={("ConfigMap", "a"): shared}), Part(), Part(policies={("Job", "b"): proved})]
    assert decision.write_policies(parts) == {("ConfigMap", "a"): shared, ("Job", "b"): proved}
    with pytest.raises(AssertionError):
        decision.write_policies([Part(policies={("Job", "b"): shared}), Part(policies={("Job", "b"): proved})])
    with pytest.raises(AssertionError):
        decision.write_policies([Part(policies={("ConfigMap", "a"): proved})])
