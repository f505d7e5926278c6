"""Fill-ahead (core/fill_ahead/part.py): a model compiled ahead and served through the node cache
keeps one fill Job on each node its replicas will go to, so a scale-up reads the store before
it, not during it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from inferentia_operator.core import decide as decision
from inferentia_operator.core.cleanup.part import cleanup_part
from inferentia_operator.core.compile.job import compile_job
from inferentia_operator.core.fill_ahead.part import MAX_FILL_NODES, fill_ahead_part, fill_job, fill_job_name
from inferentia_operator.core.names import COMPONENT_LABEL
from inferentia_operator.core.observed import Observed
from inferentia_operator.core.pod.artefact import compiled_uri
from inferentia_operator.core.pod.fetch import fetch_container
from inferentia_operator.core.settings import Settings
from specs import pd_spec
from test_decide import NOW, PROVER, built, conds, live, model_body
from test_decide import Observed as Seen
from test_decide import complete as done
from test_part_device_faults import FAULT, node

CACHE = "http://inferentia-operator-node-cache.inferentia-system.svc:8080"
COMPILED = {"compile.image": "example.com/compile:1"}


def model(**overrides):
    body = model_body(**{**COMPILED, "replicas": 3, **overrides})
    return body, replace(built(body), node_cache_url=CACHE, node_cache_namespace="inferentia-system")


def part(nodes, *jobs, compiled=True, **overrides):
    body, m = model(**overrides)
    return fill_ahead_part(m, Observed.of(body, *jobs, nodes=nodes), compiled)


def pinned_to(job) -> str:
    [term] = job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    [field] = term["matchFields"]
    assert field["key"] == "metadata.name" and field["operator"] == "In"
    [name] = field["values"]
    return name


def failed(job, why="BackoffLimitExceeded"):
    return live(
        job, conditions=[{"type": "Failed", "status": "True", "reason": why, "message": "Job has reached the specified backoff limit"}]
    )


def complete(job):
    return live(job, conditions=[{"type": "Complete", "status": "True"}])


FLEET = {f"n{i}": node() for i in range(6)}


def decided_with_the_cache():
    """A compiled model of two replicas, the operator with the node cache: the model, what was
    observed, and the decision (which writes its fill Jobs)."""
    body = model_body(**COMPILED, replicas=2)
    settings = Settings(prover=PROVER, node_cache_url=CACHE, node_cache_namespace="inferentia-system")
    m = decision.placed(built(body), settings)
    observed = Seen(body, jobs=[done(compile_job(m))], nodes=FLEET)
    return m, observed, decision.decide(observed, NOW, settings)


def test_a_fill_job_on_as_many_nodes_as_replicas_each_the_serving_fetch_with_fill_and_no_device():
    p = part(FLEET)
    assert len(p.children) == 3 and len({pinned_to(j) for j in p.children}) == 3
    assert {pinned_to(j) for j in p.children} <= set(FLEET)
    _, m = model()
    serving_fetch = fetch_container(m)
    for job in p.children:
        pod = job["spec"]["template"]["spec"]
        [container] = pod["containers"]
        assert container["args"] == [*serving_fetch["args"], "--fill"] and container["image"] == serving_fetch["image"]
        assert container["env"] == serving_fetch["env"] and container.get("envFrom") == serving_fetch.get("envFrom")
        assert "aws.amazon.com/neuron" not in str(container["resources"])  # no device: it only fills the node's disk
        # Not a serving pod: no Service, budget or status count selects it.
        assert job["spec"]["template"]["metadata"]["labels"][COMPONENT_LABEL] == "fill"
        assert pod["restartPolicy"] == "Never" and pod["automountServiceAccountToken"] is False
        assert job["spec"]["activeDeadlineSeconds"] >= 600  # a fill that cannot be placed fails, and status says so
        assert {"key": "aws.amazon.com/neuron", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    # The condition says they are on their way.
    assert p.condition.type == "FilledAhead" and p.condition.status == "False" and p.condition.reason == "Filling"


def test_autoscaling_fills_for_its_most_replicas_and_no_more_than_the_bound():
    scaled = {"autoscaling": {"minReplicas": 0, "maxReplicas": 5}, "serving.batching": {"maxBatchSize": 4}}
    assert len(part(FLEET, **scaled).children) == 5
    many = {f"n{i}": node() for i in range(MAX_FILL_NODES + 10)}
    assert len(part(many, replicas=100).children) == MAX_FILL_NODES


def test_each_model_ranks_the_nodes_its_own_way_and_a_new_node_moves_at_most_one_fill():
    _, a = model()
    b = replace(a, uid="another-uid")
    nodes = {f"n{i}": node() for i in range(12)}
    picks = [{pinned_to(j) for j in fill_ahead_part(m, Observed.of(model_body(), nodes=nodes), True).children} for m in (a, b)]
    assert picks[0] != picks[1]  # not every model on the same first nodes
    grown = {**nodes, "new": node()}
    after = {pinned_to(j) for j in fill_ahead_part(a, Observed.of(model_body(), nodes=grown), True).children}
    assert len(after - picks[0]) <= 1


@pytest.mark.parametrize(
    "closed",
    [
        node(ready=False),
        node(fault=FAULT),
        node(unschedulable=True),
        node(itype="trn1.2xlarge"),  # not of the plan's instance types
        node(taints=({"key": "dedicated", "value": "other-team", "effect": "NoSchedule"},)),
    ],
)
def test_a_node_no_replica_could_go_to_is_never_filled(closed):
    p = part({"closed": closed, "open": node()})
    assert [pinned_to(j) for j in p.children] == ["open"]


def test_the_models_own_placement_holds_for_its_fills():
    placement = {"placement": {"nodeSelector": {"team": "a"}}}
    p = part({"theirs": node(), "ours": node(team="a")}, **placement)
    assert [pinned_to(j) for j in p.children] == ["ours"]
    assert p.children[0]["spec"]["template"]["spec"]["nodeSelector"] == {"team": "a"}


def test_nothing_is_filled_without_the_node_cache_a_compile_step_or_a_compiled_artefact():
    assert part(FLEET, compiled=False).children == ()
    body = model_body(**COMPILED, replicas=3)
    assert fill_ahead_part(built(body), Observed.of(body, nodes=FLEET), True).children == ()  # no node cache
    body = model_body(replicas=3)  # no compile step: nothing fetched through the cache
    uncompiled = replace(built(body), node_cache_url=CACHE)
    assert fill_ahead_part(uncompiled, Observed.of(body, nodes=FLEET), True).children == ()


def test_status_says_filled_failed_or_that_no_node_can_take_the_model():
    wanted = part(FLEET).children
    done = part(FLEET, *map(complete, wanted))
    assert done.condition.status == "True" and done.condition.reason == "Filled"
    assert all(pinned_to(j) in done.condition.message for j in wanted)
    one_failed = part(FLEET, failed(wanted[0]), *map(complete, wanted[1:]))
    assert one_failed.condition.status == "False" and one_failed.condition.reason == "FillFailed"
    assert pinned_to(wanted[0]) in one_failed.condition.message and "BackoffLimitExceeded" in one_failed.condition.message
    assert "Delete the fill Job to fill again" in one_failed.condition.message
    none = part({"x": node(fault=FAULT)})
    assert none.children == () and none.condition.reason == "NoNode" and "inf1" in none.condition.message


def test_a_fill_job_of_a_node_no_longer_wanted_is_deleted_and_clean_up_leaves_the_wanted_ones():
    _, m = model()
    gone = live(fill_job(m, "gone-node"))
    p = part(FLEET, gone, *map(complete, part(FLEET).children))
    assert p.delete == (("Job", fill_job_name(m, "gone-node")),)
    # Every fill Job is the fill part's: clean-up (of earlier plans' compile Jobs) deletes none.
    body = model_body(**COMPILED, replicas=3)
    observed = Observed.of(body, gone, *map(live, p.children))
    assert not [ref for ref in cleanup_part(m, observed, Settings(prover=PROVER)).delete if ref[0] == "Job" and "fill" in ref[1]]
    # A model that stops filling (no node cache any more) deletes them all.
    stopped = fill_ahead_part(replace(m, node_cache_url=""), observed, True)
    assert sorted(stopped.delete) == sorted(("Job", j["metadata"]["name"]) for j in (gone, *p.children))


def test_a_reconcile_with_the_node_cache_writes_the_fill_jobs_once_compiled_and_reports_them():
    body = model_body(**COMPILED, replicas=2)
    settings = Settings(prover=PROVER, node_cache_url=CACHE, node_cache_namespace="inferentia-system")
    m = decision.placed(built(body), settings)

    def fills(d):
        return [b for b in d.apply if b["kind"] == "Job" and b["metadata"]["labels"][COMPONENT_LABEL] == "fill"]

    compiling = decision.decide(Seen(body, nodes=FLEET), NOW, settings)
    assert fills(compiling) == [] and "FilledAhead" not in conds(compiling)
    compiled = Seen(body, jobs=[done(compile_job(m))], nodes=FLEET)
    d = decision.decide(compiled, NOW, settings)
    assert len(fills(d)) == 2 and conds(d)["FilledAhead"]["reason"] == "Filling"


def test_a_model_at_no_replicas_fills_nothing_and_says_nothing():
    p = part(FLEET, replicas=0)
    assert p.children == () and p.condition is None


def test_with_a_storage_class_a_fill_still_uses_an_emptydir_that_goes_with_its_pod():
    [job, *_] = part(FLEET, **{"serving.storageClassName": "gp3"}).children
    [compiled] = [v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"] == "compiled"]
    assert "emptyDir" in compiled and "ephemeral" not in compiled


def test_a_failed_fill_quotes_what_its_fetch_said_and_is_a_warning():
    from inferentia_operator.core.names import JOB_NAME_LABEL
    from inferentia_operator.core.status import WARNING_REASONS

    wanted = part(FLEET).children
    name = wanted[0]["metadata"]["name"]
    said = "fill: the node's cache did not record s3://x/: it answered 409: not every file is held"
    fill_pod = {
        "metadata": {"name": f"{name}-abcde", "labels": {JOB_NAME_LABEL: name, COMPONENT_LABEL: "fill"}},
        "status": {"phase": "Failed", "failures": [{"container": "fill", "message": said}]},
    }
    body, m = model()
    observed = Observed.of(body, failed(wanted[0]), *map(complete, wanted[1:]), nodes=FLEET, pods=[fill_pod])
    condition = fill_ahead_part(m, observed, True).condition
    assert condition.reason == "FillFailed" and said in condition.message
    assert "FillFailed" in WARNING_REASONS


def test_a_fill_job_the_api_server_refuses_is_said_in_filled_ahead_and_leaves_ready_alone():
    from inferentia_operator.core.observed import WriteFailure
    from inferentia_operator.core.status import report

    m, observed, d = decided_with_the_cache()
    fill = next(b for b in d.apply if b["metadata"]["labels"][COMPONENT_LABEL] == "fill")
    refused = WriteFailure("Job", fill["metadata"]["name"], 403, "exceeded quota: count/jobs.batch")
    after = {c.type: c for c in report(observed, NOW, d.basis, [refused]).status.conditions}
    assert after["FilledAhead"].reason == "FillFailed" and "exceeded quota" in after["FilledAhead"].message
    assert after["Ready"].reason != "ApplyFailed" and after["Stalled"].status == "False"


def test_a_node_whose_cache_pod_was_replaced_after_its_fill_and_holds_nothing_is_filled_again():
    """Without views the cache's store is its pod's emptyDir: a replaced cache pod starts empty,
    and says so, once Ready, by holding no label of the artefact (core/holds.py). A fill done
    before that pod was made loses its Job, and the next reconcile fills the node again; so does
    a fill that failed before it. Not: a cache pod not Ready yet (a fill would find no cache),
    one older than the fill (its label may be on its way), or with views (the store, on the
    node's disk, outlived the pod)."""
    from inferentia_operator.core.holds import hold_key

    _, m = model()
    key = hold_key(compiled_uri(m))
    [job, *rest] = part(FLEET).children
    node = pinned_to(job)
    finished = live(job, conditions=[{"type": "Complete", "status": "True"}], completionTime="2026-11-28T10:00:00Z")
    gave_up = live(
        job,
        conditions=[{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "lastTransitionTime": "2026-11-28T10:00:00Z"}],
    )
    others = [complete(j) for j in rest]

    def deleted(created: str, held: list[str], ready: bool = True, views: bool = False, fill=finished) -> bool:
        body, m = model()
        caches = {node: [{"created": created, "ready": ready, "held": held}]}
        observed = Observed.of(body, fill, *others, nodes=FLEET, caches=caches)
        return ("Job", job["metadata"]["name"]) in fill_ahead_part(replace(m, node_views=views), observed, True).delete

    assert deleted("2026-11-28T10:05:00Z", [])  # replaced after the fill, empty
    assert deleted("2026-11-28T10:05:00Z", [], fill=gave_up)  # a new cache after a failed fill
    assert not deleted("2026-11-28T10:05:00Z", [], ready=False)
    assert not deleted("2026-11-28T10:05:00Z", [], views=True)
    assert not deleted("2026-11-28T10:05:00Z", [key])  # replaced, and it holds it
    assert not deleted("2026-11-28T09:00:00Z", [])  # older than the fill: its label may be on its way
    body, m = model()
    assert ("Job", job["metadata"]["name"]) not in fill_ahead_part(m, Observed.of(body, finished, *others, nodes=FLEET), True).delete


def test_a_fill_job_that_cannot_be_deleted_once_the_model_fills_no_more_is_said_and_leaves_ready_alone():
    from inferentia_operator.core.observed import WriteFailure
    from inferentia_operator.core.status import report

    body = model_body(**COMPILED, replicas=2)
    with_cache = Settings(prover=PROVER, node_cache_url=CACHE, node_cache_namespace="inferentia-system")
    m = decision.placed(built(body), with_cache)
    filled = decision.decide(Seen(body, jobs=[done(compile_job(m))], nodes=FLEET), NOW, with_cache)
    fills = [complete(b) for b in filled.apply if b["metadata"]["labels"][COMPONENT_LABEL] == "fill"]
    # The operator runs without the node cache now: the fills are no longer wanted.
    observed = Seen(body, jobs=[done(compile_job(built(body))), *fills], nodes=FLEET)
    d = decision.decide(observed, NOW, Settings(prover=PROVER))
    gone = sorted(name for kind, name in d.delete if kind == "Job")
    assert gone == sorted(j["metadata"]["name"] for j in fills) and d.basis.fill_ahead is None
    refused = WriteFailure("Job", gone[0], 403, 'jobs.batch "x" is forbidden: cannot delete')
    after = {c.type: c for c in report(observed, NOW, d.basis, [refused]).status.conditions}
    assert after["FilledAhead"].status == "False" and "cannot delete" in after["FilledAhead"].message
    assert after["Ready"].reason != "ApplyFailed" and after["Stalled"].status == "False"


def test_only_the_fill_jobs_the_part_wrote_or_deleted_are_said_in_filled_ahead():
    from inferentia_operator.core.observed import WriteFailure
    from inferentia_operator.core.status import report

    m, observed, d = decided_with_the_cache()
    # A Job named like a fill that this decision did not write: not the fill part's to report.
    other = WriteFailure("Job", f"{m.name}-fill-0123456789ab", 403, "forbidden")
    after = {c.type: c for c in report(observed, NOW, d.basis, [other]).status.conditions}
    assert after["FilledAhead"].reason == "Filling"


def pools_part(nodes, **overrides):
    """A compiled trn2 model with prefill and decode pools of one chip a replica (one compile
    serves both: prefill two replicas, decode one), served through the node cache."""
    pools = {"disaggregation.decode": {}, "compile.outputUri": "s3://models/compiled/m/"}
    spec = pd_spec(**{**COMPILED, **pools, **overrides})
    body = {**model_body(), "spec": spec}
    m = replace(built(body), node_cache_url=CACHE, node_cache_namespace="inferentia-system")
    return fill_ahead_part(m, Observed.of(body, nodes=nodes), True)


# A trn2 fleet: one-chip trn2.3xlarge nodes, which have no EFA device the pools could take
# (their pods request one, spec.disaggregation.efa auto), and trn2.48xlarge nodes.
TRN2 = {**{f"small{i}": node("trn2.3xlarge") for i in range(4)}, **{f"big{i}": node("trn2.48xlarge") for i in range(4)}}


def test_pools_fill_the_nodes_their_pods_can_take_one_for_each_pool_replica():
    """The pools' servers fetch the artefact, not the proxy: spec.replicas (the proxy's) does
    not count, the pools' replicas do, and a node whose type no pool pod can land on (no EFA
    device on trn2.3xlarge) is never filled."""
    filled = {pinned_to(j) for j in pools_part(TRN2, replicas=1).children}
    assert len(filled) == 3  # two prefill replicas and one decode replica
    assert all(name.startswith("big") for name in filled), filled


def test_an_autoscaled_pool_fills_for_its_most_replicas():
    scaled = {"disaggregation.decode.autoscaling": {"minReplicas": 1, "maxReplicas": 2, "targetRunning": 4}}
    filled = {pinned_to(j) for j in pools_part(TRN2, replicas=1, **scaled).children}
    assert len(filled) == 4 and all(name.startswith("big") for name in filled), filled


def test_no_node_for_the_pools_says_their_instance_types():
    p = pools_part({f"small{i}": node("trn2.3xlarge") for i in range(3)})
    assert p.children == ()
    assert p.condition.reason == "NoNode" and "trn2.48xlarge" in p.condition.message
    assert "trn2.3xlarge" not in p.condition.message
