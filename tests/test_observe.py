"""What the caches keep of a watched object: the projections and their packed form."""

import sys

from inferentia_operator.core import api
from inferentia_operator.core.names import FIELD_MANAGER, MODEL_LABEL
from inferentia_operator.core.projection import OWN_UPDATE_ENTRY, Packed, owner_key, project, project_pod

DEPLOYMENT = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {
        "name": "bert",
        "namespace": "ml",
        "uid": "u1",
        "resourceVersion": "42",
        "labels": {"app.kubernetes.io/instance": "bert"},
        "ownerReferences": [{"apiVersion": f"{api.GROUP}/{api.VERSION}", "kind": api.KIND, "name": "bert", "controller": True}],
        "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {"f:replicas": {}}}}],
    },
    "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "serve", "image": "x" * 200}]}}},
    "status": {"readyReplicas": 2},
}


def test_a_projection_keeps_identity_spec_and_status_and_drops_managed_fields():
    kept = project(DEPLOYMENT)
    assert "managedFields" not in kept["metadata"]
    assert kept["spec"] == DEPLOYMENT["spec"] and kept["status"] == DEPLOYMENT["status"]
    assert kept["metadata"]["resourceVersion"] == "42"
    configmap = project({"kind": "ConfigMap", "metadata": {"name": "plan-abc"}, "data": {"plan.json": "{}"}, "immutable": True})
    assert "data" not in configmap and configmap["immutable"] is True


def with_entries(*entries: dict) -> dict:
    return {**DEPLOYMENT, "metadata": {**DEPLOYMENT["metadata"], "managedFields": [{"fieldsV1": {}, **e} for e in entries]}}


def test_a_projection_says_where_the_operators_update_entry_is_and_nothing_else_of_managed_fields():
    """A child the operator created with a POST has its fields under its Update entry: the
    projection says at which index, and whether an Apply entry of its own is beside it."""
    kubectl = {"manager": "kubectl", "operation": "Update"}
    status = {"manager": FIELD_MANAGER, "operation": "Update", "subresource": "status"}
    posted = {"manager": FIELD_MANAGER, "operation": "Update"}
    applied = {"manager": FIELD_MANAGER, "operation": "Apply"}
    assert OWN_UPDATE_ENTRY not in project(DEPLOYMENT)
    assert OWN_UPDATE_ENTRY not in project(with_entries(kubectl, applied, status))
    assert project(with_entries(kubectl, posted))[OWN_UPDATE_ENTRY] == {"index": 1, "besideApply": False}
    assert project(with_entries(applied, status, posted))[OWN_UPDATE_ENTRY] == {"index": 2, "besideApply": True}
    assert OWN_UPDATE_ENTRY not in project({**DEPLOYMENT, "metadata": {"name": "x", "managedFields": "not a list"}})


def test_a_packed_projection_unpacks_to_the_same_value_and_is_smaller():
    kept = project(DEPLOYMENT)
    packed = Packed(kept)
    assert packed.unpack() == kept
    assert packed.unpack() is not packed.unpack()  # each reader gets its own copy to change
    assert sys.getsizeof(packed._data) < len(str(kept))  # noqa: SLF001 - the stored bytes


def test_a_pod_projection_keeps_placement_readiness_and_plan_volume():
    pod = {
        "metadata": {"name": "bert-1", "namespace": "ml", "labels": {"x": "y"}},
        "spec": {"nodeName": "n1", "volumes": [{"name": "plan", "configMap": {"name": "bert-plan-1"}}, {"name": "tmp", "emptyDir": {}}]},
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "Initialized", "status": "True"},
                {"type": "ContainersReady", "status": "True"},
            ],
        },
    }
    kept = project_pod(pod)
    assert kept["spec"] == {"nodeName": "n1", "volumes": [{"configMap": {"name": "bert-plan-1"}}]}
    # Initialized: whether the init containers (the fetch) are done, for status.pods.
    assert kept["status"] == {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True"}, {"type": "Initialized", "status": "True"}],
        "failures": [],
        "reports": [],  # what containers that ended with 0 said: the compile program's report
    }


def test_the_owner_is_the_controller_model_before_the_label():
    assert owner_key(DEPLOYMENT) == ("ml", "bert")
    labelled = {"metadata": {"name": "p", "namespace": "ml", "labels": {MODEL_LABEL: "gpt2"}}}
    assert owner_key(labelled) == ("ml", "gpt2")
    assert owner_key({"metadata": {"name": "p"}}) is None
