"""What a serving pod reads before its server starts, fetched into the pod by the operator's
image: the compiled artefact the compile Job uploaded."""

from __future__ import annotations

from inferentia_operator.core.pod.artefact import compiled_uri
from inferentia_operator.core.pod.contribution import NOTHING, PodContribution
from inferentia_operator.core.pod.dirs import COMPILED_DIR
from inferentia_operator.core.pod.fetch import fetch_container
from inferentia_operator.core.pod.model import Model, vllm_plugin
from inferentia_operator.core.pod.volumes import artefact_volume


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
