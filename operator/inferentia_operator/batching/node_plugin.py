"""`inferentia-operator node-plugin`: the node cache's views, mounted read-only into the pods of
its node, as a CSI driver's node plugin (docs/design.md, "A node-local artefact cache").

The kubelet mounts a pod's CSI ephemeral inline volume by calling ``NodePublishVolume`` on the
driver's node plugin (https://kubernetes-csi.github.io/docs/ephemeral-local-volumes.html), with the
volume's attributes and, since the driver's CSIDriver object says ``podInfoOnMount: true``, the
pod's namespace (``csi.storage.k8s.io/pod.namespace``). The plugin bind-mounts the node cache's
view of that namespace's artefact (``views/<namespace>/<key>``, batching/node_cache.py) at the
kubelet's target path, read-only; the pod sees the views the cache builds there, as it builds
them. A namespace sees only its own records' views, whatever key it names.

While a pod has a view mounted, the plugin keeps a pin (``<pins>/<namespace>/<key>/<volume id>``,
a directory the cache reads and cannot write, on the node's disk): the cache evicts no file a pinned view links to and removes no pinned
view, so a running replica's files never go from under it. ``NodeUnpublishVolume`` unmounts and
unpins.

The kubelet finds the plugin through its plugin registration API (``pluginregistration.v1``, the
socket ``<kubelet dir>/plugins_registry/<driver>-reg.sock``: k8s.io/kubelet
pkg/apis/pluginregistration/v1/api.proto), the API that the CSI project's node-driver-registrar
serves for a driver; here the plugin serves it itself.

Messages are those of the CSI specification's ``csi.proto`` (container-storage-interface/spec,
v1.x; package ``csi.v1``) and of ``api.proto``, field for field, for the fields used.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import re
from pathlib import Path
from typing import Any

import grpc

from inferentia_operator import __version__
from inferentia_operator.core.holds import HOLD_KEY, NODE_VIEW_DRIVER

from . import protos
from .frontend import until_signalled

log = logging.getLogger(__name__)

DRIVER = NODE_VIEW_DRIVER
# The attribute of a pod's CSI volume that names the artefact (core/holds.py, hold_key).
KEY_ATTRIBUTE = "key"
# What the kubelet adds to an inline volume's attributes (podInfoOnMount: true).
POD_NAMESPACE = "csi.storage.k8s.io/pod.namespace"
EPHEMERAL = "csi.storage.k8s.io/ephemeral"
CSI_VERSIONS = ["1.0.0"]
# A Kubernetes namespace's name (RFC 1123 label).
NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
VOLUME_ID = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_.]{0,127}$")
MAX_MESSAGE = 64 * 1024  # a publish request is a few paths and attributes
MAX_SOCKET_PATH = 107  # sockaddr_un's sun_path, less its terminating NUL (unix(7))

_S, _B, _I, _M, _ONE, _MANY, _MAP = (
    protos.STRING, protos.BOOL, protos.INT64, protos.MESSAGE, protos.ONE, protos.MANY, protos.STRING_MAP,
)  # fmt: skip
CSI = protos.messages(
    "csi.proto",
    "csi.v1",
    {
        "GetPluginInfoRequest": (),
        "GetPluginInfoResponse": (("name", 1, _S, _ONE, ""), ("vendor_version", 2, _S, _ONE, ""), ("manifest", 3, _M, _MANY, _MAP)),
        "GetPluginCapabilitiesRequest": (),
        "GetPluginCapabilitiesResponse": (),  # no capability: no controller service, no topology
        "ProbeRequest": (),
        "ProbeResponse": (),  # ready unset: ready
        "NodeGetCapabilitiesRequest": (),
        "NodeGetCapabilitiesResponse": (),  # no staging, no stats, no expansion
        "NodeGetInfoRequest": (),
        "NodeGetInfoResponse": (("node_id", 1, _S, _ONE, ""), ("max_volumes_per_node", 2, _I, _ONE, "")),
        "NodePublishVolumeRequest": (
            ("volume_id", 1, _S, _ONE, ""),
            ("target_path", 4, _S, _ONE, ""),
            ("readonly", 6, _B, _ONE, ""),
            ("volume_context", 8, _M, _MANY, _MAP),
        ),
        "NodePublishVolumeResponse": (),
        "NodeUnpublishVolumeRequest": (("volume_id", 1, _S, _ONE, ""), ("target_path", 2, _S, _ONE, "")),
        "NodeUnpublishVolumeResponse": (),
    },
)
REGISTRATION = protos.messages(
    "api.proto",
    "pluginregistration",
    {
        "InfoRequest": (),
        "PluginInfo": (
            ("type", 1, _S, _ONE, ""),
            ("name", 2, _S, _ONE, ""),
            ("endpoint", 3, _S, _ONE, ""),
            ("supported_versions", 4, _S, _MANY, ""),
        ),
        "RegistrationStatus": (("plugin_registered", 1, _B, _ONE, ""), ("error", 2, _S, _ONE, "")),
        "RegistrationStatusResponse": (),
    },
)

MNT_DETACH = 2  # umount2(2)
# The mount API of Linux 5.12 and later (open_tree(2), mount_setattr(2), move_mount(2)): one
# system call number on every architecture since 5.1's unified table.
SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_MOUNT_SETATTR = 428, 429, 442
OPEN_TREE_CLONE, AT_EMPTY_PATH, AT_FDCWD, MOVE_MOUNT_F_EMPTY_PATH = 1, 0x1000, -100, 4
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV = 1, 2, 4
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _checked(result: int, what: str) -> int:
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")
    return result


def _mount_read_only(directory: int, target: Path) -> None:
    """A read-only, nosuid, nodev bind mount of the directory ``directory`` (a descriptor) at
    ``target``, made read-only before it is attached: a remount after a bind would change only
    this mount namespace's copy, never the one the shared kubelet directory propagates to the
    kubelet and the pod (mount propagation carries mounts and unmounts, not remounts)."""
    tree = _checked(
        _libc.syscall(SYS_OPEN_TREE, ctypes.c_int(directory), b"", ctypes.c_uint(OPEN_TREE_CLONE | os.O_CLOEXEC | AT_EMPTY_PATH)),
        "open_tree",
    )
    try:
        attr = _MountAttr(attr_set=MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)
        _checked(
            _libc.syscall(SYS_MOUNT_SETATTR, ctypes.c_int(tree), b"", ctypes.c_uint(AT_EMPTY_PATH), ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr))),
            "mount_setattr",
        )  # fmt: skip
        _checked(
            _libc.syscall(SYS_MOVE_MOUNT, ctypes.c_int(tree), b"", ctypes.c_int(AT_FDCWD), os.fsencode(target), ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH)),
            "move_mount",
        )  # fmt: skip
    finally:
        os.close(tree)


def _mount_options(target: Path) -> list[str] | None:
    """The options of the mount at ``target`` (of this mount namespace's table, the last mounted
    there), or None if nothing is mounted there."""
    wanted, found = os.fsencode(target), None
    with open("/proc/self/mountinfo", "rb") as table:
        for line in table:
            fields = line.split()
            # The fifth field is the mount point, with space, tab, newline and backslash written
            # as octal escapes (\040 ...); the sixth, the mount's own options.
            if re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), fields[4]) == wanted:
                found = fields[5].decode().split(",")
    return found


class NodePlugin:
    def __init__(self, store: Path, kubelet_dir: Path, node: str, pins: Path | None = None, driver: str = DRIVER) -> None:
        self.store, self.kubelet_dir, self.node, self.driver = store, kubelet_dir.resolve(), node, driver
        # The pins sit apart from the store where the chart runs it (--pins-dir: a directory
        # the cache reads and cannot write), so the cache cannot plant a link where root writes.
        self.views, self.pins = store / "views", pins or store / "pins"
        self.endpoint = self.kubelet_dir / "plugins" / driver / "csi.sock"
        self.registration = self.kubelet_dir / "plugins_registry" / f"{driver}-reg.sock"

    # -- the CSI node service ----------------------------------------------------------------
    async def publish(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        attributes = dict(request.volume_context)
        namespace, key = attributes.get(POD_NAMESPACE, ""), attributes.get(KEY_ATTRIBUTE, "")
        target = Path(request.target_path)
        refusal = (
            "only as a CSI ephemeral inline volume of a pod" if attributes.get(EPHEMERAL) != "true"
            else "only read-only: readOnly: true" if not request.readonly
            else f"volumeAttributes.{KEY_ATTRIBUTE} must be an artefact's key, 32 hexadecimal digits (core/holds.py)" if not HOLD_KEY.fullmatch(key)
            else f"no pod namespace ({POD_NAMESPACE}): the CSIDriver must say podInfoOnMount: true" if not NAMESPACE.fullmatch(namespace)
            else "a volume id of letters, digits and -_." if not VOLUME_ID.fullmatch(request.volume_id)
            else f"a target path under {self.kubelet_dir / 'pods'}" if not self._in_pods(target)
            else None
        )  # fmt: skip
        if refusal:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{self.driver} mounts a node's view {refusal}")
        try:
            await asyncio.to_thread(self._publish, namespace, key, request.volume_id, target)
        except OSError as exc:
            await context.abort(grpc.StatusCode.INTERNAL, f"mounting the node's view at {target}: {exc}")
        return CSI["NodePublishVolumeResponse"]()

    def _in_pods(self, target: Path) -> bool:
        return ".." not in target.parts and target.is_absolute() and target.is_relative_to(self.kubelet_dir / "pods")

    def _publish(self, namespace: str, key: str, volume_id: str, target: Path) -> None:
        """Pinned first, then mounted read-only: a view is never mounted unpinned, and a pin
        whose mount failed goes (the kubelet, told of a failure, never unpublishes). Again for
        a volume mounted already: made read-only if a stop cut the last call short, else nothing
        (the kubelet retries a call it did not see answered)."""
        pin = self.pins / namespace / key / volume_id
        pin.parent.mkdir(parents=True, exist_ok=True)
        pin.write_text(str(target))
        try:
            target.mkdir(parents=True, exist_ok=True)
            options = _mount_options(target)
            if options is None:
                view = self._view_dir(namespace, key)
                try:
                    # The view as the descriptor names it: the cache, which writes in the store,
                    # cannot turn a part of its path into a link to elsewhere on the node.
                    _mount_read_only(view, target)
                finally:
                    os.close(view)
            elif "ro" not in options:  # an earlier version's bind, cut short before its remount
                _libc.umount2(str(target).encode(), MNT_DETACH)
                raise OSError(f"{target} was mounted writable: unmounted, for the kubelet's next call to mount it read-only")
        except OSError:
            with contextlib.suppress(OSError):
                if _mount_options(target) is not None:
                    _libc.umount2(str(target).encode(), MNT_DETACH)
            pin.unlink(missing_ok=True)
            raise

    def _view_dir(self, namespace: str, key: str) -> int:
        """A descriptor of VIEWS/<namespace>/<key>, made where missing (the cache's to build in:
        the store's owner's), each part opened without following a symbolic link."""
        owner = self.store.stat()
        fd = os.open(self.store, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            for part in (self.views.name, namespace, key):
                with contextlib.suppress(FileExistsError):
                    # Its owner's to build in (no chmod: it would follow a link planted
                    # between the mkdir and it).
                    os.mkdir(part, 0o755, dir_fd=fd)
                    os.chown(part, owner.st_uid, owner.st_gid, dir_fd=fd, follow_symlinks=False)
                inner = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                os.close(fd)
                fd = inner
            return fd
        except BaseException:
            os.close(fd)
            raise

    async def unpublish(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        target = Path(request.target_path)
        if not VOLUME_ID.fullmatch(request.volume_id) or not self._in_pods(target):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"a volume id and a target path under {self.kubelet_dir / 'pods'}")
        try:
            await asyncio.to_thread(self._unpublish, request.volume_id, target)
        except OSError as exc:
            await context.abort(grpc.StatusCode.INTERNAL, f"unmounting the node's view at {target}: {exc}")
        return CSI["NodeUnpublishVolumeResponse"]()

    def _unpublish(self, volume_id: str, target: Path) -> None:
        """Unmounted, then unpinned; the target directory goes (the CSI spec: the plugin removes
        what it made). Again for a volume gone already: nothing more."""
        if target.exists() and _mount_options(target) is not None and _libc.umount2(str(target).encode(), 0) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, os.strerror(errno), str(target))
        with contextlib.suppress(FileNotFoundError):
            target.rmdir()
        for pin in self.pins.glob(f"*/*/{volume_id}"):
            pin.unlink(missing_ok=True)
            with contextlib.suppress(OSError):  # still holding another pod's pin
                pin.parent.rmdir()

    def sweep_pins(self) -> None:
        """At start: a pin whose target is no longer mounted goes (a volume the kubelet forgot
        without unpublishing it, across a node's restart), else it would hold its view's files
        for ever."""
        for pin in self.pins.glob("*/*/*"):
            try:
                target = Path(pin.read_text()[:4096])
                if self._in_pods(target) and _mount_options(target) is not None:
                    continue
                pin.unlink()
                log.info("dropped the pin of %s: nothing is mounted there", target)
            except OSError as exc:
                log.warning("could not read or drop the pin %s: %s", pin, exc)

    async def node_info(self, _request: Any, _context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        return CSI["NodeGetInfoResponse"](node_id=self.node)

    async def plugin_info(self, _request: Any, _context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        return CSI["GetPluginInfoResponse"](name=self.driver, vendor_version=__version__)

    # -- the kubelet's plugin registration ---------------------------------------------------
    async def info(self, _request: Any, _context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        return REGISTRATION["PluginInfo"](type="CSIPlugin", name=self.driver, endpoint=str(self.endpoint), supported_versions=CSI_VERSIONS)

    async def status(self, request: Any, _context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        if request.plugin_registered:
            log.info("the kubelet registered %s", self.driver)
        else:
            log.error("the kubelet refused %s: %s", self.driver, request.error)
        return REGISTRATION["RegistrationStatusResponse"]()

    def handlers(self) -> tuple[list[grpc.GenericRpcHandler], list[grpc.GenericRpcHandler]]:
        """The CSI services, and the registration service."""

        def empty(response: str) -> Any:
            async def answer(_request: Any, _context: Any) -> Any:
                return CSI[response]()

            return answer

        u = protos.unary
        identity = grpc.method_handlers_generic_handler(
            "csi.v1.Identity",
            {
                "GetPluginInfo": u(self.plugin_info, CSI["GetPluginInfoRequest"], CSI["GetPluginInfoResponse"]),
                "GetPluginCapabilities": u(empty("GetPluginCapabilitiesResponse"), CSI["GetPluginCapabilitiesRequest"], CSI["GetPluginCapabilitiesResponse"]),
                "Probe": u(empty("ProbeResponse"), CSI["ProbeRequest"], CSI["ProbeResponse"]),
            },
        )  # fmt: skip
        node = grpc.method_handlers_generic_handler(
            "csi.v1.Node",
            {
                "NodePublishVolume": u(self.publish, CSI["NodePublishVolumeRequest"], CSI["NodePublishVolumeResponse"]),
                "NodeUnpublishVolume": u(self.unpublish, CSI["NodeUnpublishVolumeRequest"], CSI["NodeUnpublishVolumeResponse"]),
                "NodeGetCapabilities": u(empty("NodeGetCapabilitiesResponse"), CSI["NodeGetCapabilitiesRequest"], CSI["NodeGetCapabilitiesResponse"]),
                "NodeGetInfo": u(self.node_info, CSI["NodeGetInfoRequest"], CSI["NodeGetInfoResponse"]),
            },
        )  # fmt: skip
        registration = grpc.method_handlers_generic_handler(
            "pluginregistration.Registration",
            {
                "GetInfo": u(self.info, REGISTRATION["InfoRequest"], REGISTRATION["PluginInfo"]),
                "NotifyRegistrationStatus": u(self.status, REGISTRATION["RegistrationStatus"], REGISTRATION["RegistrationStatusResponse"]),
            },
        )  # fmt: skip
        return [identity, node], [registration]


async def _server(socket: Path, handlers: list[grpc.GenericRpcHandler]) -> grpc.aio.Server:
    if len(str(socket).encode()) > MAX_SOCKET_PATH:
        raise SystemExit(
            f"node-plugin: {socket} is longer than a Unix socket's path may be ({MAX_SOCKET_PATH} bytes): a shorter --kubelet-dir"
        )
    socket.parent.mkdir(parents=True, exist_ok=True)
    socket.unlink(missing_ok=True)  # a previous run's
    server = grpc.aio.server(
        handlers=handlers, options=[("grpc.max_receive_message_length", MAX_MESSAGE), ("grpc.max_send_message_length", MAX_MESSAGE)]
    )
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    return server


def prepare(store: Path, pins: Path, owner: tuple[int, int]) -> None:
    """The store and pin directories on the node's disk, as the chart's init container makes
    them before the cache starts: the store the cache's (``owner``), the pins root's."""
    for directory in (store, pins):
        directory.mkdir(parents=True, exist_ok=True)
    os.chown(store, *owner)
    store.chmod(0o775)
    os.chown(pins, 0, 0)
    pins.chmod(0o755)


def serve(store: Path, kubelet_dir: Path, node: str, pins: Path | None = None, driver: str = DRIVER) -> None:
    """The plugin, as `inferentia-operator node-plugin` runs it: the CSI socket first, then the
    registration socket, whose appearance is what makes the kubelet call."""
    if not node:
        raise SystemExit("node-plugin: --node-name (or $NODE_NAME) is required: the kubelet asks the plugin which node it is on")
    plugin = NodePlugin(store, kubelet_dir, node, pins, driver)
    plugin.sweep_pins()

    async def run(stop: asyncio.Event) -> None:
        csi, registration = plugin.handlers()
        servers = [await _server(plugin.endpoint, csi), await _server(plugin.registration, registration)]
        try:
            await stop.wait()
        finally:
            for server in servers:
                await server.stop(grace=1)
            plugin.registration.unlink(missing_ok=True)  # the kubelet deregisters a plugin whose socket goes

    until_signalled(run)
