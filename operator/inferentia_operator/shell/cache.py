"""The observe step: one model and its children, read from the watch caches.

kopf indexes are the caches: every InferentiaModel and every child and pod the
operator manages (server-side filtered by its managed-by label) are kept in memory as
the watches deliver them, as :mod:`inferentia_operator.core.projection` projects and packs them. kopf starts no other handler
until every index is fully populated, so nothing is decided from a half-filled cache.

What the operator wrote itself is kept beside the caches until the watch delivers it,
so a reconcile right after a write does not repeat it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

from inferentia_operator.core import api
from inferentia_operator.core.kinds import CHILD_KINDS, PODS
from inferentia_operator.core.objects import Obj
from inferentia_operator.core.observed import Observed
from inferentia_operator.core.projection import Key

# What the overlay records for an object the operator deleted.
GONE: dict[str, Any] = {"metadata": {"resourceVersion": "-1"}, "gone": True}


class ByUri(Mapping[str, Any]):
    """One namespace's part of an index keyed by (namespace, artefact URI), unpacked only on
    lookup: a reconcile looks up its own model's one or two URIs, never the whole namespace.
    Every object of a URI, records and Jobs alike: anyone may create one that claims a URI,
    and the decision keeps only those the operator proves it made. ``written``: what the
    operator created that the watch has not delivered yet."""

    def __init__(self, store: Mapping[Any, Any] | None, namespace: str, written: Mapping[Key, dict[str, Any]]) -> None:
        self._store, self._namespace, self._written = store, namespace, written

    def __getitem__(self, uri: str) -> list[dict[str, Any]]:
        found = [packed.unpack() for packed in (self._store or {}).get((self._namespace, uri), ())]
        if (self._namespace, uri) in self._written:
            found.append(self._written[self._namespace, uri])
        if not found:
            raise KeyError(uri)
        return found

    def __iter__(self) -> Iterator[str]:
        keys = {*(self._store or {}).keys(), *self._written.keys()}
        return iter(sorted({uri for ns, uri in keys if ns == self._namespace}))

    def __len__(self) -> int:
        return sum(1 for _ in self)


class Cache:
    def __init__(self) -> None:
        self.indexes: Mapping[str, Any] | None = None  # kopf's, captured when they are populated
        # Per model: what the operator wrote, (kind, name) -> object, until the watch delivers it.
        self._written: dict[Key, dict[tuple[str, str], dict[str, Any]]] = {}
        # Records of completed compiles the operator created, by (namespace, URI), until the watch delivers them.
        self._records: dict[Key, dict[str, Any]] = {}
        # Kinds the API server answered it does not serve (KEDA's, before KEDA is installed),
        # until when: reconciles meanwhile write none, and say so in status.
        self._unserved_until: dict[str, float] = {}

    def unserved(self, kind: str, seconds: float) -> None:
        """The API server does not serve ``kind``: ask again after ``seconds``."""
        self._unserved_until[kind] = time.monotonic() + seconds

    def served(self, kind: str) -> bool:
        return time.monotonic() >= self._unserved_until.get(kind, 0.0)

    def capture(self, kwargs: Mapping[str, Any]) -> None:
        """Keeps kopf's indexes, which it passes to every handler."""
        if self.indexes is None:
            self.indexes = {k: v for k, v in kwargs.items() if k.endswith("_index")}

    @property
    def ready(self) -> bool:
        return self.indexes is not None

    def models(self) -> list[Key]:
        return list(self.indexes["model_index"].keys()) if self.indexes is not None else []

    def has_model(self, key: Key) -> bool:
        return self.indexes is not None and key in self.indexes["model_index"]

    def all_models(self) -> list[dict[str, Any]]:
        if self.indexes is None:
            return []
        return [m.unpack() for store in self.indexes["model_index"].values() for m in store]

    def remember(self, key: Key, written: Mapping[tuple[str, str], dict[str, Any]]) -> None:
        """What the operator just wrote, to be read instead of the cache until the watch catches up."""
        self._written.setdefault(key, {}).update(written)

    def remember_record(self, namespace: str, uri: str, record: dict[str, Any]) -> None:
        self._records[namespace, uri] = record

    def models_of_artefact(self, namespace: str, uri: str) -> list[Key]:
        """The models whose status names ``uri`` as their artefact: those a compile Job or
        record of it concerns, whichever model made it."""
        index = (self.indexes or {}).get("compiled_uri_index")
        return [(namespace, name) for name in (index or {}).get((namespace, uri), ())]

    def forget(self, key: Key) -> None:
        self._written.pop(key, None)

    def deleted(self, key: Key, body: Mapping[str, Any]) -> None:
        """A child's delete event: lets go of what the operator wrote of it at or before the
        deleted copy. Without it, a write the watch never delivered (a relist after the
        child was deleted shows only the delete) would stand in for the child forever, and
        the model would never create it again."""
        obj, written = Obj(body), self._written.get(key, {})
        child = (str(body.get("kind")), obj.name or "")
        mine = written.get(child)
        if mine is not None and not mine.get("gone") and Obj(mine).resource_version <= obj.resource_version:
            del written[child]

    def _cached(self, index: str, key: Key) -> list[dict[str, Any]]:
        assert self.indexes is not None
        store = self.indexes.get(index)  # none for a kind the cluster does not serve, if kopf leaves it out
        return [packed.unpack() for packed in store.get(key, ())] if store is not None else []

    def _resolve(self, key: Key, kind: str, cached: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The cached objects, each replaced by what the operator wrote when that is newer,
        plus objects it created that the watch has not delivered yet."""
        by_name = {o["metadata"]["name"]: o for o in cached}
        written_here = self._written.get(key, {})
        for (k, name), written in list(written_here.items()):
            if k != kind:
                continue
            current = by_name.get(name)
            if written.get("gone"):
                if current is None:
                    del written_here[(k, name)]  # the watch has seen the delete
                else:
                    by_name.pop(name)  # deleted, though the watch has not said so yet
            elif current is not None and Obj(current).resource_version >= Obj(written).resource_version:
                del written_here[(k, name)]  # the watch has caught up
            else:
                by_name[name] = written
        return list(by_name.values())

    def observe(self, key: Key) -> Observed | None:
        cached = self._cached("model_index", key)
        if not cached:
            # Deleted (or not yet seen): only the watch makes a model exist. A status patch that
            # landed after the model's delete event would otherwise keep it alive in the overlay.
            self._written.pop(key, None)
            return None
        models = self._resolve(key, api.KIND, cached)
        model = next((m for m in models if Obj(m).name == key[1]), None)
        if model is None:
            return None

        kinds = [k for k in CHILD_KINDS if k is not PODS]
        pods = self._cached(PODS.index, key)
        children = {k.kind: self._resolve(key, k.kind, self._cached(k.index, key)) for k in kinds}
        return Observed(
            model=model,
            children=children,
            pods=pods,
            compile_records=self._compile_view("compile_record_index", key[0], records=True),
            compile_jobs=self._compile_view("compile_job_index", key[0], records=False),
            unserved=frozenset(k.kind for k in kinds if not self.served(k.kind)),
            job_events=self._job_events(key[0], children.get("Job", [])),
            # A view of the index, read only where a pod's node reports a fault.
            nodes=(self.indexes or {}).get("neuron_node_index") or {},
            caches=(self.indexes or {}).get("node_cache_index") or {},
        )

    def _job_events(self, namespace: str, jobs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
        """The FailedCreate events of the model's own Jobs."""
        store = (self.indexes or {}).get("job_event_index") or {}
        names = [name for name in (Obj(j).name for j in jobs) if name is not None]
        return {name: list(found) for name in names if (found := store.get((namespace, name)))}

    def _compile_view(self, index: str, namespace: str, records: bool) -> ByUri:
        assert self.indexes is not None
        store = self.indexes.get(index)
        if records:
            # A record the watch has delivered needs no overlay any more.
            for ns, uri in [k for k in self._records if k[0] == namespace]:
                name = Obj(self._records[ns, uri]).name
                if store is not None and any(Obj(p.unpack()).name == name for p in store.get((ns, uri), ())):
                    del self._records[ns, uri]
        return ByUri(store, namespace, self._records if records else {})
