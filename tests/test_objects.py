"""Obj, the typed view over objects as the API server sends them: absent is empty, never an error."""

from inferentia_operator.core.objects import Obj

JOB = {
    "kind": "Job",
    "metadata": {
        "name": "m-compile-1",
        "namespace": "ns",
        "uid": "u1",
        "generation": 2,
        "resourceVersion": "41",
        "labels": {"inferentia.dev/model": "m"},
        "ownerReferences": [{"kind": "ReplicaSet", "name": "x"}, {"kind": "InferentiaModel", "name": "m", "controller": True, "uid": "u0"}],
    },
    "status": {"conditions": [{"type": "Complete", "status": "True"}]},
}


def test_the_view_reads_identity_owner_and_conditions():
    job = Obj(JOB)
    assert (job.kind, job.name, job.namespace, job.uid, job.generation, job.resource_version) == ("Job", "m-compile-1", "ns", "u1", 2, 41)
    assert job.labels["inferentia.dev/model"] == "m" and job.annotations == {}
    assert job.controller is not None and job.controller["name"] == "m"
    assert job.condition_true("Complete") and not job.condition_true("Failed") and job.condition("Failed") == {}
    assert not job.deleting and bool(job) and job.key == ("ns", "m-compile-1")


def test_absent_or_malformed_objects_read_as_empty():
    for raw in (
        None,
        {},
        {"metadata": None, "status": "oops"},
        {"metadata": {"labels": None, "ownerReferences": None, "resourceVersion": "x"}},
    ):
        obj = Obj(raw)
        assert (obj.name, obj.labels, obj.controller, obj.generation, obj.resource_version) == (None, {}, None, 0, -1)
        assert obj.condition("Ready") == {} and not obj.condition_true("Ready") and obj.key is None
    assert not Obj(None)
