"""What a serving pod reads before its server starts, fetched into the pod by the operator's
image: the compiled artefact the compile Job uploaded, the model itself where the server
reads it too, and the Hub snapshot the artefact keeps."""

from __future__ import annotations

from typing import Any

from inferentia_operator.core.pod.artefact import compiled_uri, serving_fetches_model
from inferentia_operator.core.pod.contribution import NOTHING, PodContribution
from inferentia_operator.core.pod.dirs import COMPILED_DIR, HUB_CACHE_DIR, MODEL_DIR, model_path
from inferentia_operator.core.pod.fetch import fetch_container, fetch_model_container, through_node_cache
from inferentia_operator.core.pod.model import Model, vllm_plugin
from inferentia_operator.core.pod.volumes import artefact_volume, model_volume
from inferentia_operator.core.sizing import keeps_hub_snapshot


def compiled_artefact(model: Model) -> PodContribution:
    """With a compile step (compile.image), its artefact: fetched first, by an init container
    that refuses one whose upload did not complete, into the volume the server reads it from."""
    if not model.spec.compile.image:
        return NOTHING
    return PodContribution(
        env={"INFERENTIA_COMPILED_MODEL_URI": compiled_uri(model), "INFERENTIA_COMPILED_MODEL_DIR": COMPILED_DIR},
        # The plugin takes file locks in its cache, even to read it: writable for it alone.
        # (No readOnly: false: the API server drops a false readOnly, and a field it drops
        # would read as drift on every reconcile.)
        mounts=({"name": "compiled", "mountPath": COMPILED_DIR, **({} if vllm_plugin(model) else {"readOnly": True})},),
        volumes=(artefact_volume(model),),
        init_containers=(fetch_container(model),),
    )


def uncompiled_model(model: Model) -> PodContribution:
    """The model itself: where the operator's server finds it to trace at start (no compile
    step), and, where the server reads a remote model (serving_fetches_model), fetched first."""
    env = {}
    if model.spec.serves_with_program and not model.spec.compile.image:
        # No compile step: the operator's model server traces the model at start.
        env["INFERENTIA_MODEL_PATH"] = model_path(model)
    if not serving_fetches_model(model):
        return PodContribution(env=env)
    return PodContribution(
        env=env,
        mounts=({"name": "model", "mountPath": MODEL_DIR, "readOnly": True},),
        volumes=(model_volume(model),),
        init_containers=(_fetch_model(model),),
    )


def _fetch_model(model: Model) -> dict[str, Any]:
    container = fetch_model_container(model)
    if model.node_cache_url:
        # Only on serving pods, which run where the node cache's DaemonSet does: a compile Job
        # may run on any node. A model with a marker (its weights, its configuration and
        # tokenizer beside a compiled artefact) is read through it, each file checked.
        through_node_cache(model, container)
    return container


def hub_snapshot(model: Model) -> PodContribution:
    """A Hugging Face model compiled ahead for vLLM, read from the artefact's copy, offline."""
    if not keeps_hub_snapshot(model.spec):
        return NOTHING
    # The model id resolves to the commit the compile read, from the artefact's copy; the
    # Hub is never asked ("HF_HUB_OFFLINE", huggingface_hub's environment variables).
    return PodContribution(env={"HF_HUB_CACHE": HUB_CACHE_DIR, "HF_HUB_OFFLINE": "1"})
