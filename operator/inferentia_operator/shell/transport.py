"""HTTPS to the API server, with the credentials kubectl would use.

One login serves the operator's watches (kopf) and its calls (:class:`kube.Kube`). In a pod it
is the ServiceAccount's token, as ``kopf.login_with_service_account`` reads it, and the server is
the one client-go's in-cluster configuration connects to (below). Out of a pod it is the
kubeconfig's current context, read by the official client's configuration loader
(``kubernetes.config``, as ``kopf.login_via_client`` uses it), which runs exec credential plugins
(an EKS kubeconfig's ``aws eks get-token``) and auth providers as kubectl does; a token that
expires is fetched again at the first 401 (:class:`Transport` and kopf both log in again then).

That loader comes with the ``kubernetes`` library, the ``kubeconfig`` extra (``pip install
'inferentia-operator[kubeconfig]'``), which the operator's image leaves out: kopf imports the
library whenever it is installed, and with it (and the requests, oauthlib and websocket
libraries it brings) the operator started 8 MB larger, 70 against 62 MB idle (make
benchmark-scale of 2026-11-26, docs/benchmarks.md), for a login a pod never uses. Without it,
kopf's own kubeconfig reader is used, which runs no plugin: a context whose user gives nothing
else is refused with what to install.
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
        return kubeconfig_login(settings)
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if host and port:
        # kopf names the server https://kubernetes.default.svc, which needs the cluster's DNS; the
        # kubelet gives every pod the Service's address as these variables, and client-go's
        # rest.InClusterConfig connects there (https://kubernetes.io/docs/tasks/run-application/access-api-from-pod/).
        info = dataclasses.replace(info, server=f"https://{f'[{host}]' if ':' in host else host}:{port}")
    return info


def kubeconfig_paths() -> list[str]:
    """The kubeconfig files kubectl reads: KUBECONFIG's list, else ~/.kube/config."""
    listed = os.environ.get("KUBECONFIG", "")
    return [p for p in listed.split(os.pathsep) if p] if listed else [os.path.expanduser("~/.kube/config")]


def kubeconfig_login(settings: kopf.OperatorSettings) -> kopf.ConnectionInfo | None:
    """The kubeconfig's current context, or None when there is no kubeconfig."""
    import kopf

    if not any(os.path.exists(p) for p in kubeconfig_paths()):
        return None
    try:
        import kubernetes.config  # noqa: F401 - only whether the kubeconfig extra is installed
    except ImportError:
        info = kopf.login_with_kubeconfig(settings=settings)
        if info is not None and not (info.token or info.certificate_path or info.certificate_data or info.username):
            raise LoginFailed(
                "the kubeconfig's user gives no token, client certificate or password that can be read without running a "
                "program (an exec credential plugin such as aws eks get-token, or an auth provider): install "
                "'inferentia-operator[kubeconfig]', whose kubernetes library runs it as kubectl does"
            ) from None
        return info
    return _client_login(settings, kubeconfig_paths())


def _client_login(settings: kopf.OperatorSettings, paths: list[str]) -> kopf.ConnectionInfo:
    """The official client's kubeconfig loader, as ``kopf.login_via_client`` uses it, with the
    files named (the library reads KUBECONFIG once, when it is first imported) and the file
    never written back (persist_config: it would store an auth provider's refreshed token)."""
    import kopf
    from kubernetes import client, config

    loaded = client.Configuration()
    config.load_kube_config(config_file=os.pathsep.join(paths), client_configuration=loaded, persist_config=False)  # type: ignore[no-untyped-call]
    # An exec plugin's or an auth provider's token, or the context's own: where the library keeps
    # it moved in its release 36.0.1 (kopf reads both places too).
    header = loaded.get_api_key_with_prefix("BearerToken") or loaded.get_api_key_with_prefix("authorization")
    scheme, _, token = header.partition(" ") if header and " " in header else (None, None, header)
    return kopf.ConnectionInfo(
        server=loaded.host,
        ca_path=loaded.ssl_ca_cert,  # inline data is written to a temporary file by the loader
        insecure=not loaded.verify_ssl,
        username=loaded.username or None,
        password=loaded.password or None,
        scheme=scheme or None,
        token=token or None,
        certificate_path=loaded.cert_file,
        private_key_path=loaded.key_file,
        proxy_url=loaded.proxy or None,
        trust_env=settings.networking.trust_env,
    )


def credentials() -> kopf.ConnectionInfo:
    """:func:`login_info`, or :class:`LoginFailed` saying what was missing or unreadable."""
    try:
        info = login_info()
    except LoginFailed:
        raise
    except Exception as exc:  # noqa: BLE001 - a token file or a kubeconfig can fail to read in many ways (a file, YAML, a key); each is the same refusal
        raise LoginFailed(f"the credentials could not be read: {type(exc).__name__}: {exc}") from None
    if info is None:
        raise LoginFailed(f"neither a ServiceAccount token (in a pod) nor a kubeconfig ({', '.join(kubeconfig_paths())}) was found")
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
