"""`inferentia-operator node-cache`: a node's cache of compiled artefacts' and models' files, by SHA-256.

One runs on each node (a DaemonSet; docs/design.md, "A node-local artefact cache"). ``fetch``
asks the one on its own node for each file of an artefact by the SHA-256 that the artefact's
completion marker names, checks what it gets, and offers back a file it had to read from the
store. So only the first replica on a node reads the store.

- ``GET /blobs/<sha256>``: the file; or 404 with a fill lease (``{"fill": <id>, "seconds": n}``):
  the caller reads the store and offers the file, and while it does (renewing the lease with
  ``?lease=<id>`` within n seconds) every other caller is answered 409 with ``Retry-After``, to
  ask again: replicas starting together on a node read the store once. A lease not renewed
  lapses, and the next caller fills.
- ``PUT /blobs/<sha256>`` with a Content-Length: stored only if its bytes hash to that name
  (else 400), written aside and renamed whole, so a partial or wrong file is never served and
  no client can plant one under another file's hash. 200 if already held and still whole (the
  body is not read); a held copy whose bytes changed on disk is dropped and the offer stored
  in its place (``inferentia_node_cache_damaged_total``). 409 while another offer of it is being
  written, 413 above the whole cache, 411 without a length, 503 past ``MAX_OFFERS`` at once,
  408 when its body stalls for ``--body-timeout-s`` seconds, 507 when the offers being received
  fill the cache. Room is made for bytes as they arrive, never for the length an offer declares.
- ``PUT /artefacts/<key>`` (a JSON list of SHA-256s, or ``{"files": {name: SHA-256}}``, with a
  Content-Length): an artefact a fetch found whole, recorded for the caller's namespace while
  every file of it is held (else 409), and labelled on the cache's own pod (core/holds.py).
  Nothing lists what is held. A record that names its files also gets a view: hard links to
  them under their names in ``views/<namespace>/<key>/<digest>`` (``view_digest``, of the names
  and hashes), built aside and renamed whole, gone with the record. Mounted read-only where a
  fetch runs (``INFERENTIA_NODE_VIEW``), it is what the fetch links to instead of copying.
- Bounded by ``max_bytes``: the least recently used files go first to make room.
- ``/metrics``: files, bytes, hits, misses, stored, refused offers, damaged copies; ``/healthz``.
- At most ``MAX_CONNECTIONS`` open connections, ``MAX_PEER_CONNECTIONS`` of them from one
  address; one more is answered 503 and closed.

Who may call (``--node-name``, as the chart runs it): ``/blobs`` and ``/artefacts`` answer only a
pod of this node, which shows its projected ServiceAccount token for the audience ``AUDIENCE``
(``Authorization: Bearer``). The API server says whose it is (a TokenReview); its answer names
the pod's node (userInfo.extra ``authentication.kubernetes.io/node-name``:
https://kubernetes.io/docs/reference/access-authn-authz/service-accounts-admin/#bound-service-account-tokens)
and namespace. A file is handed to a caller that knows its hash, and only an artefact's marker
holds it: a namespace cannot ask for another's files without already knowing what they are.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from inferentia_operator.core.holds import (
    HOLD_KEY,
    HOLDS_PREFIX,
    MAX_VIEW_DEPTH,
    NODE_CACHE_AUDIENCE,
    NODE_CACHE_MAX_TOKEN_BYTES,
    VIEW_NAMES,
    view_digest,
    view_name,
)

from .frontend import LimitedSite, until_signalled
from .limits import DEFAULT_LIMITS

log = logging.getLogger(__name__)

SHA256 = re.compile(r"^[0-9a-f]{64}$")
MAX_OFFERS = 4  # offers written at once
# Artefacts recorded as held whole (labels on the cache's pod; core/holds.py), each of at most
# MAX_ARTEFACT_FILES files: the least recently recorded go first past a namespace's bound, and
# past the bound of all namespaces together (a label each on the pod).
MAX_ARTEFACTS = 32
MAX_RECORDS = 256
MAX_ARTEFACT_FILES = 1024
MAX_RECORD_BYTES = 128 * 1024
# Views (VIEWS/<namespace>/<key>/<digest>): a record that names its files gets one, each name
# one core/holds.py's view_name takes.
VIEWS = "views"
PINS = "pins"
UNCHECKED_NAMESPACE = "-"  # a cache that admits anyone (no --node-name) has no caller's namespace
LABEL_PERIOD = 1.0  # seconds between patches of the pod's labels, at most
# Open connections (any pod can reach a cache pod's address); one more is answered 503 and
# closed. A node's serving pods open one each while they fetch; one pod (one address) may hold
# a few, never all: the kubelet's probe and the node's other replicas still get in.
MAX_CONNECTIONS = 256
MAX_PEER_CONNECTIONS = 4
CHUNK = 1 << 20
# After an offer's grace (--body-timeout-s, the seconds its body may go without a byte) its bytes
# must arrive at this rate on average (an offer is a file on the same node, read from a local
# disk, at hundreds of MB a second).
MIN_OFFER_RATE = 1 << 20
# After an answer that left a body unread, seconds the connection still drains it (so that the
# client reads the answer, not a reset) before it is closed.
LINGER = 2.0

# The audience of the token a caller shows (core/holds.py).
AUDIENCE = NODE_CACHE_AUDIENCE
MAX_TOKEN_BYTES = NODE_CACHE_MAX_TOKEN_BYTES  # a longer one is refused unread
# A token the API server accepted, remembered (by its hash) for at most this long, and its
# expiry; at most MAX_VERDICTS of them, the least recently used forgotten first. A pod deleted
# keeps its access for at most this long.
VERDICT_SECONDS = 60.0
MAX_VERDICTS = 1024
MAX_REVIEWS = 2  # TokenReviews in flight at once
REVIEW_WAIT = 1.0  # seconds a caller waits for a review's turn, then 503
PENALTY = 10.0  # seconds an address whose token was refused gets no review (429)
# Fills leased at once, at most (a lease lasts --fill-lease-s unless its holder renews it).
MAX_FILLS = 256


class NodeCache:
    def __init__(
        self,
        directory: Path,
        max_bytes: int,
        admission: Admission | None,
        body_timeout: float,
        fill_lease: float,
        pins: Path | None = None,
    ) -> None:
        self.blobs, self.partial = directory / "blobs", directory / "partial"
        self.max_bytes, self.body_timeout, self.fill_lease = max_bytes, body_timeout, fill_lease
        # sha -> (lease, when it lapses): the caller told to fill it from the store.
        self.fills: OrderedDict[str, tuple[str, float]] = OrderedDict()
        # None: a cache run by hand (a test, a laptop), which answers any caller; the chart's
        # answers only pods of its node.
        self.admission = admission
        self.blobs.mkdir(parents=True, exist_ok=True)
        self.partial.mkdir(parents=True, exist_ok=True)
        for stale in self.partial.iterdir():  # offers a stop cut short: never served
            stale.unlink(missing_ok=True)
        # sha -> (size, last use), from what an earlier run left whole.
        self.held: dict[str, tuple[int, float]] = {}
        for path in self.blobs.iterdir():
            if SHA256.fullmatch(path.name) and path.is_file():
                self.held[path.name] = (path.stat().st_size, path.stat().st_mtime)
        self.offers: dict[str, int] = {}  # sha -> bytes of it received so far, while it is written
        r = self.registry = CollectorRegistry()
        Gauge("inferentia_node_cache_files", "Files held.", registry=r).set_function(lambda: len(self.held))
        Gauge("inferentia_node_cache_bytes", "Bytes held.", registry=r).set_function(lambda: self.used)
        Gauge("inferentia_node_cache_max_bytes", "The cache's size limit.", registry=r).set(max_bytes)
        Gauge("inferentia_node_cache_receiving_bytes", "Bytes of offers received so far, while they are written.", registry=r).set_function(
            lambda: sum(self.offers.values())
        )
        self.hits = Counter("inferentia_node_cache_hits", "Files served.", registry=r)
        self.misses = Counter("inferentia_node_cache_misses", "Files asked for and not held (each given a fill lease).", registry=r)
        self.waits = Counter("inferentia_node_cache_waits", "Asks answered 409: another caller is filling the file.", registry=r)
        self.stored = Counter("inferentia_node_cache_stored", "Offers stored.", registry=r)
        self.refused = Counter(
            "inferentia_node_cache_refused",
            "Requests refused, by reason (an offer's, a caller's token, a connection past a bound).",
            ["reason"],
            registry=r,
        )
        self.damaged = Counter("inferentia_node_cache_damaged", "Held files found changed on disk, and dropped.", registry=r)
        # (namespace, artefact key) -> its files' SHA-256s, for those a fetch found whole here (PUT
        # /artefacts). Kept per namespace: one namespace's record never replaces another's.
        self.artefacts: dict[tuple[str, str], frozenset[str]] = {}
        # (namespace, artefact key) -> the digest of its view (core/holds.py, view_digest): the
        # directory VIEWS/<namespace>/<key>/<digest> of links to its files under their names,
        # built when a record names them, and gone with the record.
        self.views_dir = directory / VIEWS
        self.views: dict[tuple[str, str], str] = {}
        # The node plugin's pins (PINS/<namespace>/<key>/<volume id>): a pod has that key's views
        # mounted. A view whose record went while pinned stays, with the files it links to.
        self.pins_dir = pins or directory / PINS
        self.orphans: dict[Path, frozenset[str]] = {}
        self.changed = asyncio.Event()  # what it holds changed: the pod's labels follow
        # The records outlive a restart of the container (they sit beside the files), and only
        # while every file they name is still held.
        self.records = directory / "artefacts.json"
        try:
            saved = json.loads(self.records.read_text())
            for name, record in saved.items() if isinstance(saved, dict) else ():
                namespace, _, key = name.rpartition("/")
                files, view = (record.get("files"), record.get("view")) if isinstance(record, dict) else (record, None)
                if HOLD_KEY.fullmatch(key) and isinstance(files, list) and files and all(f in self.held for f in files):
                    self.artefacts[namespace, key] = frozenset(files)
                    if isinstance(view, str) and SHA256.fullmatch(view):
                        self.views[namespace, key] = view
        except (OSError, ValueError):
            pass
        self._prune_views()
        Gauge("inferentia_node_cache_artefacts", "Artefacts held whole (labels on the pod).", registry=r).set_function(
            lambda: len(self.artefacts)
        )
        # sha -> the (size, mtime, inode) its bytes were last hashed at: unchanged, not hashed again.
        self.checked: dict[str, tuple[int, int, int]] = {}

    @property
    def used(self) -> int:
        return sum(size for size, _ in self.held.values())

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/metrics", self.scrape)
        app.router.add_get("/blobs/{sha}", self._admitted(self.get))
        app.router.add_put("/blobs/{sha}", self._admitted(self.put))
        app.router.add_put("/artefacts/{key}", self._admitted(self.record_artefact))
        return app

    def _admitted(
        self, handler: Callable[[web.Request, str], Awaitable[web.StreamResponse]]
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        """``handler``, called with the caller's namespace once the caller is admitted."""

        async def admitted(request: web.Request) -> web.StreamResponse:
            if self.admission is None:
                return await handler(request, "")
            caller = await self.admission.caller(request.headers.get("Authorization", ""), request.remote or "")
            if isinstance(caller, Refusal):
                return self._refuse(caller.status, caller.reason, caller.why)
            return await handler(request, caller)

        return admitted

    def holds(self) -> dict[str, str]:
        """The pod labels that say what this node holds whole (core/holds.py)."""
        return {HOLDS_PREFIX + key: "true" for _, key in self.artefacts}

    async def record_artefact(self, request: web.Request, namespace: str) -> web.Response:
        """A fetch that has every file of an artefact checked says which: recorded (and labelled)
        only while every one of them is held here. A pod can claim an artefact it did not fetch,
        but only with files this cache holds, and what it buys is a scheduling preference: the
        files themselves are still checked by every fetch against the marker."""
        key = request.match_info["key"]
        if not HOLD_KEY.fullmatch(key):
            return web.json_response({"error": "an artefact is recorded under its key, 32 hexadecimal digits"}, status=404)
        if request.content_length is None:
            return web.json_response({"error": "a record needs a Content-Length"}, status=411)
        if request.content_length > MAX_RECORD_BYTES:
            return web.json_response({"error": f"a record is at most {MAX_RECORD_BYTES} bytes"}, status=413)
        try:
            body = json.loads(await request.read())  # the whole body, its length known and bounded
        except ValueError:
            body = None
        # A list of SHA-256s; or {"files": {name: SHA-256}}, which also asks for a view.
        named = body.get("files") if isinstance(body, dict) else None
        files = list(named.values()) if isinstance(named, dict) else body
        if (
            not isinstance(files, list)
            or not 0 < len(files) <= MAX_ARTEFACT_FILES
            or not all(isinstance(f, str) and SHA256.fullmatch(f) for f in files)
        ):
            return web.json_response(
                {"error": f'a record is a JSON list of 1 to {MAX_ARTEFACT_FILES} SHA-256s, or {{"files": {{name: SHA-256}}}}'}, status=400
            )
        if isinstance(named, dict) and (bad := next((n for n in named if not view_name(n)), None)) is not None:
            return web.json_response({"error": f"{str(bad)[:80]!r} is not a file's name in a view: {VIEW_NAMES}"}, status=400)
        if missing := [f for f in files if f not in self.held]:
            return web.json_response({"error": f"{len(missing)} of its files are not held here"}, status=409)
        recorded, name = frozenset(files), (namespace, key)
        if isinstance(named, dict) and len({d for n in named for d in _parents(n)}) > len(named) + MAX_VIEW_DEPTH:
            # A view's directories are not counted in the cache's size: a record whose files
            # sit under more of them than it has files (and one file's depth) gets no view.
            named = None
        digest = view_digest(named) if isinstance(named, dict) else None
        if self.artefacts.get(name) == recorded and digest in (None, self.views.get(name)):
            # Every fetch records, hits included: the same record again only refreshes its place,
            # with no write to disk and no wake of the pod labeller (no API call per replica).
            self.artefacts[name] = self.artefacts.pop(name)
            return web.json_response({"recorded": True, "view": name in self.views}, status=200)
        previous = self.artefacts.pop(name, None)
        self.artefacts[name] = recorded  # most recent last
        if isinstance(named, dict) and digest is not None:
            self._build_view(name, digest, named)
        elif previous != recorded:
            self._drop_view(name)  # a view of other files
        # Past its own bound a namespace loses its own oldest record, never another's; past the
        # bound of all (as many namespaces as pods of a node) the oldest of all goes.
        own = [n for n in self.artefacts if n[0] == namespace]
        for oldest in own[: max(0, len(own) - MAX_ARTEFACTS)]:
            del self.artefacts[oldest]
        while len(self.artefacts) > MAX_RECORDS:
            del self.artefacts[next(iter(self.artefacts))]
        for dropped in [n for n in self.views if n not in self.artefacts]:
            self._drop_view(dropped)
        self._changed()
        return web.json_response({"recorded": True, "view": name in self.views}, status=201)

    def _changed(self) -> None:
        aside = self.records.with_suffix(".new")
        saved = {f"{ns}/{key}": {"files": sorted(files), "view": self.views.get((ns, key))} for (ns, key), files in self.artefacts.items()}
        aside.write_text(json.dumps(saved))
        aside.replace(self.records)
        self.changed.set()

    def _view_path(self, name: tuple[str, str], digest: str) -> Path:
        namespace, key = name
        return self.views_dir / (namespace or UNCHECKED_NAMESPACE) / key / digest

    def _build_view(self, name: tuple[str, str], digest: str, files: dict[str, str]) -> None:
        """The view of a record that names its files: hard links to the held files (no byte
        copied), built aside and renamed whole, so that a view is there complete or not at all.
        Links keep an evicted file's bytes on disk, so a view goes whenever its record does."""
        final = self._view_path(name, digest)
        if self.views.get(name) == digest and final.is_dir():
            return
        self._drop_view(name)
        if final in self.orphans:
            # Still mounted by a pod since its record went, and of the same names and hashes:
            # taken back if each of its links is the held file itself (one dropped as damaged
            # and offered again is another inode); else it stays an orphan and the record has
            # no view while a pod holds it (a view's name is its content's).
            if self._links_held(final, files):
                del self.orphans[final]
                self.views[name] = digest
            return
        aside = self.views_dir / f".building-{secrets.token_hex(8)}"
        try:
            for relative, sha in files.items():
                target = aside / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                os.link(self.blobs / sha, target)
            final.parent.mkdir(parents=True, exist_ok=True)
            aside.rename(final)
        except OSError as exc:  # names that clash ("a" and "a/b"), a full disk: no view, the record stands
            log.warning("no view of %s/%s: %s", *name, exc)
            shutil.rmtree(aside, ignore_errors=True)
            return
        self.views[name] = digest

    def _drop_view(self, name: tuple[str, str]) -> None:
        """A view goes with its record; but while a pod has it mounted (the node plugin's pin,
        batching/node_plugin.py) it stays, as an orphan, its files kept, until the pin goes."""
        digest = self.views.pop(name, None)
        if digest is None:
            return
        path = self._view_path(name, digest)
        if self._pinned(path.parent):
            self.orphans[path] = self._linked_from(path)
        else:
            shutil.rmtree(path, ignore_errors=True)

    def _links_held(self, view: Path, files: dict[str, str]) -> bool:
        """Each of ``view``'s names is a link to the held file of its hash."""
        try:
            return all(sha in self.held and (view / n).lstat().st_ino == (self.blobs / sha).stat().st_ino for n, sha in files.items())
        except OSError:
            return False

    def _pinned(self, key_dir: Path) -> bool:
        """A pod of the node has the views of ``key_dir`` (VIEWS/<namespace>/<key>) mounted."""
        try:
            return any((self.pins_dir / key_dir.parent.name / key_dir.name).iterdir())
        except OSError:
            return False

    def _linked_from(self, view: Path) -> frozenset[str]:
        """The held files a view's links share bytes with."""
        inodes = {(self.blobs / sha).stat().st_ino: sha for sha in self.held}
        return frozenset(inodes[f.stat().st_ino] for f in view.rglob("*") if f.is_file() and f.stat().st_ino in inodes)

    def _kept_for_pods(self) -> frozenset[str]:
        """The files of every view a pod has mounted: never evicted. Orphans no pod holds any
        more go first."""
        for path in [p for p in self.orphans if not self._pinned(p.parent)]:
            shutil.rmtree(path, ignore_errors=True)
            del self.orphans[path]
        kept = set().union(*self.orphans.values())
        for name, digest in self.views.items():
            if self._pinned(self._view_path(name, digest).parent):
                kept |= self.artefacts.get(name, frozenset())
        return frozenset(kept)

    def _prune_views(self) -> None:
        """At start, views go with their records: any directory under VIEWS that is not the view
        of a record the cache kept (one half-built when a run stopped, one of a record dropped),
        unless a pod has it mounted (an orphan, then)."""
        self.views = {n: d for n, d in self.views.items() if n in self.artefacts and self._view_path(n, d).is_dir()}
        keep = {self._view_path(n, d) for n, d in self.views.items()}
        for namespace in self.views_dir.iterdir() if self.views_dir.is_dir() else ():
            if namespace.name.startswith(".building-") or not namespace.is_dir():
                shutil.rmtree(namespace, ignore_errors=True)
                continue
            for key in namespace.iterdir():
                for view in key.iterdir() if key.is_dir() else ():
                    if view in keep:
                        continue
                    if self._pinned(key):
                        self.orphans[view] = self._linked_from(view)
                    else:
                        shutil.rmtree(view, ignore_errors=True)

    async def healthz(self, _request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def scrape(self, _request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), content_type="text/plain")

    async def get(self, request: web.Request, _namespace: str) -> web.StreamResponse:
        sha = request.match_info["sha"]
        if not SHA256.fullmatch(sha):
            return web.json_response({"error": "a file is asked for by its SHA-256, 64 hexadecimal digits"}, status=404)
        if sha not in self.held:
            return self._miss(sha, request.query.get("lease"))
        size, _ = self.held[sha]
        self.held[sha] = (size, time.time())
        self.hits.inc()
        # Evicted while being sent, the file stays readable through the open descriptor; evicted
        # before it is opened, aiohttp's FileResponse answers 404, a miss like any other.
        return web.FileResponse(self.blobs / sha)

    def _miss(self, sha: str, lease: str | None) -> web.Response:
        """A file not held: the caller fills it (a lease), unless another caller is filling it."""
        now = time.monotonic()
        for lapsed in [s for s, (_, until) in self.fills.items() if until <= now]:
            del self.fills[lapsed]
        filling = self.fills.get(sha)
        if filling is not None and lease == filling[0]:  # its filler, renewing
            self.fills[sha] = (lease, now + self.fill_lease)
            return web.json_response({"error": "not held", "fill": lease, "seconds": self.fill_lease}, status=404)
        if filling is not None or sha in self.offers:
            self.waits.inc()
            return web.json_response(
                {"error": "another replica of this node is filling it: ask again"}, status=409, headers={"Retry-After": "1"}
            )
        self.misses.inc()
        self.fills[sha] = (lease := secrets.token_hex(16), now + self.fill_lease)
        while len(self.fills) > MAX_FILLS:
            self.fills.popitem(last=False)
        return web.json_response({"error": "not held", "fill": lease, "seconds": self.fill_lease}, status=404)

    def _refuse(self, code: int, reason: str, why: str) -> web.Response:
        self.refused.labels(reason).inc()
        return web.json_response({"error": why}, status=code)

    def _intact(self, sha: str) -> bool:
        """The held file of ``sha`` still hashes to it (read again only if its stat changed)."""
        path = self.blobs / sha
        try:
            st = path.stat()
            if self.checked.get(sha) == (st.st_size, st.st_mtime_ns, st.st_ino):
                return True
            digest = hashlib.sha256()
            with path.open("rb") as f:
                while block := f.read(CHUNK):
                    digest.update(block)
        except OSError:
            return False
        if digest.hexdigest() != sha:
            return False
        self.checked[sha] = (st.st_size, st.st_mtime_ns, st.st_ino)
        return True

    def _make_room(self, size: int) -> bool:
        """Evicts the least recently used files until ``size`` more bytes fit, never one a pod
        has mounted through a view; False, evicting nothing, when they would not fit even then
        (the offers being received and the mounted files fill the cache)."""
        receiving = sum(self.offers.values())
        if self.used + receiving + size <= self.max_bytes:
            return True
        kept = self._kept_for_pods()
        if receiving + size + sum(self.held[sha][0] for sha in kept if sha in self.held) > self.max_bytes:
            return False
        for sha, _ in sorted(self.held.items(), key=lambda kv: kv[1][1]):
            if self.used + receiving + size <= self.max_bytes:
                break
            if sha not in kept:
                self._drop(sha)
        return True

    def _drop(self, sha: str) -> None:
        """A held file goes, and with it every artefact it was a part of."""
        for path, linked in self.orphans.items():  # a mounted orphan keeps the inode, uncounted now
            self.orphans[path] = linked - {sha}
        (self.blobs / sha).unlink(missing_ok=True)
        self.held.pop(sha, None)
        self.checked.pop(sha, None)
        for name in [n for n, files in self.artefacts.items() if sha in files]:
            self._drop_view(name)  # else its links would keep the evicted bytes on disk
            del self.artefacts[name]
            self._changed()

    async def put(self, request: web.Request, _namespace: str) -> web.Response:
        sha = request.match_info["sha"]
        if not SHA256.fullmatch(sha):
            return self._refuse(404, "name", "a file is offered under its SHA-256, 64 hexadecimal digits")
        if sha in self.offers:
            return self._refuse(409, "busy", "that file is being stored already")
        if len(self.offers) >= MAX_OFFERS:
            return self._refuse(503, "busy", f"{MAX_OFFERS} offers are being stored already")
        if sha in self.held:
            # An offer of a held file follows a fetch that found the cache's copy wrong: its bytes
            # changed on the node's disk since they were hashed. Checked again (in an offer's slot,
            # so MAX_OFFERS bounds the hashing too), a damaged copy goes and the offer replaces it.
            self.offers[sha] = 0
            try:
                intact = await asyncio.to_thread(self._intact, sha)
            finally:
                del self.offers[sha]
            if intact:
                return web.json_response({"held": True}, status=200)
            self.damaged.inc()
            self._drop(sha)
        length = request.content_length
        if length is None:
            return self._refuse(411, "length", "an offer needs a Content-Length, to make room before reading it")
        if length > self.max_bytes:
            return self._refuse(413, "size", f"{length} bytes is more than the whole cache ({self.max_bytes})")
        # Nothing is evicted for a length an offer only declares: room is made for each block as
        # it arrives, so an offer that sends nothing costs nothing, and offers half-sent hold
        # together at most the cache's size.
        self.offers[sha] = 0
        aside = self.partial / f"{sha}.{os.getpid()}"
        digest, read, began = hashlib.sha256(), 0, time.monotonic()
        try:
            with aside.open("wb") as out:
                while True:
                    try:
                        # A trickle is no offer: after body_timeout's grace the bytes must keep
                        # up MIN_OFFER_RATE, or the offer's slot goes to another.
                        due = began + self.body_timeout + read / MIN_OFFER_RATE - time.monotonic()
                        block = await asyncio.wait_for(request.content.read(CHUNK), max(0.0, due))
                    except TimeoutError:
                        return self._refuse(
                            408, "timeout", f"the offer sent less than {MIN_OFFER_RATE} bytes a second after {self.body_timeout:g} seconds"
                        )
                    except (ConnectionError, HttpProcessingError):  # the client went before it sent it all
                        return self._refuse(400, "gone", "the offer ended before its Content-Length")
                    if not block:
                        break
                    read += len(block)
                    if read > length:
                        return self._refuse(400, "size", "more bytes than the Content-Length said")
                    if not self._make_room(len(block)):
                        return self._refuse(507, "room", "the offers being received fill the cache: offer it again later")
                    self.offers[sha] += len(block)
                    digest.update(block)
                    out.write(block)
            if read != length or digest.hexdigest() != sha:
                return self._refuse(400, "hash", "the bytes do not hash to the name they were offered under")
            # Read-only, and readable by the serving pods that see it through a view: whoever
            # they run as, and never written through one of its links.
            aside.chmod(0o444)
            aside.rename(self.blobs / sha)
            self.held[sha] = (length, time.time())
            st = (self.blobs / sha).stat()
            self.checked[sha] = (st.st_size, st.st_mtime_ns, st.st_ino)
            self.stored.inc()
            return web.json_response({"held": True}, status=201)
        finally:
            self.offers.pop(sha, None)
            # Stored or refused, the fill is over: the next ask is served, or fills again.
            self.fills.pop(sha, None)
            aside.unlink(missing_ok=True)


def _parents(name: str) -> list[str]:
    """The directories a view makes for a file's name: "a/b/c" -> ["a", "a/b"]."""
    parts = name.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


class Refusal:
    """Why a caller is not admitted: the status, the metric's reason, the message."""

    def __init__(self, status: int, reason: str, why: str) -> None:
        self.status, self.reason, self.why = status, reason, why


class Admission:
    """Admits pods of ``node``: each shows its projected token, which the API server reviews.

    What a token's own claims already refuse (too long, not a JWT, another audience, expired,
    not bound to a pod of this node) costs no review: unsigned, the claims can only say no,
    never yes. Anyone can forge claims that pass, so reviews are bounded too: one at a time
    from an address, MAX_REVIEWS at once, a caller waiting at most REVIEW_WAIT for its turn, and
    an address whose token the API server refused gets no review for PENALTY seconds. A token
    the API server accepted is remembered by its hash for VERDICT_SECONDS (at most its life), so
    a replica's fetch costs one review, not one per file; the same token asked together is
    reviewed once."""

    def __init__(self, node: str, review: Callable[[str], dict[str, Any]]) -> None:
        self.node, self.review = node, review
        # Accepted tokens only: a refused one is never remembered, so forged tokens cannot push
        # the replicas' verdicts out; the peer that sent it is held back instead.
        self.accepted: OrderedDict[str, tuple[float, str]] = OrderedDict()
        self.pending: dict[str, asyncio.Future[str | Refusal]] = {}
        self.penalised: OrderedDict[str, float] = OrderedDict()
        self.peers_reviewing: set[str] = set()
        self.reviewing = asyncio.Semaphore(MAX_REVIEWS)

    async def caller(self, authorization: str, peer: str = "") -> str | Refusal:
        """The namespace of the pod whose token ``authorization`` carries, or why not."""
        scheme, _, bearer = authorization.partition(" ")
        if scheme.lower() != "bearer" or not bearer or len(bearer) > MAX_TOKEN_BYTES:
            return Refusal(401, "token", f"show the pod's projected token for the audience {AUDIENCE} (Authorization: Bearer)")
        claims = _claims(bearer)
        if claims is None:
            return Refusal(401, "token", "the token is not a ServiceAccount token")
        audience, expiry = claims.get("aud"), claims.get("exp")
        audiences = audience if isinstance(audience, list) else [audience]
        if AUDIENCE not in audiences or not isinstance(expiry, (int, float)) or expiry <= time.time():
            return Refusal(401, "token", f"the token is expired or not for the audience {AUDIENCE}")
        bound = claims.get("kubernetes.io")
        bound = bound if isinstance(bound, dict) else {}
        node, pod = bound.get("node"), bound.get("pod")
        # A token bound to the Node object itself (kubectl create token --bound-object-kind Node)
        # carries the node too, but no pod: only a pod's token says a pod of this node asks.
        if not isinstance(node, dict) or node.get("name") != self.node or not isinstance(pod, dict):
            return Refusal(403, "node", f"the node cache answers only pods of its node, {self.node}")
        digest = hashlib.sha256(bearer.encode()).hexdigest()
        now = time.time()
        known = self.accepted.get(digest)
        if known is not None and known[0] > now:
            self.accepted.move_to_end(digest)
            return known[1]
        if digest in self.pending:  # asked together: one review
            return await asyncio.shield(self.pending[digest])
        if self.penalised.get(peer, 0.0) > now or peer in self.peers_reviewing:
            return Refusal(429, "review", "this address's last token was refused, or one of its tokens is being checked: try again later")
        future: asyncio.Future[str | Refusal] = asyncio.get_running_loop().create_future()
        self.pending[digest] = future
        self.peers_reviewing.add(peer)
        try:
            verdict = await self._reviewed(bearer, float(expiry), digest)
            if isinstance(verdict, Refusal) and verdict.status in (401, 403):
                self.penalised[peer] = time.time() + PENALTY
                while len(self.penalised) > MAX_VERDICTS:
                    self.penalised.popitem(last=False)
            future.set_result(verdict)
            return verdict
        finally:
            del self.pending[digest]
            self.peers_reviewing.discard(peer)
            if not future.done():
                future.cancel()

    async def _reviewed(self, bearer: str, expiry: float, digest: str) -> str | Refusal:
        try:
            await asyncio.wait_for(self.reviewing.acquire(), REVIEW_WAIT)
        except TimeoutError:
            return Refusal(503, "review", "too many tokens are being checked: try again")
        try:
            status = await asyncio.to_thread(self.review, bearer)
        except Exception as exc:  # noqa: BLE001 - the API server unreachable or refusing: this request fails, alone
            log.warning("could not review a caller's token: %s", exc)
            return Refusal(503, "review", "the caller's token could not be checked with the API server: try again")
        finally:
            self.reviewing.release()
        verdict = self._judge(status)
        if isinstance(verdict, str):
            self.accepted[digest] = (min(time.time() + VERDICT_SECONDS, expiry), verdict)
            while len(self.accepted) > MAX_VERDICTS:
                self.accepted.popitem(last=False)
        return verdict

    def _judge(self, status: dict[str, Any]) -> str | Refusal:
        user = status.get("user") or {}
        username, extra = str(user.get("username", "")), user.get("extra") or {}
        if not status.get("authenticated") or AUDIENCE not in (status.get("audiences") or []):
            return Refusal(401, "token", "the API server does not accept the token")
        if extra.get("authentication.kubernetes.io/node-name") != [self.node] or not extra.get("authentication.kubernetes.io/pod-name"):
            return Refusal(403, "node", f"the node cache answers only pods of its node, {self.node}")
        prefix, _, rest = username.partition("system:serviceaccount:")
        namespace = rest.split(":", 1)[0]
        if prefix or not namespace:
            return Refusal(403, "token", "the token is not a pod's ServiceAccount token")
        return namespace


def _claims(bearer: str) -> dict[str, Any] | None:
    """A JWT's claims, unchecked (the API server checks the signature); None if not one."""
    parts = bearer.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (binascii.Error, ValueError, RecursionError):  # deep nesting is no token either
        return None
    return claims if isinstance(claims, dict) else None


def token_review(transport: Any) -> Callable[[str], dict[str, Any]]:
    """A TokenReview of a token for AUDIENCE, through ``transport``: its status."""

    def review(bearer: str) -> dict[str, Any]:
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": bearer, "audiences": [AUDIENCE]}}
        response = transport.request("POST", "/apis/authentication.k8s.io/v1/tokenreviews", body=body, content_type="application/json")
        if response.status not in (200, 201):
            raise ApiRefused(f"TokenReview: {response.status} {response.reason}")
        answer = json.loads(response.data)
        status = answer.get("status") if isinstance(answer, dict) else None
        return status if isinstance(status, dict) else {}

    return review


class PodLabels:
    """Keeps the cache's own pod labelled with what it holds whole (``holds.inferentia.dev/<key>``,
    core/holds.py), level-based: each pass reads the pod and patches only the difference, so a
    restart (which forgets nothing: the records sit beside the files) or a lost patch mends
    itself. Its ServiceAccount may patch pods in its own namespace, and the chart's admission
    policy narrows that to this pod's own ``holds`` labels."""

    def __init__(self, name: str, namespace: str) -> None:
        import urllib3

        from inferentia_operator.shell.transport import Transport  # loaded only where the cache labels its pod

        self.transport = Transport(pool_size=1, read_timeout=10)
        # What a read or a patch raises when the API refuses or cannot be reached.
        self.errors = (ApiRefused, urllib3.exceptions.HTTPError, OSError)
        self.url = f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}"

    def _call(self, method: str, body: Any = None) -> dict[str, Any]:
        content_type = "application/merge-patch+json" if body is not None else None
        response = self.transport.request(method, self.url, body=body, content_type=content_type)
        if response.status != 200:
            raise ApiRefused(f"{method} {self.url}: {response.status} {response.reason}")
        found = json.loads(response.data)
        return found if isinstance(found, dict) else {}

    def apply(self, desired: dict[str, str]) -> None:
        labels = self._call("GET").get("metadata", {}).get("labels") or {}
        current = {k: v for k, v in labels.items() if k.startswith(HOLDS_PREFIX)}
        if current == desired:
            return
        patch: dict[str, str | None] = {**{k: None for k in current if k not in desired}, **desired}
        self._call("PATCH", {"metadata": {"labels": patch}})


class ApiRefused(Exception):
    """The API server answered the cache's call (a read or patch of its own pod, a TokenReview) with an error."""


async def follow_holds(cache: NodeCache, labels: PodLabels) -> None:
    """Every change to what the cache holds, onto its pod's labels, at most once a LABEL_PERIOD."""
    cache.changed.set()  # the first pass mends whatever a previous run left
    while True:
        await cache.changed.wait()
        cache.changed.clear()
        try:
            await asyncio.to_thread(labels.apply, cache.holds())
        except labels.errors as exc:  # the labels are a preference: without them the cache serves on
            log.warning("could not label the node cache's pod with what it holds: %s", exc)
            cache.changed.set()
        await asyncio.sleep(LABEL_PERIOD)


def serve(
    directory: Path,
    max_bytes: int,
    port: int,
    host: str,
    node: str,
    body_timeout: float,
    fill_lease: float,
    pins: Path | None = None,
) -> None:
    """The cache, as `inferentia-operator node-cache` runs it: its flags (cli.py) give every
    bound that has one, with its default."""
    admission = None
    if node:
        from inferentia_operator.shell.transport import Transport  # loaded only where callers are checked

        admission = Admission(node, token_review(Transport(pool_size=MAX_REVIEWS, read_timeout=10)))
    cache = NodeCache(directory, max_bytes, admission, body_timeout, fill_lease, pins)
    # The chart gives the pod its own name and namespace (the downward API); elsewhere (a test, a
    # cache run by hand) nothing is labelled.
    pod, namespace = os.environ.get("POD_NAME"), os.environ.get("POD_NAMESPACE")

    async def run(stop: asyncio.Event) -> None:
        runner = web.AppRunner(cache.app(), access_log=None, keepalive_timeout=DEFAULT_LIMITS.header_timeout, lingering_time=LINGER)
        await runner.setup()
        site = LimitedSite(
            runner, host, port, MAX_CONNECTIONS, cache.refused.labels("connections").inc,
            per_peer=MAX_PEER_CONNECTIONS, peer_refused=cache.refused.labels("peer").inc,
        )  # fmt: skip
        await site.start()
        labelling = asyncio.create_task(follow_holds(cache, PodLabels(pod, namespace))) if pod and namespace else None
        try:
            await stop.wait()
        finally:
            if labelling:
                labelling.cancel()
            await runner.cleanup()

    until_signalled(run)
