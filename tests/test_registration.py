"""What the operator registers with kopf: indexes and event handlers only, so kopf never puts
a finalizer on users' models or writes its own bookkeeping into them."""

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
    "inferencepools", "serviceaccounts", "rolebindings", "leaderworkersets",
]  # fmt: skip


def test_every_kind_is_cached_and_triggers_a_reconcile():
    r = registry()
    indexed = {h.id: h.selector.any_name or h.selector.plural for h in r._indexing._handlers}  # noqa: SLF001
    assert indexed == {
        "model_index": "inferentiamodels", "deployment_index": "deployments", "job_index": "jobs",
        "service_index": "services", "configmap_index": "configmaps", "pod_index": "pods",
        "scaledobject_index": "scaledobjects", "resourceclaimtemplate_index": "resourceclaimtemplates",
        "inferencepool_index": "inferencepools", "serviceaccount_index": "serviceaccounts", "rolebinding_index": "rolebindings",
        "leaderworkerset_index": "leaderworkersets",
        # By artefact: the compile Jobs and records another model made, and the models of each artefact.
        "compile_job_index": "jobs", "compile_record_index": "configmaps", "compiled_uri_index": "inferentiamodels",
    }  # fmt: skip
    watched = {h.selector.any_name or h.selector.plural for h in r._watching._handlers}  # noqa: SLF001
    assert watched == {"inferentiamodels", *CHILDREN}


def test_children_are_filtered_on_the_server():
    settings = kopf.OperatorSettings()
    wiring.configure_watches(settings)
    selectors = {s.any_name: v for s, v in settings.watching.label_selectors.items()}
    assert selectors == dict.fromkeys(CHILDREN, "app.kubernetes.io/managed-by=inferentia-operator")


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
