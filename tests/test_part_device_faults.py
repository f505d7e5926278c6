"""Device faults (core/device_faults/part.py): a serving pod on a node whose Neuron devices report
a hardware error is named, and evicted only where its replacement cannot come back and has
somewhere else to go."""

from __future__ import annotations

import pytest

from inferentia_operator.core.device_faults.part import device_fault_part
from inferentia_operator.core.names import POOL_LABEL, TRAFFIC_LABEL, WORKER_INDEX_LABEL
from inferentia_operator.core.observed import Observed
from inferentia_operator.core.pod.nodes import selects, takes_pods, tolerates
from inferentia_operator.core.projection import project_pod_spec
from inferentia_operator.core.scale_to_zero.holder import replicas_service
from inferentia_operator.core.serving.deployment import serving_deployment
from inferentia_operator.core.serving.pools import pool_deployment
from inferentia_operator.core.serving.service import service
from specs import pd_spec
from test_decide import built, model_body

NEURON_TAINT = {"key": "aws.amazon.com/neuron", "value": "true", "effect": "NoSchedule"}
FAULT = {"reason": "NeuronHasError_HBM_UNCORRECTABLE_ERROR", "message": "NEURON_HW_ERR=HBM_UNCORRECTABLE_ERROR"}


def node(itype="inf1.xlarge", ready=True, unschedulable=False, taints=(NEURON_TAINT,), fault=None, **labels: str) -> list[dict]:
    labels = {"node.kubernetes.io/instance-type": itype, **labels}
    return [
        {"instanceType": itype, "labels": labels, "ready": ready, "unschedulable": unschedulable, "taints": list(taints), "fault": fault}
    ]


def pod(name: str, on: str, deleting: bool = False, body: dict | None = None, ready: bool = True, **labels: str) -> dict:
    """A serving pod of the model, made by its Deployment's ReplicaSet, its spec projected as the
    caches keep it (the template's placement, the template's labels)."""
    template = serving_deployment(built(body or model_body()))["spec"]["template"]
    meta = {
        "name": name, "uid": f"uid-{name}", "labels": {**template["metadata"]["labels"], **labels},
        "ownerReferences": [{"kind": "ReplicaSet", "name": "m-5d4f8b", "controller": True, "uid": "rs"}],
    }  # fmt: skip
    if deleting:
        meta["deletionTimestamp"] = "2026-11-28T00:00:00Z"
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    return {"metadata": meta, "spec": project_pod_spec({**template["spec"], "nodeName": on}), "status": {"conditions": conditions}}


def decided(nodes: dict, *pods: dict):
    body = model_body()
    return device_fault_part(built(body), Observed(body, pods=list(pods), nodes=nodes))


def test_no_fault_no_condition_and_no_eviction():
    part = decided({"a": node(), "b": node()}, pod("p", "a"))
    assert part.condition is None and part.evict == () and part.traffic == ()


TRAFFIC = TRAFFIC_LABEL


def test_a_replica_on_a_failing_node_that_still_takes_pods_leaves_the_traffic_while_another_answers():
    """Its node is left (nothing would keep a replacement off it), but its requests go elsewhere:
    the Service selects the traffic label, the ReplicaSet does not."""
    part = decided({"a": node(fault=FAULT), "b": node()}, pod("p", "a"), pod("q", "b"))
    assert part.traffic == (("p", "uid-p", "off"),) and part.evict == ()
    assert "pod p on node a" in part.condition.message and "out of traffic, left: the node still takes" in part.condition.message
    # The Service and the InferencePool select it; the Deployment's selector does not.
    model = built(model_body())
    assert service(model)["spec"]["selector"][TRAFFIC] == "on"
    assert TRAFFIC not in serving_deployment(model)["spec"]["selector"]["matchLabels"]
    assert replicas_service(model)["spec"]["selector"][TRAFFIC] == "on"


@pytest.mark.parametrize(
    "others",
    [
        [],  # the only replica
        [pod("q", "b", ready=False)],  # the other is not ready
        [pod("q", "a")],  # the other is on the failing node too
        [pod("q", "b", deleting=True)],  # the other is going
        [pod("q", "b", **{TRAFFIC: "off"})],  # the other is out of traffic itself
    ],
)
def test_the_last_replica_that_answers_keeps_its_traffic_on_a_failing_node(others):
    part = decided({"a": node(fault=FAULT), "b": node()}, pod("p", "a"), *others)
    assert ("p", "uid-p", "off") not in part.traffic
    assert "pod p on node a" in part.condition.message and "still receives requests" in part.condition.message


def test_traffic_comes_back_when_the_node_reports_no_fault_or_no_other_replica_answers():
    assert decided({"a": node(), "b": node()}, pod("p", "a", **{TRAFFIC: "off"}), pod("q", "b")).traffic == (("p", "uid-p", "on"),)
    alone = decided({"a": node(fault=FAULT)}, pod("p", "a", **{TRAFFIC: "off"}))
    assert alone.traffic == (("p", "uid-p", "on"),)
    # Off already, another answering: nothing to write.
    assert decided({"a": node(fault=FAULT), "b": node()}, pod("p", "a", **{TRAFFIC: "off"}), pod("q", "b")).traffic == ()


def test_a_pod_made_before_the_label_gets_it_on_so_an_upgrade_keeps_its_endpoints():
    old = pod("p", "a")
    del old["metadata"]["labels"][TRAFFIC]
    assert decided({"a": node()}, old).traffic == (("p", "uid-p", "on"),)


def test_only_the_models_own_answering_pods_are_labelled():
    """A pod the model's labels were copied onto (no controller of the model's) is nobody's to
    label; a group's worker answers nothing, its leader's label is what counts."""
    forged = pod("f", "a")
    forged["metadata"]["ownerReferences"] = [{"kind": "ReplicaSet", "name": "other-5d4f8b", "controller": True, "uid": "x"}]
    unowned = pod("u", "a")
    del unowned["metadata"]["ownerReferences"]
    worker = pod("w", "a", **{WORKER_INDEX_LABEL: "1"})
    part = decided({"a": node(fault=FAULT), "b": node()}, forged, unowned, worker, pod("q", "b"))
    assert part.traffic == ()


def test_a_faulted_node_that_still_takes_the_models_pods_is_left_and_named_for_cordoning():
    """The Neuron taint is one the serving pods tolerate: it keeps no replacement off."""
    part = decided({"a": node(fault=FAULT), "b": node()}, pod("p", "a"))
    assert part.evict == () and part.condition.reason == "NeuronHardwareError"
    said = "pod p on node a: NeuronHasError_HBM_UNCORRECTABLE_ERROR (NEURON_HW_ERR=HBM_UNCORRECTABLE_ERROR); "
    assert said + "still receives requests (no other replica answers from a node without a fault), left" in part.condition.message
    assert "Cordon a (kubectl cordon)" in part.condition.message and "npd.nodeRecovery.enabled=true" in part.condition.message


@pytest.mark.parametrize("closed", [{"unschedulable": True}, {"taints": (NEURON_TAINT, {"key": "bad", "effect": "NoExecute"})}])
def test_a_faulted_node_closed_to_new_pods_has_its_pod_evicted_when_another_can_take_it(closed):
    part = decided({"a": node(fault=FAULT, **closed), "b": node(itype="inf1.24xlarge")}, pod("p", "a"), pod("q", "b"))
    assert part.evict == (("p", "uid-p"),)
    assert "pod p on node a" in part.condition.message and "evicting" in part.condition.message and "pod q" not in part.condition.message


@pytest.mark.parametrize(
    "elsewhere",
    [
        {},  # no other node
        {"b": node(itype="trn1.32xlarge")},  # not one of the plan's instance types
        {"b": node(ready=False)},
        {"b": node(fault=FAULT, unschedulable=True)},  # failing too
        {"b": node(unschedulable=True)},
        {"b": node(taints=(NEURON_TAINT, {"key": "dedicated", "value": "llm", "effect": "NoSchedule"}))},  # not tolerated
    ],
)
def test_nothing_is_evicted_while_no_other_node_could_take_the_replica(elsewhere):
    part = decided({"a": node(fault=FAULT, unschedulable=True), **elsewhere}, pod("p", "a"))
    assert part.evict == ()
    assert "left: no other node can take it" in part.condition.message
    assert "No other node of inf1.xlarge, inf1.2xlarge, inf1.6xlarge, inf1.24xlarge is Ready" in part.condition.message


def test_a_pod_already_going_is_not_evicted_again_and_many_are_counted():
    pods = [pod("gone", "a", deleting=True), *(pod(f"p{i}", "a") for i in range(4))]
    part = decided({"a": node(fault=FAULT, unschedulable=True), "b": node()}, *pods)
    assert part.evict == tuple((f"p{i}", f"uid-p{i}") for i in range(4))
    assert "pod gone on node a" in part.condition.message and "being replaced" in part.condition.message
    assert part.condition.message.startswith("5 serving pods") and "; and 2 more" in part.condition.message


@pytest.mark.parametrize(
    ("toleration", "taint", "tolerated"),
    [
        ({"key": "k", "operator": "Exists"}, {"key": "k", "value": "v", "effect": "NoSchedule"}, True),
        ({"operator": "Exists"}, {"key": "any", "effect": "NoExecute"}, True),  # an empty key with Exists: every taint
        ({"key": "k", "value": "v"}, {"key": "k", "value": "v", "effect": "NoSchedule"}, True),  # Equal, the default
        ({"key": "k", "value": "w"}, {"key": "k", "value": "v", "effect": "NoSchedule"}, False),
        ({"key": "k", "operator": "Exists", "effect": "NoExecute"}, {"key": "k", "effect": "NoSchedule"}, False),
        ({"key": "other", "operator": "Exists"}, {"key": "k", "effect": "NoSchedule"}, False),
        ({"value": "v"}, {"key": "k", "value": "v", "effect": "NoSchedule"}, False),  # Equal needs a key
    ],
)
def test_tolerations_match_as_kubernetes_matches_them(toleration, taint, tolerated):
    assert tolerates(toleration, taint) is tolerated
    assert takes_pods({"taints": [taint]}, [toleration]) is tolerated


def test_the_models_own_tolerations_count_where_a_replacement_may_go():
    dedicated = {"key": "dedicated", "value": "llm", "effect": "NoSchedule"}
    body = model_body(placement={"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}]})
    nodes = {"a": node(fault=FAULT, unschedulable=True), "b": node(taints=(NEURON_TAINT, dedicated))}
    part = device_fault_part(built(body), Observed(body, pods=[pod("p", "a", body=body)], nodes=nodes))
    assert part.evict == (("p", "uid-p"),)


def test_a_replacement_goes_only_where_the_pods_own_placement_lets_it():
    """What admission added to the pod counts, not only the template: a namespace's node selector
    (PodNodeSelector) pins its pods to labelled nodes, and a node without the label is no place
    for the replacement; nor is one whose name a required term excludes."""
    pinned = pod("p", "a")
    pinned["spec"]["nodeSelector"] = {"pool": "mine"}
    nodes = {"a": node(fault=FAULT, unschedulable=True, pool="mine"), "b": node()}
    assert decided(nodes, pinned).evict == ()
    assert decided({**nodes, "c": node(pool="mine")}, pinned).evict == (("p", "uid-p"),)
    spec = pod("p", "a")["spec"]
    assert selects(spec, "b", node()[0]) and not selects(spec, "b", node(itype="trn1.32xlarge")[0])
    not_b = {**spec, "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["b"]}]}]}
    assert not selects(not_b, "b", node()[0]) and selects(not_b, "c", node()[0])
    assert not selects({**spec, "placementCut": True}, "b", node()[0])  # too large to read: placed nowhere


def test_a_pods_placement_is_kept_bounded_and_in_plain_strings():
    from inferentia_operator.core.projection import MAX_PLACEMENT_ITEMS

    huge = {"tolerations": [{"key": f"k{i}", "operator": "Exists"} for i in range(1000)], "nodeSelector": {"a": 1}, "affinity": "x"}
    kept = project_pod_spec(huge)
    assert kept["placementCut"] and len(kept["tolerations"]) == MAX_PLACEMENT_ITEMS and kept["nodeSelector"] == {"a": "1"}
    odd = project_pod_spec({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": ["not a requirement", {"key": "k", "operator": "In", "values": [1, 2]}]}]}}}})  # fmt: skip
    assert odd["nodeSelectorTerms"] == [{"matchExpressions": [
        {"key": "", "operator": "In", "values": []}, {"key": "k", "operator": "In", "values": ["1", "2"]}]}]  # fmt: skip


def test_a_cordon_the_pod_tolerates_keeps_its_node_open_so_nothing_is_evicted_to_come_back():
    """The scheduler places a pod that tolerates node.kubernetes.io/unschedulable on a cordoned
    node: evicting it there would bring its replacement straight back, again and again."""
    everything = {"placement": {"tolerations": [{"operator": "Exists"}]}}
    body = model_body(**everything)
    nodes = {"a": node(fault=FAULT, unschedulable=True), "b": node()}
    part = device_fault_part(built(body), Observed(body, pods=[pod("p", "a", body=body)], nodes=nodes))
    assert part.evict == () and "left: the node still takes" in part.condition.message


def test_a_node_too_large_to_read_is_never_judged_closed_nor_a_place_to_go():
    cut_fault = [{**node(fault=FAULT, unschedulable=True)[0], "labels": {}, "taints": [], "cut": True}]
    assert decided({"a": cut_fault, "b": node()}, pod("p", "a")).evict == ()
    cut_spare = [{**node()[0], "labels": {}, "taints": [], "cut": True}]
    assert decided({"a": node(fault=FAULT, unschedulable=True), "b": cut_spare}, pod("p", "a")).evict == ()


def test_an_empty_node_selector_term_matches_no_node():
    spec = {**pod("p", "a")["spec"], "nodeSelectorTerms": [{}]}
    assert not selects(spec, "b", node()[0])


def test_a_bounded_number_of_pods_is_decided_a_reconcile():
    from inferentia_operator.core.device_faults.part import MAX_DECIDED

    pods = [pod(f"p{i}", "a") for i in range(MAX_DECIDED + 5)]
    part = decided({"a": node(fault=FAULT, unschedulable=True), "b": node()}, *pods)
    assert len(part.evict) == MAX_DECIDED


def pool_pod(name: str, on: str, role: str, **labels: str) -> dict:
    """A server of a prefill or decode pool, made by its pool Deployment's ReplicaSet."""
    made = pod(name, on, **{POOL_LABEL: role, **labels})
    made["metadata"]["ownerReferences"][0]["name"] = f"m-{role}-7c9d6f"
    return made


def test_a_pool_server_on_a_failing_node_leaves_the_traffic_while_another_of_its_pool_answers():
    part = decided({"a": node(fault=FAULT), "b": node()}, pool_pod("p", "a", "decode"), pool_pod("q", "b", "decode"))
    assert part.traffic == (("p", "uid-p", "off"),)


def test_the_last_server_of_a_pool_keeps_its_traffic_though_the_other_pool_answers():
    """Each pool's Service selects its own servers: a prefill server answers no decode request."""
    part = decided({"a": node(fault=FAULT), "b": node()}, pool_pod("p", "a", "decode"), pool_pod("q", "b", "prefill"))
    assert part.traffic == ()
    assert "still receives requests" in part.condition.message


def test_a_pool_label_does_not_make_another_deployments_pod_the_models():
    stray = pool_pod("p", "a", "decode")
    stray["metadata"]["ownerReferences"][0]["name"] = "other-7c9d6f"
    part = decided({"a": node(fault=FAULT), "b": node()}, stray, pool_pod("q", "b", "decode"))
    assert ("p", "uid-p", "off") not in part.traffic


def test_a_pool_server_with_nowhere_to_go_names_the_instance_types_its_pool_may_take():
    """A trn2 pool requests EFA devices (spec.disaggregation.efa auto), which trn2.3xlarge has
    none of: its servers go to trn2.48xlarge or trn2u.48xlarge alone. A Ready trn2.3xlarge node is
    no place for them, and status does not say no node of trn2.3xlarge is Ready."""
    body = {**model_body(), "spec": pd_spec(**{"disaggregation.decode": {}})}
    m = built(body)
    template = pool_deployment(m, "decode")["spec"]["template"]
    server = pool_pod("p", "a", "decode")
    server["spec"] = project_pod_spec({**template["spec"], "nodeName": "a"})
    nodes = {"a": node("trn2.48xlarge", fault=FAULT, unschedulable=True), "s": node("trn2.3xlarge")}
    part = device_fault_part(m, Observed(body, pods=[server], nodes=nodes))
    assert part.evict == ()
    assert "left: no other node can take it" in part.condition.message
    assert "No other node of trn2.48xlarge, trn2u.48xlarge is Ready" in part.condition.message
