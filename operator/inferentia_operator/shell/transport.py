"""HTTPS to the API server, with the credentials kopf's own logins read.

One login serves the operator's watches (kopf) and its calls (:class:`kube.Kube`): in a pod the
ServiceAccount's token, elsewhere the kubeconfig's current context, as
``kopf.login_with_service_account`` and ``kopf.login_with_kubeconfig`` read them
(https://kopf.readthedocs.io/en/stable/authentication/), and kopf's ``ConnectionInfo`` makes the
TLS context and the Authorization header. In a pod the server is the one client-go's
in-cluster configuration connects to (below). The official client library is therefore not a
dependency: kopf loads it whenever it is installed, and with it (and the requests, oauthlib and
websocket libraries it brings) the operator started 8 MB larger: 70 against 62 MB, idle with
no model (make benchmark-scale of 2026-11-26, docs/benchmarks.md).

What the kubeconfig logins leave out, as kopf's do: exec credential plugins (``aws eks
get-token``) and auth-provider refreshes. In a pod, where the operator runs, neither is used.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import urllib3

if TYPE_CHECKING:
    import kopf

# The API server ends a request it has not answered within its --request-timeout (1m0s by
# default, https://kubernetes.io/docs/reference/command-line-tools-reference/kube-apiserver/):
# waiting longer for an answer only holds a worker thread.
READ_TIMEOUT = 60.0
CONNECT_TIMEOUT = 10.0


class LoginFailed(OSError):
    """No credentials could be read: a call fails as one that cannot reach the server does."""


def login_info(settings: kopf.OperatorSettings | None = None) -> kopf.ConnectionInfo | None:
    """The ServiceAccount's credentials in a pod, else the kubeconfig's (KUBECONFIG or
    ~/.kube/config), as kubectl would; None when there are neither. kopf's login handler."""
    import kopf  # here, so that a program that only reads a model (the CLI) does not load it

    settings = settings or kopf.OperatorSettings()
    info = kopf.login_with_service_account(settings=settings)
    if info is None:
        return kopf.login_with_kubeconfig(settings=settings)
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if host and port:
        # kopf names the server https://kubernetes.default.svc, which needs the cluster's DNS; the
        # kubelet gives every pod the Service's address as these variables, and client-go's
        # rest.InClusterConfig connects there (https://kubernetes.io/docs/tasks/run-application/access-api-from-pod/).
        info = dataclasses.replace(info, server=f"https://{f'[{host}]' if ':' in host else host}:{port}")
    return info


def credentials() -> kopf.ConnectionInfo:
    """:func:`login_info`, or :class:`LoginFailed` saying what was missing or unreadable."""
    try:
        info = login_info()
    except Exception as exc:  # noqa: BLE001 - a token file or a kubeconfig can fail to read in many ways (a file, YAML, a key); each is the same refusal
        raise LoginFailed(f"the credentials could not be read: {type(exc).__name__}: {exc}") from None
    if info is None:
        raise LoginFailed("neither a ServiceAccount token (in a pod) nor a kubeconfig (KUBECONFIG or ~/.kube/config) was found")
    return info


class Transport:
    """One HTTP request a call, on a pool of ``pool_size`` connections; never retried here."""

    def __init__(
        self, login: Callable[[], kopf.ConnectionInfo] = credentials, pool_size: int = 4, read_timeout: float = READ_TIMEOUT
    ) -> None:
        self._login, self._pool_size = login, pool_size
        self._timeout = urllib3.Timeout(connect=CONNECT_TIMEOUT, read=read_timeout)
        self._lock = threading.Lock()
        self._session: tuple[str, urllib3.PoolManager, dict[str, str]] | None = None

    def _connected(self) -> tuple[str, urllib3.PoolManager, dict[str, str]]:
        with self._lock:
            if self._session is None:
                info = self._login()
                options: dict[str, Any] = {"num_pools": 1, "maxsize": self._pool_size, "timeout": self._timeout, "retries": False}
                if info.server.startswith("https:"):
                    options["ssl_context"] = info.as_ssl_context()
                pool = urllib3.ProxyManager(info.proxy_url, **options) if info.proxy_url else urllib3.PoolManager(**options)
                self._session = (info.server.rstrip("/"), pool, info.as_http_headers())
            return self._session

    def request(
        self, method: str, url: str, query: list[tuple[str, str]] | None = None, body: Any = None, content_type: str | None = None
    ) -> urllib3.BaseHTTPResponse:
        """``url`` is the API path; ``body`` is sent as JSON (which is YAML too, for an apply)."""
        server, pool, auth = self._connected()
        headers = {"Accept": "application/json", **auth}
        if content_type:
            headers["Content-Type"] = content_type
        target = server + url + (f"?{urlencode(query)}" if query else "")
        data = None if body is None else json.dumps(body).encode()
        response = pool.request(method, target, body=data, headers=headers)
        if response.status == 401:
            # A ServiceAccount token rotates (the kubelet rewrites the file): read it again next time.
            with self._lock:
                self._session = None
        return response
