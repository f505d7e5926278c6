"""The API layer: one request per call, and what each answer becomes. The transport is stubbed here only to script failures the real
API server cannot be made to produce on demand; every real call is covered by tests/e2e."""

import json

import pytest

from inferentia_operator.shell.kube import ApiError, Kube, TransientError


class ScriptedResponse:
    def __init__(self, status, body=None):
        self.status, self.reason = status, "scripted"
        self.data = json.dumps(body or {}).encode()


class ScriptedTransport:
    """Answers each call with the next status of a script."""

    def __init__(self, *statuses):
        self.statuses, self.calls = list(statuses), []

    def request(self, method, url, query=None, body=None, content_type=None):
        self.calls.append((method, url))
        status = self.statuses.pop(0)
        return ScriptedResponse(status, {"metadata": {"name": "x"}} if status < 300 else {"code": status})


def kube(*statuses):
    transport = ScriptedTransport(*statuses)
    return Kube(transport), transport


@pytest.mark.parametrize("code", [409, 429, 500, 502, 503, 504])
def test_an_answer_that_may_pass_is_a_transient_error_after_one_request(code):
    """No retry here: the work queue retries the whole reconcile after its backoff
    (tests/test_workqueue.py), so no worker thread sleeps between attempts."""
    k, t = kube(code)
    with pytest.raises(TransientError) as said:
        k.patch_status("ns", "m", {"observedGeneration": 1})
    assert said.value.code == code and len(t.calls) == 1


def test_success_returns_the_object():
    k, t = kube(200)
    assert k.get("Deployment", "ns", "x") == {"metadata": {"name": "x"}}
    assert t.calls == [("GET", "/apis/apps/v1/namespaces/ns/deployments/x")]


def test_already_exists_on_create_is_not_retried_and_not_an_error():
    k, t = kube(409)
    assert k.create_if_missing({"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": "p"}}) is False
    assert t.calls == [("POST", "/apis/kopf.dev/v1/clusterkopfpeerings")]


def test_not_found_is_none_and_forbidden_is_raised_at_once():
    k, _ = kube(404)
    assert k.get("Service", "ns", "x") is None
    k, t = kube(403)
    with pytest.raises(ApiError) as refused:
        k.get("Service", "ns", "x")
    assert refused.value.code == 403 and not isinstance(refused.value, TransientError)
    assert len(t.calls) == 1


def test_every_child_kind_has_its_path_from_the_table():
    from inferentia_operator.core.kinds import CHILD_KINDS
    from inferentia_operator.shell.kube import path

    assert path("ScaledObject", "ns", "m") == "/apis/keda.sh/v1alpha1/namespaces/ns/scaledobjects/m"
    assert path("ConfigMap", "ns") == "/api/v1/namespaces/ns/configmaps"
    assert {path(k.kind, "ns").rsplit("/", 1)[1] for k in CHILD_KINDS} == {k.plural for k in CHILD_KINDS}
