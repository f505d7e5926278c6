"""The pods' sized volumes: the artefact, the fetched model, HOME and /tmp."""

from __future__ import annotations

from typing import Any

from inferentia_operator.core.catalogue import GIB
from inferentia_operator.core.pod.containers import SCRATCH_PATHS
from inferentia_operator.core.pod.contribution import PodContribution
from inferentia_operator.core.pod.meta import selector
from inferentia_operator.core.pod.model import Model


def gib_quantity(size_bytes: int) -> str:
    """A volume's size: whole GiB, rounded up."""
    return f"{-(-size_bytes // GIB)}Gi"


def _sized_volume(model: Model, name: str, size_bytes: int) -> dict[str, Any]:
    """An emptyDir of the size the plan gives, or with serving.storageClassName a generic
    ephemeral volume: a claim of that class per pod, made and deleted with the pod
    (https://kubernetes.io/docs/concepts/storage/ephemeral-volumes/#generic-ephemeral-volumes)."""
    size = gib_quantity(size_bytes)
    storage_class = model.spec.serving.storage_class_name
    if storage_class is None:
        return {"name": name, "emptyDir": {"sizeLimit": size}}
    claim = {"accessModes": ["ReadWriteOnce"], "storageClassName": storage_class, "resources": {"requests": {"storage": size}}}
    return {"name": name, "ephemeral": {"volumeClaimTemplate": {"metadata": {"labels": selector(model)}, "spec": claim}}}


def artefact_volume(model: Model) -> dict[str, Any]:
    """Where the compiled artefact is written (compile Job) or fetched to (serving pods)."""
    assert model.plan.sizes.artefact_bytes is not None, "an artefact volume without a compile step"
    return _sized_volume(model, "compiled", model.plan.sizes.artefact_bytes)


def model_volume(model: Model) -> dict[str, Any]:
    """Where an uncompiled model from a store is fetched to."""
    assert model.plan.sizes.model_bytes is not None, "a model volume for a model in no store"
    return _sized_volume(model, "model", model.plan.sizes.model_bytes)


def scratch_volumes(model: Model, home_bytes: int) -> list[dict[str, Any]]:
    """HOME (and the caches under it), sized from the model, and /tmp (spec.serving.tmpSize)."""
    return [_sized_volume(model, "home", home_bytes), {"name": "tmp", "emptyDir": {"sizeLimit": model.spec.serving.tmp_size}}]


def scratch_mounts() -> list[dict[str, Any]]:
    return [{"name": name, "mountPath": path} for name, path in SCRATCH_PATHS.items()]


def scratch(model: Model, home_bytes: int) -> PodContribution:
    """Where the main container writes (its root file system is read-only): HOME, sized
    ``home_bytes``, and /tmp: their mounts and volumes. The variables that point at them
    (SCRATCH_ENV, pod/containers.py) are not part of it: each builder (serving/deployment.py,
    compile/job.py) puts them first in the main container's environment, before every
    contribution's variables, whatever this contribution's place in its list."""
    return PodContribution(mounts=tuple(scratch_mounts()), volumes=tuple(scratch_volumes(model, home_bytes)))
