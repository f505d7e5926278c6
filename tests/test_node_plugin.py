"""The node plugin (`inferentia-operator node-plugin`, batching/node_plugin.py) as a real process,
called over its Unix sockets as the kubelet calls a CSI driver's node plugin: its registration
(pluginregistration.v1), then NodePublishVolume and NodeUnpublishVolume, which really mount. The
node cache's side of the pins the plugin writes is in tests/test_node_cache.py."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from inferentia_operator.batching.node_plugin import CSI, DRIVER, REGISTRATION

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root (CAP_SYS_ADMIN), as the chart's node plugin has")
KEY = "0123456789abcdef0123456789abcdef"


class Plugin:
    def __init__(self, tmp_path: Path) -> None:
        # A Unix socket's path is at most 107 bytes: the kubelet's directory is short, as
        # /var/lib/kubelet is (tmp_path is not).
        self.store, self.kubelet = tmp_path / "store", Path(tempfile.mkdtemp(prefix="kubelet-", dir="/tmp"))
        self.store.mkdir()
        os.chown(self.store, 65534, 65534)  # the cache's own user, as the chart runs it
        self.start()

    def start(self) -> None:
        """The plugin's process, returning once its registration socket is there."""
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "inferentia_operator", "node-plugin", "--dir", str(self.store), "--kubelet-dir", str(self.kubelet),
             "--node-name", "node-a"],
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.registration = self.kubelet / "plugins_registry" / f"{DRIVER}-reg.sock"
        deadline = time.monotonic() + 30
        while not self.registration.exists():
            assert self.proc.poll() is None and time.monotonic() < deadline, self.proc.stderr.read() if self.proc.stderr else ""
            time.sleep(0.1)

    def call(self, socket: Path, method: str, request, response_class):
        with grpc.insecure_channel(f"unix://{socket}") as channel:
            rpc = channel.unary_unary(
                method, request_serializer=type(request).SerializeToString, response_deserializer=response_class.FromString
            )
            return rpc(request, timeout=10)

    def publish(self, target: Path, namespace: str = "team-a", key: str = KEY, volume: str = "csi-0a1b", **overrides):
        attributes = {"key": key, "csi.storage.k8s.io/pod.namespace": namespace, "csi.storage.k8s.io/ephemeral": "true"}
        attributes.update(overrides.pop("attributes", {}))
        request = CSI["NodePublishVolumeRequest"](volume_id=volume, target_path=str(target), readonly=overrides.pop("readonly", True))
        request.volume_context.update(attributes)
        return self.call(self.endpoint, "/csi.v1.Node/NodePublishVolume", request, CSI["NodePublishVolumeResponse"])

    def unpublish(self, target: Path, volume: str = "csi-0a1b"):
        request = CSI["NodeUnpublishVolumeRequest"](volume_id=volume, target_path=str(target))
        return self.call(self.endpoint, "/csi.v1.Node/NodeUnpublishVolume", request, CSI["NodeUnpublishVolumeResponse"])

    @property
    def endpoint(self) -> Path:
        return self.kubelet / "plugins" / DRIVER / "csi.sock"

    def stop(self) -> str:
        self.proc.terminate()
        self.proc.wait(10)
        return self.proc.stderr.read() if self.proc.stderr else ""


@pytest.fixture
def plugin(tmp_path) -> Iterator[Plugin]:
    p = Plugin(tmp_path)
    try:
        yield p
    finally:
        log = p.stop()
        for line in reversed(Path("/proc/self/mountinfo").read_text().splitlines()):  # nothing left mounted, whatever failed
            if line.split()[4].startswith(str(p.kubelet)):
                subprocess.run(["umount", "-l", line.split()[4]], check=False)
        shutil.rmtree(p.kubelet)
        assert "Traceback" not in log, log


def target_of(plugin: Plugin, pod: str = "pod-uid-1") -> Path:
    return plugin.kubelet / "pods" / pod / "volumes" / "kubernetes.io~csi/node-view/mount"


def test_the_kubelet_finds_the_plugin_by_its_registration_socket_as_it_finds_a_csi_driver(plugin):
    info = plugin.call(
        plugin.registration, "/pluginregistration.Registration/GetInfo", REGISTRATION["InfoRequest"](), REGISTRATION["PluginInfo"]
    )
    assert (info.type, info.name, info.endpoint, list(info.supported_versions)) == ("CSIPlugin", DRIVER, str(plugin.endpoint), ["1.0.0"])
    status = REGISTRATION["RegistrationStatus"](plugin_registered=True)
    plugin.call(
        plugin.registration, "/pluginregistration.Registration/NotifyRegistrationStatus", status, REGISTRATION["RegistrationStatusResponse"]
    )
    identity = plugin.call(plugin.endpoint, "/csi.v1.Identity/GetPluginInfo", CSI["GetPluginInfoRequest"](), CSI["GetPluginInfoResponse"])
    assert identity.name == DRIVER and identity.vendor_version
    node = plugin.call(plugin.endpoint, "/csi.v1.Node/NodeGetInfo", CSI["NodeGetInfoRequest"](), CSI["NodeGetInfoResponse"])
    assert node.node_id == "node-a"


def test_a_pod_sees_its_namespaces_view_read_only_and_pinned_while_it_is_mounted(plugin):
    view = plugin.store / "views" / "team-a" / KEY / ("d" * 64)
    view.mkdir(parents=True)
    (view / "model.pt").write_bytes(b"weights")
    target = target_of(plugin)
    plugin.publish(target)
    plugin.publish(target)  # the kubelet asks again when it missed the answer: the same mount, once
    assert (target / ("d" * 64) / "model.pt").read_bytes() == b"weights"
    with pytest.raises(OSError) as refused:
        (target / "planted").write_bytes(b"x")
    assert refused.value.errno == errno.EROFS
    [mount] = [line.split() for line in Path("/proc/self/mountinfo").read_text().splitlines() if line.split()[4] == str(target)]
    assert {"ro", "nosuid", "nodev"} <= set(mount[5].split(",")), mount  # the mount's own options, from its start
    assert (plugin.store / "pins" / "team-a" / KEY / "csi-0a1b").read_text() == str(target)
    # Views the cache builds later show through the mount as they are built.
    (plugin.store / "views" / "team-a" / KEY / ("e" * 64)).mkdir()
    assert (target / ("e" * 64)).is_dir()

    plugin.unpublish(target)
    plugin.unpublish(target)  # gone already: nothing more
    assert not target.exists() and not (plugin.store / "pins" / "team-a" / KEY).exists()
    assert (view / "model.pt").read_bytes() == b"weights"  # the cache's files are the cache's


def test_another_namespace_naming_the_same_key_sees_only_its_own_views(plugin):
    (plugin.store / "views" / "team-a" / KEY / ("d" * 64)).mkdir(parents=True)
    target = target_of(plugin, "pod-of-team-b")
    plugin.publish(target, namespace="team-b", volume="csi-b")
    assert list(target.iterdir()) == []
    made = plugin.store / "views" / "team-b" / KEY
    assert made.is_dir() and made.stat().st_uid == 65534 and made.stat().st_mode & 0o700 == 0o700  # the cache builds in it
    plugin.unpublish(target, volume="csi-b")


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"attributes": {"csi.storage.k8s.io/ephemeral": "false"}}, "ephemeral inline volume"),
        ({"readonly": False}, "readOnly: true"),
        ({"key": "../../etc"}, "32 hexadecimal digits"),
        ({"namespace": "../team-a"}, "podInfoOnMount"),
        ({"volume": "../x"}, "volume id"),
        ({"target": "/etc/outside"}, "a target path under"),
    ],
    ids=["persistent", "writable", "key", "namespace", "volume-id", "target"],
)
def test_what_the_plugin_does_not_mount_is_refused_with_the_reason_and_nothing_mounted(plugin, change, says):
    target = Path(change.pop("target")) if "target" in change else target_of(plugin)
    with pytest.raises(grpc.RpcError) as refused:
        plugin.publish(target, **change)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and says in refused.value.details(), refused.value.details()
    assert not target.exists() and not (plugin.store / "pins").exists()


def test_a_view_path_the_cache_turned_into_a_link_is_not_followed_and_leaves_no_pin(plugin, tmp_path):
    """The cache writes in the store; the plugin is root. A link planted where a view would be
    (here the namespace's directory, leading to a directory of the node) is refused, nothing is
    mounted, and the failed call's pin goes (the kubelet never unpublishes a failed publish)."""
    elsewhere = tmp_path / "node-secrets"
    elsewhere.mkdir()
    (elsewhere / "key").write_text("secret")
    (plugin.store / "views").mkdir()
    (plugin.store / "views" / "team-a").symlink_to(elsewhere)
    target = target_of(plugin)
    with pytest.raises(grpc.RpcError) as refused:
        plugin.publish(target)
    assert refused.value.code() == grpc.StatusCode.INTERNAL
    assert not any(str(target) == line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines())
    assert not list((plugin.store / "pins").rglob("csi-*"))


def test_a_writable_mount_left_at_the_target_is_never_taken_for_the_view(plugin):
    """A writable mount at the target (a bind cut short before its remount, as mount(2) makes
    them in two steps): the call fails, unmounts it and pins nothing; the kubelet's next call
    mounts the view, read-only from the start, once."""
    source = plugin.store / "views" / "team-a" / KEY
    source.mkdir(parents=True)
    target = target_of(plugin)
    target.mkdir(parents=True)
    subprocess.run(["mount", "--bind", str(source), str(target)], check=True)
    with pytest.raises(grpc.RpcError) as refused:
        plugin.publish(target)
    assert refused.value.code() == grpc.StatusCode.INTERNAL and "writable" in refused.value.details()
    assert not list((plugin.store / "pins").rglob("csi-*"))
    plugin.publish(target)
    with pytest.raises(OSError) as refused:
        (target / "planted").write_bytes(b"x")
    assert refused.value.errno == errno.EROFS
    assert sum(str(target) == line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()) == 1
    plugin.unpublish(target)
    assert not target.exists()


def test_a_pin_whose_mount_is_gone_is_dropped_when_the_plugin_starts(plugin, tmp_path):
    """A pin outlives the plugin (it sits on the node's disk); one whose target is no longer
    mounted (a volume the kubelet forgot across a node's restart) would hold its view's files
    for ever: the plugin drops it at its start, and keeps a pin whose view is still mounted."""
    (plugin.store / "views" / "team-a" / KEY).mkdir(parents=True)
    mounted = target_of(plugin, "pod-still-there")
    plugin.publish(mounted, volume="csi-kept")
    stale = plugin.store / "pins" / "team-a" / KEY / "csi-gone"
    stale.write_text(str(target_of(plugin, "pod-gone")))
    assert "Traceback" not in plugin.stop()
    plugin.start()
    assert not stale.exists() and (plugin.store / "pins" / "team-a" / KEY / "csi-kept").exists()
    plugin.unpublish(mounted, volume="csi-kept")
