"""Retry rules of the API layer. The transport is stubbed here only to script failures the real
API server cannot be made to produce on demand; every real call is covered by tests/e2e."""

import json

import pytest

from inferentia_operator.shell.kube import ApiError, Kube, TransientError


class ScriptedResponse:
    def __init__(self, status, body=None):
        self.status, self.reason = status, "scripted"
        self.data = json.dumps(body or {}).encode()
        self.headers = {}

    def read(self):
        return self.data

    def getheaders(self):
        return {}


class ScriptedTransport:
    """Answers each call with the next status of a script."""

    def __init__(self, *statuses):
        self.statuses, self.calls = list(statuses), []

    def param_serialize(self, method, url, **kwargs):
        return (method, url)

    def call_api(self, method, url):
        self.calls.append((method, url))
        status = self.statuses.pop(0)
        return ScriptedResponse(status, {"metadata": {"name": "x"}} if status < 300 else {"code": status})


def kube(*statuses):
    transport = ScriptedTransport(*statuses)
    return Kube(transport, first_delay=0), transport


def test_transient_failures_are_retried_with_backoff_until_success():
    k, t = kube(503, 429, 200)
    assert k.get("Deployment", "ns", "x") == {"metadata": {"name": "x"}}
    assert len(t.calls) == 3


def test_a_conflict_on_update_is_retried():
    k, t = kube(409, 200)
    k.patch_status("ns", "m", {"observedGeneration": 1})
    assert len(t.calls) == 2


def test_persistent_failure_becomes_a_transient_error():
    k, t = kube(503, 503, 503, 503)
    with pytest.raises(TransientError):
        k.get("Deployment", "ns", "x")
    assert len(t.calls) == 4


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
