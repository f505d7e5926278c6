"""What the operator registers with kopf: indexes and event handlers only, so kopf never puts
a finalizer on users' models or writes its own bookkeeping into them."""

import json

import kopf

from inferentia_operator.shell import wiring
from inferentia_operator.shell.reconciler import Reconciler


def registry():
    r = kopf.OperatorRegistry()
    wiring.register(r, Reconciler(kube=lambda: None, workers=1, resync_seconds=60, is_active=lambda: True))
    return r


def test_no_handler_requires_a_finalizer_or_keeps_progress():
    r = registry()
    # Change and spawning handlers (create/update/resume, timers, daemons) make kopf write
    # progress and finalizers into the model; the operator registers none.
    assert r._changing._handlers == [] and r._spawning._handlers == []  # noqa: SLF001 - kopf has no public listing


# Every kind the operator watches besides its models: its children and their pods, each
# filtered on the server to the operator's own.
CHILDREN = [
    "deployments", "jobs", "services", "configmaps", "pods", "scaledobjects", "resourceclaimtemplates",
    "inferencepools", "serviceaccounts", "rolebindings", "leaderworkersets", "poddisruptionbudgets", "networkpolicies",
]  # fmt: skip


def test_every_kind_is_cached_and_triggers_a_reconcile():
    r = registry()
    indexed = {h.id: h.selector.any_name or h.selector.plural for h in r._indexing._handlers if not h.id.startswith("slim_")}  # noqa: SLF001
    assert indexed == {
        "model_index": "inferentiamodels", "deployment_index": "deployments", "job_index": "jobs",
        "service_index": "services", "configmap_index": "configmaps", "pod_index": "pods",
        "scaledobject_index": "scaledobjects", "resourceclaimtemplate_index": "resourceclaimtemplates",
        "inferencepool_index": "inferencepools", "serviceaccount_index": "serviceaccounts", "rolebinding_index": "rolebindings",
        "leaderworkerset_index": "leaderworkersets", "poddisruptionbudget_index": "poddisruptionbudgets",
        "networkpolicy_index": "networkpolicies",
        # The Job controller's FailedCreate events, by Job: why a compile Job has no pod.
        "job_event_index": "events",
        # By artefact: the compile Jobs and records another model made, and the models of each artefact.
        "compile_job_index": "jobs", "compile_record_index": "configmaps", "compiled_uri_index": "inferentiamodels",
        # The Neuron nodes: their faults (the node problem detector's NeuronHealth) and who may take a replacement.
        "neuron_node_index": "nodes",
        # The node caches' pods: which node holds which artefact (fill-ahead fills one again that lost it).
        "node_cache_index": "pods",
    }  # fmt: skip
    watched = {h.selector.any_name or h.selector.plural for h in r._watching._handlers}  # noqa: SLF001
    assert watched == {"inferentiamodels", *CHILDREN, "events", "nodes"}


def test_without_the_right_to_list_nodes_no_node_is_watched():
    """`run --no-node-faults` (the chart's namespaced install, which has no cluster-wide right)."""
    from inferentia_operator.shell.reconciler import Reconciler

    r = kopf.OperatorRegistry()
    wiring.register(r, Reconciler(lambda: None, workers=1, resync_seconds=300, is_active=lambda: True), node_faults=False)  # type: ignore[arg-type, return-value]
    watched = {h.selector.any_name or h.selector.plural for h in r._watching._handlers}  # noqa: SLF001
    indexed = {h.selector.any_name or h.selector.plural for h in r._indexing._handlers}  # noqa: SLF001
    assert "nodes" not in watched | indexed and "inferentiamodels" in watched


def test_children_are_filtered_on_the_server():
    settings = kopf.OperatorSettings()
    wiring.configure_watches(settings)
    selectors = {s.any_name: v for s, v in settings.watching.label_selectors.items()}
    assert selectors == dict.fromkeys(CHILDREN, "app.kubernetes.io/managed-by=inferentia-operator")
    # Of events, only the Job controller's FailedCreate of Jobs: the API server filters them.
    fields = {s.any_name: v for s, v in settings.watching.field_selectors.items()}
    assert fields == {"events": "involvedObject.kind=Job,reason=FailedCreate"}


def test_kopf_builds_no_diff_base_of_the_objects_it_watches():
    """kopf builds each watched object's diff base (a deep copy of the whole object) at every
    event, for change handlers to diff against; with none registered, it is never read."""
    settings = kopf.OperatorSettings()
    wiring.configure_watches(settings)
    storage = settings.persistence.diffbase_storage
    body = kopf.Body({"metadata": {"name": "m", "annotations": {"a": "b"}}, "spec": {"big": list(range(1000))}})
    assert storage.build(body=body) == {} and storage.fetch(body=body) is None
    patch = kopf.Patch()
    storage.store(body=body, patch=patch, essence=storage.build(body=body))
    assert not patch  # and never writes one into an object


def test_kopf_is_told_to_list_in_bounded_pages():
    # Only the setting: that kopf then sends limit= is kopf's (kopf/_cogs/clients/fetching.py),
    # and what paging does to a restart is measured by cluster/benchmark_scale.py (reads per
    # model rise with the pages; the RSS peak did not fall, docs/benchmarks.md).
    settings = kopf.OperatorSettings()
    wiring.configure_watches(settings)
    assert settings.watching.chunk_size == wiring.LIST_CHUNK and 0 < wiring.LIST_CHUNK <= 500


def test_kopfs_per_object_workers_do_not_linger_with_their_last_body():
    settings = kopf.OperatorSettings()
    assert settings.queueing.idle_timeout == 5.0  # kopf's default, which the operator lowers
    wiring.configure_watches(settings)
    assert settings.queueing.idle_timeout == wiring.KOPF_WORKER_IDLE_SECONDS < 1


def test_each_kind_is_slimmed_after_every_index_of_its_kind():
    """kopf runs a kind's index handlers in the order registered (its IndexingRegistry keeps a
    list); the object is cut down only after every index has projected it whole."""
    r = registry()
    handlers = r._indexing._handlers  # noqa: SLF001 - kopf has no public listing
    for plural in {"inferentiamodels", *CHILDREN}:
        of_kind = [h.id for h in handlers if (h.selector.any_name or h.selector.plural) == plural]
        assert of_kind[-1] == f"slim_{plural}", (plural, of_kind)
        assert all(i.endswith("_index") for i in of_kind[:-1])


def _managed_fields(body):
    return [{"manager": "inferentia-operator", "operation": "Apply", "fieldsV1": {"f:spec": json.loads(json.dumps(body.get("spec", {})))}}]


def _delivered():
    """What the watches deliver: every child the samples render, a compile record, a pod and
    a model, each with the managedFields and status the API server adds."""
    from pathlib import Path

    from inferentia_operator.core.compile.job import compile_record
    from inferentia_operator.core.decide import rendered
    from inferentia_operator.core.proof import Prover
    from inferentia_operator.manifests import load_models

    samples = Path(__file__).resolve().parents[1] / "manifests" / "samples"
    bodies = []
    for doc in load_models([str(samples)]).models:
        if doc.model is None:
            continue
        for child in rendered(doc.model):
            bodies.append(child)
            if child["kind"] == "Job":
                bodies.append(compile_record(doc.model, child, Prover(b"k" * 32)))
        meta = {"name": doc.key[1], "namespace": "ns", "generation": 3}
        bodies.append(
            {
                "apiVersion": "inferentia.io/v1alpha1",
                "kind": "InferentiaModel",
                "metadata": meta,
                "spec": {"inf": 1},
                "status": {"phase": "Ready"},
            }
        )
    bodies.append({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ns", "labels": {"inferentia.io/model": "m"}, "deletionTimestamp": None},
        "spec": {"nodeName": "n1", "containers": [{"name": "serve", "image": "i", "env": [{"name": "A", "value": "1"}] * 50}],
                 "volumes": [{"name": "plan", "configMap": {"name": "m-plan-1"}}, {"name": "tmp", "emptyDir": {}}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
                   "containerStatuses": [{"name": "serve", "state": {"terminated": {"exitCode": 0, "message": "neuron 97%"}}}]},
    })  # fmt: skip
    for i, body in enumerate(bodies):
        body["metadata"] = {"namespace": "ns", "resourceVersion": str(100 + i), **body["metadata"], "managedFields": _managed_fields(body)}
        body.setdefault("status", {"observedGeneration": 1, "conditions": [{"type": "Available", "status": "True"}]})
    return bodies


def _what_the_handlers_read(body):
    from inferentia_operator.core.objects import Obj
    from inferentia_operator.core.projection import compile_uri, owner_key, pod_signature

    obj = Obj(body)
    meta = body["metadata"]
    pod = pod_signature(body) if body["kind"] == "Pod" else None
    return (body["kind"], obj.key, owner_key(body), compile_uri(body), meta.get("generation"), obj.resource_version, pod)


def test_slimming_keeps_what_the_watch_handlers_read_and_drops_the_rest():
    """After the indexes, the object kopf holds is read only by the event handlers
    (Reconciler.on_model, on_child, on_pod): what they read stays, the rest goes."""
    r = registry()
    slims = {h.id: h.fn for h in r._indexing._handlers if h.id.startswith("slim_")}  # noqa: SLF001
    delivered = _delivered()
    kinds = {b["kind"] for b in delivered}
    assert {"Deployment", "Service", "ConfigMap", "Job", "Pod", "InferentiaModel"} <= kinds
    before = [_what_the_handlers_read(b) for b in delivered]
    size_before = len(json.dumps(delivered))
    assert any(b[3] for b in before), "no compile Job or record among the samples' children"
    import asyncio

    for body in delivered:
        plural = {"InferentiaModel": "inferentiamodels", "NetworkPolicy": "networkpolicies"}.get(body["kind"], body["kind"].lower() + "s")
        asyncio.run(slims[f"slim_{plural}"](body=kopf.Body(body)))  # as kopf calls it: the view over the raw object
    assert [_what_the_handlers_read(b) for b in delivered] == before
    assert not any("managedFields" in b["metadata"] for b in delivered)
    plain = [b for b in delivered if b["kind"] in ("Deployment", "Service", "InferentiaModel")]
    assert plain and all(not b["spec"] and not b["status"] for b in plain)
    assert len(json.dumps(delivered)) < size_before / 4
