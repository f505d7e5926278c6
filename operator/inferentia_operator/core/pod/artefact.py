"""The compiled artefact's identity: what goes into its key, where it is stored, the compile
Job's name after it, what a serving pod fetches, and where a Job or a Deployment says it is."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inferentia_operator.core.objects import Obj
from inferentia_operator.core.pod.dirs import remote_model
from inferentia_operator.core.pod.model import Model, stable_hash, vllm_nxd, vllm_plugin
from inferentia_operator.core.pod.vllm import vllm_engine_args
from inferentia_operator.core.sizing import keeps_hub_snapshot
from inferentia_operator.programs import COMPILE_PROGRAM_VERSION, HUB_SNAPSHOT_VERSION, NXDI_COMPILE_PROGRAM_VERSION


def compile_inputs(model: Model) -> dict[str, Any]:
    """Everything that changes the compiled artefact, and nothing else."""
    inputs: dict[str, Any] = {
        "uri": model.spec.model.uri,
        "framework": model.spec.model.framework,
        "family": model.plan.family,
        "compilerArgs": model.plan.compiler_args,
        "batchSize": model.plan.batch_size,
        "dynamicBatchSize": model.plan.dynamic_batch_size,
        "buckets": model.plan.buckets,
        "image": model.spec.compile.image,
    }
    if model.plan.compiler != "neuron-cc":
        # neuron-cc is inf1's only compiler, which "family" already pins; leaving it out
        # keeps every inf1 compile hash as it was, so upgrading the operator recompiles nothing.
        # A neuronx-cc artefact is also bound to its logical-core size and tensor-parallel
        # degree: the runtime refuses to load it under another.
        inputs |= {"compiler": model.plan.compiler, "lnc": model.plan.lnc, "tensorParallelSize": model.plan.tensor_parallel_size}
    if model.spec.compiles_with_program:
        # The operator's compile program made the artefact: its format and the example inputs' dtype.
        inputs |= {"program": COMPILE_PROGRAM_VERSION, "inputDtype": model.spec.input_dtype}
    if vllm_plugin(model):
        # The plugin's cache: one graph per shape the engine warms up, for its engine arguments.
        inputs |= {"vllm": "vllm-neuron-plugin", "engineArgs": vllm_engine_args(model)}
    if vllm_nxd(model):
        # NxD Inference's compiled model for those engine arguments, in the program's layout.
        inputs |= {"vllm": "nxd-inference", "engineArgs": vllm_engine_args(model), "program": NXDI_COMPILE_PROGRAM_VERSION}
    if keeps_hub_snapshot(model.spec):
        inputs["hubSnapshot"] = HUB_SNAPSHOT_VERSION
    return inputs


def compile_hash(model: Model) -> str:
    return stable_hash(compile_inputs(model))


def compiled_uri(model: Model) -> str:
    base = model.spec.compile.output_uri or model.spec.model.uri.rstrip("/") + "-neuron"
    return f"{base.rstrip('/')}/{compile_hash(model)}/"


def compile_id(model: Model) -> str:
    """The compile key, and the artefact's place: two models that share the key but write
    their artefacts to different places (compile.outputUri) compile apart."""
    return f"{compile_hash(model)}-{stable_hash(compiled_uri(model), 5)}"


def compile_job_name(model: Model) -> str:
    """Named after the artefact, not the model: two models with the same compile inputs
    create the same Job, and the API server's unique names let only the first one in, so
    they run one compile between them however close together they are reconciled."""
    return f"compile-{compile_id(model)}"


def _env_value(containers: Any, container: str | None, name: str) -> str | None:
    """The value of ``name`` in the env of the first of ``containers`` (named ``container``, when given) that sets it."""
    for c in containers or ():
        if container is None or c.get("name") == container:
            for e in c.get("env") or ():
                if e.get("name") == name:
                    return str(e.get("value"))
    return None


def job_output_uri(job: Mapping[str, Any]) -> str | None:
    """Where a compile Job uploads its artefact: the INFERENTIA_OUTPUT_URI of its compile step."""
    return _env_value(Obj(Obj(job).spec.get("template")).spec.get("initContainers"), "compile", "INFERENTIA_OUTPUT_URI")


def served_uri(deployment: Mapping[str, Any] | None) -> str | None:
    """The artefact a serving Deployment's pods fetch: its INFERENTIA_COMPILED_MODEL_URI."""
    return _env_value(Obj(Obj(deployment).spec.get("template")).spec.get("containers"), None, "INFERENTIA_COMPILED_MODEL_URI")


def compile_fetches_model(model: Model) -> bool:
    """The compile program reads a remote model: the compile Job fetches it first. (NxD
    Inference reads a local checkpoint too; a Hugging Face id its program downloads itself.)"""
    return (
        bool(model.spec.compile.image)
        and (model.spec.compiles_with_program or model.spec.serving.runtime == "vllm")
        and remote_model(model)
    )


def serving_fetches_model(model: Model) -> bool:
    """The serving pod fetches a remote model first: for vLLM always (it reads an object store
    only through the Run:ai streamer, "To load a model from S3, 'load_format' must be
    'runai_streamer'" (vllm/config), which AWS's Neuron images do not carry, and a compiled model
    still needs the checkpoint's configuration and tokenizer); for the operator's server when it
    traces the model at start (no compile step)."""
    if not remote_model(model):
        return False
    return model.spec.serving.runtime == "vllm" or (model.spec.serves_with_program and not model.spec.compile.image)


def fetched_uris(model: Model) -> list[str]:
    """What a serving pod fetches from the store (and so what the node cache may hold for it):
    the compiled artefact, and the model itself when the serving pod reads it too."""
    return [*([compiled_uri(model)] if model.spec.compile.image else []), *([model.spec.model.uri] if serving_fetches_model(model) else [])]
