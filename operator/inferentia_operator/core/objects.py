"""A small typed view over Kubernetes objects as the API server sends them (plain dicts).

The operator reads the same few things of every object: its name, namespace, labels,
controller, generation and conditions. :class:`Obj` reads each of them in one place,
typed, and treats an absent object or field as empty, so no caller writes
``((x or {}).get("metadata") or {}).get(...)`` again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_EMPTY: Mapping[str, Any] = {}


def as_mapping(value: object) -> Mapping[str, Any]:
    """``value`` if it is a mapping, else an empty one: an object's field read whatever its shape."""
    return value if isinstance(value, Mapping) else _EMPTY


class Obj:
    """A read-only view of one object; ``Obj(None)`` is an absent object."""

    __slots__ = ("raw",)

    def __init__(self, raw: Mapping[str, Any] | None) -> None:
        self.raw: Mapping[str, Any] = raw if raw is not None else _EMPTY

    def __bool__(self) -> bool:
        return bool(self.raw)

    @property
    def kind(self) -> str:
        return str(self.raw.get("kind") or "")

    @property
    def metadata(self) -> Mapping[str, Any]:
        return as_mapping(self.raw.get("metadata"))

    @property
    def spec(self) -> Mapping[str, Any]:
        return as_mapping(self.raw.get("spec"))

    @property
    def status(self) -> Mapping[str, Any]:
        return as_mapping(self.raw.get("status"))

    @property
    def name(self) -> str | None:
        name = self.metadata.get("name")
        return name if isinstance(name, str) else None

    @property
    def namespace(self) -> str | None:
        namespace = self.metadata.get("namespace")
        return namespace if isinstance(namespace, str) else None

    @property
    def key(self) -> tuple[str, str] | None:
        """(namespace, name), or None for an object without both."""
        return (self.namespace, self.name) if self.namespace is not None and self.name is not None else None

    @property
    def uid(self) -> str | None:
        uid = self.metadata.get("uid")
        return uid if isinstance(uid, str) else None

    @property
    def labels(self) -> Mapping[str, str]:
        return as_mapping(self.metadata.get("labels"))

    @property
    def annotations(self) -> Mapping[str, str]:
        return as_mapping(self.metadata.get("annotations"))

    @property
    def generation(self) -> int:
        generation = self.metadata.get("generation")
        return generation if isinstance(generation, int) else 0

    @property
    def resource_version(self) -> int:
        """The resourceVersion as a number, -1 when absent. Kubernetes calls it opaque, but
        every API server backed by etcd gives its revision; it is used only to tell which
        of two copies of one object is newer."""
        try:
            return int(self.metadata.get("resourceVersion") or -1)
        except (TypeError, ValueError):
            return -1

    @property
    def created(self) -> str:
        return str(self.metadata.get("creationTimestamp") or "")

    @property
    def deleting(self) -> bool:
        return bool(self.metadata.get("deletionTimestamp"))

    @property
    def controller(self) -> Mapping[str, Any] | None:
        """The owner reference with ``controller: true``, if any."""
        refs = self.metadata.get("ownerReferences")
        return next((as_mapping(r) for r in refs or () if as_mapping(r).get("controller")), None)

    def condition(self, type_: str) -> Mapping[str, Any]:
        """The status condition of that type, empty when the object has none."""
        for c in self.status.get("conditions") or ():
            if as_mapping(c).get("type") == type_:
                return as_mapping(c)
        return _EMPTY

    def condition_true(self, type_: str) -> bool:
        return self.condition(type_).get("status") == "True"
