"""Every child's labels, selectors and owner: what ties an object to its model."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inferentia_operator.core import api
from inferentia_operator.core.names import (
    COMPONENT_LABEL,
    FIELD_MANAGER,
    MANAGED_BY_LABEL,
    MODEL_LABEL,
    TRAFFIC_LABEL,
    TRAFFIC_ON,
    WORKER_INDEX_LABEL,
)
from inferentia_operator.core.pod.model import Model


def labels(model: Model, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": model.name,
        "app.kubernetes.io/instance": model.name,
        COMPONENT_LABEL: component,
        MANAGED_BY_LABEL: FIELD_MANAGER,
        "app.kubernetes.io/part-of": "inferentia-operator",
        MODEL_LABEL: model.name,
    }


def selector(model: Model) -> dict[str, str]:
    return {MODEL_LABEL: model.name, COMPONENT_LABEL: "serving"}


def traffic_selector(model: Model) -> dict[str, str]:
    """The serving pods whose traffic is on (names.TRAFFIC_LABEL): what the holder forwards to."""
    return {**selector(model), TRAFFIC_LABEL: TRAFFIC_ON}


def answering_selector(model: Model) -> dict[str, str]:
    """The pods that answer requests, for the Service and the InferencePool: every serving pod
    whose traffic is on, or of a group across nodes its leader alone, whose workers hold ranks
    and serve no API; with prefill and decode pools, their proxy (serving/pools.py)."""
    if model.spec.disaggregation is not None:
        return proxy_selector(model)
    return {**traffic_selector(model), WORKER_INDEX_LABEL: "0"} if model.plan.nodes else traffic_selector(model)


def proxy_selector(model: Model) -> dict[str, str]:
    """The proxy in front of a disaggregated model's pools: the model's own Deployment's pods."""
    return {MODEL_LABEL: model.name, COMPONENT_LABEL: "proxy"}


def selector_string(model: Model) -> str:
    return labels_string(selector(model))


def labels_string(labels: Mapping[str, str]) -> str:
    """A label selector as status.selector and ``kubectl -l`` write it."""
    return ",".join(f"{k}={v}" for k, v in labels.items())


def child_metadata(model: Model, name: str, component: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": model.namespace,
        "labels": labels(model, component),
        "ownerReferences": [
            {
                "apiVersion": api.API_VERSION,
                "kind": api.KIND,
                "name": model.name,
                "uid": model.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }


def service_account(model: Model) -> dict[str, Any]:
    return {"serviceAccountName": model.spec.service_account_name} if model.spec.service_account_name else {}


# Scale to zero (autoscaling.minReplicas 0): the names of the holder (scale_to_zero/holder.py)
# and of the Service it forwards through, and the holder's pods, which the model's Service
# selects while no replica answers (serving/service.py).
HOLDER_SUFFIX = "-holder"
REPLICAS_SUFFIX = "-replicas"


def holder_selector(model: Model) -> dict[str, str]:
    return {MODEL_LABEL: model.name, COMPONENT_LABEL: "holder"}
