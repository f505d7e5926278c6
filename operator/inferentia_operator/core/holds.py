"""Which compiled artefacts a node holds, as labels on its node cache's pod.

The scheduler reads pod labels, not a cache's contents: so the node cache (``inferentia-operator
node-cache``) labels its own pod ``holds.inferentia.dev/<key>`` for each artefact it holds whole,
and a serving pod whose artefact has that key prefers, never requires, a node whose cache pod
carries it (preferred inter-pod affinity, topology ``kubernetes.io/hostname``:
https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/#inter-pod-affinity-and-anti-affinity).
The key is a hash of the artefact's URI: a label name is at most 63 characters.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping

HOLDS_PREFIX = "holds.inferentia.dev/"
# The audience of the token a serving pod shows the node cache: projected for it alone
# (core/pod/fetch.py), so the cache can check it with a TokenReview and no one can replay it
# against the API server (batching/node_cache.py, Admission).
NODE_CACHE_AUDIENCE = "node-cache.inferentia.dev"
# The longest such token either side takes: a projected token is about 1 KiB.
NODE_CACHE_MAX_TOKEN_BYTES = 4096
HOLD_KEY = re.compile(r"^[0-9a-f]{32}$")
# The node plugin's CSI driver (batching/node_plugin.py): a serving pod's inline volume of it, with
# the attribute ``key`` (hold_key), is the node cache's views of that artefact for the pod's own
# namespace, read-only, mounted at NODE_VIEW_DIR/<key> where fetch links to them.
NODE_VIEW_DRIVER = "node-store.inferentia.dev"
NODE_VIEW_DIR = "/var/lib/inferentia/node-view"


# The node cache's pods carry this label (the chart's DaemonSet), and the operator's managed-by
# label, so that the operator's watch of pods sees them and their holds labels: which node holds
# which artefact, as the cache says (fill_ahead/part.py fills a node again that lost one).
NODE_CACHE_POD_LABEL = "inferentia.dev/node-cache"
# The most holds labels of one cache pod read: a pod's labels are its own to write, and bounded.
MAX_HELD_KEYS = 4096


def hold_key(uri: str) -> str:
    """The artefact at ``uri`` (an s3:// prefix, with or without its trailing slash)."""
    return hashlib.sha256((uri.rstrip("/") + "/").encode()).hexdigest()[:32]


def hold_label(uri: str) -> str:
    return HOLDS_PREFIX + hold_key(uri)


def view_digest(files: Mapping[str, str]) -> str:
    """The name of a node's view of an artefact: its files' names and SHA-256s, hashed. The node
    cache builds a view of links to files it checked, under this name (batching/node_cache.py);
    a fetch computes it from the artefact's marker, so a view is taken only where its every name
    holds the file the marker says (fetch.py), however the view was asked for."""
    canonical = json.dumps(sorted(files.items()), separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


# A file's name in a view: a relative path of at most MAX_VIEW_DEPTH parts, each a file name a
# Linux file system takes. What upload writes in a marker always is one.
MAX_VIEW_DEPTH = 16
VIEW_NAMES = f"a relative path of 1 to {MAX_VIEW_DEPTH} parts, none empty, '.' or '..', each at most 255 bytes, no NUL"


def view_name(name: object) -> bool:
    """``name`` can be a file's path inside a view, and lands inside it (VIEW_NAMES)."""
    if not isinstance(name, str) or not name or "\0" in name:
        return False
    parts = name.split("/")
    return len(parts) <= MAX_VIEW_DEPTH and all(p not in ("", ".", "..") and len(p.encode()) <= 255 for p in parts)


def held_keys(labels: Mapping[str, object]) -> frozenset[str]:
    """The artefacts a node cache's pod says it holds whole: its ``holds.inferentia.dev/<key>: "true"`` labels."""
    keys = (name[len(HOLDS_PREFIX) :] for name, value in labels.items() if name.startswith(HOLDS_PREFIX) and value == "true")
    return frozenset(k for k, _ in zip((k for k in keys if HOLD_KEY.fullmatch(k)), range(MAX_HELD_KEYS), strict=False))
