"""`make test-kind`'s cluster: kind, on Docker or podman, set up as the real-node tests need it.

One kind node, from the node image cluster/kindnode.py builds here (or kindest/node, named by
INFERENTIA_KIND_NODE_IMAGE), plays the local cluster's real node (cluster/realnode.py): the
same name, labels and taints, the project's images loaded with ``kind load image-archive``, the
Neuron device-plugin stand-in as a DaemonSet, and the object store (moto's S3 server) as a pod.
kwok runs in the cluster as its own release deploys it, with the local cluster's stages, and
keeps the same simulated fleet (cluster/fleet.yaml) beside the kind node. The cluster DNS is
CoreDNS built here (cluster/node/coredns, the local cluster's), in kube-system as kubeadm deploys
it, answering the cluster's names and nothing else.

Nothing leaves the machine: the node sits on a container network of its own, created
``--internal`` (no NAT, no default route), its CNI masquerades nothing, and this machine
reaches its pod and Service ranges through routes to the node's address alone.
``down`` removes the cluster, the network, the routes and the state.

    python cluster/kindcluster.py up|down|status
"""

from __future__ import annotations

import argparse
import hashlib
import ipaddress
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import images  # noqa: E402
import kindnode  # noqa: E402
import localcluster  # noqa: E402
import realnode  # noqa: E402
from inferentia_operator.core.catalogue import EFA_DEVICES  # noqa: E402

NAME = "inferentia"
NETWORK = "inferentia-kind"
# Not the local cluster's (realnode.POD_CIDR, SERVICE_CIDR), so both can exist on one machine.
NETWORK_SUBNET = "10.87.0.0/24"
POD_SUBNET = "10.244.0.0/16"
SERVICE_SUBNET = "10.97.0.0/16"
SYSTEM_NAMESPACE = "inferentia-kind-system"
SUPPORT_IMAGE_REPO = "inferentia-kind-support"
# The programs of cluster/build.sh the support image carries.
SUPPORT_TOOLS = ("neuron-device-plugin-standin", "kwok", "coredns")
DEFAULT_STATE = REPO / ".kind"
STORE_PORT = 5000
# Pod addresses kwok gives the fleet's pods: not the kind node's pod range.
FLEET_POD_CIDR = "10.246.0.0/16"
# Where the DaemonSet keeps the stand-in /dev/neuronN files and the runtime stand-in's core locks.
NODE_DIR = "/var/lib/inferentia"
# Where the CNI plugins' host-local IPAM keeps the network's addresses (podman's CNI backend):
# network rm leaves it behind.
CNI_IPAM_DIR = Path("/var/lib/cni/networks") / NETWORK
IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
# podman's network backend for the run (cni or netavark), written into kindcluster's own
# containers.conf; unset, podman's own choice (podman 4 picks netavark when it is installed and
# nothing of podman's exists yet, else CNI, and remembers the choice in its storage). A cluster
# keeps the backend it was made with until ``down``.
BACKEND_VARIABLE = "INFERENTIA_KIND_NETWORK_BACKEND"
NETWORK_BACKENDS = ("cni", "netavark")


class KindError(RuntimeError):
    pass


def provider() -> str:
    """The engine kind runs on: KIND_EXPERIMENTAL_PROVIDER when set, else Docker when its engine
    answers, else podman."""
    chosen = os.environ.get("KIND_EXPERIMENTAL_PROVIDER")
    if chosen:
        return chosen
    if shutil.which("docker") and subprocess.run(["docker", "info"], capture_output=True).returncode == 0:
        return "docker"
    return "podman"


def network_backend() -> str | None:
    """The podman network backend INFERENTIA_KIND_NETWORK_BACKEND asks for, or None for podman's own."""
    chosen = os.environ.get(BACKEND_VARIABLE, "").strip().lower()
    if chosen and chosen not in NETWORK_BACKENDS:
        raise KindError(f"{BACKEND_VARIABLE}={chosen}: podman's network backends are {' and '.join(NETWORK_BACKENDS)}")
    return chosen or None


def log(message: str) -> None:
    print(f"[kind] {message}", file=sys.stderr, flush=True)


def run(*argv: str, env: dict | None = None, input: str | bytes | None = None, check: bool = True) -> subprocess.CompletedProcess:
    text = not isinstance(input, bytes)
    result = subprocess.run(list(argv), env=env, input=input, capture_output=True, text=text)
    if check and result.returncode:
        raise KindError(f"{' '.join(argv[:4])} failed: {result.stderr if text else result.stderr.decode(errors='replace')}")
    return result


class KindCluster:
    """The kind cluster and its state directory (kubeconfig, what ``up`` made)."""

    def __init__(self, state: Path = DEFAULT_STATE, bins: Path | None = None):
        self.state = state.resolve()
        self.bins = bins or localcluster.bin_dir()
        self.kubeconfig = self.state / "kubeconfig"
        self.engine = self.recorded().get("provider") or provider()

    # -- what up() recorded ------------------------------------------------------------------
    def recorded(self) -> dict:
        path = self.state / "state.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def _save(self, **fields) -> None:
        self.state.mkdir(parents=True, exist_ok=True)
        data = {**self.recorded(), **fields}
        (self.state / "state.json").write_text(json.dumps(data, indent=2))

    @property
    def env(self) -> dict[str, str]:
        env = {**os.environ, "KIND_EXPERIMENTAL_PROVIDER": self.engine, f"KIND_EXPERIMENTAL_{self.engine.upper()}_NETWORK": NETWORK}
        if self.engine == "podman":
            env["CONTAINERS_CONF"] = str(self.state / "containers.conf")
        return env

    @property
    def node_container(self) -> str:
        return f"{NAME}-control-plane"

    def kind(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return run(str(self.bins / "kind"), *args, env=self.env, check=check)

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        return run(str(self.bins / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args, input=input, check=check)

    def node_exec(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        """A command in the kind node's own namespaces (as ``docker exec``)."""
        return run(self.engine, "exec", self.node_container, *argv, env=self.env, check=check)

    # -- what the real-node tests ask of the node -------------------------------------------
    def object_store(self) -> str | None:
        return self.recorded().get("object_store")

    def kubelet_dir(self) -> str:
        """The kind node's kubelet's --root-dir: kubeadm's default."""
        return "/var/lib/kubelet"

    def prometheus(self) -> None:
        """No Prometheus or KEDA runs on the kind cluster (the local cluster runs them)."""
        return None

    def read_node_file(self, path: Path | str) -> str:
        """A file of the node, as the kubelet sees it (inside the kind node)."""
        return self.node_exec("cat", str(path)).stdout

    def reshape_real_node(self, instance_type: str) -> None:
        """The device plugin stand-in's DaemonSet takes ``instance_type``'s chips and cores
        (realnode.SHAPES); its pod starts again and registers them. The caller relabels the
        node and waits for the new capacity."""
        self.kubectl("apply", "-f", "-", input=json.dumps(device_plugin(self._support_image(), instance_type)))
        self.kubectl("rollout", "status", "-n", SYSTEM_NAMESPACE, "daemonset/neuron-device-plugin-standin", "--timeout=120s")

    def user_kubeconfig(self, user: str, groups: tuple[str, ...] = ()) -> Path:
        """A kubeconfig that authenticates as ``user``, with a certificate from kind's CA."""
        pki = self.state / "pki"
        pki.mkdir(exist_ok=True, mode=0o700)
        for name in ("ca.crt", "ca.key"):
            if not (pki / name).exists():
                (pki / name).write_text(self.read_node_file(f"/etc/kubernetes/pki/{name}"))
                (pki / name).chmod(0o600)
        return localcluster.user_kubeconfig(self.state, pki, self.server(), user, groups)

    def server(self) -> str:
        return f"https://{self.recorded()['node_ip']}:6443"

    def _support_image(self) -> str:
        return self.recorded()["support_image"]

    # -- up and down -------------------------------------------------------------------------
    def exists(self) -> bool:
        return NAME in self.kind("get", "clusters", check=False).stdout.split()

    def up(self) -> Path:
        if os.geteuid() != 0:
            raise KindError("make test-kind needs root: an internal container network and routes to it")
        self.state.mkdir(parents=True, exist_ok=True)
        self._save(provider=self.engine)
        if self.engine == "podman":
            self.containers_conf()
        if not Path("/lib/modules").exists():
            # kind mounts the host's /lib/modules into its nodes; a machine without modules has none.
            Path("/lib/modules").mkdir()
            self._save(made_lib_modules=True)
        if "ip_forward" not in self.recorded():
            self._save(ip_forward=IP_FORWARD.read_text().strip())
        self._network()
        node_image = kindnode.build(self.bins, self.engine)
        if not self.exists():
            log(f"creating cluster {NAME} from {node_image}")
            config = self.state / "kind-config.yaml"
            config.write_text(yaml.safe_dump(kind_config(upstream_image="INFERENTIA_KIND_NODE_IMAGE" in os.environ)))
            created = self.kind(
                "create", "cluster", "--name", NAME, "--image", node_image, "--config", str(config),
                "--kubeconfig", str(self.kubeconfig), "--wait", "120s", check=False,
            )  # fmt: skip
            # Docker publishes no port of a container on an --internal network, so kind's last
            # step, the kubeconfig with the API server's published port, fails ("failed to get
            # api server port") once the cluster is up and ready; podman publishes it. The
            # kubeconfig's server is the node's address anyway (below): kind's --internal
            # kubeconfig is written instead.
            if created.returncode:
                if "failed to get api server port" not in created.stderr or not self.exists():
                    raise KindError(f"kind create cluster failed: {created.stderr}")
                log(f"{self.engine} published no API server port on the internal network: kind's --internal kubeconfig")
                self.kubeconfig.unlink(missing_ok=True)
        if not self.kubeconfig.exists():
            self.kubeconfig.write_text(self.kind("get", "kubeconfig", "--internal", "--name", NAME).stdout)
        node_ip = run(
            self.engine,
            "inspect",
            self.node_container,
            "--format",
            '{{(index .NetworkSettings.Networks "' + NETWORK + '").IPAddress}}',
            env=self.env,
        ).stdout.strip()
        self._save(node_ip=node_ip)
        # Docker 20.10 gives a container on an --internal network a default route through the
        # network's gateway all the same (its firewall drops what the bridge would forward off
        # the network); podman gives none. The node goes without one on every engine: nothing
        # it or a pod sends can then leave the network, whatever this machine forwards.
        if self.node_exec("ip", "-4", "route", "show", "default").stdout.strip():
            log(f"{self.engine} gave the node a default route on the internal network: removing it")
            self.node_exec("ip", "-4", "route", "del", "default")
        # The API server by the node's address: a port published on an internal network does not
        # forward, and kubeadm's serving certificate names the node's address.
        config = yaml.safe_load(self.kubeconfig.read_text())
        for c in config["clusters"]:
            c["cluster"]["server"] = self.server()
        self.kubeconfig.write_text(yaml.safe_dump(config))
        self.kubeconfig.chmod(0o600)
        self.host_address(node_ip)
        for subnet in (POD_SUBNET, SERVICE_SUBNET):
            run("ip", "route", "replace", subnet, "via", node_ip)
        self._save(routes=[POD_SUBNET, SERVICE_SUBNET])
        support = self._load_images()
        self.install(support)
        return self.kubeconfig

    def containers_conf(self) -> None:
        """podman's default limits for a container are above what this machine lets a process
        raise them to ("error setting rlimit ... operation not permitted"): the nodes get the
        limits this process has, as the real node's processes do. Its own file, named by
        CONTAINERS_CONF, so the machine's podman configuration is left alone. RLIMIT_NPROC above
        32768 was refused here even below the hard limit."""
        import resource

        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        nproc = min(resource.getrlimit(resource.RLIMIT_NPROC)[1], 32768)
        conf = f'[containers]\ndefault_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]\n'
        # The network backend: INFERENTIA_KIND_NETWORK_BACKEND's, else the one this cluster was
        # made with, else podman's own choice. A network lives in one backend's configuration
        # only (CNI's /etc/cni/net.d, netavark's /etc/containers/networks): a cluster made with
        # one is neither seen nor removed by the other, so it keeps its backend until down.
        asked, made_with = network_backend(), self.recorded().get("network_backend")
        if asked and made_with and asked != made_with:
            raise KindError(
                f"the kind cluster of {self.state} runs on podman's {made_with} network backend, not {asked}: make kind-down first"
            )
        backend = asked or made_with
        if backend:
            conf += f'[network]\nnetwork_backend = "{backend}"\n'
        (self.state / "containers.conf").write_text(conf)
        info = run("podman", "info", "--format", "{{.Host.NetworkBackend}}", env=self.env, check=False)
        if info.returncode or not info.stdout.strip():
            raise KindError(f"podman refuses the {backend or 'default'} network backend: {info.stderr.strip()}")
        self._save(network_backend=info.stdout.strip())

    def _network(self) -> None:
        if run(self.engine, "network", "inspect", NETWORK, env=self.env, check=False).returncode == 0:
            return
        run(self.engine, "network", "create", "--internal", "--subnet", NETWORK_SUBNET, NETWORK, env=self.env)
        self._save(made_network=True)

    def network_details(self) -> tuple[str, str | None]:
        """The network's bridge on this machine and its gateway address, as the engine has them."""
        inspected = json.loads(run(self.engine, "network", "inspect", NETWORK, env=self.env).stdout)
        net = inspected[0] if isinstance(inspected, list) else inspected
        if self.engine == "podman":  # podman 4 and 5, either backend
            gateways = [s.get("gateway") for s in net.get("subnets") or [] if s.get("subnet") == NETWORK_SUBNET]
            return net["network_interface"], next(filter(None, gateways), None)
        # Docker: br-<the first 12 of its id>, unless the network names its bridge itself.
        bridge = (net.get("Options") or {}).get("com.docker.network.bridge.name") or f"br-{net['Id'][:12]}"
        gateways = [c.get("Gateway") for c in (net.get("IPAM") or {}).get("Config") or [] if c.get("Subnet") == NETWORK_SUBNET]
        return bridge, next(filter(None, gateways), None)

    def host_address(self, node_ip: str) -> None:
        """This machine's own address on the node's network, which the routes to the pod and
        Service ranges go through: the bridge's, when the engine gave it one, else the
        network's gateway address, given to the bridge here.

        netavark and Docker give an internal network's bridge its gateway address (they only
        leave out the NAT and the default route); podman's CNI backend gives it none (its bridge
        plugin runs with isGateway false for an internal network), so this machine had no route
        to the node and ``ip route replace ... via <node>`` failed with "Nexthop has invalid
        gateway". The address is the one the engine reserved as the network's gateway, so no
        container holds it; it only makes this machine a neighbour on the bridge. Nothing more
        reaches past the machine: the network stays internal (no default route in the node, so
        the node and its pods send nothing through this machine, and nothing is masqueraded),
        and the address is on the bridge alone. Done after the cluster exists, since a bridge
        is made when its first container joins. ``down`` removes the address (the bridge may go
        with the network anyway), as the state records it."""
        bridge, gateway = self.network_details()
        subnet = ipaddress.ip_network(NETWORK_SUBNET)
        shown = json.loads(run("ip", "-j", "-4", "addr", "show", "dev", bridge).stdout or "[]")
        have = [a["local"] for link in shown for a in link.get("addr_info", []) if ipaddress.ip_address(a["local"]) in subnet]
        self._save(bridge=bridge)
        if have:
            return
        address = gateway or str(next(subnet.hosts()))
        if address == node_ip:
            raise KindError(f"the network's gateway {address} is the node's own address")
        log(f"{bridge} has no address in {NETWORK_SUBNET} ({self.recorded().get('network_backend') or self.engine}): giving it {address}")
        run("ip", "addr", "add", f"{address}/{subnet.prefixlen}", "dev", bridge)
        self._save(bridge_address=f"{address}/{subnet.prefixlen}")

    def _load_images(self) -> str:
        """The project's images, and the support image (device plugin stand-in, object store)."""
        archives = images.build(self.bins)
        support, support_archive = support_image(self.bins)
        loaded = set(self.recorded().get("loaded", []))
        for archive in [*archives, support_archive]:
            if str(archive) in loaded:
                continue
            log(f"kind load image-archive {archive.name}")
            self.kind("load", "image-archive", str(archive), "--name", NAME)
            loaded.add(str(archive))
            self._save(loaded=sorted(loaded))
        # The kubelet's image garbage collection is off on kind nodes, so nothing needs pinning.
        self._save(support_image=support)
        return support

    def install(self, support: str) -> None:
        """What runs in the cluster, from the support image, each waited for: the device plugin
        stand-in, the object store, kwok and its fleet, and (on the node image built here) the
        cluster DNS."""
        manifests = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYSTEM_NAMESPACE}}]
        manifests += [device_plugin(support, realnode.INSTANCE_TYPE), *object_store(support), *kwok(support, self.bins)]
        rollouts = [
            (SYSTEM_NAMESPACE, w)
            for w in ("daemonset/neuron-device-plugin-standin", "deployment/object-store", "deployment/kwok-controller")
        ]
        if "INFERENTIA_KIND_NODE_IMAGE" not in os.environ:
            # The built node image runs no CoreDNS of kubeadm's (kind_config): ours instead.
            manifests += cluster_dns(support)
            rollouts.append(("kube-system", f"deployment/{CLUSTER_DNS}"))
        self.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests}))
        for namespace, what in rollouts:
            self.kubectl("rollout", "status", "-n", namespace, what, "--timeout=180s")
        fleet = {"apiVersion": "v1", "kind": "List", "items": localcluster.fleet_nodes()}
        self.kubectl("apply", "-f", "-", input=json.dumps(fleet))
        self.kubectl("wait", "--for=condition=Ready", "node", "--all", "--timeout=120s")
        svc = json.loads(self.kubectl("get", "service", "object-store", "-n", SYSTEM_NAMESPACE, "-o", "json").stdout)
        store = f"http://{svc['spec']['clusterIP']}:{STORE_PORT}"
        deadline = time.monotonic() + 60
        while not realnode.http_ok(f"{store}/moto-api/"):
            if time.monotonic() > deadline:
                raise KindError(f"the object store at {store} does not answer")
            time.sleep(0.5)
        self._save(object_store=store)
        deadline = time.monotonic() + 60
        while self.kubectl(
            "get", "node", realnode.NODE_NAME, "-o", "jsonpath={.status.allocatable.aws\\.amazon\\.com/neuron}"
        ).stdout != str(realnode.CHIPS):
            if time.monotonic() > deadline:
                raise KindError("the node never advertised its Neuron devices: see the neuron-device-plugin-standin pod's log")
            time.sleep(0.5)

    def down(self) -> list[str]:
        """Removes everything ``up`` made; returns what is left of it (nothing, or a defect)."""
        data = self.recorded()
        for subnet in data.get("routes", []):
            run("ip", "route", "del", subnet, check=False)
        if data.get("bridge_address") and _link_exists(data["bridge"]):
            run("ip", "addr", "del", data["bridge_address"], "dev", data["bridge"], check=False)
        if shutil.which(self.engine):
            self.kind("delete", "cluster", "--name", NAME, check=False)
            if data.get("made_network", True):
                run(self.engine, "network", "rm", NETWORK, env=self.env, check=False)
        if self.engine == "podman" and self._podman_idle():
            remove_chains(netavark_chains() + cni_residue())
        if self._forwarding_left_on(data):
            IP_FORWARD.write_text("0\n")
        if data.get("made_network", True) and CNI_IPAM_DIR.is_dir() and not self._network_exists():
            # Its last reservation and its lock: no address is held once the network is gone.
            shutil.rmtree(CNI_IPAM_DIR, ignore_errors=True)
        if data.get("made_lib_modules") and Path("/lib/modules").is_dir() and not any(Path("/lib/modules").iterdir()):
            Path("/lib/modules").rmdir()
        # What is left is looked for while the state's containers.conf still names the backend
        # the network was made with: the other backend would not see it.
        left = [x for x in self.leftovers() if x != str(self.state)]
        shutil.rmtree(self.state, ignore_errors=True)
        return left + ([str(self.state)] if self.state.exists() else [])

    def _forwarding_left_on(self, data: dict) -> bool:
        """netavark turns the machine's IPv4 forwarding on when it sets up a bridge network, even
        an internal one, and leaves it on (CNI's bridge plugin does not, for an internal
        network). Off before ``up``, it goes off again once podman runs no container, unless
        the local cluster's real node, which needs it and restores it itself, is running."""
        return (
            data.get("ip_forward") == "0"
            and IP_FORWARD.read_text().strip() == "1"
            and self.engine == "podman"
            and self._podman_idle()
            and not _link_exists(realnode.BRIDGE)
        )

    def _network_exists(self) -> bool:
        return run(self.engine, "network", "inspect", NETWORK, env=self.env, check=False).returncode == 0

    def _podman_idle(self) -> bool:
        """No container of podman's left, ours or anyone's: its firewall chains serve nothing."""
        return bool(shutil.which("podman")) and not run("podman", "ps", "-a", "-q", env=self.env, check=False).stdout.split()

    def leftovers(self) -> list[str]:
        left = []
        if shutil.which(self.engine):
            containers = run(self.engine, "ps", "-a", "--filter", f"label=io.x-k8s.kind.cluster={NAME}", "-q", env=self.env, check=False)
            left += [f"container {c}" for c in containers.stdout.split()]
            if self._network_exists():
                left.append(f"network {NETWORK}")
        if self.engine == "podman" and self._podman_idle():
            left += [f"iptables chain {table}/{chain}" for table, chain in netavark_chains() + cni_residue()]
        routes = run("ip", "route", "show", check=False).stdout
        left += [f"route {s}" for s in (POD_SUBNET, SERVICE_SUBNET) if routes.startswith(s) or f"\n{s} " in routes]
        left += [f"address {a} on {dev}" for dev, a in host_addresses(NETWORK_SUBNET)]
        if CNI_IPAM_DIR.exists():
            left.append(str(CNI_IPAM_DIR))
        if self._forwarding_left_on(self.recorded()):
            left.append("net.ipv4.ip_forward on (off before up)")
        if self.state.exists():
            left.append(str(self.state))
        return left


def _link_exists(name: str) -> bool:
    return run("ip", "link", "show", "dev", name, check=False).returncode == 0


def host_addresses(subnet: str) -> list[tuple[str, str]]:
    """(interface, address) for each of this machine's addresses in ``subnet``."""
    network = ipaddress.ip_network(subnet)
    shown = json.loads(run("ip", "-j", "-4", "addr", "show", check=False).stdout or "[]")
    return [
        (link["ifname"], f"{a['local']}/{a['prefixlen']}")
        for link in shown
        for a in link.get("addr_info", [])
        if ipaddress.ip_address(a["local"]) in network
    ]


def netavark_chains() -> list[tuple[str, str]]:
    """podman's network backend's iptables chains (NETAVARK*), which it makes when a network
    first runs a container and leaves when the last one goes."""
    chains = []
    for table in ("filter", "nat"):
        listed = run("iptables", "-t", table, "-S", check=False).stdout.splitlines()
        chains += [(table, line.split()[1]) for line in listed if line.startswith("-N NETAVARK")]
    return chains


# The chains podman's CNI plugins make on a container's start and leave behind when the last
# one goes: the portmap plugin's (the kind node publishes its API server's port) and the
# firewall plugin's.
CNI_PLUGIN_CHAINS = ("CNI-HOSTPORT-DNAT", "CNI-HOSTPORT-MASQ", "CNI-HOSTPORT-SETMARK", "CNI-FORWARD", "CNI-ADMIN")


def cni_residue() -> list[tuple[str, str]]:
    """The CNI plugins' chains, when all they hold is what the plugins leave once no container of
    theirs is left: no chain of a container's own (CNI-DN-*, CNI-<hash>) and no rule naming an
    address or a port. Anything more belongs to a container some CNI user still runs (the local
    cluster's real node runs the portmap plugin too, in this same network namespace), and then
    all of them are left alone."""
    chains = []
    for table in ("filter", "nat"):
        for line in run("iptables", "-t", table, "-S", check=False).stdout.splitlines():
            words = line.split()
            if line.startswith("-N CNI-"):
                if words[1] not in CNI_PLUGIN_CHAINS:
                    return []
                chains.append((table, words[1]))
            elif line.startswith("-A CNI-") and {"-s", "-d", "--dport", "--dports"} & set(words):
                return []
    return chains


def remove_chains(chains: list[tuple[str, str]]) -> None:
    """Removes ``chains`` ((table, chain)): the jumps into them from other chains first, then
    their rules, then the chains."""
    for table in {t for t, _ in chains}:
        names = {c for t, c in chains if t == table}
        for line in run("iptables", "-t", table, "-S", check=False).stdout.splitlines():
            words = shlex.split(line)
            if words[:1] == ["-A"] and words[1] not in names and "-j" in words and words[words.index("-j") + 1] in names:
                run("iptables", "-t", table, "-D", *words[1:], check=False)
    for table, chain in chains:
        run("iptables", "-t", table, "-F", chain, check=False)
    for table, chain in chains:
        run("iptables", "-t", table, "-X", chain, check=False)


def kind_config(upstream_image: bool = False) -> dict:
    """One node, named, labelled and tainted as the local cluster's real node; the admission
    plugins that send a real-node namespace's pods to it; the kubelet allowed on a cgroup v1
    host, its pods resolving names at the cluster DNS's address. On the node image built here:
    no CNI of kind's (the image carries a bridge config), no CoreDNS of kubeadm's (the cluster
    runs CoreDNS built here, cluster_dns), and etcd's tag as built. An upstream kindest/node
    keeps kind's defaults there."""
    taints = [
        # kubeadm's own, which kind removes from a cluster of one node (and fails if it is not there).
        {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"},
        {"key": "aws.amazon.com/neuron", "value": "true", "effect": "NoSchedule"},
        {"key": realnode.REAL_NODE_LABEL, "value": "true", "effect": "NoSchedule"},
    ]
    init = {
        "apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "InitConfiguration",
        "nodeRegistration": {"name": realnode.NODE_NAME, "taints": taints},
    }  # fmt: skip
    cluster = {
        "apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "ClusterConfiguration",
        "apiServer": {"extraArgs": [{"name": "enable-admission-plugins", "value": "NodeRestriction,PodNodeSelector,PodTolerationRestriction"}]},
    }  # fmt: skip
    if not upstream_image:
        # kind's own skipPhases, and kubeadm's CoreDNS, whose image no registry here serves
        # (cluster_dns deploys CoreDNS built here in its place).
        init["skipPhases"] = ["preflight", "addon/coredns"]
        cluster["etcd"] = {"local": {"imageTag": kindnode.versions()["ETCD_VERSION"]}}
    kubelet = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration", "failCgroupV1": False,
        # What kubeadm gives the kubelet by itself; named here, as the kube-dns Service takes it.
        "clusterDNS": [cluster_dns_ip()], "clusterDomain": realnode.CLUSTER_DOMAIN,
    }  # fmt: skip
    return {
        "kind": "Cluster",
        "apiVersion": "kind.x-k8s.io/v1alpha4",
        "networking": {"disableDefaultCNI": not upstream_image, "podSubnet": POD_SUBNET, "serviceSubnet": SERVICE_SUBNET},
        "nodes": [
            {
                "role": "control-plane",
                "labels": {"node.kubernetes.io/instance-type": realnode.INSTANCE_TYPE, realnode.REAL_NODE_LABEL: "true"},
            }
        ],
        "kubeadmConfigPatches": [yaml.safe_dump(d) for d in (init, cluster, kubelet)],
    }


def support_image(bins: Path) -> tuple[str, Path]:
    """The Debian base with moto's S3 server, the device plugin stand-in, kwok and CoreDNS:
    ``(name, archive)``."""
    import importlib.metadata

    moto = importlib.metadata.version("moto")
    tools = [bins / name for name in SUPPORT_TOOLS]
    base = images.base_rootfs()
    key = hashlib.sha256(b"".join(t.read_bytes() for t in tools) + moto.encode() + base.name.encode()).hexdigest()[:12]
    name = f"{SUPPORT_IMAGE_REPO}:{key}"
    out = images.cache_dir().parent / "kind" / f"support-{key}.oci.tar"
    if not out.exists():
        log(f"{name}: assembling (moto[server]=={moto} from PyPI)")
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp) / "moto"
            subprocess.run(
                [sys.executable, "-m", "pip", "install", "--quiet", "--no-compile", "--target", str(root / images.SITE), f"moto[server]=={moto}"],
                check=True,
            )  # fmt: skip
            shutil.rmtree(root / images.SITE / "bin", ignore_errors=True)
            bindir = Path(tmp) / "tools" / "usr/local/bin"
            bindir.mkdir(parents=True)
            for tool in tools:
                shutil.copy2(tool, bindir / tool.name)
            layers = [base.read_bytes(), images.tar_dir(root), images.tar_dir(bindir.parents[2])]
            images.write_oci(out, name, layers, {"Env": ["PATH=/usr/local/bin:/usr/bin:/bin"]})
        for old in out.parent.glob("support-*.oci.tar"):
            if old != out:
                old.unlink()
    return name, out


# Stand-in /dev/neuronN files (character devices with /dev/null's numbers, as the real node
# makes them, realnode.RealNode._make_devices), none beyond the chips; the lock directory
# writable by the containers' non-root users.
MAKE_DEVICES = """
import os, sys
chips, dev, locks, efa = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
os.makedirs(os.path.join(dev, 'infiniband'), exist_ok=True); os.makedirs(locks, exist_ok=True); os.chmod(locks, 0o1777)
for folder, prefix, count in ((dev, 'neuron', chips), (os.path.join(dev, 'infiniband'), 'uverbs', efa)):
    for name in os.listdir(folder):
        if name.startswith(prefix) and int(name[len(prefix):]) >= count:
            os.unlink(os.path.join(folder, name))
    for n in range(count):
        path = os.path.join(folder, f'{prefix}{n}')
        if not os.path.exists(path):
            os.mknod(path, 0o666 | 0o020000, os.makedev(1, 3))
"""


def device_plugin(image: str, instance_type: str) -> dict:
    """The device plugin stand-in as AWS ships its plugin: a DaemonSet on the Neuron nodes, with
    the kubelet's device-plugin directory mounted."""
    chips, cores_per_chip = realnode.SHAPES[instance_type]
    # The EFA devices AWS's EFA device plugin would advertise on such an instance (as the local
    # cluster's real node does, realnode.RealNode._start_device_plugin).
    efa = EFA_DEVICES.get(instance_type, 0)
    labels = {"app.kubernetes.io/name": "neuron-device-plugin-standin"}
    state = {"name": "state", "mountPath": NODE_DIR}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "neuron-device-plugin-standin", "namespace": SYSTEM_NAMESPACE},
        "spec": {
            "selector": {"matchLabels": labels},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": {
                "metadata": {"labels": labels, "annotations": {"inferentia.dev/instance-type": instance_type}},
                "spec": {
                    "nodeSelector": {realnode.REAL_NODE_LABEL: "true"},
                    "tolerations": [{"operator": "Exists"}],
                    "priorityClassName": "system-node-critical",
                    "initContainers": [
                        {
                            "name": "devices",
                            "image": image,
                            "imagePullPolicy": "Never",
                            "command": ["python3", "-c", MAKE_DEVICES, str(chips), f"{NODE_DIR}/dev", f"{NODE_DIR}/locks", str(efa)],
                            "securityContext": {"privileged": True},  # mknod
                            "volumeMounts": [state],
                        }  # fmt: skip
                    ],
                    "containers": [
                        {
                            "name": "plugin",
                            "image": image,
                            "imagePullPolicy": "Never",
                            "command": [
                                "neuron-device-plugin-standin",
                                "--plugin-dir",
                                str(realnode.DEVICE_PLUGIN_DIR),
                                "--dev-dir",
                                f"{NODE_DIR}/dev",
                                "--chips",
                                str(chips),
                                "--cores-per-chip",
                                str(cores_per_chip),
                                "--lock-dir",
                                f"{NODE_DIR}/locks",
                                "--platform",
                                instance_type.split(".")[0],
                                "--efa",
                                str(efa),
                            ],
                            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                            "volumeMounts": [state, {"name": "device-plugins", "mountPath": str(realnode.DEVICE_PLUGIN_DIR)}],
                        }  # fmt: skip
                    ],
                    "volumes": [
                        {"name": "state", "hostPath": {"path": NODE_DIR, "type": "DirectoryOrCreate"}},
                        {"name": "device-plugins", "hostPath": {"path": str(realnode.DEVICE_PLUGIN_DIR), "type": "Directory"}},
                    ],
                },
            },
        },
    }


def support_deployment(name: str, container: dict, labels: dict | None = None, namespace: str = SYSTEM_NAMESPACE, **pod_spec) -> dict:
    """One replica of ``container`` (the support image's), on the kind node, as nobody, with the
    least a container needs: what the object store, kwok and the cluster DNS share."""
    labels = labels or {"app.kubernetes.io/name": name}
    container = {
        "name": name, "imagePullPolicy": "Never",
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        **container,
    }  # fmt: skip
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {realnode.REAL_NODE_LABEL: "true"},
                    "tolerations": [{"operator": "Exists"}],
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 65534, "runAsGroup": 65534},
                    "containers": [container],
                    **pod_spec,
                },
            },
        },
    }


def object_store(image: str) -> list[dict]:
    """moto's S3 server, in memory, as the local cluster runs it, behind a ClusterIP Service."""
    deployment = support_deployment(
        "object-store",
        {
            "name": "moto",
            "image": image,
            "command": ["python3", "-m", "moto.server", "-H", "0.0.0.0", "-p", str(STORE_PORT)],
            "ports": [{"containerPort": STORE_PORT}],
            "readinessProbe": {"httpGet": {"path": "/moto-api/", "port": STORE_PORT}},
        },
    )
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "object-store", "namespace": SYSTEM_NAMESPACE},
        "spec": {"selector": deployment["spec"]["selector"]["matchLabels"], "ports": [{"port": STORE_PORT, "targetPort": STORE_PORT}]},
    }
    return [deployment, service]


CLUSTER_DNS = "coredns"
# CoreDNS listens above 1024, so it runs as nobody without NET_BIND_SERVICE (kubeadm's adds that
# capability for port 53, which its image's binary carries as a file capability); the kube-dns
# Service maps port 53 to it.
CLUSTER_DNS_PORT = 1053
CLUSTER_DNS_READY_PORT = 8181


def cluster_dns_ip() -> str:
    """The cluster DNS's address: the 10th of the Service range, as kubeadm picks it
    (GetDNSIP, cmd/kubeadm/app/constants/constants.go of k8s.io/kubernetes)."""
    return str(ipaddress.ip_network(SERVICE_SUBNET)[10])


def corefile() -> str:
    """The cluster domain and reverse look-ups, answered by the kubernetes plugin from the API
    server, as kubeadm's Corefile has them; unlike kubeadm's, no ``forward``: the kind node has
    no route off the machine, and a name outside the cluster is refused at once rather than
    sent nowhere. Only plugins cluster/node/coredns compiles in."""
    port = CLUSTER_DNS_PORT
    return (
        f"{realnode.CLUSTER_DOMAIN}:{port} in-addr.arpa:{port} ip6.arpa:{port} {{\n"
        f"    errors\n    ready :{CLUSTER_DNS_READY_PORT}\n"
        f"    kubernetes {realnode.CLUSTER_DOMAIN} in-addr.arpa ip6.arpa\n}}\n"
    )


def cluster_dns(image: str) -> list[dict]:
    """CoreDNS built here (the support image's), deployed as kubeadm's addon/coredns phase
    deploys it (cmd/kubeadm/app/phases/addons/dns/manifests.go of k8s.io/kubernetes: its
    ServiceAccount, ClusterRole, binding, Corefile ConfigMap, Deployment and the kube-dns Service
    at the kubelet's clusterDNS), as nobody with no capability, without its forwarder."""
    labels = {"k8s-app": "kube-dns"}
    role = f"system:{CLUSTER_DNS}"
    deployment = support_deployment(
        CLUSTER_DNS,
        {
            "image": image,
            "command": ["coredns", "-conf", "/etc/coredns/Corefile"],
            "ports": [
                {"name": "dns", "containerPort": CLUSTER_DNS_PORT, "protocol": "UDP"},
                {"name": "dns-tcp", "containerPort": CLUSTER_DNS_PORT, "protocol": "TCP"},
                {"name": "readiness-probe", "containerPort": CLUSTER_DNS_READY_PORT, "protocol": "TCP"},
            ],
            # Ready once the kubernetes plugin has synced with the API server.
            "readinessProbe": {"httpGet": {"path": "/ready", "port": "readiness-probe"}},
            "resources": {"requests": {"cpu": "100m", "memory": "70Mi"}, "limits": {"memory": "170Mi"}},
            "volumeMounts": [{"name": "config-volume", "mountPath": "/etc/coredns", "readOnly": True}],
        },
        labels=labels,
        namespace="kube-system",
        serviceAccountName=CLUSTER_DNS,
        priorityClassName="system-cluster-critical",
        # The node's resolver, as kubeadm's: the cluster DNS cannot ask itself.
        dnsPolicy="Default",
        volumes=[{"name": "config-volume", "configMap": {"name": CLUSTER_DNS, "items": [{"key": "Corefile", "path": "Corefile"}]}}],
    )  # fmt: skip
    deployment["metadata"]["labels"] = labels
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] = True
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": CLUSTER_DNS, "namespace": "kube-system"}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": role},
            "rules": [
                {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"], "verbs": ["list", "watch"]},
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": CLUSTER_DNS, "namespace": "kube-system"}],
        },
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": CLUSTER_DNS, "namespace": "kube-system"}, "data": {"Corefile": corefile()}},
        deployment,
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": {**labels, "kubernetes.io/name": "CoreDNS"}},
            "spec": {
                "clusterIP": cluster_dns_ip(),
                "selector": labels,
                "ports": [
                    {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": "dns"},
                    {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": "dns-tcp"},
                ],
            },
        },
    ]  # fmt: skip


def kwok(image: str, bins: Path) -> list[dict]:
    """kwok's controller as its release deploys it (kustomize/kwok, kustomize/rbac of the pinned
    module: its ClusterRole as is), with the stages the local cluster runs it with."""
    module = kindnode.module_dir("sigs.k8s.io/kwok", kindnode.versions()["KWOK_VERSION"])
    role = yaml.safe_load((module / "kustomize/rbac/role.yaml").read_text())
    name = "kwok-controller"
    stages = {"default.yaml": (bins / "kwok-stages.yaml").read_text(), "test.yaml": (HERE / "kwok-test-stages.yaml").read_text()}
    deployment = support_deployment(
        name,
        {
            "image": image,
            "command": [
                "kwok", "--config", "/etc/kwok/default.yaml", "--config", "/etc/kwok/test.yaml",
                "--manage-nodes-with-annotation-selector", "kwok.x-k8s.io/node=fake",
                "--node-lease-duration-seconds", "40", "--cidr", FLEET_POD_CIDR, "--node-ip", "127.0.0.1",
                "--server-address", "0.0.0.0:10247",
            ],
            "readinessProbe": {"httpGet": {"path": "/healthz", "port": 10247}},
            "volumeMounts": [{"name": "stages", "mountPath": "/etc/kwok", "readOnly": True}],
        },
        serviceAccountName=name,
        volumes=[{"name": "stages", "configMap": {"name": "kwok-stages"}}],
    )  # fmt: skip
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": SYSTEM_NAMESPACE}},
        role,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role["metadata"]["name"]},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": SYSTEM_NAMESPACE}],
        },  # fmt: skip
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kwok-stages", "namespace": SYSTEM_NAMESPACE}, "data": stages},
        deployment,
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE)
    args = parser.parse_args(argv)
    cluster = KindCluster(args.state_dir)
    if args.command == "up":
        started = time.monotonic()
        try:
            path = cluster.up()
        except (KindError, subprocess.CalledProcessError) as exc:
            print(f"kind-up failed: {exc}", file=sys.stderr)
            return 1
        log(f"kind cluster {NAME} ready in {time.monotonic() - started:.0f}s on {cluster.engine}; kubeconfig: {path}")
        print(path)
    elif args.command == "down":
        left = cluster.down()
        if left:
            print(f"kind-down left these behind: {left}", file=sys.stderr)
            return 1
        log(f"kind cluster {NAME} removed")
    else:
        print(json.dumps({"exists": cluster.exists(), **cluster.recorded()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
