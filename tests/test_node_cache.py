"""The node-local artefact cache (`inferentia-operator node-cache`, docs/design.md, "A node-local
artefact cache"), as a real server on loopback, and `fetch` reading through it."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from inferentia_operator.fetch import fetch, upload
from ports import free_port
from test_frontend_limits import _wait_for


class Cache:
    def __init__(self, directory, max_bytes: int, *flags: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "inferentia_operator", "node-cache", "--host", "127.0.0.1", "--port", str(self.port),
             "--dir", str(directory), "--max-bytes", str(max_bytes), *flags],
            stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        _wait_for(f"{self.url}/healthz", self.proc)

    def put(self, data: bytes, name: str | None = None, length: bool = True) -> int:
        sha = name or hashlib.sha256(data).hexdigest()
        headers = {"Content-Length": str(len(data))} if length else {"Transfer-Encoding": "chunked"}
        body = data if length else iter([data])
        request = urllib.request.Request(f"{self.url}/blobs/{sha}", body, headers, method="PUT")
        try:
            with urllib.request.urlopen(request, timeout=10) as r:
                return r.status
        except urllib.error.HTTPError as exc:
            return exc.code

    def get(self, sha: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"{self.url}/blobs/{sha}", timeout=10) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as exc:
            return exc.code, b""

    def metric(self, name: str) -> float:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
        return 0.0

    def stop(self) -> str:
        self.proc.terminate()
        self.proc.wait(10)
        return self.proc.stderr.read() if self.proc.stderr else ""


@pytest.fixture
def cache(tmp_path) -> Iterator[Cache]:
    c = Cache(tmp_path / "cache", max_bytes=100)
    yield c
    assert "Traceback" not in c.stop()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_file_is_held_only_under_the_sha256_of_its_bytes(cache):
    data = b"compiled graph"
    assert cache.get(sha(data)) == (404, b"")
    assert cache.put(b"something else", name=sha(data)) == 400  # offered under another file's hash
    assert cache.get(sha(data)) == (404, b"")
    assert cache.put(data) == 201
    assert cache.get(sha(data)) == (200, data)
    assert cache.put(data) == 200  # held already: nothing read, nothing written
    assert cache.put(data, name="../../etc/passwd") == 404
    # A name is the whole SHA-256: Python's "$" would take one with a line break after it.
    assert cache.put(data, name=sha(data) + "%0A") == 404
    assert cache.metric("inferentia_node_cache_bytes") == len(data)


def test_the_least_recently_used_file_goes_first_and_the_cache_stays_within_its_size(cache):
    a, b, c = b"a" * 40, b"b" * 40, b"c" * 40
    assert cache.put(a) == 201 and cache.put(b) == 201
    assert cache.get(sha(a))[0] == 200  # a used after b
    assert cache.put(c) == 201  # 120 > 100: b goes
    assert cache.get(sha(b))[0] == 404 and cache.get(sha(a))[0] == 200 and cache.get(sha(c))[0] == 200
    assert cache.put(b"x" * 101) == 413  # more than the whole cache
    assert cache.put(b"y" * 10, length=False) == 411  # a length is needed to make room before reading
    assert cache.metric("inferentia_node_cache_bytes") <= 100


def test_what_it_holds_survives_a_restart_and_a_partial_file_never_does(tmp_path):
    first = Cache(tmp_path / "cache", max_bytes=100)
    assert first.put(b"kept") == 201
    first.stop()
    (tmp_path / "cache" / "partial").mkdir(exist_ok=True)
    (tmp_path / "cache" / "partial" / "half").write_bytes(b"half of it")
    again = Cache(tmp_path / "cache", max_bytes=100)
    try:
        assert again.get(sha(b"kept")) == (200, b"kept")
        assert not (tmp_path / "cache" / "partial" / "half").exists()
    finally:
        assert "Traceback" not in again.stop()


def test_only_the_first_fetch_on_a_node_reads_the_store(s3, cache, tmp_path):
    source = tmp_path / "compiled"
    source.mkdir()
    (source / "model.pt").write_bytes(b"neff" * 5)
    upload(source, "s3://models/m/abc/")
    first = fetch("s3://models/m/abc/", tmp_path / "one", cache=cache.url)
    assert [p.read_bytes() for p in first] == [b"neff" * 5]
    assert cache.metric("inferentia_node_cache_misses_total") == 1 and cache.metric("inferentia_node_cache_stored_total") == 1
    # The store's copy is gone: the second fetch on this node can only have read the cache.
    s3.delete_object(Bucket="models", Key="m/abc/model.pt")
    second = fetch("s3://models/m/abc/", tmp_path / "two", cache=cache.url)
    assert [p.read_bytes() for p in second] == [b"neff" * 5]
    assert cache.metric("inferentia_node_cache_hits_total") == 1


def test_without_a_reachable_cache_fetch_reads_the_store(s3, tmp_path):
    source = tmp_path / "compiled"
    source.mkdir()
    (source / "model.pt").write_bytes(b"neff")
    upload(source, "s3://models/m/abc/")
    nobody = f"http://127.0.0.1:{free_port()}"
    assert [p.read_bytes() for p in fetch("s3://models/m/abc/", tmp_path / "out", cache=nobody)] == [b"neff"]


def test_connections_past_the_caches_bound_are_refused_and_it_goes_on(tmp_path):
    """Any pod can reach a node cache's pod address: open connections are bounded as the front
    end's and the holder's are (Limits.max_connections), each past it answered 503 and closed."""
    import socket

    from inferentia_operator.batching import node_cache

    c = Cache(tmp_path / "cache", max_bytes=100)
    try:
        # One by one, each answered once and kept open, until one is refused: the bound (less the
        # readiness check's connection, which may still be open).
        held, refused = [], None
        for i in range(node_cache.MAX_CONNECTIONS + 2):
            # Each from its own loopback address: one address holds at most MAX_PEER_CONNECTIONS.
            conn = socket.create_connection(("127.0.0.1", c.port), source_address=(f"127.1.{i // 250}.{i % 250 + 1}", 0))
            conn.settimeout(10)
            conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = conn.recv(64)
            held.append(conn)
            if not answer.startswith(b"HTTP/1.1 200"):
                refused = answer
                break
        assert refused is not None and refused.startswith(b"HTTP/1.1 503"), refused
        assert node_cache.MAX_CONNECTIONS - 2 <= len(held) - 1 <= node_cache.MAX_CONNECTIONS
        for conn in held:
            conn.close()

        # Once the server has seen those close, it takes connections again.
        def put() -> int:
            try:
                return c.put(b"still serving")
            except OSError:  # refused while the body was still being sent: 503 and closed first
                return 503

        deadline = time.monotonic() + 10
        while (code := put()) == 503 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert code == 201
    finally:
        assert "Traceback" not in c.stop()


def test_a_cache_that_sends_more_than_the_marker_says_is_cut_off_and_the_store_read(s3, tmp_path):
    """The node cache is another pod's server: fetch reads at most the size the completion marker
    names from it (one byte more proves it wrong), never whatever it chooses to send."""
    import http.server
    import threading

    sent = [0]

    class Endless(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            block = b"x" * 65536
            try:
                while sent[0] < 1 << 30:  # a gigabyte, were nobody to stop reading
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(block), block))
                    sent[0] += len(block)
            except OSError:
                pass

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Endless)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    source = tmp_path / "compiled"
    source.mkdir()
    (source / "model.pt").write_bytes(b"neff" * 5)
    upload(source, "s3://models/m/abc/")
    try:
        result: list[list] = []
        worker = threading.Thread(
            target=lambda: result.append(fetch("s3://models/m/abc/", tmp_path / "out", cache=f"http://127.0.0.1:{server.server_port}"))
        )
        worker.start()
        worker.join(60)
        assert result and [p.read_bytes() for p in result[0]] == [b"neff" * 5]
        # What the kernel's buffers took before the cut, not the gigabyte on offer.
        assert sent[0] < 32 << 20, sent[0]
    finally:
        server.shutdown()
        server.server_close()


def test_a_copy_damaged_on_disk_is_refused_by_fetch_and_replaced_by_its_offer(s3, tmp_path):
    """The marker's SHA-256 is checked on every use: a cache file changed on the node's disk is
    never taken for the artefact; the fetch reads the store, and its offer heals the cache."""
    c = Cache(tmp_path / "cache", max_bytes=100)
    try:
        source = tmp_path / "compiled"
        source.mkdir()
        (source / "model.pt").write_bytes(b"neff" * 5)
        upload(source, "s3://models/m/abc/")
        fetch("s3://models/m/abc/", tmp_path / "one", cache=c.url)
        [held] = (tmp_path / "cache" / "blobs").iterdir()
        held.write_bytes(b"evil" * 5)  # the same size, other bytes
        assert [p.read_bytes() for p in fetch("s3://models/m/abc/", tmp_path / "two", cache=c.url)] == [b"neff" * 5]
        assert c.metric("inferentia_node_cache_damaged_total") == 1
        # Healed: with the store's copy gone, the cache alone serves the right bytes.
        s3.delete_object(Bucket="models", Key="m/abc/model.pt")
        assert [p.read_bytes() for p in fetch("s3://models/m/abc/", tmp_path / "three", cache=c.url)] == [b"neff" * 5]
        # An offer of an unchanged held file is not hashed again, and changes nothing.
        assert c.put(b"neff" * 5) == 200 and c.metric("inferentia_node_cache_damaged_total") == 1
    finally:
        assert "Traceback" not in c.stop()


def test_an_artefact_fetched_whole_is_recorded_and_goes_with_its_evicted_file(s3, cache, tmp_path):
    """What the cache's pod labels say it holds (core/holds.py): an artefact a fetch found whole
    here, named by the hash of its URI, only while every file of it is held."""
    from inferentia_operator.core.holds import hold_key

    source = tmp_path / "compiled"
    source.mkdir()
    (source / "model.pt").write_bytes(b"a" * 60)
    upload(source, "s3://models/m/abc/")
    fetch("s3://models/m/abc/", tmp_path / "one", cache=cache.url)
    records = tmp_path / "cache" / "artefacts.json"  # beside the files; no client can list them
    [(name, record)] = json.loads(records.read_text()).items()
    assert name == f"/{hold_key('s3://models/m/abc')}" and record["files"] == [sha(b"a" * 60)]
    # A claim of files it does not hold is refused, whatever key it names.
    claim = urllib.request.Request(f"{cache.url}/artefacts/{'0' * 32}", json.dumps([sha(b"zz")]).encode(), method="PUT")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(claim, timeout=5)
    assert refused.value.code == 409
    assert cache.put(b"b" * 60) == 201  # 120 > 100: the artefact's file goes, and the record with it
    assert json.loads(records.read_text()) == {}
    assert cache.metric("inferentia_node_cache_artefacts") == 0
    # And its view: a link left there would keep the evicted bytes on the node's disk.
    assert not [p for p in (tmp_path / "cache" / "views").rglob("*") if p.is_file()]


def test_a_record_is_read_whole_however_it_arrives(cache):
    """A record that arrives in two parts is parsed whole (here refused, 409, for naming files
    the cache does not hold), never cut at the first read of the socket."""
    import socket

    body = json.dumps([hashlib.sha256(str(i).encode()).hexdigest() for i in range(100)]).encode()
    conn = socket.create_connection(("127.0.0.1", cache.port))
    conn.settimeout(10)
    conn.sendall(f"PUT /artefacts/{'a' * 32} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body[:100])
    time.sleep(0.3)
    conn.sendall(body[100:])
    answer = conn.recv(64)
    conn.close()
    assert answer.startswith(b"HTTP/1.1 409"), answer


def test_recording_what_is_recorded_already_writes_nothing(s3, cache, tmp_path):
    """Every fetch records its artefact, hits included: a record the cache already has is
    answered without rewriting its file or waking the pod labeller (no API call per replica)."""
    source = tmp_path / "compiled"
    source.mkdir()
    (source / "model.pt").write_bytes(b"a" * 60)
    upload(source, "s3://models/m/abc/")
    fetch("s3://models/m/abc/", tmp_path / "one", cache=cache.url)
    records = tmp_path / "cache" / "artefacts.json"
    first = records.stat().st_ino, records.stat().st_mtime_ns
    fetch("s3://models/m/abc/", tmp_path / "two", cache=cache.url)  # a hit, recorded again
    assert (records.stat().st_ino, records.stat().st_mtime_ns) == first
    assert cache.metric("inferentia_node_cache_hits_total") == 1


def test_a_model_with_a_marker_is_read_through_the_cache_and_checked(s3, cache, tmp_path):
    """No compile step: a model uploaded by `inferentia-operator upload` (or indexed in place by
    `inferentia-operator index`) has a marker naming each file's SHA-256, so its weights come from
    the node's cache after the first replica on a node, each checked, like a compiled artefact.
    A model without one is read from the store, as before."""
    from inferentia_operator import cli
    from inferentia_operator.core.holds import hold_key
    from inferentia_operator.fetch import FetchError, fetch_model

    s3.put_object(Bucket="models", Key="llama/config.json", Body=b"{}")
    s3.put_object(Bucket="models", Key="llama/weights/model.safetensors", Body=b"w" * 30)
    assert [p.name for p in fetch_model("s3://models/llama/", tmp_path / "plain", cache=cache.url)] == ["config.json", "model.safetensors"]
    assert cache.metric("inferentia_node_cache_stored_total") == 0  # no marker: no hash known before reading, so no cache
    assert cli.main(["index", "--at", "s3://models/llama/"]) == 0
    first = fetch_model("s3://models/llama/", tmp_path / "one", cache=cache.url)
    assert sorted(p.relative_to(tmp_path / "one").as_posix() for p in first) == ["config.json", "weights/model.safetensors"]
    assert cache.metric("inferentia_node_cache_stored_total") == 2
    assert f"/{hold_key('s3://models/llama/')}" in json.loads((tmp_path / "cache" / "artefacts.json").read_text())
    s3.delete_object(Bucket="models", Key="llama/weights/model.safetensors")  # only the cache has it now
    again = fetch_model("s3://models/llama/", tmp_path / "two", cache=cache.url)
    assert (tmp_path / "two" / "weights" / "model.safetensors").read_bytes() == b"w" * 30 and len(again) == 2
    # Weights changed after indexing: refused, never served unchecked.
    s3.put_object(Bucket="models", Key="llama/weights/model.safetensors", Body=b"v" * 30)
    with pytest.raises(FetchError, match="does not match its completion marker"):
        fetch_model("s3://models/llama/", tmp_path / "three")


def test_a_cache_that_does_not_answer_is_asked_once_per_fetch_not_once_per_file(s3, tmp_path):
    """With `internalTrafficPolicy: Local`, a node whose cache pod is gone drops the connection:
    each ask would wait out the timeout, so after one that times out the rest of the fetch reads
    the store alone (here a listener that accepts and never answers, counting its connections)."""
    import socket
    import threading

    from inferentia_operator.fetch import fetch_model, index

    for name in ("a.bin", "b.bin", "c.bin"):
        s3.put_object(Bucket="models", Key=f"three/{name}", Body=name.encode() * 10)
    index("s3://models/three/")
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                accepted.append(silent.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    try:
        got = fetch_model("s3://models/three/", tmp_path / "m", cache=f"http://127.0.0.1:{silent.getsockname()[1]}")
    finally:
        silent.close()
    assert sorted(p.name for p in got) == ["a.bin", "b.bin", "c.bin"]
    assert len(accepted) == 1


class SlowStore:
    """The store, each file read from it taking ``seconds`` and counted (a large file on S3)."""

    def __init__(self, client, seconds: float) -> None:
        self.client, self.seconds, self.reads = client, seconds, []

    def download_file(self, bucket, key, filename, **kwargs):
        self.reads.append(key)
        time.sleep(self.seconds)
        return self.client.download_file(bucket, key, filename, **kwargs)

    def __getattr__(self, name):
        return getattr(self.client, name)


def test_replicas_starting_together_on_a_node_read_the_store_once(s3, tmp_path):
    """The first to miss fills the file (a lease it renews while it reads the store); a replica
    that asks meanwhile is told to ask again, and is then served by the cache, not the store."""
    import threading

    c = Cache(tmp_path / "cache", 10_000)
    try:
        source = tmp_path / "compiled"
        source.mkdir()
        (source / "model.pt").write_bytes(b"w" * 3000)
        upload(source, "s3://models/m/together/")
        store = SlowStore(s3, 1.5)
        done = []

        def start(name: str) -> None:
            done.append(fetch("s3://models/m/together/", tmp_path / name, client=store, cache=c.url))

        first = threading.Thread(target=start, args=("one",))
        first.start()
        time.sleep(0.5)  # the first is reading the store
        start("two")
        first.join(10)
        assert store.reads == ["m/together/model.pt"]
        assert len(done) == 2
        assert (tmp_path / "two" / "model.pt").read_bytes() == b"w" * 3000
        assert c.metric("inferentia_node_cache_waits_total") >= 1 and c.metric("inferentia_node_cache_hits_total") == 1
    finally:
        assert "Traceback" not in c.stop()


def test_a_filler_that_goes_away_holds_the_others_only_until_its_lease_lapses(s3, tmp_path):
    c = Cache(tmp_path / "cache", 10_000, "--fill-lease-s", "1")
    try:
        source = tmp_path / "compiled"
        source.mkdir()
        (source / "model.pt").write_bytes(b"v" * 300)
        upload(source, "s3://models/m/lapsed/")
        # A replica misses, takes the lease, and is gone before it renews or offers anything.
        assert c.get(sha(b"v" * 300))[0] == 404
        began = time.monotonic()
        fetch("s3://models/m/lapsed/", tmp_path / "next", cache=c.url)
        assert (tmp_path / "next" / "model.pt").read_bytes() == b"v" * 300
        assert 0.5 < time.monotonic() - began < 5
        assert c.metric("inferentia_node_cache_stored_total") == 1  # the next one filled it
    finally:
        assert "Traceback" not in c.stop()


class CountingStore:
    """The store's client, counting what is read from it."""

    def __init__(self, client) -> None:
        self.client, self.downloads = client, []
        self.exceptions = client.exceptions

    def get_object(self, **kwargs):
        return self.client.get_object(**kwargs)

    def download_file(self, bucket, key, target):
        self.downloads.append(key)
        return self.client.download_file(bucket, key, target)


def artefact(tmp_path, files: dict[str, bytes], uri: str = "s3://models/m/abc/") -> str:
    source = tmp_path / "compiled"
    for name, data in files.items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes(data)
    upload(source, uri)
    return uri


def test_a_second_fetch_on_the_node_links_the_view_and_copies_and_hashes_nothing(s3, cache, tmp_path, monkeypatch):
    """The first fetch on a node fills the cache and records the artefact by its files' names:
    the cache builds a view of hard links to what it checked. A fetch that sees that view (the
    node's view of the key, mounted read-only) links to it: no byte read from the store or the
    cache, none written, none hashed."""
    from inferentia_operator import fetch as fetching
    from inferentia_operator.core.holds import hold_key, view_digest

    uri = artefact(tmp_path, {"model.pt": b"w" * 40, "conf/config.json": b"{}"})
    fetch(uri, tmp_path / "one", cache=cache.url)
    view = tmp_path / "cache" / "views" / "-" / hold_key(uri)  # a cache that admits anyone: no namespace
    [built] = view.iterdir()
    assert built.name == view_digest({"model.pt": sha(b"w" * 40), "conf/config.json": sha(b"{}")})
    blob = tmp_path / "cache" / "blobs" / sha(b"w" * 40)
    assert (built / "model.pt").stat().st_ino == blob.stat().st_ino  # a link, not a copy
    assert blob.stat().st_mode & 0o777 == 0o444

    store = CountingStore(s3)
    monkeypatch.setattr(fetching, "_digest", lambda path: pytest.fail(f"{path} hashed again"))
    served = cache.metric("inferentia_node_cache_hits_total")
    second = fetch(uri, tmp_path / "two", client=store, cache=cache.url, view=view)
    assert sorted(p.relative_to(tmp_path / "two").as_posix() for p in second) == ["conf/config.json", "model.pt"]
    assert all(p.is_symlink() and p.resolve().parent.is_relative_to(built) for p in second)
    assert (tmp_path / "two" / "model.pt").read_bytes() == b"w" * 40
    assert store.downloads == [] and cache.metric("inferentia_node_cache_hits_total") == served


def test_a_view_is_taken_only_where_it_holds_what_the_marker_says(s3, cache, tmp_path):
    """A record's names come from a pod: one that names another file under the model's name
    gets a view under another digest, which no fetch of the real marker takes."""
    from inferentia_operator.core.holds import hold_key

    uri = artefact(tmp_path, {"model.pt": b"right"})
    assert cache.put(b"wrong") == 201
    forged = {"files": {"model.pt": sha(b"wrong")}}
    key = hold_key(uri)
    request = urllib.request.Request(f"{cache.url}/artefacts/{key}", json.dumps(forged).encode(), method="PUT")
    with urllib.request.urlopen(request, timeout=5) as answer:
        assert json.loads(answer.read()) == {"recorded": True, "view": True}
    got = fetch(uri, tmp_path / "out", cache=cache.url, view=tmp_path / "cache" / "views" / "-" / key)
    assert [(p.is_symlink(), p.read_bytes()) for p in got] == [(False, b"right")]


@pytest.mark.parametrize(
    "files",
    [
        {"../escape": "x"},
        {"/abs": "x"},
        {"a//b": "x"},
        {"./a": "x"},
        {"a/": "x"},
        {"a\0b": "x"},
        {"x" * 256: "x"},
        {"/".join("d" * 17): "x"},
    ],
    ids=["dotdot", "absolute", "empty-part", "dot", "trailing-slash", "nul", "long-part", "deep"],
)
def test_a_record_whose_names_would_leave_its_view_is_refused(cache, files):
    assert cache.put(b"held") == 201
    body = {"files": {name.replace("\\0", "\0"): sha(b"held") for name in files}}
    request = urllib.request.Request(f"{cache.url}/artefacts/{'a' * 32}", json.dumps(body).encode(), method="PUT")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=5)
    assert refused.value.code == 400 and "view" in json.loads(refused.value.read())["error"]


def test_names_that_clash_are_recorded_without_a_view(cache, tmp_path):
    assert cache.put(b"held") == 201
    body = {"files": {"a": sha(b"held"), "a/b": sha(b"held")}}  # "a" cannot be a file and a directory
    request = urllib.request.Request(f"{cache.url}/artefacts/{'a' * 32}", json.dumps(body).encode(), method="PUT")
    with urllib.request.urlopen(request, timeout=5) as answer:
        assert answer.status == 201 and json.loads(answer.read()) == {"recorded": True, "view": False}
    assert not [p for p in (tmp_path / "cache" / "views").rglob("*") if p.is_file()]


def test_a_view_survives_a_restart_with_its_record_and_nothing_else_does(s3, tmp_path):
    from inferentia_operator.core.holds import hold_key

    first = Cache(tmp_path / "cache", max_bytes=100)
    uri = artefact(tmp_path, {"model.pt": b"m" * 10})
    fetch(uri, tmp_path / "one", cache=first.url)
    first.stop()
    views = tmp_path / "cache" / "views"
    (views / ".building-0123").mkdir()  # a view half-built when the cache stopped
    (views / "-" / ("b" * 32) / ("c" * 64)).mkdir(parents=True)  # one no record names
    again = Cache(tmp_path / "cache", max_bytes=100)
    try:
        kept = [p.relative_to(views).as_posix() for p in views.rglob("*") if p.is_file()]
        assert len(kept) == 1 and kept[0].startswith(f"-/{hold_key(uri)}/") and kept[0].endswith("/model.pt"), kept
        assert not (views / ".building-0123").exists() and not (views / "-" / ("b" * 32) / ("c" * 64)).exists()
        linked = fetch(uri, tmp_path / "two", cache=again.url, view=views / "-" / hold_key(uri))
        assert [p.is_symlink() for p in linked] == [True]
    finally:
        assert "Traceback" not in again.stop()


def test_a_record_naming_more_directories_than_files_gets_no_view(cache, tmp_path):
    """A view's directories are not counted in the cache's size: a record whose few files sit
    under many directories would cost the node's disk what no bound counts. It is recorded
    (the node still holds the files), with no view."""
    assert cache.put(b"held") == 201
    deep = {f"{i}/" + "/".join(f"d{j}" for j in range(14)) + "/f": sha(b"held") for i in range(2)}  # 2 files, 30 directories
    request = urllib.request.Request(f"{cache.url}/artefacts/{'a' * 32}", json.dumps({"files": deep}).encode(), method="PUT")
    with urllib.request.urlopen(request, timeout=5) as answer:
        assert answer.status == 201 and json.loads(answer.read()) == {"recorded": True, "view": False}
    assert not (tmp_path / "cache" / "views").exists() or not any((tmp_path / "cache" / "views").rglob("d0"))


def test_the_cache_keeps_a_mounted_views_files_and_the_view_until_the_pod_lets_go(s3, tmp_path):
    """The node cache at its bound: a file a mounted view links to is never evicted (an offer
    that would need it gets 507), nor the view when its record goes; unpinned, both go."""
    from inferentia_operator.core.holds import hold_key
    from inferentia_operator.fetch import fetch

    cache = Cache(tmp_path / "cache", max_bytes=100)
    try:
        uri = artefact(tmp_path, {"model.pt": b"m" * 60})
        fetch(uri, tmp_path / "one", cache=cache.url)
        pin = tmp_path / "cache" / "pins" / "-" / hold_key(uri) / "csi-1"
        pin.parent.mkdir(parents=True)
        pin.write_text("/var/lib/kubelet/pods/x/volumes/kubernetes.io~csi/node-view/mount")
        assert cache.put(b"n" * 60) == 507  # room only by evicting the mounted file: refused
        assert cache.get(sha(b"m" * 60))[0] == 200
        [view] = (tmp_path / "cache" / "views" / "-" / hold_key(uri)).iterdir()
        pin.unlink()
        assert cache.put(b"n" * 60) == 201  # unpinned: evicted, and its view with it
        assert not view.exists() and json.loads((tmp_path / "cache" / "artefacts.json").read_text()) == {}
    finally:
        assert "Traceback" not in cache.stop()


def test_a_mounted_view_outlives_its_record_and_is_taken_back_or_dropped_once_unpinned(s3, tmp_path):
    """A view's record replaced while a pod has it mounted: the view stays, as an orphan, with
    its files; the same record again takes it back; once unpinned, the cache drops it at its
    next need of room."""

    cache = Cache(tmp_path / "cache", max_bytes=100)
    try:
        uri, key, pin = pinned_artefact(cache, tmp_path)
        [view] = (tmp_path / "cache" / "views" / "-" / key).iterdir()

        def record(files: dict[str, str]) -> bool:
            return record_view(cache, key, files)

        assert cache.put(b"o" * 30) == 201
        assert record({"other.pt": sha(b"o" * 30)})  # another view of the key; the mounted one stays
        assert (view / "model.pt").read_bytes() == b"m" * 30
        assert record({"model.pt": sha(b"m" * 30)})  # the same names and hashes: taken back as its view
        assert (view / "model.pt").read_bytes() == b"m" * 30
        assert record({"other.pt": sha(b"o" * 30)})  # an orphan again
        pin.unlink()
        assert cache.put(b"p" * 50) == 201  # room needed: the unpinned orphan goes, and its file with it
        assert not view.exists() and cache.get(sha(b"m" * 30))[0] == 404
    finally:
        assert "Traceback" not in cache.stop()


def test_a_mounted_view_whose_file_was_found_damaged_is_never_taken_back(s3, tmp_path):
    """An orphan (its record went while a pod has it mounted) links the inode it was built of.
    If that file is found changed on disk and offered again, the cache holds a new inode: the
    same record again does not take the orphan back (it would serve the damaged bytes unhashed)."""
    import os

    cache = Cache(tmp_path / "cache", max_bytes=1000)
    try:
        uri, key, pin = pinned_artefact(cache, tmp_path)

        def record(files: dict[str, str]) -> bool:
            return record_view(cache, key, files)

        assert cache.put(b"o" * 30) == 201
        assert record({"other.pt": sha(b"o" * 30)})  # the mounted view of model.pt: an orphan now
        blob = tmp_path / "cache" / "blobs" / sha(b"m" * 30)
        os.chmod(blob, 0o644)
        blob.write_bytes(b"x" * 30)  # changed on the node's disk
        assert cache.put(b"m" * 30) == 201  # found damaged, replaced by the offer (another inode)
        assert not record({"model.pt": sha(b"m" * 30)})  # not the damaged orphan: no view while it is held
    finally:
        assert "Traceback" not in cache.stop()


def pinned_artefact(cache: Cache, tmp_path) -> tuple[str, str, object]:
    """An artefact of one 30-byte file fetched through ``cache`` (its view built), and the pin a
    pod's mount of that view leaves (as the node plugin writes it): the URI, key and pin."""
    from inferentia_operator.core.holds import hold_key

    uri = artefact(tmp_path, {"model.pt": b"m" * 30})
    fetch(uri, tmp_path / "one", cache=cache.url)
    key = hold_key(uri)
    pin = tmp_path / "cache" / "pins" / "-" / key / "csi-1"
    pin.parent.mkdir(parents=True)
    pin.write_text("mounted")
    return uri, key, pin


def record_view(cache: Cache, key: str, files: dict[str, str]) -> bool:
    """Records ``files`` under ``key`` as a new record (201); whether it has a view."""
    body = json.dumps({"files": files}).encode()
    with urllib.request.urlopen(urllib.request.Request(f"{cache.url}/artefacts/{key}", body, method="PUT"), timeout=5) as r:
        return bool(r.status == 201 and json.loads(r.read())["view"])


def test_a_fill_leaves_the_artefact_on_the_node_and_nothing_in_its_pod(s3, cache, tmp_path):
    """`fetch --fill`, the operator's fill-ahead Job: the node's cache gets every file and the
    record (so a view, and the scheduler's label), and the pod's own copy is removed, so a
    finished fill holds no disk. A replica after it reads nothing from the store; a second fill
    of a node that holds it all links its view and reads nothing either."""
    from inferentia_operator.core.holds import hold_key
    from inferentia_operator.fetch import fill

    uri = artefact(tmp_path, {"model.pt": b"w" * 40, "conf/config.json": b"{}"})
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    assert fill(uri, scratch, cache=cache.url) == ["conf/config.json", "model.pt"]
    assert list(scratch.iterdir()) == []  # an emptyDir's mount point stays; nothing in it
    view = tmp_path / "cache" / "views" / "-" / hold_key(uri)
    assert len(list(view.iterdir())) == 1

    store = CountingStore(s3)
    assert len(fill(uri, scratch, client=store, cache=cache.url, view=view)) == 2
    assert store.downloads == [] and list(scratch.iterdir()) == []
    # Its links went, not what they led to: the view is the cache's.
    [built] = view.iterdir()
    assert (built / "model.pt").read_bytes() == b"w" * 40 and (built / "conf" / "config.json").read_bytes() == b"{}"
    replica = fetch(uri, tmp_path / "replica", client=store, cache=cache.url)
    assert sorted(p.read_bytes() for p in replica) == [b"w" * 40, b"{}"]
    assert store.downloads == []


def test_a_fill_that_the_node_cache_does_not_keep_fails_and_says_why(s3, tmp_path):
    """A fill's only product is the node's copy: with no cache, a silent one, or one too small to
    hold the artefact (its record refused), the fill fails with the reason, and removes its copy."""
    from inferentia_operator.fetch import FetchError, fill

    uri = artefact(tmp_path, {"model.pt": b"w" * 80, "other.pt": b"v" * 80})  # 160 bytes
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    with pytest.raises(FetchError, match="INFERENTIA_NODE_CACHE"):
        fill(uri, scratch, cache=None)
    store = CountingStore(s3)
    with pytest.raises(FetchError, match="did not answer"):
        fill(uri, scratch, client=store, cache=f"http://127.0.0.1:{free_port()}")
    assert list(scratch.iterdir()) == [] and store.downloads == []  # stopped before reading the store
    small = Cache(tmp_path / "small", max_bytes=100)
    try:
        with pytest.raises(FetchError, match="409"):
            fill(uri, scratch, cache=small.url)
        assert list(scratch.iterdir()) == []
    finally:
        assert "Traceback" not in small.stop()
