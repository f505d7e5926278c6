"""The containers of the operator's image that move a model or an artefact in or out of a pod,
and, with the node-local cache, the token and views their fetch reads through."""

from __future__ import annotations

from typing import Any

from inferentia_operator.core.holds import NODE_CACHE_AUDIENCE, NODE_VIEW_DIR, NODE_VIEW_DRIVER, hold_key
from inferentia_operator.core.pod.artefact import compiled_uri, fetched_uris
from inferentia_operator.core.pod.containers import BATCHER_RESOURCES, CONTAINER_SECURITY, SCRATCH_ENV
from inferentia_operator.core.pod.contribution import PodContribution
from inferentia_operator.core.pod.dirs import COMPILED_DIR, MODEL_DIR
from inferentia_operator.core.pod.model import Model, vllm_plugin
from inferentia_operator.core.pod.volumes import scratch_mounts


def _storage_env_from(model: Model) -> dict[str, Any]:
    """The object store's credentials and endpoint, from the Secret the spec names."""
    secret = model.spec.compile.storage_secret
    return {"envFrom": [{"secretRef": {"name": secret}}]} if secret else {}


def operator_container(model: Model, name: str, args: list[str], mounts: list[dict[str, Any]]) -> dict[str, Any]:
    """A container of the operator's own image that moves a model or an artefact in or out of the pod."""
    return {
        "name": name,
        "image": model.operator_image,
        "args": args,
        **_storage_env_from(model),
        "env": [{"name": k, "value": v} for k, v in SCRATCH_ENV.items()],
        "resources": BATCHER_RESOURCES,
        "securityContext": CONTAINER_SECURITY,
        "volumeMounts": [*mounts, *scratch_mounts()],
        # Its last log lines (the store's error) become the termination message, which the
        # model's status quotes when a fetch or an upload fails.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def fetch_container(model: Model) -> dict[str, Any]:
    """The init container that copies the compiled artefact into the pod before the server
    starts (``inferentia-operator fetch``), refusing one whose upload did not complete."""
    container = operator_container(
        model,
        "fetch-artifacts",
        ["fetch", "--from", compiled_uri(model), "--to", COMPILED_DIR],
        [{"name": "compiled", "mountPath": COMPILED_DIR}],
    )
    if model.node_cache_url:
        # Each file is asked of the node's cache first, by the SHA-256 the marker names, and
        # checked; one read from the store is offered back (fetch.py, batching/node_cache.py).
        through_node_cache(model, container)
    return container


# The serving pod's token for the node cache (batching/node_cache.py answers only pods of its
# node that show one): projected for the cache's audience alone, so it opens nothing else, and
# mounted only where fetch reads it (the pod mounts no API token).
NODE_CACHE_TOKEN = {"volume": "node-cache-token", "dir": "/var/run/secrets/inferentia.dev/node-cache", "file": "token"}


def through_node_cache(model: Model, container: dict[str, Any]) -> None:
    container["env"] += [
        {"name": "INFERENTIA_NODE_CACHE", "value": model.node_cache_url},
        {"name": "INFERENTIA_NODE_CACHE_TOKEN", "value": f"{NODE_CACHE_TOKEN['dir']}/{NODE_CACHE_TOKEN['file']}"},
        *([{"name": "INFERENTIA_NODE_VIEW", "value": NODE_VIEW_DIR}] if node_view_volumes(model) else []),
    ]
    container["volumeMounts"] += [
        {"name": NODE_CACHE_TOKEN["volume"], "mountPath": NODE_CACHE_TOKEN["dir"], "readOnly": True},
        *node_view_mounts(model),
    ]


def node_cache(model: Model) -> PodContribution:
    """A serving pod's share of the node cache: the token its fetches show it, and the views of
    what they fetch, mounted in the serving container too."""
    return PodContribution(
        # What fetch linked to instead of copying, at the paths its links name.
        mounts=tuple(node_view_mounts(model)),
        volumes=(*node_cache_token_volumes(model), *node_view_volumes(model)),
    )


def node_view_mounts(model: Model) -> list[dict[str, Any]]:
    """Where the node cache's views of what the pod fetches are mounted: in fetch, which links
    to them, and in the serving container, which reads through the links (the same paths)."""
    return [
        {"name": v["name"], "mountPath": f"{NODE_VIEW_DIR}/{v['csi']['volumeAttributes']['key']}", "readOnly": True}
        for v in node_view_volumes(model)
    ]


def node_view_volumes(model: Model) -> list[dict[str, Any]]:
    """With the node plugin (--node-views), one CSI ephemeral inline volume per artefact the pod
    fetches: the node cache's views of it for the pod's namespace (batching/node_plugin.py).
    Restricted Pod Security admits csi volumes
    (https://kubernetes.io/docs/concepts/security/pod-security-standards/#restricted)."""
    if not (model.node_cache_url and model.node_views) or vllm_plugin(model):
        # The vLLM Neuron plugin takes file locks in its compiled artefact, even to read it:
        # files behind links into a read-only view would refuse them. It copies, as before.
        return []
    return [
        {"name": f"node-view-{i}", "csi": {"driver": NODE_VIEW_DRIVER, "readOnly": True, "volumeAttributes": {"key": hold_key(uri)}}}
        for i, uri in enumerate(fetched_uris(model))
    ]


def node_cache_token_volumes(model: Model) -> list[dict[str, Any]]:
    """The projected token, where a serving pod's fetch reads through the node cache."""
    if not (model.node_cache_url and fetched_uris(model)):
        return []
    # 600 s is the least a projected token may live; the kubelet renews it before it expires
    # (https://kubernetes.io/docs/concepts/storage/projected-volumes/#serviceaccounttoken).
    token = {"audience": NODE_CACHE_AUDIENCE, "expirationSeconds": 600, "path": NODE_CACHE_TOKEN["file"]}
    return [{"name": NODE_CACHE_TOKEN["volume"], "projected": {"sources": [{"serviceAccountToken": token}]}}]


def fetch_model_container(model: Model) -> dict[str, Any]:
    """The init container that copies the uncompiled model into the pod (``inferentia-operator fetch --model``)."""
    return operator_container(
        model,
        "fetch-model",
        ["fetch", "--model", "--from", model.spec.model.uri, "--to", MODEL_DIR],
        [{"name": "model", "mountPath": MODEL_DIR}],
    )
