"""The KEDA ScaledObjects of a model, or of each of its prefill and decode pools
(:mod:`inferentia_operator.core.autoscaling` builds their bodies)."""

from __future__ import annotations

from typing import Any

from inferentia_operator.core.autoscaling import PoolRole, Prometheus, scales_to_zero
from inferentia_operator.core.autoscaling import pool_scaled_object as pool_object
from inferentia_operator.core.autoscaling import scaled_object as autoscaling_object
from inferentia_operator.core.pod.meta import child_metadata
from inferentia_operator.core.pod.model import Model
from inferentia_operator.core.pod.pools import pool_name
from inferentia_operator.core.pod.ports import holder_scaler_address


def scaled_object(model: Model, prometheus: Prometheus, has_artefact: bool = True, push: bool = True) -> dict[str, Any]:
    """The KEDA ScaledObject of a model with spec.autoscaling (core/autoscaling.py builds its
    body); with ``push``, a model that scales to zero also has its holder's external scaler as
    a push trigger."""
    return autoscaling_object(
        model.spec, model.namespace, model.name, child_metadata(model, model.name, "autoscaling"), prometheus, has_artefact,
        push_address=holder_scaler_address(model) if push and scales_to_zero(model.spec) else None,
    )  # fmt: skip


def pool_scaled_object(model: Model, role: PoolRole, prometheus: Prometheus) -> dict[str, Any]:
    """The ScaledObject of a pool with its own autoscaling: named as the pool's Deployment, which it scales."""
    name = pool_name(model, role)
    return pool_object(model.spec, role, model.namespace, model.name, name, child_metadata(model, name, "autoscaling"), prometheus)
