"""Proof that the operator itself made an object: an HMAC (RFC 2104, SHA-256) under a key only
the operator holds, in the annotation ``inferentia.dev/proof``.

The compile cache trusts two kinds of object: the record of a completed compile (a ConfigMap)
and a completed compile Job. Both live in the model's namespace, where anyone with ordinary
namespace rights can create a ConfigMap or a Job with the operator's labels and names; a forged
one would let a model skip its compile and serve whatever sits at its artefact's URI. So each
carries a proof the namespace's users cannot make:

- a record, over its namespace, name and artefact URI (the operator writes the proof into the
  record it creates);
- a compile Job, over its namespace, name, artefact URI and UID: the UID is the API server's,
  known only once the Job exists, so the operator adds the proof right after its own create,
  from the create's answer. A proof copied onto another Job names the wrong UID.

Neither the key nor a proof is a name: names stay what the spec says, so ``render`` prints
them without the key, and a name someone else took is a NameConflict, never a cache hit.
docs/design.md ("The compile cache's threat model") says what this does and does not defend.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .objects import Obj

PROOF_ANNOTATION = "inferentia.dev/proof"
# 256 bits, as HMAC-SHA256's block-size advice (RFC 2104, section 3) and the key Secret hold.
KEY_BYTES = 32


@dataclass(frozen=True)
class Prover:
    """Seals and checks proofs with the operator's key. Without a key (the CLI offline, a test)
    it makes no proof and vouches for nothing."""

    key: bytes | None = field(default=None, repr=False)

    def _seal(self, *parts: str) -> str:
        if not self.key:
            return ""
        return hmac.new(self.key, "\0".join(parts).encode(), hashlib.sha256).hexdigest()

    def _vouches(self, given: Any, *parts: str) -> bool:
        expected = self._seal(*parts)
        return bool(expected) and isinstance(given, str) and hmac.compare_digest(given, expected)

    def record(self, namespace: str, name: str, uri: str) -> str:
        return self._seal("compile-record", namespace, name, uri)

    def job(self, namespace: str, name: str, uid: str, uri: str) -> str:
        return self._seal("compile-job", namespace, name, uid, uri)

    def made_record(self, body: Mapping[str, Any] | None, uri: str) -> bool:
        """``body`` is a record the operator made of a completed compile of ``uri``."""
        obj = Obj(body)
        data = (body or {}).get("data") or {}
        given = obj.annotations.get(PROOF_ANNOTATION)
        return data.get("uri") == uri and self._vouches(given, "compile-record", obj.namespace or "", obj.name or "", uri)

    def made_job(self, body: Mapping[str, Any] | None, uri: str | None) -> bool:
        """``body`` is a compile Job of ``uri`` that the operator created."""
        obj = Obj(body)
        if not uri or not obj.uid:
            return False
        return self._vouches(obj.annotations.get(PROOF_ANNOTATION), "compile-job", obj.namespace or "", obj.name or "", obj.uid, uri)


NO_PROVER = Prover()
