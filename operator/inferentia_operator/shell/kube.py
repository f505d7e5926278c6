"""The few Kubernetes API calls the operator makes, each one request.

Every call the operator's reconciles make goes through here, so RBAC can grant exactly
these (tests/test_rbac.py records them), and the metrics count them: create and server-side
apply (patch) of the children, the JSON patch that makes a created child's fields the apply's,
the compile Job's proof (patch), a get of a child whose create found its name taken (409),
delete of superseded plan ConfigMaps, compile Jobs and claim templates, patch of
InferentiaModel status, create of events, and at start the proof key Secret (get, create).
Reads of the children otherwise come from the watch caches (see :mod:`cache`).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import urllib3

from inferentia_operator.core import api
from inferentia_operator.core.autoscaling import NOT_SERVED
from inferentia_operator.core.kinds import CHILD_KINDS
from inferentia_operator.core.names import FIELD_MANAGER
from inferentia_operator.core.status import now

from . import metrics
from .transport import Transport

# kind -> (API path prefix, plural): the children's from the table of child kinds, and the
# few other kinds the operator calls.
RESOURCES = {
    **{k.kind: (k.path_prefix, k.plural) for k in CHILD_KINDS},
    "Secret": ("/api/v1", "secrets"),
    "Event": ("/api/v1", "events"),
    api.KIND: (f"/apis/{api.API_VERSION}", api.PLURAL),
    "KopfPeering": ("/apis/kopf.dev/v1", "kopfpeerings"),
    "ClusterKopfPeering": ("/apis/kopf.dev/v1", "clusterkopfpeerings"),
}
CLUSTER_SCOPED = {"ClusterKopfPeering"}
# Answers that may pass: the call is not repeated here but the reconcile is, after the work
# queue's backoff (the one retry layer, shell/workqueue.py). 409 is a conflict for an update,
# but AlreadyExists for a create, which is permanent.
TRANSIENT = {409, 429, 500, 502, 503, 504}


class ApiError(Exception):
    """The API server refused a request; ``message`` is its own explanation."""

    def __init__(self, code: int, reason: str, message: str):
        self.code, self.reason, self.message = code, reason, message
        super().__init__(f"{code} {reason}: {message}")


class TransientError(ApiError):
    """The API server did not answer usefully now (sent once, never retried here); the same call may succeed later."""


def _server_message(status: int, reason: str, data: bytes | None) -> str:
    """The API server's Status message, else the HTTP reason."""
    try:
        found = json.loads(data or b"{}")
        return str(found.get("message") or reason) if isinstance(found, dict) else reason
    except ValueError:
        if status == 404:
            # A path of an API group the server does not serve at all gets its plain-text
            # "404 page not found", not a Status: the same answer as for an unserved resource.
            return NOT_SERVED
        return reason


def path(kind: str, namespace: str | None, name: str | None = None, subresource: str | None = None) -> str:
    prefix, plural = RESOURCES[kind]
    out = f"{prefix}/{plural}" if kind in CLUSTER_SCOPED else f"{prefix}/namespaces/{quote(namespace or '')}/{plural}"
    if name:
        out += f"/{quote(name)}"
    if subresource:
        out += f"/{subresource}"
    return out


class Kube:
    """One call, one request: a failure that may pass is a :class:`TransientError` for the
    caller, and the work queue retries the whole reconcile after its backoff, so no reconcile
    blocks a worker thread sleeping between attempts."""

    def __init__(self, transport: Transport):
        self.transport = transport

    def _call(
        self, method: str, url: str, body: Any = None, query: list[tuple[str, str]] | None = None, content_type: str | None = None
    ) -> dict[str, Any] | None:
        resource = url.split("?")[0].split("/")
        verb = {"GET": "get", "PATCH": "patch", "POST": "create", "DELETE": "delete", "PUT": "update"}[method]
        plural = next((p for _, p in RESOURCES.values() if p in resource), "other")
        try:
            response = self.transport.request(method, url, query=query, body=body, content_type=content_type)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            metrics.API_REQUESTS.labels(verb, plural, "error").inc()
            raise TransientError(0, type(exc).__name__, f"{method} {url}: {exc}") from None
        status = response.status
        metrics.API_REQUESTS.labels(verb, plural, str(status)).inc()
        if 200 <= status < 300:
            found: dict[str, Any] | None = json.loads(response.data or b"null")
            return found
        if status == 404 and method == "GET":
            return None
        # 401: the transport logs in again at the next call (a rotated token).
        transient = (status in TRANSIENT or status == 401) and not (status == 409 and method == "POST")
        reason = response.reason or ""
        raise (TransientError if transient else ApiError)(status, reason, _server_message(status, reason, response.data))

    def _object(self, method: str, url: str, **kwargs: Any) -> dict[str, Any]:
        """A write, which the API server answers with the object written."""
        found = self._call(method, url, **kwargs)
        if found is None:
            raise TransientError(0, "EmptyResponse", f"{method} {url}: the API server answered with no object")
        return found

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self._call("GET", path(kind, namespace, name))

    def list(self, kind: str, namespace: str, selector: str) -> list[dict[str, Any]]:
        found = self._call("GET", path(kind, namespace), query=[("labelSelector", selector)])
        return (found or {}).get("items") or []

    def apply(self, body: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply under the operator's field manager; fields others own are left alone."""
        meta = body["metadata"]
        return self._object(
            "PATCH",
            path(body["kind"], meta["namespace"], meta["name"]),
            body=body,
            query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
            content_type="application/apply-patch+yaml",
        )

    def make_own_fields_applied(self, kind: str, namespace: str, name: str, index: int, beside_apply: bool) -> dict[str, Any]:
        """Makes the fields of the operator's Update entry, at ``index`` of the object's
        managedFields (those of its POST), its Apply's: the entry becomes its Apply entry, or,
        beside one, goes (its fields are the apply's already, the defaults the API server filled
        in aside, which come back if dropped). Without it, an apply that drops a field the POST
        wrote leaves it (kubernetes/kubernetes#99003). kubectl does the same on an object it
        once applied client-side: k8s.io/client-go/util/csaupgrade, UpgradeManagedFields. The
        patch tests the entry first, so an entry moved since the cache saw it is left alone: the
        API server refuses the patch, and the write is reported and tried again."""
        at = f"/metadata/managedFields/{index}"
        ops: list[dict[str, Any]] = [
            {"op": "test", "path": f"{at}/manager", "value": FIELD_MANAGER},
            {"op": "test", "path": f"{at}/operation", "value": "Update"},
            {"op": "remove", "path": at} if beside_apply else {"op": "replace", "path": f"{at}/operation", "value": "Apply"},
        ]
        return self._object("PATCH", path(kind, namespace, name), body=ops, content_type="application/json-patch+json")

    def replace_field(self, kind: str, namespace: str, name: str, pointer: str, value: Any) -> dict[str, Any]:
        """Replaces one field whole (a JSON patch), whoever owns its entries."""
        return self._object(
            "PATCH", path(kind, namespace, name), body=[{"op": "replace", "path": pointer, "value": value}],
            content_type="application/json-patch+json",
        )  # fmt: skip

    def annotate(self, kind: str, namespace: str, name: str, annotations: dict[str, str]) -> dict[str, Any]:
        """Sets annotations (a merge patch), leaving every other field as it is."""
        return self._object(
            "PATCH", path(kind, namespace, name), body={"metadata": {"annotations": annotations}},
            content_type="application/merge-patch+json",
        )  # fmt: skip

    def create(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """Creates ``body`` as the operator's field manager; None when the name is taken (409)."""
        meta = body["metadata"]
        try:
            return self._call(
                "POST", path(body["kind"], meta.get("namespace")), body=body,
                query=[("fieldManager", FIELD_MANAGER)], content_type="application/json",
            )  # fmt: skip
        except ApiError as exc:
            if exc.code == 409:
                return None
            raise

    def create_if_missing(self, body: dict[str, Any]) -> bool:
        """Creates ``body`` unless an object of that name exists; True when it created it."""
        meta = body["metadata"]
        try:
            self._call("POST", path(body["kind"], meta.get("namespace")), body=body, content_type="application/json")
        except ApiError as exc:
            if exc.code == 409:  # AlreadyExists
                return False
            raise
        return True

    def delete(self, kind: str, namespace: str, name: str) -> None:
        """Deletes an object; its dependents (a Job's pods) go with it. Already gone is fine."""
        try:
            self._call("DELETE", path(kind, namespace, name), body={"propagationPolicy": "Background"}, content_type="application/json")
        except ApiError as exc:
            if exc.code != 404:
                raise

    def evict(self, namespace: str, name: str, uid: str) -> None:
        """Evicts a pod through the Eviction API, which honours its PodDisruptionBudget (429 while
        the budget allows none), and only the pod of that uid. Already gone is fine.
        (https://kubernetes.io/docs/concepts/scheduling-eviction/api-eviction/)"""
        body = {
            "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": {"preconditions": {"uid": uid}},
        }  # fmt: skip
        try:
            self._call("POST", path("Pod", namespace, name, "eviction"), body=body, content_type="application/json")
        except ApiError as exc:
            if exc.code != 404:
                raise

    def label_pod(self, namespace: str, name: str, uid: str, labels: dict[str, str]) -> None:
        """Sets labels on the pod of that uid (a merge patch that names the uid, which the API
        server refuses to change, so another pod of the same name is left alone). Gone is fine."""
        body = {"metadata": {"uid": uid, "labels": labels}}
        try:
            self._call("PATCH", path("Pod", namespace, name), body=body, content_type="application/merge-patch+json")
        except ApiError as exc:
            if exc.code != 404:
                raise

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any] | None:
        return self._call(
            "PATCH",
            path(api.KIND, namespace, name, "status"),
            body={"status": status},
            content_type="application/merge-patch+json",
        )

    def post_event(self, model: dict[str, Any], kind: str, reason: str, message: str) -> None:
        """A core/v1 Event on the model, as ``kubectl describe`` shows them."""
        meta = model["metadata"]
        at = now()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": api.API_VERSION,
                "kind": api.KIND,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },  # fmt: skip
            "type": kind,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": FIELD_MANAGER},
            "reportingComponent": FIELD_MANAGER,
            "firstTimestamp": at,
            "lastTimestamp": at,
            "count": 1,
        }
        self._call("POST", path("Event", meta["namespace"]), body=event, content_type="application/json")
