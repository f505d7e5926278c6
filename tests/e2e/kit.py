"""What the end-to-end tests share: a handle on the cluster under test, and polling."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "cluster"))

import localcluster  # noqa: E402
from ports import free_port  # noqa: E402

CRD_FILE = ROOT / "crds" / "inferentia.dev_inferentiamodels.yaml"
# `make test-kind` names the kind cluster's state directory (cluster/kindcluster.py).
KIND_STATE = os.environ.get("INFERENTIA_E2E_KIND")
USE_EXISTING = os.environ.get("INFERENTIA_E2E_USE_EXISTING_CLUSTER") == "1" or bool(KIND_STATE)


@dataclass
class Cluster:
    """A reachable cluster: its kubeconfig and the tools to drive it. ``local`` is the project's
    own control plane when the suite started it; ``node`` is what plays the real node (the
    local cluster's, or the kind cluster's node), or None where there is none."""

    kubeconfig: Path
    bin_dir: Path
    local: localcluster.LocalCluster | None
    node: Any = None

    def tool(self, name: str) -> str:
        override = os.environ.get(f"INFERENTIA_{name.upper()}")
        return override or str(self.bin_dir / name)

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run([self.tool("kubectl"), *args], input=input, capture_output=True, text=True, env=self.env, timeout=120)
        if check and result.returncode:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr}")
        return result

    def get(self, *args: str) -> dict:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def install_inference_extension(self) -> None:
        localcluster.install_inference_extension(self.kubectl)

    def neuron_capacity(self, family: str | None = None, resource: str = "aws.amazon.com/neuron") -> list[int]:
        """Neuron chips (or, with ``resource``, NeuronCores) per node, of one family's instance types when ``family`` is given."""
        # The real node is tainted for the real-node tests alone: it is not fleet capacity.
        nodes = [n for n in self.get("nodes")["items"] if "inferentia.dev/real-node" not in n["metadata"]["labels"]]
        if family:
            prefix = f"{family}."
            nodes = [n for n in nodes if n["metadata"]["labels"].get("node.kubernetes.io/instance-type", "").startswith(prefix)]
        return sorted(int(n["status"].get("allocatable", {}).get(resource, 0)) for n in nodes)


def condition(body: dict, type_: str) -> dict:
    """A model's condition of that type, or {}."""
    return next((c for c in (body.get("status") or {}).get("conditions") or [] if c["type"] == type_), {})


def ready_now(model: dict) -> bool:
    """Ready for the spec as it is now: a status written before the last apply does not count."""
    ready = condition(model, "Ready")
    return ready.get("status") == "True" and ready.get("observedGeneration") == model["metadata"]["generation"]


def wait_for(predicate, timeout: float, what: str, interval: float = 0.25):
    """Polls predicate until it returns a truthy value, which is returned."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


class OperatorProcess:
    """`inferentia-operator run` as a separate process, as it runs in production."""

    def __init__(
        self, kubeconfig: Path, log_path: Path, resync_seconds: float = 3.0, peering: str = "inferentia-operator",
        extra_args: tuple[str, ...] = (), python: str = sys.executable, key_namespace: str | None = None,
    ):  # fmt: skip
        self.kubeconfig, self.log_path, self.extra_args, self.python = kubeconfig, log_path, extra_args, python
        self.key_namespace = key_namespace or KEY_NAMESPACE
        self.resync_seconds, self.peering = resync_seconds, peering
        self.proc: subprocess.Popen | None = None
        self.port = free_port()
        self.metrics_port = free_port()

    def start(self) -> None:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [
                self.python, "-m", "inferentia_operator", "run",
                "--liveness", f"http://127.0.0.1:{self.port}/healthz", "--metrics-port", str(self.metrics_port),
                "--resync-seconds", str(self.resync_seconds), "--peering", self.peering, "--key-namespace", self.key_namespace,
                *self.extra_args,
            ],
            env={**os.environ, "KUBECONFIG": str(self.kubeconfig)},
            stdout=log, stderr=subprocess.STDOUT,
            # Killed with the test run, as its control plane is: a run stopped outright (make
            # test's runs beside each other are stopped with SIGTERM) runs no teardown.
            preexec_fn=localcluster.die_with_parent,
        )  # fmt: skip
        import urllib.request

        def healthy():
            assert self.proc.poll() is None, f"the operator exited: see {self.log_path}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=1) as r:
                    return r.status == 200
            except OSError:
                return False

        wait_for(healthy, 60, "the operator's liveness endpoint")

    def kill(self) -> None:
        """kill -9: no shutdown handler runs, as when a node dies."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


CHART = ROOT / "charts" / "inferentia-operator"
# The chart requires image.repository: the image the local cluster builds and imports under this name.
LOCAL_IMAGE = ("--set", "image.repository=inferentia-operator")


# Where the operators these tests start keep their proof key Secret (run --key-namespace),
# with the chart's Role for it. Not the release namespace helm_template renders into: the
# plain-manifests test deletes that one with its operator.
KEY_NAMESPACE = "e2e-operator-keys"
PROOF_KEY_ROLE_SUFFIX = "-proof-key"


def helm_template(cluster: Cluster, *args: str, release: str = "inferentia-operator", namespace: str = "inferentia-system") -> list[dict]:
    out = subprocess.run(
        [cluster.tool("helm"), "template", release, str(CHART), "--namespace", namespace, *LOCAL_IMAGE, *args],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    return [d for d in yaml.safe_load_all(out) if d]


def _bind_to_user(roles: list[dict], user: str) -> list[dict]:
    """The roles and, for each, a binding of the same name and scope that grants it to ``user``."""
    bindings = []
    for role in roles:
        binding_kind = "RoleBinding" if role["kind"] == "Role" else "ClusterRoleBinding"
        bindings.append(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": binding_kind,
                "metadata": dict(role["metadata"]),
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role["kind"], "name": role["metadata"]["name"]},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
            }
        )
    return roles + bindings


def bind_user_to_operator_role(cluster: Cluster, user: str, name: str) -> None:
    """The chart's ClusterRole (default values), renamed, bound to ``user``: what the operator gets in production."""
    docs = helm_template(cluster)
    [role] = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "inferentia-operator"]
    role["metadata"] = {"name": name}
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(_bind_to_user([role], user)))
    _bind_proof_key_role(cluster, docs, user)


def _bind_proof_key_role(cluster: Cluster, docs: list[dict], user: str) -> None:
    """The chart's Role for the proof key Secret, in the tests' key namespace (KEY_NAMESPACE),
    bound to ``user`` by a binding of its own."""
    [role] = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"].endswith(PROOF_KEY_ROLE_SUFFIX)]
    role["metadata"]["namespace"] = KEY_NAMESPACE  # the chart's rules, in the tests' key namespace
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KEY_NAMESPACE}}
    [binding] = [b for b in _bind_to_user([role], user) if b["kind"] == "RoleBinding"]
    binding["metadata"] = {**binding["metadata"], "name": f"{role['metadata']['name']}-{user}"}
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([namespace, role, binding]))


def service_account_kubeconfig(cluster: Cluster, namespace: str, name: str, path: Path) -> Path:
    """A kubeconfig that authenticates with a token of that ServiceAccount (TokenRequest API)."""
    token = cluster.kubectl("create", "token", name, "-n", namespace, "--duration=1h").stdout.strip()
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    context = next(c for c in config["contexts"] if c["name"] == config["current-context"])
    cluster_entry = next(c for c in config["clusters"] if c["name"] == context["context"]["cluster"])
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [cluster_entry],
                "users": [{"name": name, "user": {"token": token}}],
                "contexts": [{"name": "sa", "context": {"cluster": cluster_entry["name"], "user": name}}],
                "current-context": "sa",
            }
        )
    )
    path.chmod(0o600)
    return path


def bind_user_to_namespaced_roles(cluster: Cluster, user: str, namespaces: list[str]) -> None:
    """The chart's Roles for watchNamespaces, bound to ``user``: no cluster-wide rights at all."""
    docs = helm_template(cluster, "--set", "watchNamespaces={" + ",".join(namespaces) + "}")
    roles = [d for d in docs if d["kind"] == "Role" and not d["metadata"]["name"].endswith(PROOF_KEY_ROLE_SUFFIX)]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(_bind_to_user(roles, user)))
    _bind_proof_key_role(cluster, docs, user)


def listeners_of(state_dir: Path) -> dict[int, int]:
    """Listening TCP ports owned by a process whose command line names `state_dir`: port to pid.

    Every component of a local cluster names its state directory on its command line. Asking
    who owns a port, not whether it is in use, keeps a check of "nothing of that run still
    listens" true while other test runs on the machine bind the ports it freed."""
    listening: dict[str, int] = {}  # socket inode to port
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A":  # TCP_LISTEN
                listening[fields[9]] = int(fields[1].rsplit(":", 1)[1], 16)
    owners: dict[int, int] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if str(state_dir) not in (proc / "cmdline").read_bytes().decode(errors="replace"):
                continue
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:[") and (inode := target[8:-1]) in listening:
                    owners[listening[inode]] = int(proc.name)
        except OSError:  # the process ended while it was read
            continue
    return owners
