"""A real local Kubernetes control plane on loopback, with simulated Inferentia nodes.

Starts etcd, kube-apiserver (generated CA and certificates, RBAC authorization),
kube-controller-manager, kube-scheduler and kwok, on ports picked free at start,
from the binaries cluster/build.sh compiles. kwok keeps the fleet of
cluster/fleet.yaml Ready and runs pods through their lifecycle.

    python cluster/localcluster.py up [--state-dir DIR]    # prints the kubeconfig path
    python cluster/localcluster.py down [--state-dir DIR]
    python cluster/localcluster.py status [--state-dir DIR]

With ``real_node=True`` (``make cluster-up``, ``make demo``, and the e2e suite's cluster when
a test of the run needs the node) it also starts one real node (cluster/realnode.py): a
kubelet with containerd, runc, a CNI bridge, kube-proxy and a Neuron device-plugin stand-in,
where pods really run, with CoreDNS as their cluster DNS; :meth:`LocalCluster.add_real_node` starts a second such node for a test.
That needs root; without it the cluster starts without the node and says why
(:attr:`LocalCluster.real_node_skipped`).

Tests use :class:`LocalCluster` directly (see tests/e2e/conftest.py).
"""

from __future__ import annotations

import argparse
import base64
import ctypes
import functools
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import yaml

import realnode
from inferentia_operator.core.catalogue import EFA_DEVICES, EFA_RESOURCE, FAMILIES, NEURON_RESOURCE, NEURONCORE_RESOURCE
from ports import free_port

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEFAULT_STATE = REPO / ".cluster"
FLEET = HERE / "fleet.yaml"
NEURON_TAINT = {"key": "aws.amazon.com/neuron", "value": "true", "effect": "NoSchedule"}
SERVICE_CIDR = "10.96.0.0/16"


class ClusterError(RuntimeError):
    pass


@functools.cache
def bin_dir() -> Path:
    """Builds what is missing (a no-op when cached) and returns the binaries' folder; once a
    process, and not at all when make has just built it (INFERENTIA_CONTROLPLANE_BUILT)."""
    check = ["--print"] if os.environ.get("INFERENTIA_CONTROLPLANE_BUILT") else []
    out = subprocess.run(["bash", str(HERE / "build.sh"), *check], check=True, stdout=subprocess.PIPE, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


class PortInUse(ClusterError):
    """A component could not bind the port it was given: start again on new ones."""


def die_with_parent() -> None:
    """Child side of fork: receive SIGKILL when the process that started us dies."""
    os.setsid()
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


_EC_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def _sign(pki: Path, name: str, subject: str, extensions: str) -> None:
    """A key and a certificate for ``subject``, signed by the CA in ``pki``: NAME.key, NAME.crt."""
    (pki / f"{name}.ext").write_text(extensions)
    _openssl("req", *_EC_KEY, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject, cwd=pki)
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", "30", "-out", f"{name}.crt", "-extfile", f"{name}.ext", cwd=pki,
    )  # fmt: skip


def issue_client_cert(pki: Path, name: str, user: str, groups: tuple[str, ...] = ()) -> None:
    """A client certificate for ``user`` in ``groups`` (RBAC subjects), signed by the cluster CA."""
    _sign(pki, name, "".join(f"/O={g}" for g in groups) + f"/CN={user}", "extendedKeyUsage=clientAuth\n")


def make_pki(pki: Path) -> None:
    """A CA, the API server's serving certificate, the admin's, the real node's and kube-proxy's
    client certificates, and the service-account key."""
    pki.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", *_EC_KEY, "-keyout", "ca.key", "-out", "ca.crt", "-days", "30", "-subj", "/CN=inferentia-local-ca", cwd=pki)
    _sign(
        pki,
        "apiserver",
        "/CN=kube-apiserver",
        f"subjectAltName=IP:127.0.0.1,IP:{realnode.GATEWAY},IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
        "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\nextendedKeyUsage=serverAuth\n",
    )
    issue_client_cert(pki, "admin", "kubernetes-admin", ("system:masters",))
    # The node authorizer's and kube-proxy's own identities (their default RBAC bindings).
    issue_client_cert(pki, "kubelet", f"system:node:{realnode.NODE_NAME}", ("system:nodes",))
    issue_client_cert(pki, "kube-proxy", "system:kube-proxy")
    # The identity the API server's aggregation layer proxies requests to extension API
    # servers with (KEDA's external metrics): --proxy-client-cert-file, --requestheader-allowed-names.
    issue_client_cert(pki, "front-proxy-client", "front-proxy-client")
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "sa.key", cwd=pki)
    _openssl("ec", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)


# Write requests, by whom and on what: lets tests count what the operator writes.
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    verbs: [create, update, patch, delete, deletecollection]
  - level: None
"""


def write_kubeconfig(path: Path, pki: Path, server: str, user: str = "admin") -> None:
    def b64(name: str) -> str:
        return base64.b64encode((pki / name).read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "inferentia-local", "cluster": {"server": server, "certificate-authority-data": b64("ca.crt")}}],
        "users": [{"name": user, "user": {"client-certificate-data": b64(f"{user}.crt"), "client-key-data": b64(f"{user}.key")}}],
        "contexts": [{"name": "inferentia-local", "context": {"cluster": "inferentia-local", "user": user}}],
        "current-context": "inferentia-local",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)


def user_kubeconfig(state: Path, pki: Path, server: str, user: str, groups: tuple[str, ...] = ()) -> Path:
    """``state/kubeconfig-user-<user>``, with a client certificate for ``user`` from the CA in ``pki``."""
    name = "user-" + "".join(c if c.isalnum() else "-" for c in user)
    issue_client_cert(pki, name, user, groups)
    path = state / f"kubeconfig-{name}"
    write_kubeconfig(path, pki, server, user=name)
    return path


# Neuron chips and cores of every instance type, from the operator's own catalogue.
NEURON_SHAPES = {itype: (chips, f) for f in FAMILIES.values() for itype, chips in f.instance_chips.items()}


def fleet_nodes(fleet_file: Path = FLEET) -> list[dict]:
    """The Node objects of the simulated fleet."""
    fleet = yaml.safe_load(fleet_file.read_text())
    nodes = []
    for group in fleet["nodes"]:
        itype = group["instanceType"]
        shape = fleet["instanceTypes"][itype]
        chips, family = NEURON_SHAPES.get(itype, (0, None))
        resources = {"cpu": str(shape["cpu"]), "memory": str(shape["memory"]), "pods": str(shape["pods"])}
        if family:
            resources |= {
                NEURON_RESOURCE: str(chips),
                NEURONCORE_RESOURCE: str(chips * family.physical_cores_per_chip),
            }
        if itype in EFA_DEVICES:
            # As AWS's EFA device plugin advertises them, for replicas across nodes.
            resources[EFA_RESOURCE] = str(EFA_DEVICES[itype])
        for i in range(int(group["count"])):
            name = f"{itype.replace('.', '-')}-{i}"
            nodes.append(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": name,
                        "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                        "labels": {
                            "kubernetes.io/hostname": name,
                            "kubernetes.io/os": "linux",
                            "kubernetes.io/arch": "amd64",
                            "node.kubernetes.io/instance-type": itype,
                            "type": "kwok",
                        },
                    },
                    "spec": {"taints": [NEURON_TAINT]} if chips else {},
                    "status": {"capacity": resources, "allocatable": resources},
                }
            )
    return nodes


def wait_established(kubectl: Callable[..., object], *crds: str, timeout: float = 60.0) -> None:
    """Until each CRD named (none: every CRD) is Established. Asked again every 0.2 s rather than
    with `kubectl wait --for=condition=Established`, which fails at once (".status.conditions
    accessor error: <nil>") on a CRD whose status has no conditions yet, as one applied a
    moment before may not."""
    deadline = time.monotonic() + timeout
    while True:
        out = kubectl("get", "crd", *crds, "-o", "json")
        found = json.loads(out if isinstance(out, str) else getattr(out, "stdout", ""))
        items = found["items"] if "items" in found else [found]
        pending = [
            crd["metadata"]["name"] for crd in items
            if not any(c["type"] == "Established" and c["status"] == "True" for c in (crd.get("status") or {}).get("conditions") or [])
        ]  # fmt: skip
        if not pending:
            return
        if time.monotonic() > deadline:
            raise ClusterError(f"CRDs not Established after {timeout:g} s: {pending}")
        time.sleep(0.2)


def install_inference_extension(kubectl: Callable[..., object]) -> None:
    """The Gateway API Inference Extension's CRDs (built from its Go module by build.sh), applied
    as users install them with ``kubectl``, and waited for until the API server serves
    InferencePools."""
    kubectl("apply", "--server-side", "-f", str(bin_dir() / "inference-extension-crds"))
    wait_established(kubectl, "inferencepools.inference.networking.k8s.io")


class LocalCluster:
    """One local control plane whose state (data, PKI, logs, kubeconfig) lives in ``state_dir``."""

    COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")

    def __init__(
        self,
        state_dir: Path = DEFAULT_STATE,
        fleet_file: Path = FLEET,
        die_with_parent: bool = False,
        audit_policy: str = AUDIT_POLICY,
        real_node: bool = False,
    ):
        self.state = Path(state_dir).resolve()
        # Why the real node did not start (not asked for, or not possible here); None when it runs.
        self.real_node_skipped: str | None = None if real_node else "not asked for"
        self.real_node: realnode.RealNode | None = None
        self.fleet_file = fleet_file
        self.audit_policy = audit_policy
        self.die_with_parent = die_with_parent
        self.kubeconfig = self.state / "kubeconfig"
        self.state_file = self.state / "state.json"
        self.audit_log = self.state / "logs" / "audit.log"

    # -- processes -------------------------------------------------------------------------
    def _start(self, name: str, argv: list[str], pids: dict[str, int], env: dict[str, str] | None = None) -> None:
        log = open(self.state / "logs" / f"{name}.log", "ab")
        kwargs = {"preexec_fn": die_with_parent} if self.die_with_parent else {"start_new_session": True}
        full_env = {**os.environ, **env} if env else None
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=full_env, **kwargs)
        pids[name] = proc.pid
        argvs = self.recorded().get("argv", {})
        argvs[name] = argv
        self._save(pids=pids, argv=argvs)

    # -- faults, for the fault tests -------------------------------------------------------
    def stop_component(self, name: str) -> None:
        """Stops one component (the API server, say) and leaves the others running."""
        stop_process_groups([self.recorded()["pids"][name]])

    def start_component(self, name: str, timeout: float = 60.0) -> None:
        """Starts a stopped component again, as it was started, and waits until it answers."""
        data = self.recorded()
        pids = data["pids"]
        self._start(name, data["argv"][name], pids)
        if name == "kube-apiserver":
            self._wait(f"{self.server()}/readyz", time.monotonic() + timeout, name, pids, self.state / "pki")

    def reshape_real_node(self, instance_type: str) -> None:
        """The real node's device plugin stand-in registers again with the Neuron devices of
        ``instance_type`` (realnode.SHAPES); the caller relabels the node and waits for the
        new capacity. For tests of another family than the node's default inf2.24xlarge."""
        assert self.real_node is not None, "no real node"
        self.real_node.reshape(instance_type, self.recorded()["pids"], stop_process_groups)

    def real_node_dra(self, on: bool, instance_type: str = "inf2.24xlarge") -> None:
        """The real node in DRA mode (its devices from the Neuron DRA driver stand-in), or back
        to the device plugin stand-in as ``instance_type``. The caller relabels the node."""
        assert self.real_node is not None, "no real node"
        pids = self.recorded()["pids"]
        if on:
            self.real_node.dra_mode(self.kubeconfig, pids, stop_process_groups)
        else:
            self.real_node.device_plugin_mode(instance_type, pids, stop_process_groups)
        self._save(pids=pids)

    def add_real_node(self, instance_type: str, timeout: float = 120.0) -> str:
        """A second real node (realnode.RealNode, index 1) as ``instance_type``, for a test of
        pods on two nodes; returns its name once it is Ready and advertises its devices.
        remove_real_node (or down) stops it. It holds the serving image and the sandbox's only."""
        assert self.real_node is not None, "no real node"
        deadline = time.monotonic() + timeout
        images = [p for p in self.real_node.images if p.name.startswith(("pause-", "standin-"))]
        node = realnode.RealNode(self.state, bin_dir(), self._start, images, index=1)
        pki = self.state / "pki"
        issue_client_cert(pki, f"kubelet{node.suffix}", f"system:node:{node.name}", ("system:nodes",))
        kubeconfig = self.state / f"kubeconfig-kubelet{node.suffix}"
        write_kubeconfig(kubeconfig, pki, self.server(), user=f"kubelet{node.suffix}")
        self._save(extra_real_nodes=[1])
        pids = self.recorded()["pids"]
        node.network_up()
        node.start({"kubelet": kubeconfig}, pki, pids, deadline, instance_type)
        self._wait_for_node(node, realnode.SHAPES[instance_type][0], deadline)
        return node.name

    def remove_real_node(self) -> None:
        """Stops the second real node, removes everything it made, and deletes its Node."""
        pids = dict(self.recorded().get("pids", {}))
        node = realnode.RealNode(self.state, bin_dir(), self._start, [], index=1)
        node.stop(stop_process_groups, pids)
        kubectl = [str(bin_dir() / "kubectl"), "--kubeconfig", str(self.kubeconfig)]
        subprocess.run([*kubectl, "delete", "node", node.name, "--ignore-not-found", "--wait=false"], capture_output=True)
        self._save(pids={k: v for k, v in pids.items() if not k.endswith(node.suffix)}, extra_real_nodes=[])

    def etcd(self, method: str, body: dict) -> dict:
        """A call to etcd's v3 JSON gateway (``method`` such as "kv/put" or "kv/compaction")."""
        url = f"http://127.0.0.1:{self.ports()['etcd']}/v3/{method}"
        request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read() or b"{}")

    def _save(self, **fields) -> None:
        data = self.recorded()
        data.update(fields)
        self.state_file.write_text(json.dumps(data, indent=2))

    def recorded(self) -> dict:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}

    def running(self) -> bool:
        pids = self.recorded().get("pids", {})
        return bool(pids) and all(alive(pid) for pid in pids.values())

    # -- lifecycle -------------------------------------------------------------------------
    # Starts in a row that may each lose a port to another program before giving up.
    START_ATTEMPTS = 3

    def up(self, timeout: float = 120.0) -> Path:
        if self.running():
            return self.kubeconfig
        for attempt in range(1, self.START_ATTEMPTS + 1):
            try:
                return self._up(timeout)
            except PortInUse as exc:
                if attempt == self.START_ATTEMPTS:
                    raise
                print(f"{exc}; starting again on new ports", file=sys.stderr)
        raise AssertionError("unreachable")

    def _up(self, timeout: float) -> Path:
        self.down()  # a half-dead earlier run
        started = time.monotonic()
        bins = bin_dir()
        for sub in ("logs", "etcd", "pki", "kwok"):
            (self.state / sub).mkdir(parents=True, exist_ok=True)
        pki = self.state / "pki"
        make_pki(pki)
        ports = {name: free_port() for name in ("etcd", "etcd-peer", "apiserver", "controller-manager", "scheduler", "kwok")}
        self._save(ports=ports, pids={})
        pids: dict[str, int] = {}
        if self.real_node_skipped is None:
            self.real_node_skipped = realnode.unavailable_reason()
        try:
            if self.real_node_skipped is None:
                import images  # only the real node needs them

                self.real_node = realnode.RealNode(self.state, bins, self._start, images.build(bins))
                self.real_node.network_up()
                self._save(real_node=True)
            self._start_all(bins, pki, ports, pids, started + timeout)
            self._start_leader_worker_sets(bins, pki, pids, started + timeout + 60)
            if self.real_node is not None:
                self._start_real_node(bins, pki, pids, started + timeout + 120)
                self._start_autoscaling(bins, pki, pids, started + timeout + 180)
        except BaseException:
            self.down()
            raise
        self._save(ready_seconds=round(time.monotonic() - started, 1))
        return self.kubeconfig

    def _start_all(self, bins: Path, pki: Path, ports: dict[str, int], pids: dict[str, int], deadline: float) -> None:
        etcd_url = f"http://127.0.0.1:{ports['etcd']}"
        peer_url = f"http://127.0.0.1:{ports['etcd-peer']}"
        self._start(
            "etcd",
            [
                str(bins / "etcd"), "--name", "local", "--data-dir", str(self.state / "etcd"),
                "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
                "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                "--initial-cluster", f"local={peer_url}",
                "--unsafe-no-fsync",  # throwaway test data: durability buys nothing, fsync costs seconds
                "--log-level", "warn",
            ],
            pids,
        )  # fmt: skip
        self._wait(f"{etcd_url}/health", deadline, "etcd", pids)

        # With a real node the API server listens on the node's bridge address too, the
        # only address its pods (the operator under Helm among them) can reach.
        host = realnode.GATEWAY if self.real_node else "127.0.0.1"
        server = f"https://{host}:{ports['apiserver']}"
        (self.state / "audit-policy.yaml").write_text(self.audit_policy)
        self.audit_log.unlink(missing_ok=True)
        self._start(
            "kube-apiserver",
            [
                str(bins / "kube-apiserver"), "--etcd-servers", etcd_url,
                "--bind-address", host, "--advertise-address", host,
                "--secure-port", str(ports["apiserver"]), "--cert-dir", str(pki),
                "--tls-cert-file", str(pki / "apiserver.crt"), "--tls-private-key-file", str(pki / "apiserver.key"),
                "--client-ca-file", str(pki / "ca.crt"),
                "--service-account-key-file", str(pki / "sa.pub"),
                "--service-account-signing-key-file", str(pki / "sa.key"),
                "--service-account-issuer", "https://kubernetes.default.svc",
                "--authorization-mode", "Node,RBAC", "--service-cluster-ip-range", SERVICE_CIDR,
                # Namespaces opt in to the real node (realnode.REAL_NODE_NAMESPACE_ANNOTATIONS).
                "--enable-admission-plugins", "NodeRestriction,PodNodeSelector,PodTolerationRestriction",
                "--kubelet-client-certificate", str(pki / "admin.crt"), "--kubelet-client-key", str(pki / "admin.key"),
                # Reach kubelets by address, never by a host name that would need a DNS look-up.
                "--kubelet-preferred-address-types", "InternalIP",
                "--allow-privileged=true", "--profiling=false", "--v", "1",
                "--audit-policy-file", str(self.state / "audit-policy.yaml"),
                "--audit-log-path", str(self.audit_log), "--audit-log-format", "json",
                "--audit-log-mode", "blocking",
                # The aggregation layer, for extension API servers (KEDA's external metrics API):
                # the requests it proxies carry the user in these headers, and it reaches the
                # extension server at its endpoint's address.
                "--requestheader-client-ca-file", str(pki / "ca.crt"), "--requestheader-allowed-names", "front-proxy-client",
                "--requestheader-username-headers", "X-Remote-User", "--requestheader-group-headers", "X-Remote-Group",
                "--requestheader-extra-headers-prefix", "X-Remote-Extra-",
                "--proxy-client-cert-file", str(pki / "front-proxy-client.crt"),
                "--proxy-client-key-file", str(pki / "front-proxy-client.key"),
                "--enable-aggregator-routing=true",
            ],
            pids,
        )  # fmt: skip
        self._wait(f"{server}/readyz", deadline, "kube-apiserver", pids, pki)
        write_kubeconfig(self.kubeconfig, pki, server)
        kubeconfig = str(self.kubeconfig)

        self._start(
            "kube-controller-manager",
            [
                str(bins / "kube-controller-manager"), "--kubeconfig", kubeconfig,
                "--authentication-kubeconfig", kubeconfig, "--authorization-kubeconfig", kubeconfig,
                "--bind-address", "127.0.0.1", "--secure-port", str(ports["controller-manager"]),
                "--leader-elect=false", "--root-ca-file", str(pki / "ca.crt"),
                "--service-account-private-key-file", str(pki / "sa.key"),
                "--service-cluster-ip-range", SERVICE_CIDR, "--profiling=false",
                "--controllers", "*,-bootstrap-signer-controller,-token-cleaner-controller",
            ],
            pids,
        )  # fmt: skip
        self._start(
            "kube-scheduler",
            [
                str(bins / "kube-scheduler"), "--kubeconfig", kubeconfig,
                "--authentication-kubeconfig", kubeconfig, "--authorization-kubeconfig", kubeconfig,
                "--bind-address", "127.0.0.1", "--secure-port", str(ports["scheduler"]),
                "--leader-elect=false", "--profiling=false",
            ],
            pids,
        )  # fmt: skip
        # The pinned kwok release's default stages (build.sh): nodes Ready, pods Ready, Job pods
        # Succeeded; and ours, which fails a compile on request (kwok-test-stages.yaml).
        kwok_config = bins / "kwok-stages.yaml"
        self._start(
            "kwok",
            [
                str(bins / "kwok"), "--kubeconfig", kubeconfig, "--config", str(kwok_config),
                "--config", str(HERE / "kwok-test-stages.yaml"),
                "--manage-nodes-with-annotation-selector", "kwok.x-k8s.io/node=fake",
                "--node-lease-duration-seconds", "40", "--cidr", "10.244.0.0/16", "--node-ip", "127.0.0.1",
                "--server-address", f"127.0.0.1:{ports['kwok']}",
            ],
            pids,
        )  # fmt: skip
        self._wait(f"https://127.0.0.1:{ports['controller-manager']}/healthz", deadline, "kube-controller-manager", pids)
        self._wait(f"https://127.0.0.1:{ports['scheduler']}/healthz", deadline, "kube-scheduler", pids)
        self._wait(f"http://127.0.0.1:{ports['kwok']}/healthz", deadline, "kwok", pids)

        kubectl = [str(bins / "kubectl"), "--kubeconfig", kubeconfig]
        nodes = {"apiVersion": "v1", "kind": "List", "items": fleet_nodes(self.fleet_file)}
        subprocess.run([*kubectl, "apply", "-f", "-"], input=json.dumps(nodes), text=True, check=True, capture_output=True)
        remaining = lambda: f"{max(1, int(deadline - time.monotonic()))}s"  # noqa: E731
        _run_or_fail([*kubectl, "wait", "--for=condition=Ready", "node", "--all", f"--timeout={remaining()}"])
        # Pods are refused until the namespace's default ServiceAccount exists.
        while True:
            if subprocess.run([*kubectl, "get", "serviceaccount", "default", "-n", "default"], capture_output=True).returncode == 0:
                break
            if time.monotonic() > deadline:
                raise ClusterError("the default ServiceAccount never appeared: see kube-controller-manager.log")
            time.sleep(0.2)

    def _start_real_node(self, bins: Path, pki: Path, pids: dict[str, int], deadline: float) -> None:
        server = f"https://{realnode.GATEWAY}:{self.ports()['apiserver']}"
        kubeconfigs = {}
        for user in ("kubelet", "kube-proxy"):
            kubeconfigs[user] = self.state / f"kubeconfig-{user}"
            write_kubeconfig(kubeconfigs[user], pki, server, user=user)
        assert self.real_node is not None
        self._start_cluster_dns(bins, pids, deadline)
        self.real_node.start(kubeconfigs, pki, pids, deadline)
        # The object store for compiled artefacts and model files, on the bridge's address so
        # that pods reach it: moto's S3 server (PyPI's moto[server]), in memory, no build.
        store = free_port(realnode.GATEWAY)
        self._start("object-store", [sys.executable, "-m", "moto.server", "-H", realnode.GATEWAY, "-p", str(store)], pids)
        self._wait(f"http://{realnode.GATEWAY}:{store}/moto-api/", deadline, "object-store", pids)
        self._save(object_store=f"http://{realnode.GATEWAY}:{store}")
        self._wait_for_node(self.real_node, realnode.CHIPS, deadline)

    def _wait_for_node(self, node: realnode.RealNode, chips: int, deadline: float) -> None:
        """Until ``node`` is registered, Ready, and advertises ``chips`` Neuron devices."""
        kubectl = [str(bin_dir() / "kubectl"), "--kubeconfig", str(self.kubeconfig)]
        while True:
            found = subprocess.run([*kubectl, "get", "node", node.name, "-o", "json"], capture_output=True, text=True)
            if found.returncode == 0:
                status = json.loads(found.stdout)["status"]
                ready = any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", []))
                if ready and status.get("allocatable", {}).get(NEURON_RESOURCE) == str(chips):
                    return
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"node {node.name} is not Ready with {chips} Neuron devices: see logs/kubelet{node.suffix}.log "
                    f"and logs/device-plugin{node.suffix}.log"
                )
            time.sleep(0.5)

    def _start_cluster_dns(self, bins: Path, pids: dict[str, int], deadline: float) -> None:
        """CoreDNS (cluster/node/coredns) on the bridge's address, port 53, the real node's
        clusterDNS: it answers the cluster's names from the API server and nothing else, so no
        look-up leaves the machine. Ready once its kubernetes plugin has synced."""
        ready = free_port("127.0.0.1")
        corefile = self.state / "Corefile"
        corefile.write_text(
            f"{realnode.CLUSTER_DOMAIN}:53 {{\n"
            f"    bind {realnode.GATEWAY}\n    errors\n    ready 127.0.0.1:{ready}\n"
            f"    kubernetes {realnode.CLUSTER_DOMAIN} {{\n        kubeconfig {self.kubeconfig}\n    }}\n}}\n"
        )
        self._start("cluster-dns", [str(bins / "coredns"), "-conf", str(corefile)], pids)
        self._wait(f"http://127.0.0.1:{ready}/ready", deadline, "cluster-dns", pids)

    def _start_autoscaling(self, bins: Path, pki: Path, pids: dict[str, int], deadline: float) -> None:
        """Prometheus and KEDA (cluster/autoscaling.py), when they were built."""
        import autoscaling

        engines = autoscaling.Autoscaling(self.state, self.kubeconfig, bins, pki, self._start, self._wait, self._save)
        self._start_engine(engines, "autoscaling_skipped", pids, deadline)

    def _start_leader_worker_sets(self, bins: Path, pki: Path, pids: dict[str, int], deadline: float) -> None:
        """LeaderWorkerSet's controller and webhooks (cluster/leaderworkerset.py), when built."""
        import leaderworkerset

        engine = leaderworkerset.LeaderWorkerSets(self.state, self.kubeconfig, bins, pki, self._start, self._wait, self._save)
        self._start_engine(engine, "leaderworkerset_skipped", pids, deadline)

    def _start_engine(self, engine, skipped: str, pids: dict[str, int], deadline: float) -> None:
        """An engine users run beside the cluster, if it was built; else why not, recorded."""
        reason = engine.available()
        if reason:
            self._save(**{skipped: reason})
            return
        engine.start(pids, deadline, _sign)

    def prometheus(self) -> str | None:
        """Prometheus's URL (with the real node and the autoscaling engines), for queries."""
        return self.recorded().get("prometheus")

    def _wait(self, url: str, deadline: float, name: str, pids: dict[str, int], pki: Path | None = None) -> None:
        context = ssl.create_default_context()
        if pki is not None:
            context.load_verify_locations(pki / "ca.crt")
            context.load_cert_chain(pki / "admin.crt", pki / "admin.key")
        else:
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # health endpoints only
        while True:
            if not alive(pids[name]):
                log = self.state / "logs" / f"{name}.log"
                if "address already in use" in log.read_text(errors="replace")[-4000:]:
                    raise PortInUse(f"{name} could not bind its port (another program took it): see {log}")
                raise ClusterError(f"{name} exited during start: see {log}")
            try:
                with urllib.request.urlopen(url, timeout=2, context=context) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise ClusterError(f"{name} was not ready in time: see {self.state / 'logs' / (name + '.log')}")
            time.sleep(0.1)

    def down(self, grace: float = 10.0) -> None:
        """Stops every component and waits until none runs, and removes what the real node
        made (processes, mounts, cgroups, namespaces, links, routes, rules); safe to call twice."""
        pids = dict(self.recorded().get("pids", {}))
        for index in self.recorded().get("extra_real_nodes", []):
            realnode.RealNode(self.state, bin_dir(), self._start, [], index=index).stop(stop_process_groups, pids)
            self._save(extra_real_nodes=[])
        if self.recorded().get("real_node") or self.real_node is not None:
            node = self.real_node or realnode.RealNode(self.state, bin_dir(), self._start, [])
            node.stop(stop_process_groups, pids)
            self._save(real_node=False)
        stop_process_groups(list(pids.values()), grace)
        if self.state_file.exists():
            self._save(pids={})
        # The data and kubeconfig are throwaway; logs stay for a post-mortem.
        for sub in ("etcd", "pki", "kwok", "autoscaling"):
            subprocess.run(["rm", "-rf", str(self.state / sub)], check=False)
        self.kubeconfig.unlink(missing_ok=True)
        for path in self.state.glob("kubeconfig-*"):  # the node's, kube-proxy's and test users' keys
            path.unlink()

    def user_kubeconfig(self, user: str, groups: tuple[str, ...] = ()) -> Path:
        """A kubeconfig that authenticates as ``user`` (RBAC decides what it may do)."""
        return user_kubeconfig(self.state, self.state / "pki", self.server(), user, groups)

    def writes_by(self, user: str) -> list[dict]:
        """The audited write requests ``user`` made, oldest first."""
        entries = []
        for line in self.audit_log.read_text().splitlines() if self.audit_log.exists() else []:
            event = json.loads(line)
            if event.get("stage") == "ResponseComplete" and event.get("user", {}).get("username") == user:
                entries.append(event)
        return entries

    def kubectl(self, *args: str, input: str | None = None) -> str:
        """kubectl against this cluster as its admin; raises ClusterError with kubectl's message."""
        result = subprocess.run(
            [str(bin_dir() / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args], input=input, capture_output=True, text=True
        )
        if result.returncode:
            raise ClusterError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout

    def install_crds(self) -> None:
        """Everything in crds/ (the InferentiaModel CRD, kopf's peering CRDs), ready to use."""
        self.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
        wait_established(self.kubectl)

    def read_node_file(self, path: Path | str) -> str:
        """A file of the real node, as its kubelet sees it: on this machine."""
        return Path(path).read_text()

    def kubelet_dir(self) -> str:
        """The real node's kubelet's --root-dir (the chart's nodeCache.views.kubeletDir there)."""
        assert self.real_node is not None, "no real node"
        return str(self.real_node.kubelet_dir)

    def object_store(self) -> str | None:
        """The S3-compatible object store's endpoint (with the real node), for AWS_ENDPOINT_URL."""
        return self.recorded().get("object_store")

    def server(self) -> str:
        """The API server's URL, as this cluster's kubeconfigs name it."""
        return yaml.safe_load(self.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]

    def ports(self) -> dict[str, int]:
        return self.recorded().get("ports", {})


def _run_or_fail(argv: list[str]) -> None:
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode:
        raise ClusterError(f"{' '.join(argv[2:])}: {result.stderr.strip() or result.stdout.strip()}")


def alive(pid: int) -> bool:
    """Whether any thread of ``pid`` still runs (and so may still hold its sockets).

    A Go program's main thread turns zombie while its other threads are still exiting
    with the process's file descriptors, so a zombie is not yet gone: our own child is
    gone once it can be reaped (the kernel allows that only when every thread is
    gone), another process once no thread of it is left."""
    try:
        reaped, _ = os.waitpid(pid, os.WNOHANG)
        return reaped != pid
    except ChildProcessError:
        pass  # not our child: make cluster-down stopping what make cluster-up started
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0]
        return state != "Z" or len(os.listdir(f"/proc/{pid}/task")) > 1
    except (OSError, IndexError):
        return False


def stop_process_groups(pids: list[int], grace: float = 10.0) -> None:
    """SIGTERM each process group, SIGKILL what is left after ``grace`` seconds, and wait
    until no thread of any of them runs."""
    for pid in pids:
        _signal_group(pid, signal.SIGTERM)
    end = time.monotonic() + grace
    while any(alive(p) for p in pids) and time.monotonic() < end:
        time.sleep(0.05)
    for pid in pids:
        _signal_group(pid, signal.SIGKILL)
    while any(alive(p) for p in pids):
        time.sleep(0.05)


def _signal_group(pid: int, sig: int) -> None:
    for target in (lambda: os.killpg(pid, sig), lambda: os.kill(pid, sig)):
        try:
            target()
        except (ProcessLookupError, PermissionError):
            pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--no-real-node", action="store_true", help="only the simulated fleet")
    args = parser.parse_args(argv)
    cluster = LocalCluster(args.state_dir, real_node=not args.no_real_node)
    if args.command == "up":
        try:
            started = time.monotonic()
            path = cluster.up(args.timeout)
        except (ClusterError, subprocess.CalledProcessError) as exc:
            print(f"cluster-up failed: {exc}", file=sys.stderr)
            return 1
        print(f"local control plane ready in {time.monotonic() - started:.1f}s; kubeconfig: {path}", file=sys.stderr)
        if cluster.real_node_skipped:
            print(f"no real node: {cluster.real_node_skipped}", file=sys.stderr)
        print(path)
    elif args.command == "down":
        cluster.down()
        print("local control plane stopped", file=sys.stderr)
    else:
        running = cluster.running()
        print(json.dumps({"running": running, "ports": cluster.ports(), "kubeconfig": str(cluster.kubeconfig)}))
        return 0 if running else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
