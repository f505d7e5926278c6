"""Prefill and decode pools at the level of decide(): what a model moving to pools leaves behind."""

from inferentia_operator.core.serving.service import serving_network_policy
from specs import pd_spec
from test_decide import Observed, built, decide, live, model_body

NOW = "2026-11-22T10:00:00Z"


def test_a_model_that_had_a_batching_front_end_and_moves_to_pools_deletes_its_network_policy():
    """The front end's NetworkPolicy selects the model's serving pods, which the pools' servers are
    too: left behind, it would admit only the front end's port to them (not the serving port the
    proxy calls, nor NIXL's side channel)."""
    front = model_body(**{"serving.batching": {"maxBatchSize": 4}, "processesPerReplica": 2})
    policy = serving_network_policy(built(front))
    assert policy is not None
    pooled = {**model_body(), "spec": pd_spec()}
    decision = decide(Observed(pooled, others=[live(policy)]), NOW)
    assert ("NetworkPolicy", policy["metadata"]["name"]) in decision.delete
    # Someone else's policy of that name is left alone.
    theirs = {**live(policy), "metadata": {"name": policy["metadata"]["name"], "namespace": "ns", "labels": {"team": "a"}}}
    assert ("NetworkPolicy", policy["metadata"]["name"]) not in decide(Observed(pooled, others=[theirs]), NOW).delete


def test_a_pooled_model_reconciled_again_plans_its_pools_once_and_each_pool_with_the_operators_placement(monkeypatch):
    """Each pool's model is planned with the model (Model.pools), not by each part that reads it
    on every reconcile; a change of the operator's placement settings places the pools too."""
    import copy

    from inferentia_operator.core import decide as decision
    from inferentia_operator.core.pod import model as models
    from inferentia_operator.core.settings import Settings
    from test_decide import PROVER

    planned = []
    planner = models.plan
    monkeypatch.setattr(models, "plan", lambda spec, **kw: planned.append(spec) or planner(spec, **kw))
    body = {**model_body(), "spec": pd_spec()}
    body["metadata"].update(name="pd-memo", uid="uid-pd-memo")
    first = decide(Observed(body), NOW)
    assert len(planned) == 2
    assert decide(Observed(copy.deepcopy(body)), NOW).apply == first.apply and len(planned) == 2
    placed = decision.decide(Observed(body), NOW, Settings(prover=PROVER, scheduler_name="my-scheduler"))
    assert len(planned) == 4
    for name in ("pd-memo-prefill", "pd-memo-decode"):
        pool = next(o for o in placed.apply if (o["kind"], o["metadata"]["name"]) == ("Deployment", name))
        assert pool["spec"]["template"]["spec"]["schedulerName"] == "my-scheduler"
