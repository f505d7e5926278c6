"""What the operator registers with kopf: no handler may put a finalizer on users' models."""

import kopf

from inferentia_operator import controller


def registry():
    r = kopf.OperatorRegistry()
    controller.register(r, kube=lambda: None, resync_seconds=60)
    return r


def test_no_handler_requires_a_finalizer():
    r = registry()
    handlers = [*r._spawning._handlers, *r._changing._handlers]
    assert any(type(h).__name__ == "TimerHandler" for h in handlers)
    assert [h.id for h in handlers if getattr(h, "requires_finalizer", False)] == []


def test_children_of_every_kind_trigger_a_reconcile():
    watched = {h.selector.any_name for h in registry()._watching._handlers}
    assert watched == {"deployments", "jobs", "services", "configmaps", "pods"}
