"""A replica's artefact fetch on a node whose cache holds it: copied from the cache, or linked
to its view. What it reads, what it writes, how long.

    make benchmark-node-views        # or: python cluster/benchmark_node_views.py --gib 4

An artefact of --gib GiB in --files files (random bytes) has its completion marker in an
S3-compatible store (moto's server, on loopback), as the compile Job leaves one, and its files
in a real `inferentia-operator node-cache` process, offered and recorded as the first replica
on the node offers and records them (each file by its SHA-256, the record by the files' names,
so the cache builds the artefact's view). The store holds the marker alone: whatever a fetch
reads, it reads from the node. Then `inferentia-operator fetch`, the serving pod's init
container, runs as a process, each time into a fresh directory, the two ways in turn, --rounds
times each:

- the cache's copy: each file from the cache, hashed as it arrives, written to the replica's
  directory (a second replica without the node plugin);
- linked to the view: the view where the node plugin mounts it (INFERENTIA_NODE_VIEW; here the
  cache's own directory, which is what the plugin's read-only bind mount shows).

Printed, one row a way: the median seconds and their ratio to the cache's copy, bytes written
into the replica's directory, and files the cache served. A fetch from the store pays at least
the cache's copy (it hashes every byte it writes, as the copy does), so the copy is the
baseline a view is measured against; moto's server, a few MB a second, would say more of moto
than of S3.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import logging
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from ports import free_port

BUCKET = "models"
URI = f"s3://{BUCKET}/bench/compiled/"
MARKER = "_INFERENTIA_COMPLETE"


def written(directory: Path) -> int:
    """Bytes the fetch wrote: regular files' sizes (a link's own few bytes, not its target's)."""
    return sum(p.lstat().st_size for p in directory.rglob("*") if not p.is_dir())


def metric(url: str, name: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
        found = re.search(rf"^{name} (\S+)$", r.read().decode(), re.M)
    return float(found.group(1)) if found else 0.0


def call(url: str, method: str, body: bytes | Path) -> None:
    data = body.open("rb") if isinstance(body, Path) else body
    length = body.stat().st_size if isinstance(body, Path) else len(body)
    try:
        request = urllib.request.Request(url, data, {"Content-Length": str(length)}, method=method)
        urllib.request.urlopen(request, timeout=600).close()
    finally:
        if isinstance(body, Path):
            data.close()  # type: ignore[union-attr]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gib", type=float, default=4.0, help="the artefact's size")
    parser.add_argument("--files", type=int, default=4, help="how many files it is in")
    parser.add_argument("--rounds", type=int, default=3, help="fetches each way")
    args = parser.parse_args(argv)

    import boto3
    from moto.server import ThreadedMotoServer

    from inferentia_operator.core.holds import hold_key

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's server logs every request
    work = Path(tempfile.mkdtemp(prefix="bench-views-"))
    port = free_port()
    store = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    store.start()
    cache = None
    try:
        env = {
            **os.environ, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        }  # fmt: skip
        client = boto3.client(
            "s3", endpoint_url=env["AWS_ENDPOINT_URL"], aws_access_key_id="bench", aws_secret_access_key="bench", region_name="us-east-1"
        )
        client.create_bucket(Bucket=BUCKET)

        cache_port = free_port()
        cache_url = f"http://127.0.0.1:{cache_port}"
        total = 0
        cache = subprocess.Popen(
            [sys.executable, "-m", "inferentia_operator", "node-cache", "--host", "127.0.0.1", "--port", str(cache_port),
             "--dir", str(work / "cache"), "--max-bytes", str(int(args.gib * (1 << 30)) + (1 << 30))],
            env=env, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{cache_url}/healthz", timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

        # The artefact: its files offered to the cache and its marker in the store, as the
        # first replica on the node and the compile Job leave them.
        source = work / "compiled"
        source.mkdir()
        size = int(args.gib * (1 << 30)) // args.files
        files = {}
        for i in range(args.files):
            path, digest = source / f"model-{i:02d}.safetensors", hashlib.sha256()
            with path.open("wb") as out:
                left = size
                while left:
                    block = os.urandom(min(left, 1 << 24))
                    digest.update(block)
                    out.write(block)
                    left -= len(block)
            files[path.name] = {"size": size, "sha256": digest.hexdigest()}
            call(f"{cache_url}/blobs/{digest.hexdigest()}", "PUT", path)
            path.unlink()
            total += size
        client.put_object(Bucket=BUCKET, Key=f"bench/compiled/{MARKER}", Body=json.dumps({"files": files}).encode())
        record = json.dumps({"files": {name: f["sha256"] for name, f in files.items()}}).encode()
        call(f"{cache_url}/artefacts/{hold_key(URI)}", "PUT", record)

        views = work / "cache" / "views" / "-"  # a cache run by hand admits anyone: no namespace
        ways = {"the cache's copy": {"INFERENTIA_NODE_CACHE": cache_url},
                "linked to the view": {"INFERENTIA_NODE_CACHE": cache_url, "INFERENTIA_NODE_VIEW": str(views)}}  # fmt: skip
        seconds: dict[str, list[float]] = {name: [] for name in ways}
        wrote: dict[str, int] = {}
        served: dict[str, int] = {}
        for round_ in range(args.rounds):
            for name, extra in ways.items():
                destination = work / f"replica-{round_}"
                hits = metric(cache_url, "inferentia_node_cache_hits_total")
                started = time.monotonic()
                subprocess.run(
                    [sys.executable, "-m", "inferentia_operator", "fetch", "--from", URI, "--to", str(destination)],
                    env={**env, **extra}, check=True, capture_output=True, text=True,
                )  # fmt: skip
                seconds[name].append(time.monotonic() - started)
                wrote[name], served[name] = written(destination), int(metric(cache_url, "inferentia_node_cache_hits_total") - hits)
                shutil.rmtree(destination)

        command = f"python cluster/benchmark_node_views.py --gib {args.gib:g} --files {args.files} --rounds {args.rounds}"
        print(f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, {command}: {total / (1 << 30):.2f} GiB in {args.files} files")
        print()
        print("| way | seconds (median, each) | of the cache's copy | written to the replica's volume | files from the cache |")
        print("|---|---|---|---|---|")
        baseline = statistics.median(seconds["the cache's copy"])
        for name in ways:
            each = ", ".join(f"{s:.2f}" for s in seconds[name])
            median = statistics.median(seconds[name])
            print(
                f"| {name} | {median:.2f} ({each}) | {median / baseline:.3f}x | {wrote[name]:,} bytes ({wrote[name] / total:.4%}) | {served[name]} |"
            )
        return 0
    finally:
        if cache is not None:
            cache.terminate()
            cache.wait(10)
        store.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
