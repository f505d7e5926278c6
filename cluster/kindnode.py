"""kind's node image, built here from the parts the project already builds.

No registry is reachable from these machines, so ``kindest/node`` cannot be pulled. This builds
its stand-in, ``inferentia.local/kind-node:<KUBERNETES_VERSION>-<key>``, by kind's own recipe
(images/base/Dockerfile and ``kind build node-image`` of the pinned kind release, whose files
it copies from the kind module):

- Debian bookworm with the packages kind's base image installs (mmdebstrap, cached), runc from
  Debian, and kind's base files: its entrypoint, systemd units, containerd config;
- containerd, its runc shim and ctr, and the CNI plugins, as cluster/build.sh built them for the
  real node; kubeadm, kubelet and kubectl of KUBERNETES_VERSION;
- the control plane's images, preloaded into the node's containerd as ``kind build node-image``
  does: kube-apiserver, kube-controller-manager, kube-scheduler and kube-proxy of
  KUBERNETES_VERSION under their registry.k8s.io names, etcd of ETCD_VERSION (the cluster's
  kubeadm patch names its tag), and the project's pause process as the sandbox image kind's
  containerd config names.

What differs from kindest/node, and why: no CoreDNS image (the kind cluster skips kubeadm's
addon/coredns phase, as no registry serves its image, and runs CoreDNS built here from the
support image instead, kindcluster.cluster_dns), no crictl (not
served as a module here; only ``kind load docker-image`` uses it, ``make test-kind`` loads
archives), and a bridge CNI config in the image instead of kindnetd (not served either; the
cluster is one node, and kind is told to install no CNI). A user with Docker can use the
upstream ``kindest/node:<KUBERNETES_VERSION>`` instead: INFERENTIA_KIND_NODE_IMAGE names it.

    python cluster/kindnode.py      # build (or find) the image, print its name
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import images  # noqa: E402

NODE_PACKAGES = ",".join(
    (
        # kind's base image (images/base/Dockerfile), less what only rootless or NFS/iSCSI
        # volumes need (fuse-overlayfs, nfs-common, open-iscsi), plus Debian's runc.
        "systemd", "conntrack", "iptables", "nftables", "iproute2", "ethtool", "util-linux", "mount", "kmod",
        "libseccomp2", "pigz", "e2fsprogs", "bash", "ca-certificates", "curl", "jq", "procps", "runc",
    )
)  # fmt: skip
# kube-proxy programs iptables: its image has Debian's.
KUBE_PROXY_PACKAGES = "iptables,conntrack,ca-certificates"
# The sandbox image kind's containerd config (images/base/files/etc/containerd/config.toml) names.
SANDBOX_IMAGE = "registry.k8s.io/pause:3.10"
# The single node's pods, in kind's default pod subnet (10.244.0.0/16): what kindnetd would give
# the first node. No masquerade: pods reach only what is on the node's own networks.
POD_SUBNET = "10.244.0.0/24"
NODE_IMAGE_REPO = "inferentia.local/kind-node"


def versions() -> dict[str, str]:
    out = {}
    for line in (HERE / "versions.env").read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip()
    return out


def log(message: str) -> None:
    print(f"[kind-node] {message}", file=sys.stderr, flush=True)


def module_dir(module: str, version: str) -> Path:
    """Where Go's module cache holds ``module@version`` (fetched through the module proxy if missing)."""
    out = subprocess.run(["go", "mod", "download", "-json", f"{module}@{version}"], capture_output=True, text=True, check=True)
    return Path(json.loads(out.stdout)["Dir"])


def cache_dir() -> Path:
    path = images.cache_dir().parent / "kind"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _component_image(out: Path, name: str, binary: Path, base: bytes | None = None) -> Path:
    """An image of one static binary at /usr/local/bin, as the upstream images keep it."""
    if out.exists():
        return out
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        dest = root / "usr/local/bin" / binary.name
        dest.parent.mkdir(parents=True)
        shutil.copy2(binary, dest)
        dest.chmod(0o755)
        layers = ([base] if base else []) + [images.tar_dir(root)]
        path = "/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin"
        images.write_oci(out, name, layers, {"Env": [f"PATH={path}"]})
    return out


def control_plane_images(bins: Path, v: dict[str, str]) -> list[Path]:
    """The images kubeadm's static pods and kube-proxy DaemonSet run, under the names it gives them."""
    k8s, etcd = v["KUBERNETES_VERSION"], v["ETCD_VERSION"]
    built = []
    for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler"):
        built.append(_component_image(cache_dir() / f"{name}-{k8s}.oci.tar", f"registry.k8s.io/{name}:{k8s}", bins / name))
    proxy_base = images.base_rootfs(KUBE_PROXY_PACKAGES)
    built.append(
        _component_image(
            cache_dir() / f"kube-proxy-{k8s}-{proxy_base.stem.rsplit('-', 1)[-1]}.oci.tar",
            f"registry.k8s.io/kube-proxy:{k8s}", bins / "kube-proxy", proxy_base.read_bytes(),
        )
    )  # fmt: skip
    built.append(_component_image(cache_dir() / f"etcd-{etcd}.oci.tar", f"registry.k8s.io/etcd:{etcd}", bins / "etcd"))
    built.append(images.pause_image(bins, SANDBOX_IMAGE, cache_dir()))
    return built


def cni_config() -> dict:
    return {
        "cniVersion": "1.0.0",
        "name": "inferentia-kind",
        "plugins": [
            {
                "type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False, "hairpinMode": True,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET}]], "routes": [{"dst": "0.0.0.0/0"}]},
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }  # fmt: skip


def image_key(bins: Path, v: dict[str, str], kind_dir: Path, preload: list[Path]) -> str:
    h = hashlib.sha256()
    h.update(Path(__file__).read_bytes())
    h.update(NODE_PACKAGES.encode())
    for key in ("KUBERNETES_VERSION", "ETCD_VERSION", "CONTAINERD_VERSION", "CNI_PLUGINS_VERSION", "KIND_VERSION"):
        h.update(f"{key}={v[key]}".encode())
    for f in sorted((kind_dir / "images/base/files").rglob("*")):
        if f.is_file():
            h.update(f.read_bytes())
    for p in preload:
        h.update(p.name.encode())
    return h.hexdigest()[:12]


def _run(*argv: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), check=True, **kw)


def _preload(rootfs: Path, bins: Path, archives: list[Path]) -> None:
    """Imports the archives into the node's containerd store, as ``kind build node-image`` does:
    a containerd of the same release runs here against the image's /var/lib/containerd."""
    with tempfile.TemporaryDirectory(prefix="kind-node-ctrd-") as tmp:
        t = Path(tmp)
        sock = t / "containerd.sock"
        (t / "config.toml").write_text(
            "version = 3\n"
            f'root = "{rootfs}/var/lib/containerd"\nstate = "{t}/state"\n'
            f'[grpc]\n  address = "{sock}"\n'
            'disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images",'
            ' "io.containerd.nri.v1.nri"]\n'
        )
        proc = subprocess.Popen(
            [str(bins / "containerd"), "--config", str(t / "config.toml")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            ctr = [str(bins / "ctr"), "--address", str(sock), "--namespace", "k8s.io"]
            deadline = time.monotonic() + 60
            while subprocess.run([*ctr, "version"], capture_output=True).returncode:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the containerd that preloads the node's images did not start")
                time.sleep(0.2)
            for archive in archives:
                _run(*ctr, "images", "import", "--platform", "linux/amd64", str(archive), stdout=subprocess.DEVNULL)
            # Never collected by the kubelet: nothing could pull them back.
            for ref in subprocess.run([*ctr, "images", "list", "-q"], capture_output=True, text=True, check=True).stdout.split():
                _run(*ctr, "images", "label", ref, "io.cri-containerd.pinned=pinned", stdout=subprocess.DEVNULL)
        finally:
            proc.terminate()
            proc.wait(30)


def build(bins: Path, engine: str) -> str:
    """The node image's name, built and imported into ``engine`` (docker, podman) when missing."""
    if os.environ.get("INFERENTIA_KIND_NODE_IMAGE"):
        return os.environ["INFERENTIA_KIND_NODE_IMAGE"]
    v = versions()
    kind_dir = module_dir("sigs.k8s.io/kind", v["KIND_VERSION"])
    preload = control_plane_images(bins, v)
    key = image_key(bins, v, kind_dir, preload)
    name = f"{NODE_IMAGE_REPO}:{v['KUBERNETES_VERSION']}-{key}"
    archive = cache_dir() / f"node-{v['KUBERNETES_VERSION']}-{key}.tar"
    if not archive.exists():
        log(f"{name}: building (once)")
        base = images.base_rootfs(NODE_PACKAGES)
        work = Path(tempfile.mkdtemp(prefix="kind-node-", dir=cache_dir()))
        try:
            rootfs = work / "rootfs"
            rootfs.mkdir()
            _run("tar", "-C", str(rootfs), "--numeric-owner", "-xf", str(base))
            _assemble(rootfs, bins, v, kind_dir / "images/base/files")
            _preload(rootfs, bins, preload)
            _run("tar", "-C", str(rootfs), "--numeric-owner", "--xattrs", "-cf", str(archive.with_suffix(".partial")), ".")
            archive.with_suffix(".partial").rename(archive)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        for old in cache_dir().glob("node-*.tar"):
            if old != archive:
                old.unlink()
    if subprocess.run([engine, "image", "inspect", name], capture_output=True).returncode:
        log(f"{name}: importing into {engine}")
        # The base image's ENTRYPOINT, ENV and STOPSIGNAL (images/base/Dockerfile).
        changes = ['ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]', "ENV container=docker", "STOPSIGNAL SIGRTMIN+3"]
        argv = [engine, "import", *(a for c in changes for a in ("--change", c)), str(archive), name]
        imported = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if imported.returncode and "stopsignal is not a valid change command" in imported.stderr.lower():
            # Docker before 23 (Debian bookworm's docker.io 20.10) takes no STOPSIGNAL in an
            # import. Without it a graceful `docker stop` of the node waits out its timeout
            # (systemd re-executes on SIGTERM); kind deletes its nodes with `docker rm -f`.
            log(f"{engine} import takes no STOPSIGNAL: the node image goes without it")
            argv = [engine, "import", *(a for c in changes[:-1] for a in ("--change", c)), str(archive), name]
            imported = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if imported.returncode:
            sys.stderr.write(imported.stderr)
            raise subprocess.CalledProcessError(imported.returncode, argv, stderr=imported.stderr)
        # Older builds go (about 1 GB each); one a node still runs is refused, and stays.
        listed = subprocess.run(
            [engine, "images", "--format", "{{.Repository}}:{{.Tag}}", "--filter", f"reference={NODE_IMAGE_REPO}"],
            capture_output=True, text=True,
        )  # fmt: skip
        for old in set(listed.stdout.split()) - {name}:
            subprocess.run([engine, "rmi", old], capture_output=True)
    return name


def _assemble(rootfs: Path, bins: Path, v: dict[str, str], files: Path) -> None:
    """images/base/Dockerfile's steps on the Debian root, then the node image's contents."""
    for src in files.rglob("*"):
        if src.is_file():
            rel = src.relative_to(files)
            dest = rootfs / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest)
            executable = rel.parts[:3] == ("usr", "local", "bin") or rel.parts[:2] == ("kind", "bin")
            dest.chmod(0o755 if executable else 0o644)
    (rootfs / "kind").chmod(0o755)
    (rootfs / "kind/bin").chmod(0o755)
    script = """set -e
find /lib/systemd/system/sysinit.target.wants/ -name "systemd-tmpfiles-setup.service" -delete
rm -f /lib/systemd/system/multi-user.target.wants/* /etc/systemd/system/*.wants/* /lib/systemd/system/local-fs.target.wants/*
rm -f /lib/systemd/system/sockets.target.wants/*udev* /lib/systemd/system/sockets.target.wants/*initctl* /lib/systemd/system/basic.target.wants/*
echo "ReadKMsg=no" >> /etc/systemd/journald.conf
ln -sf /usr/lib/systemd/systemd /sbin/init
systemctl enable kubelet.service containerd.service undo-mount-hacks.service
systemctl mask systemd-binfmt.service
mkdir -p /etc/kubernetes/manifests /opt/cni/bin /etc/cni/net.d
"""
    _run("chroot", str(rootfs), "/bin/sh", "-c", script, stdout=subprocess.DEVNULL)
    # This machine grants no CAP_SYS_RESOURCE, not even to a privileged container: runc cannot
    # write a negative oom_score_adj, and fails with "can't get final child's PID from pipe".
    # containerd's restrict_oom_score_adj keeps a container's at or above its own, as it does
    # on the real node (and as kind's config does for rootless nodes).
    config = rootfs / "etc/containerd/config.toml"
    config.write_text(config.read_text().replace("restrict_oom_score_adj = false", "restrict_oom_score_adj = true"))
    for name in ("containerd", "containerd-shim-runc-v2", "ctr"):
        shutil.copy2(bins / name, rootfs / "usr/local/bin" / name)
    # kind's cri-base.json: containerd's default spec with kind's product-files hook and no rlimits.
    spec = json.loads(subprocess.run([str(bins / "ctr"), "oci", "spec"], capture_output=True, text=True, check=True).stdout)
    spec.setdefault("hooks", {}).setdefault("createContainer", []).append({"path": "/kind/bin/mount-product-files.sh"})
    spec["process"].pop("rlimits", None)
    (rootfs / "etc/containerd/cri-base.json").write_text(json.dumps(spec, indent=2))
    for plugin in (bins / "cni").iterdir():
        if not plugin.name.startswith("."):
            shutil.copy2(plugin, rootfs / "opt/cni/bin" / plugin.name)
    (rootfs / "etc/cni/net.d/10-inferentia-kind.conflist").write_text(json.dumps(cni_config(), indent=2))
    for name in ("kubeadm", "kubelet", "kubectl"):
        shutil.copy2(bins / name, rootfs / "usr/bin" / name)
    (rootfs / "kind/version").write_text(v["KUBERNETES_VERSION"] + "\n")


if __name__ == "__main__":
    from kindcluster import provider
    from localcluster import bin_dir

    print(build(bin_dir(), provider()))
