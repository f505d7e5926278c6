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
import re

HOLDS_PREFIX = "holds.inferentia.dev/"
# The audience of the token a serving pod shows the node cache: projected for it alone
# (core/children.py), so the cache can check it with a TokenReview and no one can replay it
# against the API server (batching/node_cache.py, Admission).
NODE_CACHE_AUDIENCE = "node-cache.inferentia.dev"
# The longest such token either side takes: a projected token is about 1 KiB.
NODE_CACHE_MAX_TOKEN_BYTES = 4096
HOLD_KEY = re.compile(r"^[0-9a-f]{32}$")


def hold_key(uri: str) -> str:
    """The artefact at ``uri`` (an s3:// prefix, with or without its trailing slash)."""
    return hashlib.sha256((uri.rstrip("/") + "/").encode()).hexdigest()[:32]


def hold_label(uri: str) -> str:
    return HOLDS_PREFIX + hold_key(uri)
