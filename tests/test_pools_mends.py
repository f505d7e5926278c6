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
