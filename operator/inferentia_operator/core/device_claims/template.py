"""The ResourceClaimTemplate each serving pod's claim is made from (allocation dra)."""

from __future__ import annotations

from typing import Any

from inferentia_operator.core.pod.claims import claim_spec, claim_template_name
from inferentia_operator.core.pod.meta import child_metadata
from inferentia_operator.core.pod.model import Model


def resource_claim_template(model: Model) -> dict[str, Any] | None:
    """With allocation dra, the template each serving pod's claim is made from; else None."""
    if model.plan.allocation != "dra":
        return None
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": child_metadata(model, claim_template_name(model), "serving"),
        "spec": {"spec": claim_spec(model)},
    }
