"""`inferentia-operator fetch` and `upload`: what moves models and compiled artefacts in and out of
pods. Both run in the operator's own image, so the user's Neuron image needs no S3 client.

- ``upload`` (the compile Job's last container): every file the compile step wrote, then a
  completion marker (``_INFERENTIA_COMPLETE``, JSON: each file's size and SHA-256) last.
- ``fetch`` (the serving pods' init container): an artefact only when its marker is there, and
  only the files the marker names, each checked against its size and digest. An upload that
  stopped half-way has no marker, so nothing half-written is ever served.
- ``fetch --model`` (the uncompiled model, for the compile program or the model server): every
  object under an ``s3://`` prefix, or one ``https://`` file; or, where the prefix has a marker
  (``upload`` wrote the model, or ``index`` hashed it in place), exactly the files it names, each
  checked and, on a serving pod, read through the node's cache.

vLLM on Neuron reads NEURON_COMPILED_ARTIFACTS as a local directory, and so does every framework
that loads a compiled model from a path; nothing in a serving image downloads an ``s3://`` URI.
Credentials and the endpoint come from the environment, as boto3 reads it (AWS_ACCESS_KEY_ID /
AWS_SECRET_ACCESS_KEY from spec.compile.storageSecret, or the pod's ServiceAccount through IRSA or
EKS Pod Identity; AWS_ENDPOINT_URL for an S3-compatible store).
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import shutil
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path, PurePosixPath
from typing import Any

from .core.holds import NODE_CACHE_MAX_TOKEN_BYTES, hold_key, view_digest, view_name

MARKER = "_INFERENTIA_COMPLETE"
# An https:// model larger than this is refused: a URL is for a small model, S3 for the rest.
MAX_HTTPS_BYTES = 50 * 1024**3
# A marker lists a file's name, size and SHA-256 in about 150 bytes: room for 100,000 files.
MAX_MARKER_BYTES = 16 * 1024**2
# The node's cache answers on this node or not at all: its Service routes only to the node's own
# pod (internalTrafficPolicy: Local), and drops the connection where there is none.
CACHE_TIMEOUT = 2.0
# Seconds a fetch waits, asking each second, while another replica of the node fills a file it
# wants from the store; then it reads the store itself. (The filler renews its lease as it reads:
# a filler that dies lets it lapse within the cache's --fill-lease-s.)
FILL_WAIT = 600.0


# The file of the pod's projected ServiceAccount token for the node cache's audience: the cache
# answers only pods of its own node that show one (batching/node_cache.py, Admission).
CACHE_ENV = "INFERENTIA_NODE_CACHE"
TOKEN_ENV = "INFERENTIA_NODE_CACHE_TOKEN"
# Where the node's views are mounted, read-only, one directory per artefact's key (hold_key),
# and in it one per digest of an artefact's names and hashes (batching/node_cache.py, views).
VIEW_ENV = "INFERENTIA_NODE_VIEW"


class FetchError(Exception):
    pass


def _cache_headers() -> dict[str, str]:
    """The pod's token for the node cache, read afresh each time (the kubelet rotates the file)."""
    path = os.environ.get(TOKEN_ENV)
    if not path:
        return {}
    try:
        with open(path, "rb") as f:
            token = f.read(NODE_CACHE_MAX_TOKEN_BYTES + 1).decode().strip()
    except (OSError, UnicodeDecodeError):
        return {}  # the cache refuses then, and the store is read: a replica still starts
    return {"Authorization": f"Bearer {token}"} if token and len(token) <= NODE_CACHE_MAX_TOKEN_BYTES else {}


def split_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix/`` -> ("bucket", "some/prefix/")."""
    if not uri.startswith("s3://") or not uri[5:].split("/", 1)[0]:
        raise FetchError(f"{uri!r} is not an s3:// URI; valid values look like s3://bucket/prefix/")
    bucket, _, prefix = uri[5:].partition("/")
    return bucket, prefix


def split_s3_dir(uri: str) -> tuple[str, str]:
    """As split_s3_uri, the prefix ending in "/": the directory an artefact or a marked model is in."""
    bucket, prefix = split_s3_uri(uri)
    return bucket, prefix if not prefix or prefix.endswith("/") else prefix + "/"


def _client(client: Any) -> Any:
    if client is not None:
        return client
    try:
        import boto3
    except ImportError as exc:  # the operator's image installs it (the [s3] extra, in the Dockerfile)
        raise FetchError("boto3 is not installed: pip install 'inferentia-operator[s3]'") from exc
    return boto3.client("s3")


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _matches(path: Path, expected: dict[str, Any]) -> bool:
    return bool(path.stat().st_size == expected["size"] and _digest(path) == expected["sha256"])


def _safe_target(destination: Path, relative: str) -> Path | None:
    """Where ``relative`` lands under ``destination``; None for a key that would leave it (``..``)."""
    parts = PurePosixPath(relative.lstrip("/")).parts
    if not parts or ".." in parts:
        return None
    return destination.joinpath(*parts)


def _keys(client: Any, bucket: str, prefix: str) -> list[str]:
    keys: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys += [item["Key"] for item in page.get("Contents", [])]
    return keys


class _Fill:
    """The node cache's answer to a miss: this fetch fills the file, holding a lease the cache
    lets lapse unless it is renewed within ``seconds``; renewed here, from a thread, while the
    store is read (so that the node's other replicas wait for this read rather than repeat it)."""

    def __init__(self, cache: str, sha256: str, lease: str, seconds: float) -> None:
        self.url = f"{cache.rstrip('/')}/blobs/{sha256}?lease={urllib.parse.quote(lease)}"
        self.period = max(0.2, min(seconds, 3600.0) / 3)
        self.done = threading.Event()
        self.renewer = threading.Thread(target=self._renew, daemon=True)

    def _renew(self) -> None:
        while not self.done.wait(self.period):
            try:
                urllib.request.urlopen(urllib.request.Request(self.url, headers=_cache_headers()), timeout=CACHE_TIMEOUT).close()
            except urllib.error.HTTPError as answer:  # 404: renewed (the file is not held yet)
                answer.close()
            except (OSError, ValueError, http.client.HTTPException):
                return  # the cache is gone: the lease lapses, as it should

    def __enter__(self) -> _Fill:
        self.renewer.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.done.set()


def _from_cache(cache: str, sha256: str, size: int, target: Path) -> bool | _Fill:
    """The file of ``sha256`` from the node's cache into ``target``, if it holds it, checked as it
    arrives (its size and SHA-256, so the file is not read again to hash it); else the lease to
    fill it with, if the cache gives one, else False. While another
    replica of the node fills it, asked again each second, for at most FILL_WAIT seconds. The
    cache is another pod's server: at most ``size`` bytes are read from it, one byte more proving
    the answer wrong, whatever length it declares or however long it streams."""
    deadline = time.monotonic() + FILL_WAIT
    while True:
        try:
            asked = urllib.request.Request(f"{cache.rstrip('/')}/blobs/{sha256}", headers=_cache_headers())
            with urllib.request.urlopen(asked, timeout=CACHE_TIMEOUT) as answer, target.open("wb") as out:
                declared = answer.headers.get("Content-Length")
                if declared is not None and declared != str(size):
                    return False
                left, digest = size + 1, hashlib.sha256()
                while left and (block := answer.read(min(1 << 20, left))):
                    left -= len(block)
                    digest.update(block)
                    out.write(block)
                return left == 1 and digest.hexdigest() == sha256
        except urllib.error.HTTPError as answer:  # a miss (404), another's fill (409), not admitted (401, 403)
            with answer:
                if answer.code == 409 and time.monotonic() < deadline:
                    time.sleep(1.0)
                    continue
                if answer.code in (401, 403):
                    raise _CacheRefused(f"it answered {answer.code}: {answer.read(512).decode(errors='replace').strip()}") from None
                return _lease(cache, sha256, answer) if answer.code == 404 else False
        except (OSError, ValueError) as exc:  # no answer: with no cache pod on this node, none will come
            raise _CacheSilent from exc
        except http.client.HTTPException:  # a broken answer: the store then
            return False


def _lease(cache: str, sha256: str, miss: urllib.error.HTTPError) -> _Fill | bool:
    """The fill lease a miss carries (read to at most 1 KiB), or False."""
    try:
        found = json.loads(miss.read(1024))
    except (OSError, ValueError, http.client.HTTPException):
        return False
    lease, seconds = (found.get("fill"), found.get("seconds")) if isinstance(found, dict) else (None, None)
    if isinstance(lease, str) and isinstance(seconds, (int, float)) and seconds > 0:
        return _Fill(cache, sha256, lease, float(seconds))
    return False


class _CacheRefused(Exception):
    """The node's cache does not admit this pod (401, 403): it keeps nothing this fetch offers."""


class _CacheSilent(Exception):
    """The node's cache did not answer (refused, or timed out): the rest of the fetch reads the
    store alone rather than wait out the timeout once per file."""


def _offer(cache: str, sha256: str, path: Path) -> None:
    """Gives the node's cache a file read from the store; it keeps it only if the bytes hash to
    ``sha256``. Best effort: a refusal or an absent cache changes nothing for this pod."""
    try:
        with path.open("rb") as body:
            request = urllib.request.Request(
                f"{cache.rstrip('/')}/blobs/{sha256}", body, {"Content-Length": str(path.stat().st_size), **_cache_headers()}, method="PUT"
            )
            urllib.request.urlopen(request, timeout=CACHE_TIMEOUT).close()
    except (OSError, ValueError, http.client.HTTPException):
        pass


def _record(cache: str, uri: str, files: dict[str, str] | list[str]) -> str | None:
    """Tells the node's cache that this artefact is here whole (each file's name and SHA-256), so
    that its pod is labelled with it (core/holds.py) and the scheduler prefers this node for the
    artefact's next replica, and so that it builds the artefact's view, which the node's next
    replicas link to. It records it only while it holds every file. Best effort, as the offer:
    None when recorded, else why not (which only a fill acts on)."""
    body = json.dumps({"files": files} if isinstance(files, dict) else files, sort_keys=True).encode()
    try:
        request = urllib.request.Request(
            f"{cache.rstrip('/')}/artefacts/{hold_key(uri)}", body, {"Content-Type": "application/json", **_cache_headers()}, method="PUT"
        )
        urllib.request.urlopen(request, timeout=CACHE_TIMEOUT).close()
        return None
    except urllib.error.HTTPError as answer:
        with answer:
            return f"it answered {answer.code}: {answer.read(512).decode(errors='replace').strip()}"
    except (OSError, ValueError, http.client.HTTPException) as exc:
        return f"it did not answer ({type(exc).__name__})"


def fetch(uri: str, destination: Path, client: Any = None, cache: str | None = None, view: Path | None = None) -> list[Path]:
    """A compiled artefact: the files its completion marker names, each checked, into
    ``destination``; with ``cache`` (the node's cache, INFERENTIA_NODE_CACHE), each file is
    asked of it first by its SHA-256, and one read from the store is offered back; with ``view``
    (the node's view of the artefact, INFERENTIA_NODE_VIEW), linked from there if it has them."""
    bucket, prefix = split_s3_dir(uri)
    client = _client(client)
    marker = _marker(client, bucket, prefix)
    if marker is None:
        if _keys(client, bucket, prefix):
            raise FetchError(f"{uri} has no completion marker ({MARKER}): its upload did not finish, so it is not served")
        raise FetchError(f"no compiled artefact under {uri}: the compile Job has not written one there")
    return _fetch_marked(uri, marker, destination, client, cache, view)


def _marker(client: Any, bucket: str, prefix: str) -> dict[str, Any] | None:
    """The completion marker under ``prefix``, read to at most MAX_MARKER_BYTES; None if absent."""
    try:
        body = client.get_object(Bucket=bucket, Key=prefix + MARKER)["Body"].read(MAX_MARKER_BYTES + 1)
    except client.exceptions.NoSuchKey:
        return None
    if len(body) > MAX_MARKER_BYTES:
        raise FetchError(f"s3://{bucket}/{prefix}{MARKER} is more than {MAX_MARKER_BYTES} bytes: not a marker this tool wrote")
    marker = json.loads(body)
    if not isinstance(marker, dict) or not isinstance(marker.get("files"), dict):
        raise FetchError(f"s3://{bucket}/{prefix}{MARKER} is not a completion marker: it names no files")
    return marker


def _fetch_marked(
    uri: str, marker: dict[str, Any], destination: Path, client: Any, cache: str | None, view: Path | None = None, filling: bool = False
) -> list[Path]:
    """The files ``marker`` names under ``uri``: linked from the node's view of them if it has
    them all; else each from the node's cache if it holds it, else from the store (and offered
    to the cache), each checked against the marker's size and SHA-256."""
    bucket, prefix = split_s3_dir(uri)
    named = {name: e["sha256"] for name, e in marker["files"].items() if _safe_target(destination, name)}
    if view is not None and (linked := _linked(view, marker, named, destination)) is not None:
        if cache:
            _record(cache, uri, named)  # its place in the cache's records, refreshed
        return linked
    written: list[Path] = []
    for name, expected in sorted(marker["files"].items()):
        target = _safe_target(destination, name)
        if target is None:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        fill: _Fill | None = None
        try:
            got = _from_cache(cache, expected["sha256"], expected["size"], target) if cache else False
            if got is True:
                written.append(target)
                continue
            fill = got if isinstance(got, _Fill) else None
        except _CacheSilent as exc:
            if filling:  # a fill's only product is the cache's copy: no store read for nothing
                raise FetchError(f"the node's cache did not answer ({type(exc.__cause__).__name__}): nothing would keep {uri}") from None
            cache = None
        except _CacheRefused as exc:
            if filling:
                raise FetchError(f"the node's cache did not admit this pod ({exc}): nothing would keep {uri}") from None
            cache = None  # it would refuse the offer and the record too
        with fill or contextlib.nullcontext():
            client.download_file(bucket, prefix + name, str(target))
            if not _matches(target, expected):
                raise FetchError(f"{uri.rstrip('/')}/{name} does not match its completion marker (size or SHA-256): refusing it")
            if cache:
                _offer(cache, expected["sha256"], target)
        written.append(target)
    if cache and written:
        # Names a view cannot hold (a marker written by hand): recorded by their hashes alone.
        _record(cache, uri, named if all(map(view_name, named)) else sorted(set(named.values())))
    return written


def fill(uri: str, scratch: Path, client: Any = None, cache: str | None = None, view: Path | None = None) -> list[str]:
    """Fill-ahead (the operator's fill Jobs, core/fill_ahead/part.py): the artefact fetched into
    ``scratch`` through the node's cache as a replica fetches it, so that the cache holds and
    records it (and builds its view), then the pod's copy removed: a finished fill leaves
    nothing on the node but the cache's own files. On a node whose view holds it all, nothing is
    read. The names it filled; it fails, saying why, unless the cache recorded the artefact whole."""
    if not cache:
        raise FetchError(f"a fill is for the node's cache, and {CACHE_ENV} is not set: nothing would keep {uri}")
    bucket, prefix = split_s3_dir(uri)
    client = _client(client)
    marker = _marker(client, bucket, prefix)
    if marker is None:
        raise FetchError(f"{uri} has no completion marker ({MARKER}): there is nothing whole to fill")
    named = {name: e["sha256"] for name, e in marker["files"].items() if _safe_target(scratch, name)}
    try:
        files = _fetch_marked(uri, marker, scratch, client, cache, view, filling=True)
    finally:
        for entry in list(scratch.iterdir()) if scratch.is_dir() else ():
            # Links into a view are removed, never followed: the view is the cache's.
            entry.unlink() if entry.is_symlink() or not entry.is_dir() else shutil.rmtree(entry)
    # Asked again (recording what is recorded writes nothing): the fetch's own record is best
    # effort, and a cache that went silent mid-fetch, or evicted a file, left the node unfilled.
    refused = _record(cache, uri, named if all(map(view_name, named)) else sorted(set(named.values())))
    if refused is not None:
        raise FetchError(f"the node's cache did not record {uri}: {refused}")
    return sorted(p.relative_to(scratch).as_posix() for p in files)


def _linked(view: Path, marker: dict[str, Any], named: dict[str, str], destination: Path) -> list[Path] | None:
    """Links in ``destination`` to the files of the node's view of the artefact, without reading
    a byte of them; None (nothing linked) unless the view has every file. The view is the one
    whose name is the digest of the marker's names and hashes (core/holds.py): the node cache
    builds it only of files it checked against those hashes, and the view is read-only, so each
    file is the marker's without hashing it again."""
    if not all(map(view_name, named)):  # names no view holds ("/x" would leave it): copied
        return None
    built = view / view_digest(named)
    try:
        for name in named:
            if (built / name).stat().st_size != marker["files"][name]["size"]:
                return None
    except (OSError, ValueError):  # not there (yet): no view of this artefact on this node
        return None
    linked = []
    for name in sorted(named):
        target = _safe_target(destination, name)
        assert target is not None  # named holds only names that land inside
        target.parent.mkdir(parents=True, exist_ok=True)
        target.unlink(missing_ok=True)
        target.symlink_to(built / name)
        linked.append(target)
    return linked


def fetch_model(uri: str, destination: Path, client: Any = None, cache: str | None = None, view: Path | None = None) -> list[Path]:
    """The uncompiled model: every object under an s3:// prefix (or the one object it names), or one
    https:// file. A prefix with a completion marker (``upload`` or ``index`` wrote it) is fetched as
    an artefact is: exactly the files it names, each checked, through the node's cache."""
    destination.mkdir(parents=True, exist_ok=True)
    if uri.startswith("https://"):
        name = PurePosixPath(urllib.parse.urlparse(uri).path).name or "model"
        target = destination / name
        try:
            with urllib.request.urlopen(uri, timeout=60) as response, target.open("wb") as out:
                length = int(response.headers.get("Content-Length") or 0)
                if length > MAX_HTTPS_BYTES:
                    raise FetchError(f"{uri} is {length} bytes, more than {MAX_HTTPS_BYTES}: put a model this large in S3")
                _copy_at_most(response, out, MAX_HTTPS_BYTES, uri)
        except BaseException:
            target.unlink(missing_ok=True)  # nothing half-fetched is left to be taken for the model
            raise
        return [target]
    bucket, prefix = split_s3_uri(uri)
    client = _client(client)
    marker = _marker(client, *split_s3_dir(uri))
    if marker is not None:
        return _fetch_marked(uri, marker, destination, client, cache, view)
    written: list[Path] = []
    for key, relative in _model_keys(client, bucket, prefix):
        landing = _safe_target(destination, relative)
        if landing is None:
            continue
        landing.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(bucket, key, str(landing))
        written.append(landing)
    if not written:
        raise FetchError(f"no model under {uri}: nothing there to compile or serve")
    return written


def _model_keys(client: Any, bucket: str, prefix: str) -> list[tuple[str, str]]:
    """The keys of the model at ``prefix`` and where each lands, relative to the model's directory.
    Whole path segments only: s3://b/models/m is the object models/m or what lies under models/m/,
    never models/m-other/ (S3's own prefix match is by characters). A prefix keeps the paths below
    it; a key that is the whole URI lands under its own name."""
    found = []
    for key in _keys(client, bucket, prefix):
        if not (key == prefix or prefix.endswith("/") or not prefix or key.startswith(prefix + "/")):
            continue
        found.append((key, key[len(prefix) :].lstrip("/") if key != prefix else PurePosixPath(key).name))
    return found


def index(uri: str, client: Any = None) -> list[str]:
    """A completion marker for a model already in the store, written in place: each object under
    the ``uri`` prefix read once and hashed as it streams (nothing is kept on disk). With it, the
    model's replicas read its files through the node's cache and check each one."""
    bucket, prefix = split_s3_dir(uri)
    client = _client(client)
    listed: dict[str, dict[str, Any]] = {}
    for key, name in _model_keys(client, bucket, prefix):
        if name == MARKER or _safe_target(Path("."), name) is None:
            continue
        h, size = hashlib.sha256(), 0
        for block in client.get_object(Bucket=bucket, Key=key)["Body"].iter_chunks(1 << 20):
            h.update(block)
            size += len(block)
        listed[name] = {"size": size, "sha256": h.hexdigest()}
    if not listed:
        raise FetchError(f"no model under {uri}: nothing to index")
    client.put_object(Bucket=bucket, Key=prefix + MARKER, Body=json.dumps({"files": listed}, sort_keys=True).encode())
    return sorted(listed)


def upload(source: Path, uri: str, client: Any = None) -> list[str]:
    """Every file under ``source`` to ``uri``, then the completion marker naming them, last."""
    bucket, prefix = split_s3_dir(uri)
    files = sorted(p for p in source.rglob("*") if p.is_file())
    root = source.resolve()
    for path in files:
        # A symlink the compile step left (or was made to leave) must not carry a file from
        # outside its output, such as a mounted credential, into the store.
        if not path.resolve().is_relative_to(root):
            raise FetchError(f"{path.relative_to(source).as_posix()} leads outside {source} (to {path.resolve()}): refusing to upload it")
    if not files:
        raise FetchError(f"nothing to upload in {source}: the compile step wrote no artefact")
    client = _client(client)
    listed: dict[str, dict[str, Any]] = {}
    for path in files:
        name = path.relative_to(source).as_posix()
        if name == MARKER:
            continue
        client.upload_file(str(path), bucket, prefix + name)
        listed[name] = {"size": path.stat().st_size, "sha256": _digest(path)}
    client.put_object(Bucket=bucket, Key=prefix + MARKER, Body=json.dumps({"files": listed}, sort_keys=True).encode())
    return sorted(listed)


def _copy_at_most(source: Any, out: Any, limit: int, uri: str) -> None:
    """Copies ``source`` to ``out``, counting as it goes: a chunked answer declares no length."""
    copied = 0
    while block := source.read(1 << 20):
        copied += len(block)
        if copied > limit:
            raise FetchError(f"{uri} is more than {limit} bytes: put a model this large in S3")
        out.write(block)


def _report(action: str, uri: str, run: Any) -> int:
    try:
        result = run()
    except FetchError as exc:
        print(f"{action}: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - boto3's and urllib's errors are many; each ends the container with its message
        print(f"{action}: {uri}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"{action}: {len(result)} files, {uri}")
    return 0


def main(uri: str, destination: str, model: bool = False, fill_only: bool = False) -> int:
    cache = os.environ.get(CACHE_ENV)
    # The views of each artefact are mounted under its key (core/pod/fetch.py, node_view_mounts).
    view = Path(os.environ[VIEW_ENV]) / hold_key(uri) if os.environ.get(VIEW_ENV) else None
    if fill_only:
        return _report("fill", uri, lambda: fill(uri, Path(destination), cache=cache, view=view))
    if model:
        return _report("fetch", uri, lambda: fetch_model(uri, Path(destination), cache=cache, view=view))
    return _report("fetch", uri, lambda: fetch(uri, Path(destination), cache=cache, view=view))


def index_main(uri: str) -> int:
    return _report("index", uri, lambda: index(uri))


def upload_main(source: str, uri: str) -> int:
    return _report("upload", uri, lambda: upload(Path(source), uri))
