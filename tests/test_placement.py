"""Placement as Kubernetes spells it: the model's nodeSelector, tolerations, affinity,
topologySpreadConstraints and priorityClassName reach the serving pods (with what Neuron needs),
the compile Job (alone) and the holder; a PodDisruptionBudget per model; and the API server's
own refusals of a pod's placement made on the model (validate, with CEL twins)."""

from __future__ import annotations

import pytest

from inferentia_operator.core.api import InferentiaModelSpec
from inferentia_operator.core.compile.job import compile_job
from inferentia_operator.core.model import check_model
from inferentia_operator.core.planner import plan
from inferentia_operator.core.pod.meta import selector
from inferentia_operator.core.pod.model import Model
from inferentia_operator.core.scale_to_zero.holder import holder_deployment
from inferentia_operator.core.serving.deployment import serving_deployment
from inferentia_operator.core.serving.groups import serving_group
from inferentia_operator.core.serving.service import disruption_budget
from specs import make_spec

DEDICATED = {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}
NEURON = {"key": "aws.amazon.com/neuron", "operator": "Exists", "effect": "NoSchedule"}
POOL = {"karpenter.sh/nodepool": "neuron-llm"}
ZONES = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-east-2a", "us-east-2b"]}
SPREAD = {
    "maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway",
    "labelSelector": {"matchLabels": {"inferentia.dev/model": "llm"}},
}  # fmt: skip
PLACEMENT = {
    "nodeSelector": POOL,
    "tolerations": [DEDICATED, NEURON],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [ZONES]},
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
                ]
            },
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 10, "preference": {"matchExpressions": [ZONES]}}],
        },
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"team": "x"}}}
            ]
        },
    },
    "topologySpreadConstraints": [SPREAD],
    "priorityClassName": "llm-serving",
}
CPU_POOL = {"nodeSelector": {"karpenter.sh/nodepool": "cpu-compile"}, "tolerations": [{"key": "compile", "operator": "Exists"}]}


def model(**overrides) -> Model:
    spec = InferentiaModelSpec.model_validate(make_spec(**overrides))
    return Model("llm", "team", "uid-1", spec, plan(spec))


def pod_of(body: dict) -> dict:
    return body["spec"]["template"]["spec"]


def test_serving_pods_take_the_models_placement_with_what_neuron_needs():
    m = model(placement=PLACEMENT)
    pod = pod_of(serving_deployment(m))
    assert pod["nodeSelector"] == POOL
    # The Neuron toleration first, once, though the model lists it too.
    assert pod["tolerations"] == [NEURON, DEDICATED]
    # Each of the model's required terms holds together with the planned instance types.
    instance_types = {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": m.plan.instance_types}
    node = pod["affinity"]["nodeAffinity"]
    assert node["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
        {"matchExpressions": [instance_types, ZONES]},
        {"matchExpressions": [instance_types], "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
    ]
    assert node["preferredDuringSchedulingIgnoredDuringExecution"] == [{"weight": 10, "preference": {"matchExpressions": [ZONES]}}]
    anti = pod["affinity"]["podAntiAffinity"]
    # The operator's preference to spread replicas over nodes stays beside the model's requirement.
    assert anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"] == 100
    assert anti["requiredDuringSchedulingIgnoredDuringExecution"][0]["labelSelector"] == {"matchLabels": {"team": "x"}}
    assert pod["topologySpreadConstraints"] == [SPREAD]
    assert pod["priorityClassName"] == "llm-serving"


def test_without_placement_the_serving_pods_are_placed_as_before():
    pod = pod_of(serving_deployment(model()))
    assert pod["tolerations"] == [NEURON]
    assert not {"nodeSelector", "topologySpreadConstraints", "priorityClassName"} & pod.keys()
    assert set(pod["affinity"]) == {"nodeAffinity", "podAntiAffinity"}


def test_the_compile_job_takes_its_own_placement_and_no_neuron_toleration():
    m = model(placement=PLACEMENT, **{"compile.image": "example.com/neuron:1", "compile.placement": CPU_POOL})
    job = compile_job(m)
    assert job is not None
    pod = pod_of(job)
    assert pod["nodeSelector"] == {"karpenter.sh/nodepool": "cpu-compile"}
    assert pod["tolerations"] == [{"key": "compile", "operator": "Exists"}]
    assert "affinity" not in pod and "priorityClassName" not in pod
    # Without one, the Job is placed as before: anywhere that has no taint.
    unplaced = compile_job(model(placement=PLACEMENT, **{"compile.image": "example.com/neuron:1"}))
    assert unplaced is not None and not {"nodeSelector", "tolerations", "affinity"} & pod_of(unplaced).keys()


def test_the_holder_takes_its_own_placement():
    scaled = {"autoscaling": {"minReplicas": 0, "maxReplicas": 2, "holderPlacement": CPU_POOL}, "compile.image": "example.com/neuron:1"}
    pod = pod_of(holder_deployment(model(placement=PLACEMENT, **scaled, **{"serving.batching": {"maxBatchSize": 2}})))
    assert pod["nodeSelector"] == CPU_POOL["nodeSelector"] and pod["tolerations"] == CPU_POOL["tolerations"]


def test_a_group_across_nodes_keeps_the_models_terms_beside_its_own():
    trn1 = {
        "compute.family": "trn1", "compute.inf": 16, "compute.nodes": 2, "compute.topologyKey": "topology.k8s.aws/network-node-layer-3",
        "serving.runtime": "vllm", "model.architecture": "transformer", "serving.batching": {"maxBatchSize": 4},
    }  # fmt: skip
    group = serving_group(model(placement=PLACEMENT, **trn1))
    for role in ("leaderTemplate", "workerTemplate"):
        pod = group["spec"]["leaderWorkerTemplate"][role]["spec"]
        assert pod["tolerations"] == [NEURON, DEDICATED]
        # The group's own affinity (together in one network node), and the model's anti-affinity,
        # but not the Deployment's preference for a node a replica: a group takes whole nodes.
        assert (
            pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]["topologyKey"]
            == trn1["compute.topologyKey"]
        )
        assert pod["affinity"]["podAntiAffinity"] == PLACEMENT["affinity"]["podAntiAffinity"]


@pytest.mark.parametrize(
    ("overrides", "wanted"),
    [
        ({}, 1),
        ({"disruptionBudget": {"maxUnavailable": "50%"}}, "50%"),
        ({"disruptionBudget": {"maxUnavailable": 0}}, 0),
        # A group of two nodes: one eviction takes its whole group, whose other pod then counts
        # as unavailable, so a replica is one pod of the budget, never two (two groups could go).
        ({"compute.family": "trn1", "compute.inf": 16, "compute.nodes": 2, "serving.runtime": "vllm",
          "model.architecture": "transformer", "serving.batching": {"maxBatchSize": 4}}, 1),
        # A percentage of groups, rounded up, not of pods.
        ({"compute.family": "trn1", "compute.inf": 16, "compute.nodes": 2, "serving.runtime": "vllm", "replicas": 3,
          "model.architecture": "transformer", "serving.batching": {"maxBatchSize": 4},
          "disruptionBudget": {"maxUnavailable": "50%"}}, 2),
        # A count written as text is a count: a PodDisruptionBudget takes text only as a percentage.
        ({"disruptionBudget": {"maxUnavailable": "2"}}, 2),
    ],
)  # fmt: skip
def test_every_model_has_a_disruption_budget_over_its_serving_pods(overrides, wanted):
    m = model(**overrides)
    pdb = disruption_budget(m)
    assert pdb["spec"] == {
        "maxUnavailable": wanted,
        "selector": {"matchLabels": selector(m)},
        "unhealthyPodEvictionPolicy": "AlwaysAllow",
    }
    assert pdb["metadata"]["ownerReferences"][0]["uid"] == "uid-1"


def errors_of(**overrides) -> list[str]:
    found = check_model("llm", "team", make_spec(**overrides))
    return [str(f) for f in found.errors]


@pytest.mark.parametrize(
    ("placement", "message"),
    [
        ({"tolerations": [{"key": "a", "operator": "Exists", "value": "x"}]},
         "spec.placement.tolerations: a toleration with operator Exists has value 'x'; valid values are none"),
        ({"tolerations": [{"operator": "Equal", "value": "x"}]},
         "spec.placement.tolerations: a toleration without a key has operator Equal; valid values are Exists"),
        ({"tolerations": [{"key": "a", "effect": "NoSchedule", "tolerationSeconds": 30}]},
         "spec.placement.tolerations: a toleration with tolerationSeconds has effect 'NoSchedule'; valid values are NoExecute"),
        ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In"}]}]}}}},
         "spec.placement.affinity.nodeAffinity: a node requirement has values that do not fit its operator"),
        ({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {
            "matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["new"]}]}}]}}},
         "spec.placement.affinity.nodeAffinity: a node requirement has values that do not fit its operator"),
        ({"priorityClassName": "High_Priority"}, "spec.placement.priorityClassName: 'High_Priority' is not a valid PriorityClass name"),
    ],
)  # fmt: skip
def test_placement_the_api_server_would_refuse_in_a_pod_is_refused_on_the_model(placement, message):
    errors = errors_of(placement=placement)
    assert any(e.startswith(message) for e in errors), errors
    # The same in the compile Job's placement, named there.
    compile_errors = errors_of(**{"compile.placement": placement, "compile.image": "example.com/neuron:1"})
    assert any(e.startswith(message.replace("spec.placement", "spec.compile.placement")) for e in compile_errors), compile_errors


def test_a_disruption_budget_that_is_no_count_is_refused():
    assert errors_of(disruptionBudget={"maxUnavailable": "150%"}) == [
        "spec.disruptionBudget.maxUnavailable: '150%' is not valid; valid values are a whole number or a percentage up to 100%, "
        "for example 1 or 25%"
    ]


def test_valid_placement_passes():
    assert errors_of(placement=PLACEMENT, **{"compile.placement": CPU_POOL, "compile.image": "example.com/neuron:1"}) == []


def test_the_install_guides_placed_model_is_valid_and_placed_as_it_says():
    """docs/install.md's model on a tainted NodePool, compiled on a CPU one."""
    from pathlib import Path

    import yaml

    body = yaml.safe_load((Path(__file__).resolve().parent.parent / "docs" / "install" / "placed-model.yaml").read_text())
    found = check_model(body["metadata"]["name"], body["metadata"]["namespace"], body["spec"], uid="u")
    assert found.errors == [] and found.model is not None
    serving = pod_of(serving_deployment(found.model))
    assert serving["nodeSelector"] == {"karpenter.sh/nodepool": "neuron-llm"} and serving["priorityClassName"] == "llm-serving"
    assert serving["tolerations"] == [NEURON, {"key": "dedicated", "value": "llm", "effect": "NoSchedule"}]
    job = compile_job(found.model)
    assert job is not None
    compile_pod = pod_of(job)
    assert compile_pod["nodeSelector"] == {"karpenter.sh/nodepool": "cpu-compile"}
    assert compile_pod["tolerations"] == [{"key": "dedicated", "value": "compile", "effect": "NoSchedule"}]


def tolerates(pod: dict, taint: dict) -> bool:
    """Whether one of the pod's tolerations matches the taint, as the scheduler matches them
    (https://kubernetes.io/docs/concepts/scheduling-eviction/taint-and-toleration/)."""
    return any(
        t.get("key") in (None, taint["key"])
        and t.get("effect") in (None, taint["effect"])
        and (t.get("operator") == "Exists" or t.get("value") == taint.get("value"))
        for t in pod.get("tolerations", [])
    )


def test_the_install_guides_nodepool_takes_the_placed_models_serving_pods_and_not_its_compile():
    """docs/install.md's Karpenter NodePool beside the placed model: its name is the one the
    serving pods select, its taint is one they tolerate (and the compile pod does not), and its
    instance types are among those the plan requires."""
    from pathlib import Path

    import yaml

    from inferentia_operator.core.catalogue import INSTANCE_TYPE_LABEL

    guide = Path(__file__).resolve().parent.parent / "docs" / "install"
    body = yaml.safe_load((guide / "placed-model.yaml").read_text())
    pool = yaml.safe_load((guide / "neuron-nodepool.yaml").read_text())
    # The page shows the file (test_docs holds a labelled block to its file).
    assert "# docs/install/neuron-nodepool.yaml" in (guide.parent / "install.md").read_text()
    assert (pool["apiVersion"], pool["kind"]) == ("karpenter.sh/v1", "NodePool")
    found = check_model(body["metadata"]["name"], body["metadata"]["namespace"], body["spec"], uid="u")
    assert found.model is not None
    serving = pod_of(serving_deployment(found.model))
    job = compile_job(found.model)
    assert job is not None
    assert serving["nodeSelector"]["karpenter.sh/nodepool"] == pool["metadata"]["name"]
    node = pool["spec"]["template"]["spec"]
    assert node["taints"] == [{"key": "dedicated", "value": "llm", "effect": "NoSchedule"}]
    for taint in node["taints"]:
        assert tolerates(serving, taint), taint
        assert not tolerates(pod_of(job), taint), taint
    [types] = [r["values"] for r in node["requirements"] if r["key"] == INSTANCE_TYPE_LABEL and r["operator"] == "In"]
    terms = serving["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    for term in terms:
        [required] = [e["values"] for e in term["matchExpressions"] if e["key"] == INSTANCE_TYPE_LABEL]
        assert set(types) <= set(required), (types, required)
