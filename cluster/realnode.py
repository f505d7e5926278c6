"""Real nodes beside the simulated fleet: a kubelet with containerd, runc, a CNI bridge,
kube-proxy and a Neuron device-plugin stand-in, on this machine. One runs for the cluster's
life; a test of pods on two nodes starts a second (RealNode with index 1) and stops it again.

Pods that must really run (the serving pods, the compile Job, the operator under Helm)
land here; the kwok fleet stays for scale and capacity. The node needs root (it creates a
bridge, network namespaces, cgroups, mounts and iptables rules); without root
:func:`unavailable_reason` says why it cannot run and the suite says so.

Networking stays on this machine: pods get addresses on the cluster's own bridge, the pod
and Service ranges are routed to that bridge (never through the default route), and a
FORWARD rule drops anything from the bridge to another interface. ``stop()`` removes every
process, mount, cgroup, namespace, link, route and rule the node made.

Facts this stand-in follows: the device plugin's resources and Allocate
(cluster/node/deviceplugin/main.go); the kubelet on a cgroup v1 host needs
``failCgroupV1: false`` (https://kubernetes.io/docs/concepts/architecture/cgroups/).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import yaml

from inferentia_operator.core.catalogue import EFA_DEVICES, FAMILIES
from ports import free_port

NODE_NAME = "real-inf2"
# An inf2.24xlarge: 6 Inferentia2 chips of 2 NeuronCores each, so the device plugin can
# grant a chip other than the first.
INSTANCE_TYPE = "inf2.24xlarge"
# The shapes the node can take for a test (RealNode.reshape): chips and NeuronCores per chip
# of each instance type, as the operator's catalogue has them. trn2's are counted in logical
# cores at its default LNC 2 (4 of a chip's 8 physical cores): how AWS's device plugin numbers
# trn2 cores under LNC is not documented, so only the samples' LNC 2 is modelled.
SHAPES = {"inf2.24xlarge": (6, 2), "inf1.6xlarge": (4, 4), "trn2.48xlarge": (16, 4), "trn1.32xlarge": (16, 2)}
CHIPS = SHAPES[INSTANCE_TYPE][0]
# The node's shape in DRA mode (RealNode.dra_mode): Trainium2, whose DRA claims set their LNC.
DRA_INSTANCE_TYPE = "trn2.48xlarge"
DRA_FAMILY = FAMILIES[DRA_INSTANCE_TYPE.split(".")[0]]
# Pods reach this node only where their namespace lets them: the node carries this taint,
# and a namespace annotated with REAL_NODE_NAMESPACE_ANNOTATIONS gets the toleration and node
# selector by the API server's PodTolerationRestriction and PodNodeSelector admission plugins.
REAL_NODE_LABEL = "inferentia.dev/real-node"
REAL_NODE_TAINT = f"{REAL_NODE_LABEL}=true:NoSchedule"
REAL_NODE_NAMESPACE_ANNOTATIONS = {
    "scheduler.alpha.kubernetes.io/node-selector": f"{REAL_NODE_LABEL}=true",
    # The Neuron taint too, for the pods that need no device (the compile Job): on this
    # one-node cluster they run where everything else does.
    "scheduler.alpha.kubernetes.io/defaultTolerations": json.dumps(
        [
            {"key": REAL_NODE_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"},
            {"key": "aws.amazon.com/neuron", "operator": "Exists", "effect": "NoSchedule"},
        ]
    ),
}

BRIDGE = "infbr0"
POD_CIDR = "10.85.0.0/24"
GATEWAY = "10.85.0.1"
SERVICE_CIDR = "10.96.0.0/16"
CLUSTER_DOMAIN = "cluster.local"
FORWARD_CHAIN = "INFERENTIA-NODE"
# Chains other programs of the node create: kube-proxy (KUBE-*), the CNI portmap plugin (CNI-*).
OWNED_CHAIN_PREFIXES = ("KUBE-", "CNI-", FORWARD_CHAIN)
CGROUP_ROOT = "inferentia-node"  # the kubelet's --cgroup-root: every pod cgroup is under it
RUNC = "/usr/sbin/runc"
# The kubelet's device manager listens here whatever its --root-dir (pluginapi.KubeletSocket):
# another real node's kubelet (RealNode with index 1 and up) runs, with its containerd, in a
# mount namespace of its own where its own directory is mounted over this one. stop() removes
# the directory again.
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
REQUIRED_COMMANDS = ("ip", "iptables", "ip6tables", "mmdebstrap", RUNC, "mount", "umount", "unshare", "nsenter")


def pin_to_real_node(pod_spec: dict) -> dict:
    """A DaemonSet's pod template, placed on the real node alone: the DaemonSet controller places
    pods by the template, before admission, so a namespace's node selector cannot do it."""
    pod_spec["nodeSelector"] = {REAL_NODE_LABEL: "true"}
    pod_spec.setdefault("tolerations", []).append({"key": REAL_NODE_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"})
    return pod_spec


NODE_CACHE_KINDS = (
    "DaemonSet", "Service", "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding",
    "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "CSIDriver",
)  # fmt: skip


def node_cache_on_real_node(chart_docs: list[dict]) -> list[dict]:
    """The node cache's objects of a chart render (nodeCache.enabled), its DaemonSet pinned to
    the real node: the one change from the chart's render, as this cluster's real node carries
    a taint of its own."""
    docs = [
        d for d in chart_docs
        if d["kind"] in NODE_CACHE_KINDS and ("-node-cache" in d["metadata"]["name"] or d["kind"] == "CSIDriver")
    ]  # fmt: skip
    for d in docs:
        if d["kind"] == "DaemonSet":
            pin_to_real_node(d["spec"]["template"]["spec"])
    return docs


def unavailable_reason() -> str | None:
    """Why the real node cannot run on this machine, or None when it can."""
    if os.environ.get("INFERENTIA_REAL_NODE", "1") == "0":
        return "INFERENTIA_REAL_NODE=0 turned it off"
    if os.geteuid() != 0:
        return "it needs root (a bridge, network namespaces, cgroups, mounts and iptables rules); run make test as root"
    missing = [c for c in REQUIRED_COMMANDS if not shutil.which(c)]
    if missing:
        return f"missing commands {missing}: cluster/node-deps.sh installs them"
    if not Path("/sys/fs/cgroup").is_dir():
        return "no cgroup file system at /sys/fs/cgroup"
    return None


def run(*argv: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), check=check, capture_output=True, text=True, input=input)


class RealNode:
    """A real node of one LocalCluster: the first (``index`` 0, state in ``state/node``) runs
    from the cluster's start to its end, with kube-proxy for every node; another (index 1 and
    up, state in ``state/node-<index + 1>``) is started and stopped by a test that needs a second
    node (LocalCluster.add_real_node), on a bridge and pod range of its own
    (10.85.<index>.0/24), routed to and from the first's."""

    def __init__(self, state: Path, bins: Path, start_process, images: list[Path], index: int = 0):
        self.index = index
        first = index == 0
        self.state = state / ("node" if first else f"node-{index + 1}")
        self.bins = bins
        self._start_process = start_process  # LocalCluster._start: records pid and argv
        self.images = images
        self.name = NODE_NAME if first else f"real-node-{index + 1}"
        self.bridge = BRIDGE if first else f"infbr{index}"
        self.pod_cidr = POD_CIDR if first else f"10.85.{index}.0/24"
        self.gateway = GATEWAY if first else f"10.85.{index}.1"
        self.cgroup_root = CGROUP_ROOT if first else f"{CGROUP_ROOT}-{index + 1}"
        # The directory the kubelet's device manager uses, as this machine sees it.
        self.plugin_dir = DEVICE_PLUGIN_DIR if first else self.state / "device-plugins"
        self.suffix = "" if first else f"-{index + 1}"  # of its processes' names

    def _forward_rules(self) -> list[list[str]]:
        """Another node's FORWARD rules, inserted before the first's: its pods and the first's
        reach each other; nothing from its bridge goes anywhere else."""
        b = self.bridge
        return [
            ["-i", b, "-o", b, "-j", "ACCEPT"], ["-i", b, "-o", BRIDGE, "-j", "ACCEPT"], ["-i", BRIDGE, "-o", b, "-j", "ACCEPT"],
        ]  # fmt: skip

    def _drop_rules(self) -> list[list[str]]:
        b = self.bridge
        return [["-i", b, "-j", "DROP"], ["-o", b, "!", "-i", b, "!", "-s", self.gateway, "-j", "DROP"]]

    # -- network ----------------------------------------------------------------------------
    def network_up(self) -> None:
        """The bridge, its address, the routes of the pod and Service ranges, and the rule that
        keeps pod traffic on the bridge; before anything starts, so that no packet to those
        ranges can take the default route even while kube-proxy has not programmed its rules."""
        self.network_down()
        self.state.mkdir(parents=True, exist_ok=True)
        if self.index:
            run("ip", "link", "add", self.bridge, "type", "bridge")
            run("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            run("ip", "link", "set", self.bridge, "up")
            for rule in self._forward_rules():
                run("iptables", "-I", FORWARD_CHAIN, "1", *rule)
            for rule in self._drop_rules():
                run("iptables", "-A", FORWARD_CHAIN, *rule)
            return
        run("ip", "link", "add", BRIDGE, "type", "bridge")
        run("ip", "addr", "add", f"{GATEWAY}/24", "dev", BRIDGE)
        run("ip", "link", "set", BRIDGE, "up")
        run("ip", "route", "replace", SERVICE_CIDR, "dev", BRIDGE)
        run("iptables", "-N", FORWARD_CHAIN)
        # Between pods (and to the Services kube-proxy rewrites to them): allowed. From a
        # pod to any other interface: dropped. Pods reach the host itself (INPUT), which
        # is how they reach the API server and the object store on the gateway address.
        run("iptables", "-A", FORWARD_CHAIN, "-i", BRIDGE, "-o", BRIDGE, "-j", "ACCEPT")
        run("iptables", "-A", FORWARD_CHAIN, "-i", BRIDGE, "-j", "DROP")
        run("iptables", "-A", FORWARD_CHAIN, "-o", BRIDGE, "!", "-i", BRIDGE, "!", "-s", GATEWAY, "-j", "DROP")
        run("iptables", "-I", "FORWARD", "1", "-j", FORWARD_CHAIN)
        # Routed Service traffic from a pod back to a pod on the same bridge must pass the
        # iptables rules kube-proxy writes; br_netfilter is how bridged traffic does.
        for knob in ("net/bridge/bridge-nf-call-iptables", "net/ipv4/ip_forward"):
            self._set_sysctl(knob, "1")
        # No hugepages are reserved, as the operator requests none by default; a pod that asks
        # for them anyway (spec.compute.hugepages) must show, on this node, what it does on
        # a node that has none.

    def _set_sysctl(self, knob: str, value: str) -> None:
        path = Path("/proc/sys") / knob
        if not path.exists():
            return
        saved = self.state / "sysctl.json"
        previous = json.loads(saved.read_text()) if saved.exists() else {}
        previous.setdefault(knob, path.read_text().strip())
        saved.write_text(json.dumps(previous))
        path.write_text(value)

    def network_down(self) -> None:
        if self.index:
            for link in _links_with_master(self.bridge):
                run("ip", "link", "del", link, check=False)
            run("ip", "link", "del", self.bridge, check=False)
            for rule in self._forward_rules() + self._drop_rules():
                run("iptables", "-D", FORWARD_CHAIN, *rule, check=False)
            return
        for link in _links_with_master(BRIDGE):
            run("ip", "link", "del", link, check=False)
        run("ip", "link", "del", BRIDGE, check=False)
        remove_owned_iptables()
        saved = self.state / "sysctl.json"
        if saved.exists():
            for knob, value in json.loads(saved.read_text()).items():
                try:
                    (Path("/proc/sys") / knob).write_text(value)
                except OSError:
                    pass
            saved.unlink()

    # -- processes --------------------------------------------------------------------------
    def start(
        self, kubeconfigs: dict[str, Path], pki: Path, pids: dict[str, int], deadline: float, instance_type: str = INSTANCE_TYPE
    ) -> None:
        """containerd, the images, the kubelet, the device plugin and (on the first node)
        kube-proxy, as ``instance_type``; returns once kube-proxy is ready (the caller waits for
        the node to be Ready)."""
        for sub in ("containerd", "kubelet", "cni-conf", "cni-data", "dev"):
            (self.state / sub).mkdir(parents=True, exist_ok=True)
        if not self.index and str(self.kubelet_dir) not in mounts_under(self.state):
            # A shared mount, as systemd makes / on a node: what a CSI node plugin mounts in a
            # pod's volume directory (mountPropagation: Bidirectional) reaches the kubelet and
            # the pod's containers. stop() unmounts everything under the state directory.
            run("mount", "--bind", str(self.kubelet_dir), str(self.kubelet_dir))
            run("mount", "--make-rshared", str(self.kubelet_dir))
        self._make_devices(SHAPES[instance_type][0], EFA_DEVICES.get(instance_type, 0))
        self._write_cni_config()
        sock = self.state / "containerd" / "containerd.sock"
        (self.state / "containerd.toml").write_text(self._containerd_config(sock))
        env_path = f"{self.bins}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
        containerd = [str(self.bins / "containerd"), "--config", str(self.state / "containerd.toml")]
        if self.index:
            # A mount namespace of its own, where its own device-plugin directory is mounted over
            # the one the kubelet's device manager is fixed to; containerd runs there too, so it
            # sees the volumes the kubelet mounts.
            self.plugin_dir.mkdir(parents=True, exist_ok=True)
            containerd = [
                "unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c",
                'mkdir -p "$1" && mount --bind "$2" "$1" && shift 2 && exec "$@"', "sh",
                str(DEVICE_PLUGIN_DIR), str(self.plugin_dir), *containerd,
            ]  # fmt: skip
        self._start_process("containerd" + self.suffix, containerd, pids, {"PATH": env_path})
        _wait(lambda: sock.exists() and self.ctr("version", check=False).returncode == 0, deadline, "containerd")
        for image in self.images:
            self.ctr("images", "import", "--platform", "linux/amd64", str(image))
        # The kubelet must never collect an image nothing can pull back: pin them.
        for line in self.ctr("images", "list", "-q").stdout.split():
            self.ctr("images", "label", line, "io.cri-containerd.pinned=pinned", check=False)

        make_cgroups(self.cgroup_root)
        kubelet_config = self.state / "kubelet-config.yaml"
        kubelet_config.write_text(yaml.safe_dump(self._kubelet_config(pki)))
        in_namespace = ["nsenter", f"--mount=/proc/{pids['containerd' + self.suffix]}/ns/mnt", "--"] if self.index else []
        self._start_process(
            "kubelet" + self.suffix,
            [
                *in_namespace, str(self.bins / "kubelet"), "--config", str(kubelet_config),
                "--kubeconfig", str(kubeconfigs["kubelet"]), "--root-dir", str(self.state / "kubelet"),
                "--cert-dir", str(self.state / "kubelet" / "pki"),
                "--container-runtime-endpoint", f"unix://{sock}",
                "--hostname-override", self.name, "--node-ip", self.gateway,
                "--node-labels", f"node.kubernetes.io/instance-type={instance_type},{REAL_NODE_LABEL}=true",
                "--register-with-taints", f"aws.amazon.com/neuron=true:NoSchedule,{REAL_NODE_TAINT}",
                "--v", "1",
            ],
            pids,
            {"PATH": env_path},
        )  # fmt: skip
        plugin_dir = self.plugin_dir
        _wait(lambda: (plugin_dir / "kubelet.sock").exists(), deadline, "kubelet's device-plugin socket")
        self._start_device_plugin(instance_type, pids)
        if self.index:
            return  # the first node's kube-proxy programs this machine for every node
        healthz_port, metrics_port = free_port("127.0.0.1"), free_port("127.0.0.1")
        self._start_process(
            "kube-proxy",
            [
                str(self.bins / "kube-proxy"), "--kubeconfig", str(kubeconfigs["kube-proxy"]),
                "--hostname-override", NODE_NAME, "--proxy-mode", "iptables", "--cluster-cidr", POD_CIDR,
                # This machine refuses raising conntrack limits (no CAP_SYS_RESOURCE): leave them.
                "--conntrack-max-per-core", "0",
                "--bind-address", "127.0.0.1", "--metrics-bind-address", f"127.0.0.1:{metrics_port}",
                "--healthz-bind-address", f"127.0.0.1:{healthz_port}",
                "--v", "1",
            ],
            pids,
            {"PATH": env_path},
        )  # fmt: skip
        # Ready once it has programmed the Services it found: its healthz answers 200 then.
        _wait(lambda: http_ok(f"http://127.0.0.1:{healthz_port}/healthz"), deadline, "kube-proxy")

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        sock = self.state / "containerd" / "containerd.sock"
        return run(str(self.bins / "ctr"), "--address", str(sock), "--namespace", "k8s.io", *args, check=check)

    def _start_device_plugin(self, instance_type: str, pids: dict[str, int]) -> None:
        chips, cores_per_chip = SHAPES[instance_type]
        self._start_process(
            "device-plugin" + self.suffix,
            [
                str(self.bins / "neuron-device-plugin-standin"), "--plugin-dir", str(self.plugin_dir),
                "--dev-dir", str(self.state / "dev"), "--chips", str(chips), "--cores-per-chip", str(cores_per_chip),
                "--lock-dir", str(self._lock_dir()), "--platform", instance_type.split(".")[0],
                "--efa", str(EFA_DEVICES.get(instance_type, 0)),
            ],
            pids,
        )  # fmt: skip

    def _lock_dir(self) -> Path:
        """The runtime stand-in's core locks (neuron_standin.hold_cores): writable by the
        containers' non-root users, as /tmp is."""
        path = self.state / "neuron-standin-locks"
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o1777)
        return path

    def reshape(self, instance_type: str, pids: dict[str, int], stop_process_groups) -> None:
        """Make the node's Neuron devices those of ``instance_type`` (SHAPES): the device plugin
        stand-in registers again with that many chips and cores, and the device files follow.
        The caller relabels the node and waits for the kubelet to advertise the new capacity;
        no pod may hold a Neuron device meanwhile."""
        stop_process_groups([pids["device-plugin" + self.suffix]])
        self._make_devices(SHAPES[instance_type][0], EFA_DEVICES.get(instance_type, 0))
        self._start_device_plugin(instance_type, pids)

    def dra_mode(self, kubeconfig: Path, pids: dict[str, int], stop_process_groups) -> None:
        """The node as one that AWS's Neuron DRA driver runs instead of the device plugin (a node
        runs one or the other): a trn2.48xlarge's 16 devices, published by the DRA driver
        stand-in (cluster/node/draplugin), which the kubelet finds through its plugin registry
        and whose CDI specs containerd applies. The caller relabels the node; device_plugin_mode
        (or reshape) goes back."""
        stop_process_groups([pids["device-plugin"]])
        chips = SHAPES[DRA_INSTANCE_TYPE][0]
        self._make_devices(chips)
        self._start_process(
            "dra-plugin",
            [
                str(self.bins / "neuron-dra-standin"), "--kubeconfig", str(kubeconfig), "--node-name", NODE_NAME,
                "--kubelet-dir", str(self.state / "kubelet"), "--dev-dir", str(self.state / "dev"),
                "--lock-dir", str(self._lock_dir()), "--cdi-dir", str(self.cdi_dir), "--instance-type", DRA_INSTANCE_TYPE,
                "--chips", str(chips), "--physical-cores-per-chip", str(DRA_FAMILY.physical_cores_per_chip),
                "--default-lnc", str(DRA_FAMILY.default_lnc),
            ],
            pids,
        )  # fmt: skip

    def device_plugin_mode(self, instance_type: str, pids: dict[str, int], stop_process_groups) -> None:
        """Back from dra_mode: the DRA driver stand-in stops, the device plugin stand-in starts."""
        if "dra-plugin" in pids:
            stop_process_groups([pids.pop("dra-plugin")])
        self.reshape(instance_type, pids, stop_process_groups)

    @property
    def kubelet_dir(self) -> Path:
        return self.state / "kubelet"

    @property
    def cdi_dir(self) -> Path:
        """Where containerd reads CDI specs (the DRA driver stand-in writes one per prepared claim)."""
        return self.state / "cdi"

    def _make_devices(self, chips: int, efa: int = 0) -> None:
        """Stand-in /dev/neuronN files (and EFA's /dev/infiniband/uverbsN): character devices
        with /dev/null's numbers, so that runc can create them in a container as it creates a
        real device; none beyond ``chips`` (and ``efa``)."""
        dev = self.state / "dev"
        (dev / "infiniband").mkdir(parents=True, exist_ok=True)
        for prefix, count in (("neuron", chips), ("infiniband/uverbs", efa)):
            for n in range(count):
                path = dev / f"{prefix}{n}"
                if not path.exists():
                    os.mknod(path, 0o666 | 0o020000, os.makedev(1, 3))
            for path in dev.glob(f"{prefix}*"):
                if int(path.name.removeprefix(prefix.rpartition("/")[2])) >= count:
                    path.unlink()

    def _write_cni_config(self) -> None:
        conf = {
            "cniVersion": "1.0.0",
            "name": "inferentia-node" + self.suffix,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    "isGateway": True,
                    # No masquerading: nothing a pod sends may leave the machine.
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": self.pod_cidr, "gateway": self.gateway}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.state / "cni-data"),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }
        (self.state / "cni-conf" / "10-inferentia.conflist").write_text(json.dumps(conf, indent=2))

    def _containerd_config(self, sock: Path) -> str:
        s = self.state / "containerd"
        return f"""version = 3
root = "{s / "root"}"
state = "{s / "state"}"
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[debug]
  level = "warn"
[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  # No registry is reachable: the images are imported, never pulled.
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "docker.io/library/inferentia-pause:1"
[plugins."io.containerd.cri.v1.runtime"]
  # CDI specs, for the DRA driver stand-in's prepared claims (containerd 2 applies them).
  enable_cdi = true
  cdi_spec_dirs = ["{self.cdi_dir}"]
  # This machine does not grant CAP_SYS_RESOURCE: a negative oom_score_adj, which containerd
  # gives every sandbox, kills runc's init. Restricting it to the daemon's own avoids that.
  restrict_oom_score_adj = true
  # Network namespaces under the state directory, so that stopping the node finds them all.
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{self.bins / "cni"}"]
    conf_dir = "{self.state / "cni-conf"}"
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
      BinaryName = "{RUNC}"
      SystemdCgroup = false
      Root = "{s / "runc"}"
"""

    def _kubelet_config(self, pki: Path) -> dict:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # This machine boots cgroup v1, which the kubelet refuses unless told otherwise.
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{self.cgroup_root}",
            "address": self.gateway,
            "port": free_port(self.gateway),
            # Its own, as a kubelet removes the log directories of pods it does not know.
            "podLogsDir": "/var/log/pods" if self.index == 0 else str(self.state / "pod-logs"),
            "readOnlyPort": 0,
            "healthzPort": 0,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(pki / "ca.crt")},
            },
            # The API server reaches the kubelet (logs, exec) with the cluster's admin-class
            # client certificate; nothing else can reach the bridge address.
            "authorization": {"mode": "AlwaysAllow"},
            "failSwapOn": False,
            "resolvConf": "",
            # The cluster DNS (LocalCluster's CoreDNS) on the bridge's address: pods resolve
            # Services and a headless Service's pods by name (a LeaderWorkerSet's leader).
            "clusterDNS": [GATEWAY],
            "clusterDomain": CLUSTER_DOMAIN,
            # Imported images cannot be pulled again: never collect them, never evict for disk.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
            "enforceNodeAllocatable": [],
            "maxPods": 30,
            "serializeImagePulls": False,
            "containerLogMaxSize": "5Mi",
            "syncFrequency": "5s",
            "fileCheckFrequency": "5s",
            # A node's devices change when a test reshapes it (reshape, dra_mode): the kubelet
            # computes its status every 2 s rather than 10, so the new capacity shows about 4 s
            # sooner on average. It still posts the status only when it changed, or every 10 s.
            "nodeStatusUpdateFrequency": "2s",
            "nodeStatusReportFrequency": "10s",
            "staticPodPath": "",
            "shutdownGracePeriod": "0s",
        }

    def stop(self, stop_process_groups, pids: dict[str, int]) -> None:
        """Stops the node and removes everything it made; safe to call twice and after a crash."""
        if self.index:
            self._stop_another(stop_process_groups, pids)
            return
        order = [n for n in ("kubelet", "kube-proxy", "device-plugin", "dra-plugin") if n in pids]
        stop_process_groups([pids[n] for n in order], 10.0)
        kill_cgroup_tree(CGROUP_ROOT)
        kill_cgroup_tree("k8s.io")
        if "containerd" in pids:
            stop_process_groups([pids["containerd"]], 10.0)
        # The runc shims outlive containerd by design; ours are known by their binary.
        shim = str(self.bins / "containerd-shim-runc-v2")
        for pid in _pids_of_exe(shim):
            _kill(pid)
        unmount_under(self.state)
        _remove_device_plugin_dir()
        remove_cgroups(CGROUP_ROOT)
        remove_cgroups("k8s.io")
        # kube-proxy's own clean-up of its rules, then whatever remains of ours by name.
        proxy = self.bins / "kube-proxy"
        if proxy.exists():
            run(str(proxy), "--cleanup", check=False)
        self.network_down()
        subprocess.run(["rm", "-rf", str(self.state)], check=False)

    def _stop_another(self, stop_process_groups, pids: dict[str, int]) -> None:
        """Another node's stop: its processes, its containers (its shims are those in its mount
        namespace; the first node's are left alone), its cgroups, bridge, rules and state."""
        stop_process_groups([pids[n + self.suffix] for n in ("kubelet", "device-plugin") if n + self.suffix in pids], 10.0)
        kill_cgroup_tree(self.cgroup_root)
        containerd = pids.get("containerd" + self.suffix)
        namespace = _mount_namespace(containerd) if containerd else None
        if containerd:
            stop_process_groups([containerd], 10.0)
        shim = str(self.bins / "containerd-shim-runc-v2")
        for pid in _pids_of_exe(shim):
            if namespace is not None and _mount_namespace(pid) == namespace:
                _kill(pid)
        remove_cgroups(self.cgroup_root)
        self.network_down()
        subprocess.run(["rm", "-rf", str(self.state)], check=False)


def _mount_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


# -- clean-up helpers, shared with the test that checks nothing is left ----------------------


def _remove_device_plugin_dir() -> None:
    """The kubelet's device-plugin sockets and checkpoint, and the directories it made for
    them when they are left empty (a real kubelet of this machine's own would keep them)."""
    if not DEVICE_PLUGIN_DIR.is_dir():
        return
    for name in ("kubelet.sock", "neuron-standin.sock", "neuroncore-standin.sock", "kubelet_internal_checkpoint"):
        (DEVICE_PLUGIN_DIR / name).unlink(missing_ok=True)
    for d in (DEVICE_PLUGIN_DIR, DEVICE_PLUGIN_DIR.parent):
        try:
            d.rmdir()
        except OSError:
            break


def _links_with_master(bridge: str) -> list[str]:
    out = run("ip", "-o", "link", "show", "master", bridge, check=False).stdout
    return [line.split(": ")[1].split("@")[0] for line in out.splitlines() if ": " in line]


def owned_iptables_chains() -> dict[tuple[str, str], list[str]]:
    """(command, table) -> chains of ours that exist, for iptables and ip6tables."""
    found: dict[tuple[str, str], list[str]] = {}
    for cmd in ("iptables", "ip6tables"):
        for table in ("filter", "nat", "mangle", "raw"):
            out = run(cmd, "-t", table, "-S", check=False).stdout
            chains = [line.split()[1] for line in out.splitlines() if line.startswith("-N ")]
            mine = [c for c in chains if c.startswith(OWNED_CHAIN_PREFIXES)]
            if mine:
                found[(cmd, table)] = mine
    return found


def remove_owned_iptables() -> None:
    for (cmd, table), chains in owned_iptables_chains().items():
        rules = run(cmd, "-t", table, "-S", check=False).stdout.splitlines()
        for rule in rules:
            words = rule.split()
            if rule.startswith("-A ") and "-j" in words and words[words.index("-j") + 1] in chains and words[1] not in chains:
                run(cmd, "-t", table, "-D", *words[1:], check=False)
        for chain in chains:
            run(cmd, "-t", table, "-F", chain, check=False)
        for chain in chains:
            run(cmd, "-t", table, "-X", chain, check=False)


def cgroup_dirs(name: str) -> list[Path]:
    """``name`` in every mounted cgroup hierarchy, where it exists."""
    return [top / name for top in cgroup_hierarchies() if (top / name).is_dir()]


def cgroup_hierarchies() -> list[Path]:
    """Every mounted cgroup hierarchy (v1: one per controller, and systemd's; v2: one)."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[fields.index("-") + 1] in ("cgroup", "cgroup2"):
            found.append(Path(fields[4]))
    return found


def make_cgroups(name: str) -> None:
    """The kubelet's --cgroup-root must exist in every hierarchy; a v1 cpuset cgroup starts
    with no CPUs or memory nodes, so it takes its parent's."""
    for top in cgroup_hierarchies():
        path = top / name
        path.mkdir(exist_ok=True)
        for knob in ("cpuset.cpus", "cpuset.mems"):
            if (top / knob).exists() and not (path / knob).read_text().strip():
                (path / knob).write_text((top / knob).read_text())


def kill_cgroup_tree(name: str) -> None:
    for _ in range(50):
        pids = set()
        for top in cgroup_dirs(name):
            for procs in top.rglob("cgroup.procs"):
                try:
                    pids |= {int(p) for p in procs.read_text().split()}
                except OSError:
                    pass
        if not pids:
            return
        for pid in pids:
            _kill(pid)
        time.sleep(0.1)


def remove_cgroups(name: str) -> None:
    for top in cgroup_dirs(name):
        for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            try:
                d.rmdir()
            except OSError:
                pass
        try:
            top.rmdir()
        except OSError:
            pass


def mounts_under(root: Path) -> list[str]:
    prefix = str(root)
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == prefix or point.startswith(prefix + "/"):
            found.append(point)
    return found


def unmount_under(root: Path) -> None:
    for _ in range(5):
        points = mounts_under(root)
        if not points:
            return
        for point in sorted(points, key=len, reverse=True):
            run("umount", "-l", point, check=False)


def _pids_of_exe(exe: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if os.readlink(proc / "exe") == exe:
                    pids.append(int(proc.name))
            except OSError:
                pass
    return pids


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return reply.status == 200
    except OSError:
        return False


def _wait(predicate, deadline: float, what: str) -> None:
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} was not ready in time")
        time.sleep(0.2)


def leftovers(state: Path, bins: Path) -> list[str]:
    """What a stopped node left behind on this machine; empty when ``stop()`` cleaned up."""
    found = []
    # The first node's and any other's (RealNode with index 1 and up): infbr0, infbr1, ...
    found += [f"link {line.split(': ')[1]}" for line in run("ip", "-o", "link", "show", check=False).stdout.splitlines()
              if ": " in line and line.split(": ")[1].split("@")[0].startswith(BRIDGE[:-1])]  # fmt: skip
    found += [f"iptables {cmd} -t {table}: {chains}" for (cmd, table), chains in owned_iptables_chains().items()]
    found += [f"route {line}" for line in run("ip", "route", "show", check=False).stdout.splitlines() if BRIDGE[:-1] in line]
    found += [f"mount {m}" for m in mounts_under(state)]
    cgroups = [CGROUP_ROOT, "k8s.io", *(p.name for top in cgroup_hierarchies() for p in top.glob(f"{CGROUP_ROOT}-*"))]
    found += [f"cgroup {d}" for name in sorted(set(cgroups)) for d in cgroup_dirs(name)]
    ours = [
        str(bins / n)
        for n in ("containerd", "containerd-shim-runc-v2", "kubelet", "kube-proxy", "neuron-device-plugin-standin", "neuron-dra-standin")
    ]
    found += [f"process {pid} ({exe})" for exe in ours for pid in _pids_of_exe(exe)]
    if DEVICE_PLUGIN_DIR.exists():
        found.append(f"directory {DEVICE_PLUGIN_DIR}")
    found += [f"directory {d}" for d in sorted(state.glob("node-*")) if d.is_dir()]
    if (state / "node").exists():
        found.append(f"directory {state / 'node'}")
    return found
