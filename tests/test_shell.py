"""The stateful shell under unit test, with an in-memory API server in place of the client:
the cache's write overlay (stale and out-of-order writes, resourceVersions as numbers, a child
deleted under a pending write), the actor (conflicts, refusals), one decision per reconcile,
and the triggers. The end-to-end suite runs the same code against a real API server."""

from __future__ import annotations

import asyncio
import copy
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from inferentia_operator.core import api
from inferentia_operator.core.compile.job import compile_job
from inferentia_operator.core.decide import decide
from inferentia_operator.core.kinds import CHILD_KINDS
from inferentia_operator.core.names import TRAFFIC_LABEL
from inferentia_operator.core.projection import Packed, project
from inferentia_operator.core.serving.deployment import serving_deployment
from inferentia_operator.core.serving.service import service
from inferentia_operator.core.settings import DEFAULT_SETTINGS
from inferentia_operator.shell import reconciler as reconciler_module
from inferentia_operator.shell.act import act
from inferentia_operator.shell.cache import Cache
from inferentia_operator.shell.kube import ApiError
from inferentia_operator.shell.reconciler import Reconciler
from specs import make_model

NS = "team"
INDEXES = {api.KIND: "model_index", **{k.kind: k.index for k in CHILD_KINDS}}


class FakeKube:
    """An API server in memory: objects by (kind, name) in one namespace, a resourceVersion
    counter, and refusals to inject by (kind, name)."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.rv = 100
        self.refuse: dict[tuple[str, str], ApiError] = {}
        self.calls: list[tuple[str, str, str]] = []
        self.events: list[tuple[str, str]] = []
        self.evicted: list[tuple[str, str, str]] = []
        self.labelled: list[tuple[str, str, str, dict[str, str]]] = []

    def _stored(self, body: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        stored = copy.deepcopy(body)
        stored["metadata"] = {**stored["metadata"], "resourceVersion": str(self.rv), "uid": f"uid-{self.rv}"}
        self.objects[(body["kind"], body["metadata"]["name"])] = stored
        return stored

    def _check(self, verb: str, kind: str, name: str) -> None:
        self.calls.append((verb, kind, name))
        if (kind, name) in self.refuse:
            raise self.refuse[(kind, name)]

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append(("get", kind, name))
        return self.objects.get((kind, name))

    def create(self, body: dict[str, Any]) -> dict[str, Any] | None:
        self._check("create", body["kind"], body["metadata"]["name"])
        if (body["kind"], body["metadata"]["name"]) in self.objects:
            return None
        return self._stored(body)

    def apply(self, body: dict[str, Any]) -> dict[str, Any]:
        self._check("apply", body["kind"], body["metadata"]["name"])
        return self._stored(body)

    def make_own_fields_applied(self, kind: str, namespace: str, name: str, index: int, beside_apply: bool) -> dict[str, Any]:
        self._check("make_own_fields_applied", kind, name)
        self.calls.append(("entry", str(index), str(beside_apply)))
        return self.objects[(kind, name)]

    def delete(self, kind: str, namespace: str, name: str) -> None:
        self._check("delete", kind, name)
        self.objects.pop((kind, name), None)

    def evict(self, namespace: str, name: str, uid: str) -> None:
        self._check("evict", "Pod", name)
        self.evicted.append((namespace, name, uid))

    def label_pod(self, namespace: str, name: str, uid: str, labels: dict[str, str]) -> None:
        self._check("label", "Pod", name)
        self.labelled.append((namespace, name, uid, labels))

    def patch_status(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any] | None:
        self.calls.append(("patch_status", api.KIND, name))
        model = self.objects[(api.KIND, name)]
        model["status"] = {**(model.get("status") or {}), **(patch.get("status") or patch)}
        model["status"] = {k: v for k, v in model["status"].items() if v is not None}
        self.rv += 1
        model["metadata"]["resourceVersion"] = str(self.rv)
        return copy.deepcopy(model)

    def post_event(self, model: dict[str, Any], kind: str, reason: str, message: str) -> None:
        self._check("create", "Event", reason)
        self.events.append((kind, reason))


def indexes(*objects: dict[str, Any]) -> dict[str, Any]:
    """kopf's indexes as the cache reads them: packed projections by model key."""
    out: dict[str, dict[tuple[str, str], list[Packed]]] = {index: {} for index in INDEXES.values()}
    for obj in objects:
        name = obj["metadata"]["labels"]["inferentia.dev/model"] if obj["kind"] != api.KIND else obj["metadata"]["name"]
        out[INDEXES[obj["kind"]]].setdefault((NS, name), []).append(Packed(project(obj)))
    return out


def stored_model(name: str = "m", **overrides: Any) -> dict[str, Any]:
    body = make_model(name, NS, **overrides)
    body["metadata"] |= {"uid": f"uid-{name}", "generation": 1, "resourceVersion": "50"}
    return body


def with_rv(body: dict[str, Any], rv: int) -> dict[str, Any]:
    body = copy.deepcopy(body)
    body["metadata"]["resourceVersion"] = str(rv)
    return body


def a_service(rv: int) -> dict[str, Any]:
    model = stored_model()
    from inferentia_operator.core.model import check_model

    m = check_model("m", NS, model["spec"], uid="uid-m").model
    assert m is not None
    return with_rv(service(m), rv)


# -- the cache's overlay -----------------------------------------------------------------------


def test_what_the_operator_wrote_is_seen_until_the_watch_catches_up():
    cache = Cache()
    cache.indexes = indexes(stored_model())
    cache.remember((NS, "m"), {("Service", "m"): project(a_service(120))})
    assert cache.observe((NS, "m")).own("Service")["metadata"]["resourceVersion"] == "120"  # the watch has not delivered it
    cache.indexes = indexes(stored_model(), a_service(121))
    assert cache.observe((NS, "m")).own("Service")["metadata"]["resourceVersion"] == "121"
    assert cache._written[(NS, "m")] == {}  # caught up: the overlay let go  # noqa: SLF001


def test_a_stale_write_never_hides_what_the_watch_delivered_after_it():
    """Out of order: the watch already holds a newer copy than the write the overlay got."""
    cache = Cache()
    cache.indexes = indexes(stored_model(), a_service(130))
    cache.remember((NS, "m"), {("Service", "m"): project(a_service(125))})
    assert cache.observe((NS, "m")).own("Service")["metadata"]["resourceVersion"] == "130"


def test_resource_versions_are_compared_as_numbers_not_text():
    """ "9" sorts after "10" as text; as numbers the watch's 10 is the newer."""
    cache = Cache()
    cache.indexes = indexes(stored_model(), a_service(10))
    cache.remember((NS, "m"), {("Service", "m"): project(a_service(9))})
    assert cache.observe((NS, "m")).own("Service")["metadata"]["resourceVersion"] == "10"


def test_a_deleted_model_is_not_kept_alive_by_its_own_status_patch():
    """Seen in make test: a model's namespace was deleted while a reconcile of it was in flight;
    the DELETED event cleared the overlay, then the reconcile's status patch put the model back
    in it, and the operator kept creating its children in a namespace that no longer existed
    (404 at every retry, for as long as it ran). Only the watch makes a model exist: what the
    operator wrote of it is laid over a model the index holds, never in place of one."""
    cache = Cache()
    cache.indexes = indexes(stored_model())
    cache.remember((NS, "m"), {(api.KIND, "m"): project(with_rv(stored_model(), 60))})
    assert cache.observe((NS, "m")) is not None
    cache.indexes = indexes()  # the model is deleted: the watch dropped it from the index
    assert cache.observe((NS, "m")) is None


def test_a_delete_is_seen_before_the_watch_says_so_and_let_go_after():
    from inferentia_operator.shell.cache import GONE

    cache = Cache()
    cache.indexes = indexes(stored_model(), a_service(140))
    cache.remember((NS, "m"), {("Service", "m"): GONE})
    assert cache.observe((NS, "m")).own("Service") is None
    cache.indexes = indexes(stored_model())
    assert cache.observe((NS, "m")).own("Service") is None and cache._written[(NS, "m")] == {}  # noqa: SLF001


def test_a_child_deleted_under_a_pending_write_is_not_brought_back_by_the_overlay():
    """The operator wrote the Service (rv 150); someone deleted it before the watch delivered
    the write, and the watch, after a relist, delivers only the delete. The overlay must let
    go, or the model would see a Service that does not exist and never create it again."""
    cache = Cache()
    cache.indexes = indexes(stored_model())
    cache.remember((NS, "m"), {("Service", "m"): project(a_service(150))})
    cache.deleted((NS, "m"), a_service(151))  # the delete event: the object as it last was
    observed = cache.observe((NS, "m"))
    assert observed.own("Service") is None
    assert any(b["kind"] == "Service" for b in decide(observed, "2026-11-24T00:00:00Z").apply)  # and so it is created again


def test_a_delete_event_older_than_the_write_keeps_the_write():
    """The delete of an earlier copy (a name re-created since) does not hide the newer write."""
    cache = Cache()
    cache.indexes = indexes(stored_model())
    cache.remember((NS, "m"), {("Service", "m"): project(a_service(160))})
    cache.deleted((NS, "m"), a_service(155))
    assert cache.observe((NS, "m")).own("Service")["metadata"]["resourceVersion"] == "160"


# -- the actor -----------------------------------------------------------------------------------

NOW = "2026-11-24T00:00:00Z"


def observed_holding(*objects: dict[str, Any]):
    """Model m as the caches give it to a reconcile, when their watches hold ``objects``."""
    cache = Cache()
    cache.indexes = indexes(*objects)
    return cache.observe((NS, "m"))


def run_act(kube: FakeKube, observed, decision=None):
    """One act step, of ``decision`` or of what ``observed`` decides."""
    with ThreadPoolExecutor(1) as pool:
        return asyncio.run(act(pool, kube, observed, decision or decide(observed, NOW), DEFAULT_SETTINGS.prover))


def as_posted(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` as the API server holds it after the operator's POST: its fields the Update entry's."""
    stored = copy.deepcopy(body)
    stored["metadata"] |= {
        "uid": "u-s",
        "resourceVersion": "7",
        "managedFields": [{"manager": "inferentia-operator", "operation": "Update"}],
    }
    return stored


def service_calls(kube: FakeKube) -> list[tuple[str, str, str]]:
    return [c for c in kube.calls if c[1:] == ("Service", "m") or c[0] == "entry"]


def test_the_actor_writes_each_child_and_records_refusals_and_conflicts_without_stopping():
    kube = FakeKube()
    someone_elses = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "m", "namespace": NS, "labels": {}}}
    kube.objects[("Service", "m")] = someone_elses
    observed = observed_holding(stored_model(**{"compile.image": "example.com/neuron:1"}))
    decision = decide(observed, NOW)
    job = next(b for b in decision.apply if b["kind"] == "Job")
    kube.refuse[("Job", job["metadata"]["name"])] = ApiError(422, "Invalid", "spec.template: invalid")
    outcome = run_act(kube, observed, decision)
    assert [(c.kind, c.name) for c in outcome.conflicts] == [("Service", "m")]
    assert kube.objects[("Service", "m")] is someone_elses  # never written over
    assert [(f.kind, f.code) for f in outcome.failures] == [("Job", 422)]
    plan = next(b for b in decision.apply if b["kind"] == "ConfigMap")
    assert ("ConfigMap", plan["metadata"]["name"]) in outcome.written  # the rest went ahead


def test_a_new_models_children_are_created_without_a_read():
    """A create's 409 is the check for a name taken by an object the watch cannot see: a model
    whose names are free costs no GET (the read happens only on a 409), and no apply."""
    kube = FakeKube()
    outcome = run_act(kube, observed_holding(stored_model()))
    assert not outcome.failures and not outcome.conflicts
    assert {(k, n) for k, n in outcome.written} >= {("Deployment", "m"), ("Service", "m")}
    assert [c for c in kube.calls if c[0] in ("get", "apply")] == []


def test_a_child_created_by_a_post_has_its_fields_made_the_applys_before_its_first_apply_only():
    """The first apply to a child the operator POSTed makes the POST's fields the apply's first
    (else an apply that drops a field would leave it); a child without that entry is applied alone."""
    kube = FakeKube()
    model = stored_model()
    service = next(b for b in decide(observed_holding(model), NOW).apply if b["kind"] == "Service")
    live = as_posted(service)
    live["spec"]["ports"] = [{**live["spec"]["ports"][0], "port": 1}]  # differs: to be applied
    kube.objects[("Service", "m")] = live
    run_act(kube, observed_holding(model, live))
    assert service_calls(kube) == [("make_own_fields_applied", "Service", "m"), ("entry", "0", "False"), ("apply", "Service", "m")]

    kube.calls.clear()
    applied = kube.objects[("Service", "m")]
    applied["metadata"]["managedFields"] = [{"manager": "inferentia-operator", "operation": "Apply"}]
    applied["spec"]["ports"] = [{**applied["spec"]["ports"][0], "port": 2}]
    run_act(kube, observed_holding(model, applied))
    assert service_calls(kube) == [("apply", "Service", "m")]


def test_a_post_that_meets_its_own_child_unseen_makes_its_fields_the_applys_at_once():
    """A create's 409 on a child of the model's own that the caches do not hold yet (a restart
    before the watch delivered it): the GET that checked its owner also says whether the POST's
    fields are still the operator's Update entry, so the apply that follows takes them over in
    the same reconcile, not a reconcile later."""
    kube = FakeKube()
    observed = observed_holding(stored_model())
    decision = decide(observed, NOW)
    kube.objects[("Service", "m")] = as_posted(next(b for b in decision.apply if b["kind"] == "Service"))
    outcome = run_act(kube, observed, decision)
    assert not outcome.failures and not outcome.conflicts
    assert service_calls(kube) == [
        ("create", "Service", "m"),
        ("get", "Service", "m"),
        ("make_own_fields_applied", "Service", "m"),
        ("entry", "0", "False"),
        ("apply", "Service", "m"),
    ]


class ProvingKube(FakeKube):
    """FakeKube that also takes the proof's annotation (the compile Job's, after its create)."""

    def annotate(self, kind: str, namespace: str, name: str, annotations: dict[str, str]) -> dict[str, Any]:
        self._check("annotate", kind, name)
        stored = self.objects[(kind, name)]
        stored["metadata"]["annotations"] = {**stored["metadata"].get("annotations", {}), **annotations}
        return stored


def test_a_created_compile_job_is_proved_from_the_creates_answer_and_nothing_else_is():
    """The proof names the Job's UID, which exists only once it is created: the annotation
    follows its create at once, and no other child is annotated."""
    kube = ProvingKube()
    observed = observed_holding(stored_model(**{"compile.image": "example.com/neuron:1"}))
    decision = decide(observed, NOW)
    job = next(b for b in decision.apply if b["kind"] == "Job")["metadata"]["name"]
    outcome = run_act(kube, observed, decision)
    assert not outcome.failures and not outcome.conflicts
    assert [c for c in kube.calls if c[0] == "annotate"] == [("annotate", "Job", job)]
    assert "inferentia.dev/proof" in outcome.written[("Job", job)]["metadata"]["annotations"]


def test_a_compile_job_name_taken_by_another_models_compile_job_is_waited_for_not_a_conflict():
    """Compile Jobs are named after their artefact: a create's 409 on one that another model's
    compile Job holds leaves it to that model (neither written nor a NameConflict); the same
    name held by a Job the operator did not make is a conflict."""
    observed = observed_holding(stored_model(**{"compile.image": "example.com/neuron:1"}))
    decision = decide(observed, NOW)
    body = next(b for b in decision.apply if b["kind"] == "Job")
    name = body["metadata"]["name"]
    others = copy.deepcopy(body)
    others["metadata"]["ownerReferences"] = [{**others["metadata"]["ownerReferences"][0], "uid": "uid-other", "name": "other"}]
    kube = ProvingKube()
    kube.objects[("Job", name)] = others
    outcome = run_act(kube, observed, decision)
    assert not outcome.failures and not outcome.conflicts and ("Job", name) not in outcome.written
    assert [c for c in kube.calls if c[1:] == ("Job", name)] == [("create", "Job", name), ("get", "Job", name)]
    assert kube.objects[("Job", name)] is others

    someone_elses = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": NS, "labels": {}}}
    kube = ProvingKube()
    kube.objects[("Job", name)] = someone_elses
    outcome = run_act(kube, observed, decision)
    assert [(c.kind, c.name) for c in outcome.conflicts] == [("Job", name)]
    assert kube.objects[("Job", name)] is someone_elses


# -- one decision per reconcile, and the triggers --------------------------------------------------


@pytest.fixture
def counted_decide(monkeypatch):
    calls = []

    def counting(observed, now, settings):
        calls.append(observed)
        return decide(observed, now, settings)

    monkeypatch.setattr(reconciler_module, "decide", counting)
    return calls


def reconciler_with(kube: FakeKube, *objects: dict[str, Any]) -> Reconciler:
    r = Reconciler(lambda: kube, workers=1, resync_seconds=300, is_active=lambda: True)
    r.cache.indexes = indexes(*objects)
    for obj in objects:
        kube.objects[(obj["kind"], obj["metadata"]["name"])] = copy.deepcopy(obj)
    return r


def test_a_reconcile_decides_once_and_reports_what_its_writes_found(counted_decide):
    kube = FakeKube()
    model = stored_model()
    r = reconciler_with(kube, model)
    kube.refuse[("Service", "m")] = ApiError(422, "Invalid", 'Service "m" is invalid: spec.ports: Duplicate value')
    result = asyncio.run(r.reconcile((NS, "m")))
    assert len(counted_decide) == 1
    assert result == "changed"
    conditions = {c["type"]: c for c in kube.objects[(api.KIND, "m")]["status"]["conditions"]}
    assert conditions["Ready"]["reason"] == "ApplyFailed" and "Duplicate value" in conditions["Ready"]["message"]
    assert ("Warning", "ApplyFailed") in kube.events
    # The Observed the decision read was not changed by the writes.
    assert counted_decide[0].own("Deployment") is None and counted_decide[0].own("Service") is None


def test_a_refused_event_never_fails_the_reconcile(caplog):
    """A namespace being deleted refuses every create, its models' events too: the status is
    still reported, the reconcile succeeds, and nothing is logged as a warning."""
    kube = FakeKube()
    r = reconciler_with(kube, stored_model())
    kube.refuse[("Event", "ApplyFailed")] = ApiError(
        403, "Forbidden", 'events "m." is forbidden: unable to create new content in namespace ns because it is being terminated'
    )
    kube.refuse[("Service", "m")] = ApiError(422, "Invalid", "spec.ports: Duplicate value")
    with caplog.at_level("DEBUG", logger="inferentia_operator.shell.reconciler"):
        assert asyncio.run(r.reconcile((NS, "m"))) == "changed"
    assert kube.objects[(api.KIND, "m")]["status"]["conditions"]
    event_logs = [rec for rec in caplog.records if "not posted" in rec.getMessage()]
    assert [rec.levelname for rec in event_logs] == ["DEBUG"]
    # Any other refusal is worth a warning, and still no failure.
    other = FakeKube()
    other.refuse = {
        ("Event", "ApplyFailed"): ApiError(500, "InternalError", "etcd is down"),
        ("Service", "n"): ApiError(422, "Invalid", "x"),
    }
    r2 = reconciler_with(other, stored_model("n"))
    caplog.clear()
    with caplog.at_level("DEBUG", logger="inferentia_operator.shell.reconciler"):
        assert asyncio.run(r2.reconcile((NS, "n"))) == "changed"
    assert [rec.levelname for rec in caplog.records if "not posted" in rec.getMessage()] == ["WARNING"]


def test_a_steady_model_is_decided_once_and_writes_nothing(counted_decide):
    kube = FakeKube()
    r = reconciler_with(kube, stored_model())
    asyncio.run(r.reconcile((NS, "m")))  # creates the children and reports
    r.cache.indexes = indexes(*kube.objects.values())
    r.cache.forget((NS, "m"))
    before = len(kube.calls)
    counted_decide.clear()
    asyncio.run(r.reconcile((NS, "m")))
    assert len(counted_decide) == 1
    writes = [c for c in kube.calls[before:] if c[0] in ("apply", "create", "delete")]
    assert writes == []


def test_the_echo_of_the_operators_own_status_patch_triggers_nothing():
    kube = FakeKube()
    model = stored_model()
    r = reconciler_with(kube, model)

    async def scenario() -> None:
        r.on_model(model, "ADDED", {})
        assert len(r.queue) == 1
        key = await r.queue.get()
        r.queue.done(key)
        r._own_status[key] = "77"  # noqa: SLF001 - the resourceVersion the status patch returned
        r.on_model(with_rv(model, 77), "MODIFIED", {})
        assert len(r.queue) == 0  # its own echo: nothing new to decide
        changed = with_rv(model, 78)
        changed["metadata"]["generation"] = 2
        r.on_model(changed, "MODIFIED", {})
        assert len(r.queue) == 1  # a new spec is

    asyncio.run(scenario())


def test_a_pod_event_that_changes_nothing_status_reports_is_not_a_reconcile(monkeypatch):
    kube = FakeKube()
    model = stored_model()
    r = reconciler_with(kube, model)
    queued = []
    monkeypatch.setattr(r.queue, "add_after", lambda key, delay: queued.append(key))
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "m-1", "namespace": NS, "labels": {"inferentia.dev/model": "m"}, "resourceVersion": "5"},
        "spec": {"nodeName": "n1"}, "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }  # fmt: skip
    r.on_pod(pod, "ADDED", {})
    r.on_pod(with_rv(pod, 6), "MODIFIED", {})  # only the resourceVersion moved
    unready = with_rv(pod, 7)
    unready["status"]["conditions"][0]["status"] = "False"
    r.on_pod(unready, "MODIFIED", {})
    assert queued == [(NS, "m"), (NS, "m")]  # the new pod and its readiness, not the resourceVersion


def test_a_deleted_child_lets_go_of_the_overlay_through_its_delete_event(monkeypatch):
    kube = FakeKube()
    r = reconciler_with(kube, stored_model())
    monkeypatch.setattr(r.queue, "add_after", lambda key, delay: None)
    r.cache.remember((NS, "m"), {("Service", "m"): project(a_service(150))})
    r.on_child(a_service(151), "DELETED", {})
    assert r.cache.observe((NS, "m")).own("Service") is None


# -- the one retry layer: the worker and the queue's backoff -------------------------------------


def test_a_write_that_may_pass_brings_the_model_back_after_a_growing_backoff_and_success_resets_it(monkeypatch):
    """kube.py sends each call once; a refusal that may pass (503) fails the reconcile with
    RetryLater, and the worker puts the key back after the queue's backoff: 1 s, then 2 s,
    and after a success the next failure starts again from 1 s."""
    kube = FakeKube()
    r = reconciler_with(kube, stored_model())
    kube.refuse[("Service", "m")] = ApiError(503, "ServiceUnavailable", "etcd leader changed")
    delays: list[float] = []

    async def attempt() -> None:
        """One pass of the worker over the key, which the test puts back itself."""
        r.queue.add((NS, "m"))
        while len(r.queue) or r.queue._active:  # noqa: SLF001 - until the worker is done with it
            await asyncio.sleep(0.01)

    async def scenario() -> None:
        monkeypatch.setattr(r.queue, "add_after", lambda key, delay: delays.append(delay))
        worker = asyncio.get_running_loop().create_task(r.worker())
        await attempt()
        await attempt()
        del kube.refuse[("Service", "m")]
        await attempt()  # succeeds
        kube.refuse[("Service", "m")] = ApiError(503, "ServiceUnavailable", "again")
        r.cache.forget((NS, "m"))
        r.cache.indexes = indexes(stored_model())  # the Service is missing again
        await attempt()
        worker.cancel()

    asyncio.run(scenario())
    assert delays == [1.0, 2.0, 1.0]
    assert [c for c in kube.calls if c[:2] == ("create", "Service")], "the Service write was attempted"


def test_resync_queues_every_model_only_while_this_replica_is_active():
    kube = FakeKube()
    active = {"now": False}
    r = Reconciler(lambda: kube, workers=1, resync_seconds=0.01, is_active=lambda: active["now"])
    r.cache.indexes = indexes(stored_model("a"), stored_model("b"))

    async def scenario() -> tuple[int, int]:
        task = asyncio.get_running_loop().create_task(r.resync())
        await asyncio.sleep(0.1)
        standby = len(r.queue)  # a standby's caches are frozen: it queues nothing
        active["now"] = True
        await asyncio.sleep(0.1)
        task.cancel()
        return standby, len(r.queue)

    assert asyncio.run(scenario()) == (0, 2)


def test_a_drained_queue_is_settled_by_the_settle_loop_alone_within_a_poll(monkeypatch):
    """The worker only counts its reconciles; the settle loop alone decides, at most a poll
    after the queue drains, so a burst's memory never waits for the next burst (shell/memory.py)."""
    from inferentia_operator.shell import memory

    r = reconciler_with(FakeKube(), stored_model())
    r.settler = memory.Settler(after=1, interval=0.0, poll=0.02)
    trims: list[int] = []
    monkeypatch.setattr(memory, "trim", lambda: trims.append(1) or True)
    frozen: list[int] = []
    monkeypatch.setattr(r.settler, "freeze_survivors", lambda: frozen.append(1) or 0)

    async def scenario() -> tuple[list[int], list[int]]:
        loop = asyncio.get_running_loop()
        worker = loop.create_task(r.worker())
        r.queue.add((NS, "m"))
        while len(r.queue) or r.queue._active:  # noqa: SLF001 - until the worker is done with it
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        by_worker = (list(trims), list(frozen))
        settling = loop.create_task(r.settle_when_due())
        await asyncio.sleep(0.3)
        worker.cancel(), settling.cancel()
        return by_worker

    assert asyncio.run(scenario()) == ([], []), "the worker settled: the decision is the loop's alone"
    assert (trims, frozen) == ([1], [1]), "the loop settles the drained queue once, and once only"


def test_progress_within_a_rollout_is_held_back_and_the_model_comes_back_for_it(monkeypatch):
    """Pods becoming ready one by one cost one status write at the end, not one each: the
    patch is held (status.hold_seconds) and the model queued again for when it is due."""
    kube = FakeKube()
    r = reconciler_with(kube, stored_model(replicas=3))
    later: list[float] = []
    monkeypatch.setattr(r.queue, "add_after", lambda key, delay: later.append(delay))
    asyncio.run(r.reconcile((NS, "m")))  # creates the children and reports RollingOut
    assert kube.objects[(api.KIND, "m")]["status"]["conditions"]
    deployment = kube.objects[("Deployment", "m")]
    deployment["status"] = {"observedGeneration": 1, "replicas": 3, "updatedReplicas": 3, "readyReplicas": 1, "availableReplicas": 1}
    r.cache.indexes = indexes(*kube.objects.values())
    r.cache.forget((NS, "m"))
    patches = len([c for c in kube.calls if c[0] == "patch_status"])
    asyncio.run(r.reconcile((NS, "m")))
    assert len([c for c in kube.calls if c[0] == "patch_status"]) == patches  # held back
    assert later and 590 < later[-1] < 601


NEURON_FAULT_NODE = {
    "apiVersion": "v1", "kind": "Node",
    "metadata": {"name": "n1", "resourceVersion": "9", "labels": {"node.kubernetes.io/instance-type": "inf1.xlarge"}},
    "spec": {"taints": [{"key": "aws.amazon.com/neuron", "value": "true", "effect": "NoSchedule"}]},
    "status": {"conditions": [
        {"type": "Ready", "status": "True"},
        # As AWS's Neuron node problem detector sets it (its Helm chart's npd-config.yaml).
        {"type": "NeuronHealth", "status": "True", "reason": "NeuronHasError_DMA_ERROR", "message": "kernel: NEURON_HW_ERR=DMA_ERROR"},
    ]},
}  # fmt: skip


def test_a_node_whose_neuron_devices_fail_is_named_in_the_status_of_the_models_on_it(monkeypatch):
    """A node's NeuronHealth turning True reconciles the models with a pod on it (and no other),
    and their status says which pod, which node and which error, until the fault ends."""
    from inferentia_operator.core.model import check_model
    from inferentia_operator.core.projection import project_neuron_node

    kube = FakeKube()
    model = stored_model()
    template = serving_deployment(check_model("m", NS, model["spec"], uid="uid-m").model)["spec"]["template"]["spec"]
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "m-1", "namespace": NS, "uid": "pod-uid", "resourceVersion": "5",
                     "labels": {"inferentia.dev/model": "m", "app.kubernetes.io/component": "serving"}},
        "spec": {**template, "nodeName": "n1"}, "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }  # fmt: skip
    r = reconciler_with(kube, model, pod)
    queued = []
    monkeypatch.setattr(r.queue, "add_after", lambda key, delay: queued.append(key))
    r.on_pod(pod, "ADDED", {})
    queued.clear()
    healthy = copy.deepcopy(NEURON_FAULT_NODE)
    healthy["status"]["conditions"][1] |= {"status": "False", "reason": "NeuronHasNoError"}
    r.on_node(healthy, "ADDED", {})
    other = copy.deepcopy(NEURON_FAULT_NODE)
    other["metadata"]["name"] = "n2"
    r.on_node(other, "ADDED", {})  # no pod of the model there
    assert queued == []
    r.on_node(NEURON_FAULT_NODE, "MODIFIED", {})
    r.on_node(with_rv(NEURON_FAULT_NODE, 10), "MODIFIED", {})  # the same fault again: nothing new
    assert queued == [(NS, "m")]
    cordoned = with_rv(NEURON_FAULT_NODE, 11)
    cordoned["spec"]["unschedulable"] = True
    r.on_node(cordoned, "MODIFIED", {})  # where a replacement may go changed: decided again
    assert queued == [(NS, "m"), (NS, "m")]

    r.cache.indexes["neuron_node_index"] = {"n1": [project_neuron_node(NEURON_FAULT_NODE)]}
    asyncio.run(r.reconcile((NS, "m")))
    conditions = {c["type"]: c for c in kube.objects[(api.KIND, "m")]["status"]["conditions"]}
    fault = conditions["DeviceFault"]
    assert (fault["status"], fault["reason"]) == ("True", "NeuronHardwareError")
    assert "pod m-1 on node n1: NeuronHasError_DMA_ERROR (kernel: NEURON_HW_ERR=DMA_ERROR); " in fault["message"]
    assert "left: the node still takes" in fault["message"]
    assert "Cordon n1 (kubectl cordon)" in fault["message"]  # the Neuron taint is the pods' own: it keeps nobody off
    assert ("Warning", "NeuronHardwareError") in kube.events and not kube.evicted
    # Cordoned, with another node of the plan's instance types to go to: evicted, by its uid.
    spare = project_neuron_node(healthy | {"metadata": {"name": "n3", "labels": {"node.kubernetes.io/instance-type": "inf1.6xlarge"}}})
    r.cache.indexes["neuron_node_index"] = {"n1": [project_neuron_node(cordoned)], "n3": [spare]}
    asyncio.run(r.reconcile((NS, "m")))
    assert kube.evicted == [(NS, "m-1", "pod-uid")]
    # A pod gone from its node leaves nothing of it behind in the triggers.
    r.on_pod(pod, "DELETED", {})
    assert "n1" not in r._node_models  # noqa: SLF001
    r.on_pod(pod, "ADDED", {})
    # The fault ends: the condition goes.
    r.cache.indexes["neuron_node_index"] = {}
    r.on_node(healthy, "MODIFIED", {})
    asyncio.run(r.reconcile((NS, "m")))
    assert "DeviceFault" not in {c["type"] for c in kube.objects[(api.KIND, "m")]["status"]["conditions"]}


def test_a_replica_on_a_failing_node_is_taken_out_of_traffic_by_its_uid_before_anything_is_written():
    """Another replica answers from a healthy node: the one on the failing node gets its traffic
    label turned off (the Service stops selecting it), named by uid, and the model says so."""
    from inferentia_operator.core.model import check_model
    from inferentia_operator.core.projection import project_neuron_node

    kube = FakeKube()
    model = stored_model()
    template = serving_deployment(check_model("m", NS, model["spec"], uid="uid-m").model)["spec"]["template"]

    def pod(name: str, node: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "resourceVersion": "5",
                         "labels": template["metadata"]["labels"],
                         "ownerReferences": [{"kind": "ReplicaSet", "name": "m-7c9d", "uid": "rs", "controller": True}]},
            "spec": {**template["spec"], "nodeName": node},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
        }  # fmt: skip

    r = reconciler_with(kube, model, pod("m-1", "n1"), pod("m-2", "n2"))
    healthy = copy.deepcopy(NEURON_FAULT_NODE)
    healthy["status"]["conditions"][1] |= {"status": "False", "reason": "NeuronHasNoError"}
    healthy["metadata"]["name"] = "n2"
    r.cache.indexes["neuron_node_index"] = {"n1": [project_neuron_node(NEURON_FAULT_NODE)], "n2": [project_neuron_node(healthy)]}
    asyncio.run(r.reconcile((NS, "m")))
    assert kube.labelled == [(NS, "m-1", "uid-m-1", {TRAFFIC_LABEL: "off"})]
    first_write = next(i for i, call in enumerate(kube.calls) if call[0] in ("apply", "create") and call[1] != "Event")
    assert kube.calls.index(("label", "Pod", "m-1")) < first_write
    fault = {c["type"]: c for c in kube.objects[(api.KIND, "m")]["status"]["conditions"]}["DeviceFault"]
    assert "pod m-1 on node n1" in fault["message"] and "out of traffic" in fault["message"]


def test_a_neuron_node_is_read_with_its_fault_and_taints_bounded():
    from inferentia_operator.core.projection import FAILURE_MESSAGE_CHARS, MAX_NODE_TAINTS, project_neuron_node

    node = project_neuron_node(NEURON_FAULT_NODE)
    assert node == {
        "instanceType": "inf1.xlarge", "labels": {"node.kubernetes.io/instance-type": "inf1.xlarge"}, "ready": True, "unschedulable": False,
        "taints": [{"key": "aws.amazon.com/neuron", "value": "true", "effect": "NoSchedule"}],
        "fault": {"reason": "NeuronHasError_DMA_ERROR", "message": "kernel: NEURON_HW_ERR=DMA_ERROR"},
    }  # fmt: skip
    cpu = copy.deepcopy(NEURON_FAULT_NODE)
    cpu["metadata"]["labels"]["node.kubernetes.io/instance-type"] = "m5.large"
    assert project_neuron_node(cpu) is None  # no Neuron node: never kept
    no_detector = copy.deepcopy(NEURON_FAULT_NODE)
    del no_detector["status"]["conditions"][1]
    assert project_neuron_node(no_detector)["fault"] is None
    huge = copy.deepcopy(NEURON_FAULT_NODE)
    huge["status"]["conditions"][1]["message"] = "x" * 100_000
    huge["spec"]["taints"] = [{"key": f"k{i}", "effect": "NoSchedule"} for i in range(MAX_NODE_TAINTS + 1)]
    projected = project_neuron_node(huge)
    assert len(projected["fault"]["message"]) == FAILURE_MESSAGE_CHARS
    assert projected["cut"] and projected["taints"] == [] and projected["labels"] == {}  # not read whole: judged by nobody
    crowded = copy.deepcopy(NEURON_FAULT_NODE)
    crowded["metadata"]["labels"] |= {f"l{i}": "x" for i in range(1000)}
    assert project_neuron_node(crowded)["cut"]


def test_a_neuron_node_that_comes_goes_or_changes_reconciles_the_models_that_fill_ahead(monkeypatch):
    """Which nodes a model fills ahead (fill_ahead/part.py) depends on every Neuron node open to
    its replicas: a node added, made Ready, cordoned or deleted decides those models again, and
    only those; a node's status written again with nothing new decides nothing."""
    from dataclasses import replace

    from inferentia_operator.core.decide import placed
    from inferentia_operator.core.model import check_model
    from inferentia_operator.core.settings import Settings
    from test_decide import PROVER
    from test_decide import complete as done

    settings = Settings(prover=PROVER, node_cache_url="http://cache:8080", node_cache_namespace="inferentia-system")
    filling, plain = stored_model("m", **{"compile.image": "example.com/compile:1"}), stored_model("plain")
    m = placed(check_model("m", NS, filling["spec"], uid="uid-m").model, settings)
    kube = FakeKube()
    r = reconciler_with(kube, filling, plain, done(compile_job(m)))
    r.settings = replace(settings)
    asyncio.run(r.reconcile((NS, "m")))
    asyncio.run(r.reconcile((NS, "plain")))
    assert "FilledAhead" in {c["type"] for c in kube.objects[(api.KIND, "m")]["status"]["conditions"]}
    queued: list[Any] = []
    monkeypatch.setattr(r.queue, "add_after", lambda key, delay: queued.append(key))

    healthy = copy.deepcopy(NEURON_FAULT_NODE)
    healthy["status"]["conditions"][1] |= {"status": "False", "reason": "NeuronHasNoError"}
    r.on_node(healthy, "ADDED", {})
    assert queued == [(NS, "m")]
    r.on_node(with_rv(healthy, 20), "MODIFIED", {})  # written again, nothing new
    assert queued == [(NS, "m")]
    cordoned = with_rv(healthy, 21)
    cordoned["spec"]["unschedulable"] = True
    r.on_node(cordoned, "MODIFIED", {})
    r.on_node(cordoned, "DELETED", {})
    assert queued == [(NS, "m")] * 3

    # A node cache's pod (the chart labels its pods so that the operator's watch sees them): made,
    # holding another artefact, replaced. Written again with nothing new: nothing.
    queued.clear()
    cache_pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "cache-x", "namespace": "inferentia-system", "uid": "c1", "creationTimestamp": "2026-11-28T10:00:00Z",
                     "labels": {"inferentia.dev/node-cache": "true", "app.kubernetes.io/managed-by": "inferentia-operator"}},
        "spec": {"nodeName": "n1"}, "status": {"phase": "Running"},
    }  # fmt: skip
    r.on_pod(cache_pod, "ADDED", {})
    r.on_pod(with_rv(cache_pod, 30), "MODIFIED", {})
    holding = copy.deepcopy(cache_pod)
    holding["metadata"]["labels"]["holds.inferentia.dev/" + "a" * 32] = "true"
    r.on_pod(holding, "MODIFIED", {})
    r.on_pod(holding, "DELETED", {})
    assert queued == [(NS, "m")] * 3
    assert not any(name == "cache-x" for _, name in r._pods)  # noqa: SLF001 - kept as no serving pod's state
