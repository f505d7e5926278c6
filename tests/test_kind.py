"""The kind cluster's configuration (cluster/kindcluster.py, cluster/kindnode.py), without a
cluster: what `make test-kind` runs on is checked end to end by the suite itself there."""

import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "cluster"))

import kindcluster
import kindnode
import realnode
from inferentia_operator.core.catalogue import EFA_DEVICES


def patches(config: dict) -> dict[str, dict]:
    return {d["kind"]: d for d in map(yaml.safe_load, config["kubeadmConfigPatches"])}


def test_the_kind_node_is_the_real_node_by_name_labels_and_taints():
    config = kindcluster.kind_config()
    [node] = config["nodes"]
    assert node["labels"] == {"node.kubernetes.io/instance-type": realnode.INSTANCE_TYPE, realnode.REAL_NODE_LABEL: "true"}
    registration = patches(config)["InitConfiguration"]["nodeRegistration"]
    assert registration["name"] == realnode.NODE_NAME
    taints = {(t["key"], t.get("value"), t["effect"]) for t in registration["taints"]}
    # kind removes kubeadm's control-plane taint from a one-node cluster, and fails when it is missing.
    assert ("node-role.kubernetes.io/control-plane", None, "NoSchedule") in taints
    assert ("aws.amazon.com/neuron", "true", "NoSchedule") in taints
    assert (realnode.REAL_NODE_LABEL, "true", "NoSchedule") in taints
    args = {a["name"]: a["value"] for a in patches(config)["ClusterConfiguration"]["apiServer"]["extraArgs"]}
    # The admission plugins that apply a real-node namespace's annotations to its pods.
    assert set(args["enable-admission-plugins"].split(",")) >= {"PodNodeSelector", "PodTolerationRestriction"}
    assert patches(config)["KubeletConfiguration"]["failCgroupV1"] is False


def test_the_built_node_image_runs_no_cni_or_coredns_of_kinds_and_an_upstream_one_does():
    built, upstream = kindcluster.kind_config(), kindcluster.kind_config(upstream_image=True)
    assert built["networking"]["disableDefaultCNI"] is True
    assert "addon/coredns" in patches(built)["InitConfiguration"]["skipPhases"]
    assert "preflight" in patches(built)["InitConfiguration"]["skipPhases"]  # kind's own
    assert patches(built)["ClusterConfiguration"]["etcd"]["local"]["imageTag"] == kindnode.versions()["ETCD_VERSION"]
    assert upstream["networking"]["disableDefaultCNI"] is False
    assert "skipPhases" not in patches(upstream)["InitConfiguration"]
    assert "etcd" not in patches(upstream)["ClusterConfiguration"]


def test_the_cluster_dns_is_coredns_built_here_at_the_kubelets_cluster_dns_address():
    """kube-dns as kubeadm deploys it, at the address the kubelet gives pods as their resolver,
    running the support image's CoreDNS as nobody with no capability."""
    manifests = {(m["kind"], m["metadata"]["name"]): m for m in kindcluster.cluster_dns("support:1")}
    # kubeadm's choice (GetDNSIP): the 10th address of the Service range.
    assert patches(kindcluster.kind_config())["KubeletConfiguration"]["clusterDNS"] == ["10.97.0.10"]
    assert patches(kindcluster.kind_config())["KubeletConfiguration"]["clusterDomain"] == realnode.CLUSTER_DOMAIN
    service = manifests[("Service", "kube-dns")]
    assert service["metadata"]["namespace"] == "kube-system" and service["spec"]["clusterIP"] == "10.97.0.10"
    deployment = manifests[("Deployment", "coredns")]
    assert deployment["metadata"]["namespace"] == "kube-system"
    pod = deployment["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    [container] = pod["spec"]["containers"]
    named = {p["name"]: p for p in container["ports"]}
    served = {(p["port"], p["protocol"], named[p["targetPort"]]["protocol"]) for p in service["spec"]["ports"]}
    assert served == {(53, "UDP", "UDP"), (53, "TCP", "TCP")}
    # The binary cluster/build.sh built for the local cluster, in the support image.
    assert container["image"] == "support:1" and container["imagePullPolicy"] == "Never"
    assert container["command"][0] == "coredns" and "coredns" in kindcluster.SUPPORT_TOOLS
    # Its Corefile is the ConfigMap's.
    [volume] = pod["spec"]["volumes"]
    [mount] = container["volumeMounts"]
    assert container["command"][1:] == ["-conf", f"{mount['mountPath']}/Corefile"] and mount["name"] == volume["name"]
    assert volume["configMap"]["name"] == "coredns"
    assert manifests[("ConfigMap", "coredns")]["data"]["Corefile"] == kindcluster.corefile()
    # Non-root, no capability: every port it listens on is above 1023.
    security = container["securityContext"]
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True and pod["spec"]["securityContext"]["runAsUser"] != 0
    assert security["capabilities"] == {"drop": ["ALL"]} and security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert all(p["containerPort"] > 1023 for p in container["ports"])
    # Ready once the kubernetes plugin has synced: the ready plugin's port.
    probe = container["readinessProbe"]["httpGet"]
    assert probe["path"] == "/ready" and f"ready :{named[probe['port']]['containerPort']}" in kindcluster.corefile()
    assert pod["spec"]["dnsPolicy"] == "Default"
    # What the kubernetes plugin watches, granted to the pod's ServiceAccount.
    binding = manifests[("ClusterRoleBinding", "system:coredns")]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": pod["spec"]["serviceAccountName"], "namespace": "kube-system"}]
    assert ("ServiceAccount", pod["spec"]["serviceAccountName"]) in manifests
    role = manifests[("ClusterRole", binding["roleRef"]["name"])]
    granted = {
        (g, r) for rule in role["rules"] if {"list", "watch"} <= set(rule["verbs"]) for g in rule["apiGroups"] for r in rule["resources"]
    }
    assert granted >= {("discovery.k8s.io", "endpointslices"), ("", "services"), ("", "pods"), ("", "namespaces")}


def test_the_cluster_dns_answers_the_cluster_and_forwards_nothing():
    """The Corefile's zones are the cluster's and reverse look-ups only, on the port the
    container declares, with only plugins cluster/node/coredns compiles in, and no forwarder:
    the kind node has no route off the machine."""
    import re

    text = kindcluster.corefile()
    header, body = text.split("{", 1)
    keys = [k.rsplit(":", 1) for k in header.split()]
    assert {zone for zone, _ in keys} == {realnode.CLUSTER_DOMAIN, "in-addr.arpa", "ip6.arpa"}
    assert {int(port) for _, port in keys} == {kindcluster.CLUSTER_DNS_PORT}
    assert body.rstrip().endswith("}") and "{" not in body
    directives = [line.split()[0] for line in body.splitlines() if line.strip() not in ("", "}")]
    main_go = (Path(kindcluster.HERE) / "node/coredns/main.go").read_text()
    compiled = set(re.findall(r'"github.com/coredns/coredns/plugin/(\w+)"', main_go))
    assert set(directives) <= compiled, (directives, compiled)
    assert directives.count("kubernetes") == 1 and "forward" not in directives
    [kubernetes] = [line.split()[1:] for line in body.splitlines() if line.split()[:1] == ["kubernetes"]]
    assert kubernetes == [realnode.CLUSTER_DOMAIN, "in-addr.arpa", "ip6.arpa"]


def test_up_installs_and_waits_for_the_cluster_dns_on_the_built_node_image_only(tmp_path, monkeypatch):
    """kube-dns is applied with the rest and its rollout waited for; an upstream kindest/node
    runs kubeadm's own CoreDNS, which ours would collide with."""
    import json
    import subprocess

    kind = kind_on("podman", tmp_path, monkeypatch)
    calls = []

    def kubectl(*args, input=None, check=True):
        calls.append((args, input))
        out = ""
        if args[:2] == ("get", "service"):
            out = json.dumps({"spec": {"clusterIP": "10.97.0.20"}})
        elif args[:2] == ("get", "node"):
            out = str(realnode.CHIPS)
        return subprocess.CompletedProcess(args, 0, out, "")

    monkeypatch.setattr(kind, "kubectl", kubectl)
    monkeypatch.setattr(kindcluster, "kwok", lambda image, bins: [])  # reads the kwok module: not what is tested
    monkeypatch.setattr(realnode, "http_ok", lambda url: True)
    kind.state.mkdir()
    for upstream in (False, True):
        if upstream:
            monkeypatch.setenv("INFERENTIA_KIND_NODE_IMAGE", "kindest/node:v1.36.3")
        else:
            monkeypatch.delenv("INFERENTIA_KIND_NODE_IMAGE", raising=False)
        calls.clear()
        kind.install("support:1")
        [applied] = [json.loads(i)["items"] for a, i in calls if a[:1] == ("apply",) and "neuron-device-plugin-standin" in i]
        kinds = {(m["kind"], m["metadata"]["name"]) for m in applied}
        waited = [a for a, _ in calls if a[:2] == ("rollout", "status")]
        assert (("Service", "kube-dns") in kinds) is (not upstream)
        assert (("rollout", "status", "-n", "kube-system", "deployment/coredns", "--timeout=180s") in waited) is (not upstream)


def test_kind_ranges_are_not_the_local_clusters_and_pods_are_never_masqueraded():
    import ipaddress

    ours = [ipaddress.ip_network(n) for n in (kindcluster.NETWORK_SUBNET, kindcluster.POD_SUBNET, kindcluster.SERVICE_SUBNET)]
    ours.append(ipaddress.ip_network(kindcluster.FLEET_POD_CIDR))
    local = [ipaddress.ip_network(n) for n in (realnode.POD_CIDR, realnode.SERVICE_CIDR)]
    assert not any(a.overlaps(b) for a in ours for b in local)
    assert not any(a.overlaps(b) for i, a in enumerate(ours) for b in ours[i + 1 :])
    [bridge, _] = kindnode.cni_config()["plugins"]
    assert bridge["ipMasq"] is False
    assert ipaddress.ip_network(bridge["ipam"]["ranges"][0][0]["subnet"]).subnet_of(ipaddress.ip_network(kindcluster.POD_SUBNET))


def test_the_device_plugin_daemonset_takes_each_shape():
    for instance_type, (chips, per_chip) in realnode.SHAPES.items():
        ds = kindcluster.device_plugin("support:1", instance_type)
        spec = ds["spec"]["template"]["spec"]
        [plugin] = spec["containers"]
        argv = plugin["command"]
        assert argv[argv.index("--chips") + 1] == str(chips) and argv[argv.index("--cores-per-chip") + 1] == str(per_chip)
        assert argv[argv.index("--platform") + 1] == instance_type.split(".")[0]
        [devices] = spec["initContainers"]
        assert devices["command"][3] == str(chips)
        # EFA devices as AWS's EFA device plugin advertises them, and their device files.
        efa = EFA_DEVICES.get(instance_type, 0)
        assert argv[argv.index("--efa") + 1] == devices["command"][6] == str(efa)
        # The kubelet's device-plugin directory, where the stand-in registers.
        assert {"name": "device-plugins", "mountPath": str(realnode.DEVICE_PLUGIN_DIR)} in plugin["volumeMounts"]
        assert plugin["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_the_device_files_are_each_chips_and_each_efa_devices(tmp_path, monkeypatch):
    """MAKE_DEVICES, as the DaemonSet's init container runs it: /dev/neuronN and
    /dev/infiniband/uverbsN, none beyond the counts (a reshape to fewer removes the rest)."""
    import os

    made = []
    monkeypatch.setattr(os, "mknod", lambda path, *_: (made.append(path), Path(path).touch()))

    def run(chips: int, efa: int) -> None:
        monkeypatch.setattr(sys, "argv", ["-c", str(chips), str(tmp_path / "dev"), str(tmp_path / "locks"), str(efa)])
        exec(kindcluster.MAKE_DEVICES, {})

    run(16, 16)
    assert sorted(p.name for p in (tmp_path / "dev").glob("neuron*")) == sorted(f"neuron{n}" for n in range(16))
    assert sorted(p.name for p in (tmp_path / "dev" / "infiniband").iterdir()) == sorted(f"uverbs{n}" for n in range(16))
    run(12, 0)
    assert len(list((tmp_path / "dev").glob("neuron*"))) == 12 and not list((tmp_path / "dev" / "infiniband").iterdir())


def test_the_fleet_advertises_efa_devices_on_the_types_that_have_them():
    """The simulated fleet (kind's and the local cluster's) as AWS's EFA device plugin would
    advertise it: each type's count from the catalogue, none on a type without one."""
    import localcluster

    nodes = localcluster.fleet_nodes()
    by_type = {n["metadata"]["labels"]["node.kubernetes.io/instance-type"]: n["status"]["allocatable"] for n in nodes}
    assert by_type["trn2.48xlarge"]["vpc.amazonaws.com/efa"] == "16"
    assert by_type["trn1.32xlarge"]["vpc.amazonaws.com/efa"] == "8"
    assert "vpc.amazonaws.com/efa" not in by_type["inf2.48xlarge"]
    for itype, allocatable in by_type.items():
        assert allocatable.get("vpc.amazonaws.com/efa") == (str(EFA_DEVICES[itype]) if itype in EFA_DEVICES else None)


class FakeRun:
    """kindcluster.run, answering the commands ``up`` asks of the engine and of ip(8)."""

    def __init__(self, inspected: dict, addresses: list[str], backend: str = "cni"):
        self.inspected, self.addresses, self.backend, self.calls = inspected, addresses, backend, []

    def __call__(self, *argv, env=None, input=None, check=True):
        import json
        import subprocess

        self.calls.append(argv)
        out = ""
        if argv[1:3] == ("network", "inspect"):
            out = json.dumps([self.inspected])
        elif argv[:4] == ("ip", "-j", "-4", "addr"):
            out = json.dumps([{"ifname": argv[-1], "addr_info": [{"local": a, "prefixlen": 24} for a in self.addresses]}])
        elif argv[1:2] == ("info",):
            out = self.backend + "\n"
        return subprocess.CompletedProcess(argv, 0, out, "")


def kind_on(engine: str, tmp_path, monkeypatch) -> kindcluster.KindCluster:
    monkeypatch.setenv("KIND_EXPERIMENTAL_PROVIDER", engine)
    # Not this machine's: a kind cluster may be running here.
    monkeypatch.setattr(kindcluster, "CNI_IPAM_DIR", tmp_path / "cni-networks" / kindcluster.NETWORK)
    (tmp_path / "ip_forward").write_text("0\n")
    monkeypatch.setattr(kindcluster, "IP_FORWARD", tmp_path / "ip_forward")
    return kindcluster.KindCluster(tmp_path / ".kind", bins=tmp_path)


def test_the_network_backend_is_the_one_asked_for_and_kept_until_down(tmp_path, monkeypatch):
    import pytest

    kind = kind_on("podman", tmp_path, monkeypatch)
    fake = FakeRun({}, [], backend="cni")
    monkeypatch.setattr(kindcluster, "run", fake)
    monkeypatch.delenv(kindcluster.BACKEND_VARIABLE, raising=False)
    kind.state.mkdir()
    kind.containers_conf()  # podman's own choice: no [network] of ours
    assert "network_backend" not in (kind.state / "containers.conf").read_text()
    assert kind.recorded()["network_backend"] == "cni"
    monkeypatch.setenv(kindcluster.BACKEND_VARIABLE, "netavark")
    with pytest.raises(kindcluster.KindError, match="make kind-down first"):
        kind.containers_conf()
    monkeypatch.setenv(kindcluster.BACKEND_VARIABLE, "CNI")
    kind.containers_conf()
    assert '[network]\nnetwork_backend = "cni"\n' in (kind.state / "containers.conf").read_text()
    monkeypatch.setenv(kindcluster.BACKEND_VARIABLE, "slirp")
    with pytest.raises(kindcluster.KindError, match="cni and netavark"):
        kindcluster.network_backend()


def test_a_bridge_without_an_address_in_the_network_gets_the_gateway_and_down_takes_it_back(tmp_path, monkeypatch):
    kind = kind_on("podman", tmp_path, monkeypatch)
    # podman's CNI backend, an internal network: no gateway recorded, none on the bridge.
    inspected = {"network_interface": "cni-podman1", "subnets": [{"subnet": kindcluster.NETWORK_SUBNET}], "internal": True}
    fake = FakeRun(inspected, [])
    monkeypatch.setattr(kindcluster, "run", fake)
    kind.host_address("10.87.0.2")
    assert ("ip", "addr", "add", "10.87.0.1/24", "dev", "cni-podman1") in fake.calls
    assert kind.recorded()["bridge_address"] == "10.87.0.1/24" and kind.recorded()["bridge"] == "cni-podman1"
    fake.calls.clear()
    kind.down()
    assert ("ip", "addr", "del", "10.87.0.1/24", "dev", "cni-podman1") in fake.calls
    assert not kind.state.exists()


def test_a_bridge_with_its_gateway_is_left_as_the_engine_made_it(tmp_path, monkeypatch):
    # netavark: the bridge carries the gateway the network records.
    kind = kind_on("podman", tmp_path, monkeypatch)
    inspected = {"network_interface": "podman1", "subnets": [{"subnet": kindcluster.NETWORK_SUBNET, "gateway": "10.87.0.1"}]}
    fake = FakeRun(inspected, ["10.87.0.1"])
    monkeypatch.setattr(kindcluster, "run", fake)
    kind.host_address("10.87.0.2")
    assert not [c for c in fake.calls if c[:3] == ("ip", "addr", "add")]
    assert "bridge_address" not in kind.recorded()


def test_dockers_bridge_is_br_and_its_id_unless_the_network_names_one(tmp_path, monkeypatch):
    kind = kind_on("docker", tmp_path, monkeypatch)
    config = {"Subnet": kindcluster.NETWORK_SUBNET, "Gateway": "10.87.0.1"}
    fake = FakeRun({"Id": "0123456789abcdef", "Options": {}, "IPAM": {"Config": [config]}}, [])
    monkeypatch.setattr(kindcluster, "run", fake)
    assert kind.network_details() == ("br-0123456789ab", "10.87.0.1")
    fake.inspected["Options"] = {"com.docker.network.bridge.name": "kindbr0"}
    assert kind.network_details() == ("kindbr0", "10.87.0.1")


# What `iptables -S` showed here after podman's CNI backend ran the kind node and it was gone.
CNI_LEFT = {
    "filter": ["-P FORWARD ACCEPT", "-N CNI-ADMIN", "-N CNI-FORWARD", '-A FORWARD -m comment --comment "CNI firewall plugin rules" -j CNI-FORWARD',
               '-A CNI-FORWARD -m comment --comment "CNI firewall plugin admin overrides" -j CNI-ADMIN'],
    "nat": ["-N CNI-HOSTPORT-DNAT", "-N CNI-HOSTPORT-MASQ", "-N CNI-HOSTPORT-SETMARK",
            "-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT",
            "-A CNI-HOSTPORT-MASQ -m mark --mark 0x2000/0x2000 -j MASQUERADE"],
}  # fmt: skip


def test_the_cni_plugins_chains_are_removed_only_when_no_container_of_anyones_uses_them(monkeypatch):
    import subprocess

    tables = {t: list(lines) for t, lines in CNI_LEFT.items()}
    calls = []

    def fake(*argv, env=None, input=None, check=True):
        calls.append(argv)
        out = "\n".join(tables.get(argv[2], [])) if argv[0] == "iptables" and argv[3] == "-S" else ""
        return subprocess.CompletedProcess(argv, 0, out, "")

    monkeypatch.setattr(kindcluster, "run", fake)
    residue = kindcluster.cni_residue()
    assert set(residue) == {("filter", "CNI-ADMIN"), ("filter", "CNI-FORWARD"), ("nat", "CNI-HOSTPORT-DNAT"),
                            ("nat", "CNI-HOSTPORT-MASQ"), ("nat", "CNI-HOSTPORT-SETMARK")}  # fmt: skip
    kindcluster.remove_chains(residue)
    # The jumps from the built-in chains go first; the rules inside the chains go with -F.
    assert (
        "iptables",
        "-t",
        "filter",
        "-D",
        "FORWARD",
        "-m",
        "comment",
        "--comment",
        "CNI firewall plugin rules",
        "-j",
        "CNI-FORWARD",
    ) in calls
    assert ("iptables", "-t", "nat", "-D", "PREROUTING", "-m", "addrtype", "--dst-type", "LOCAL", "-j", "CNI-HOSTPORT-DNAT") in calls
    assert not [c for c in calls if c[3] == "-D" and c[4].startswith("CNI-")]
    assert ("iptables", "-t", "nat", "-X", "CNI-HOSTPORT-DNAT") in calls
    # A container of some CNI user's (a published port, a firewall rule): nothing is touched.
    tables["nat"] += ["-N CNI-DN-f69b429e65671ebf00ebd"]
    assert kindcluster.cni_residue() == []
    tables["nat"].pop()
    tables["filter"] += ["-A CNI-FORWARD -d 10.85.0.5/32 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"]
    assert kindcluster.cni_residue() == []


def test_forwarding_netavark_turned_on_goes_off_at_down_unless_the_real_node_runs(tmp_path, monkeypatch):
    import subprocess

    links = {"cni-podman1"}

    def fake(*argv, env=None, input=None, check=True):
        if argv[:3] == ("ip", "link", "show"):
            return subprocess.CompletedProcess(argv, 0 if argv[-1] in links else 1, "", "")
        if argv[1:3] == ("network", "inspect"):
            return subprocess.CompletedProcess(argv, 1, "", "no such network")
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(kindcluster, "run", fake)
    # podman installed, whether or not this machine has it: make test runs here without it.
    monkeypatch.setattr(kindcluster.shutil, "which", lambda name: f"/usr/bin/{name}")
    kind = kind_on("podman", tmp_path, monkeypatch)
    forward = kindcluster.IP_FORWARD
    forward.write_text("1\n")
    kind.state.mkdir()
    (kind.state / "state.json").write_text('{"provider": "podman", "ip_forward": "0"}')
    links.add(realnode.BRIDGE)  # the local cluster's real node runs: it needs forwarding
    assert kind.leftovers() == [str(kind.state)]
    links.remove(realnode.BRIDGE)
    assert "net.ipv4.ip_forward on (off before up)" in kind.leftovers()
    assert kind.down() == [] and forward.read_text() == "0\n"
