"""The operator's HTTP client of the API server (shell/transport.py), against a real HTTP
server on loopback: the credentials kopf's logins read, the request as the API server
receives it, a bounded wait, and a new login after the server refuses a token."""

import http.server
import json
import os
import ssl
import subprocess
import sys
import threading
import tomllib
from pathlib import Path

import kopf
import pytest

from inferentia_operator.shell.kube import Kube, TransientError
from inferentia_operator.shell.transport import LoginFailed, Transport, credentials

ROOT = Path(__file__).resolve().parent.parent


# A Python program's first lines that make the kubernetes library impossible to import, as in
# the operator's image, which does not install it.
HIDE_KUBERNETES = (
    "import sys\n"
    "class Hidden:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.split('.')[0] == 'kubernetes': raise ImportError('hidden: ' + name)\n"
    "sys.meta_path.insert(0, Hidden())\n"
)


class Recorder(http.server.BaseHTTPRequestHandler):
    """Answers 401 to the tokens in ``refuse``, else the request back as JSON; ``hang`` never answers."""

    refuse: set[str] = set()
    seen: list[dict] = []
    hang = threading.Event()

    def _answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        request = {
            "method": self.command, "path": self.path, "authorization": self.headers.get("Authorization"),
            "contentType": self.headers.get("Content-Type"), "body": json.loads(body) if body else None,
        }  # fmt: skip
        self.seen.append(request)
        if "/namespaces/hang/" in self.path:
            self.hang.wait(10)
            return
        token = (request["authorization"] or "").removeprefix("Bearer ")
        status, answer = (401, {"kind": "Status", "message": "Unauthorized"}) if token in self.refuse else (200, request)
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PATCH = do_DELETE = _answer

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    Recorder.refuse, Recorder.seen = set(), []
    Recorder.hang.clear()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    Recorder.hang.set()
    httpd.shutdown()


def test_a_call_reaches_the_server_with_the_logins_token_body_and_query(server):
    transport = Transport(lambda: kopf.ConnectionInfo(server=server, token="t1"))
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"}}
    echoed = Kube(transport).apply(body)
    assert echoed["method"] == "PATCH" and echoed["authorization"] == "Bearer t1"
    assert echoed["path"] == "/api/v1/namespaces/ns/configmaps/c?fieldManager=inferentia-operator&force=true"
    assert echoed["contentType"] == "application/apply-patch+yaml" and echoed["body"] == body


def test_a_refused_token_is_a_transient_error_and_the_next_call_logs_in_again(server):
    """A ServiceAccount token rotates (the kubelet rewrites the file): after a 401 the next call
    reads the credentials again, as kopf does for its watches."""
    tokens = iter(["old", "new"])
    logins = []

    def login():
        logins.append(next(tokens))
        return kopf.ConnectionInfo(server=server, token=logins[-1])

    Recorder.refuse = {"old"}
    k = Kube(Transport(login))
    with pytest.raises(TransientError) as refused:
        k.get("ConfigMap", "ns", "c")
    assert refused.value.code == 401
    assert k.get("ConfigMap", "ns", "c")["authorization"] == "Bearer new"
    assert logins == ["old", "new"]
    assert [r["authorization"] for r in Recorder.seen] == ["Bearer old", "Bearer new"]


def test_a_server_that_never_answers_fails_the_call_after_the_read_timeout(server):
    k = Kube(Transport(lambda: kopf.ConnectionInfo(server=server, token="t"), read_timeout=0.5))
    with pytest.raises(TransientError) as waited:
        k.get("ConfigMap", "hang", "c")
    assert waited.value.reason == "ReadTimeoutError"


def test_no_credentials_is_a_transient_error_that_says_where_it_looked(monkeypatch, tmp_path):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    with pytest.raises(TransientError) as failed:
        Kube(Transport()).get("ConfigMap", "ns", "c")
    assert "absent" in failed.value.message
    monkeypatch.delenv("KUBECONFIG")
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(LoginFailed, match="neither a ServiceAccount token"):
        credentials()


def test_in_a_pod_the_server_is_the_kubelets_address_of_the_kubernetes_service(monkeypatch):
    """client-go's in-cluster rule: KUBERNETES_SERVICE_HOST and _PORT, which need no cluster DNS
    (the local cluster runs none); kopf's own login names kubernetes.default.svc."""
    from inferentia_operator.shell.transport import login_info

    token = kopf.ConnectionInfo(server="https://kubernetes.default.svc", token="t", ca_path="/ca.crt")
    monkeypatch.setattr(kopf, "login_with_service_account", lambda settings: token)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert login_info().server == "https://kubernetes.default.svc"
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    found = login_info()
    assert (found.server, found.token, found.ca_path) == ("https://10.96.0.1:443", "t", "/ca.crt")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    assert login_info().server == "https://[fd00::1]:443"


def test_a_kubeconfig_with_a_client_certificate_makes_a_tls_context(tmp_path, monkeypatch):
    """The local control plane's kind of kubeconfig: a CA and a client certificate as files. The
    server on loopback speaks TLS with that CA's certificate and requires the client's, so the
    call is answered only if the transport verified the server and presented the certificate."""
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=t",
         "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(tmp_path / "k.pem"), "-out", str(tmp_path / "c.pem")],
        check=True, capture_output=True,
    )  # fmt: skip
    Recorder.refuse, Recorder.seen = set(), []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(tmp_path / "c.pem"))
    tls.load_cert_chain(str(tmp_path / "c.pem"), str(tmp_path / "k.pem"))
    tls.verify_mode = ssl.CERT_REQUIRED  # no client certificate, no answer
    httpd.socket = tls.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    server = f"https://127.0.0.1:{httpd.server_address[1]}"
    config = {
        "current-context": "c",
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "clusters": [{"name": "k", "cluster": {"server": server, "certificate-authority": str(tmp_path / "c.pem")}}],
        "users": [{"name": "u", "user": {"client-certificate": str(tmp_path / "c.pem"), "client-key": str(tmp_path / "k.pem")}}],
    }
    (tmp_path / "config").write_text(json.dumps(config))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "config"))
    try:
        assert credentials().server == server
        echoed = Kube(Transport(credentials)).get("ConfigMap", "ns", "c")
        assert echoed["path"] == "/api/v1/namespaces/ns/configmaps/c" and len(Recorder.seen) == 1
    finally:
        httpd.shutdown()


def test_the_operator_runs_without_the_kubernetes_client_library():
    """The operator's image installs the runtime dependencies alone, and the official client is
    not one of them: every program of the package imports with it hidden (kopf would load it
    whenever it is installed, and it is about a fifth of the operator's memory at start)."""
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert not [d for d in dependencies if d.startswith("kubernetes")], dependencies
    code = (
        HIDE_KUBERNETES + "import inferentia_operator.cli, inferentia_operator.shell.runner, inferentia_operator.batching.node_cache\n"
        "import kopf\n"
        "kopf.OperatorRegistry()\n"
        "print(sorted(n for n in sys.modules if n.split('.')[0] == 'kubernetes'))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stdout + result.stderr


def exec_kubeconfig(tmp_path: Path, server: str) -> Path:
    """A kubeconfig whose user is an exec credential plugin (client.authentication.k8s.io/v1,
    as aws eks get-token is): a program that prints a new token each time it runs."""
    plugin = tmp_path / "get-token.py"
    plugin.write_text(
        "import json, pathlib\n"
        f"runs = pathlib.Path({str(tmp_path / 'runs')!r})\n"
        "n = int(runs.read_text()) + 1 if runs.exists() else 1\n"
        "runs.write_text(str(n))\n"
        "print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1', 'kind': 'ExecCredential',\n"
        "                  'status': {'token': f'exec-token-{n}'}}))\n"
    )
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "eks"}}],
        "clusters": [{"name": "k", "cluster": {"server": server}}],
        "users": [{"name": "eks", "user": {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": sys.executable, "args": [str(plugin)],
            "interactiveMode": "Never"}}}],
    }  # fmt: skip
    (tmp_path / "config").write_text(json.dumps(config))
    return tmp_path / "config"


def test_a_kubeconfig_whose_user_is_an_exec_plugin_logs_in_with_its_token_and_runs_it_again_after_a_401(server, tmp_path, monkeypatch):
    """An EKS kubeconfig authenticates with an exec plugin (aws eks get-token), whose tokens
    expire: the official client's loader runs it, and a refused token makes the next call run it again."""
    monkeypatch.setenv("KUBECONFIG", str(exec_kubeconfig(tmp_path, server)))
    k = Kube(Transport(credentials))
    assert k.get("ConfigMap", "ns", "c")["authorization"] == "Bearer exec-token-1"
    Recorder.refuse = {"exec-token-1"}  # expired
    with pytest.raises(TransientError):
        k.get("ConfigMap", "ns", "c")
    assert k.get("ConfigMap", "ns", "c")["authorization"] == "Bearer exec-token-2"
    assert (tmp_path / "runs").read_text() == "2"


def test_without_the_kubeconfig_extra_an_exec_plugin_user_is_refused_with_what_to_install(server, tmp_path):
    """The operator's image has no kubernetes library: kopf's own reader runs no plugin, and the
    login says so rather than calling the API server with no credentials."""
    config = exec_kubeconfig(tmp_path, server)
    code = (
        HIDE_KUBERNETES + "from inferentia_operator.shell.transport import LoginFailed, credentials\n"
        "try:\n"
        "    credentials()\n"
        "except LoginFailed as exc:\n"
        "    print(exc)\n"
    )
    env = {**os.environ, "KUBECONFIG": str(config)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert "install 'inferentia-operator[kubeconfig]'" in result.stdout, result.stdout + result.stderr
    assert not (tmp_path / "runs").exists()
