"""`inferentia-operator fetch`: the serving pods' init container, which copies a compiled
artefact from the object store into the pod before the server starts.

vLLM on Neuron reads NEURON_COMPILED_ARTIFACTS as a local directory, and so does every
framework that loads a compiled model from a path; nothing in a serving image downloads an
``s3://`` URI. Credentials and the endpoint come from the environment, as boto3 reads it
(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY from spec.compile.storageSecret, or the pod's
ServiceAccount through IRSA or EKS Pod Identity; AWS_ENDPOINT_URL for an S3-compatible store).
"""

from __future__ import annotations

import sys
from pathlib import Path, PurePosixPath
from typing import Any


class FetchError(Exception):
    pass


def split_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix/`` -> ("bucket", "some/prefix/")."""
    if not uri.startswith("s3://") or not uri[5:].split("/", 1)[0]:
        raise FetchError(f"{uri!r} is not an s3:// URI; valid values look like s3://bucket/prefix/")
    bucket, _, prefix = uri[5:].partition("/")
    return bucket, prefix


def fetch(uri: str, destination: Path, client: Any = None) -> list[Path]:
    """Every object under ``uri`` into ``destination``, keeping the paths below the prefix.
    Refuses a key that would land outside ``destination`` (``..``)."""
    bucket, prefix = split_s3_uri(uri)
    if client is None:
        try:
            import boto3
        except ImportError as exc:  # the operator's image installs it (the [s3] extra)
            raise FetchError("boto3 is not installed: pip install 'inferentia-operator[s3]'") from exc
        client = boto3.client("s3")
    written: list[Path] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            relative = PurePosixPath(item["Key"][len(prefix) :].lstrip("/"))
            if not relative.parts or ".." in relative.parts:
                continue
            target = destination.joinpath(*relative.parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            client.download_file(bucket, item["Key"], str(target))
            written.append(target)
    if not written:
        raise FetchError(f"no compiled artefact under {uri}: the compile Job has not written one there")
    return written


def main(uri: str, destination: str) -> int:
    try:
        files = fetch(uri, Path(destination))
    except FetchError as exc:
        print(f"fetch: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - boto3's errors are many; each ends the init container with its message
        print(f"fetch: {uri}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    size = sum(f.stat().st_size for f in files)
    print(f"fetched {len(files)} files ({size} bytes) from {uri} into {destination}")
    return 0
