"""What the compile step runs in compile.image, and what it reads: the operator's compile program
by default, the model, the compiler and its flags, where the artefact is written and uploaded;
the target it compiles for on the CPU; and for the vLLM preset, the operator's compile step on
NxD Inference or on the vLLM Neuron plugin instead, and where it keeps a Hub model's snapshot."""

from __future__ import annotations

import json

from inferentia_operator.core.names import PLAN_FILE, PLAN_MOUNT
from inferentia_operator.core.pod.artefact import compiled_uri
from inferentia_operator.core.pod.contribution import NOTHING, PodContribution
from inferentia_operator.core.pod.dirs import COMPILED_DIR, HUB_CACHE_DIR, model_path
from inferentia_operator.core.pod.model import Model, vllm_nxd, vllm_plugin
from inferentia_operator.core.pod.vllm import VLLM_PLUGIN_COMPILE_ENV, vllm_engine_args
from inferentia_operator.core.sizing import keeps_hub_snapshot
from inferentia_operator.programs import COMPILE_PROGRAM, NXDI_COMPILE_PROGRAM, VLLM_COMPILE_PROGRAM


def compile_program(model: Model) -> PodContribution:
    """The operator's compile program, and what every compile step reads: the model, the
    compiler and its flags, where it writes the artefact and where the upload puts it, the plan."""
    return PodContribution(
        env={
            "INFERENTIA_MODEL_URI": model.spec.model.uri,
            "INFERENTIA_MODEL_PATH": model_path(model),
            "INFERENTIA_COMPILER": model.plan.compiler,
            "INFERENTIA_OUTPUT_URI": compiled_uri(model),
            "INFERENTIA_COMPILED_MODEL_DIR": COMPILED_DIR,
            "NEURON_CC_FLAGS": " ".join(model.plan.compiler_args),
            "INFERENTIA_PLAN_FILE": PLAN_FILE,
        },
        command=("python3", f"{PLAN_MOUNT}/{COMPILE_PROGRAM}"),
    )


def cpu_target(model: Model) -> PodContribution:
    """The family a neuronx-cc compile targets, from a Job without a Neuron device."""
    if model.plan.compiler != "neuronx-cc":
        return NOTHING
    # No Neuron device in the Job: torch-neuronx traces on the CPU (cpu_backend=True, the
    # program's docstring) for the target set before it is imported, as optimum-neuron does
    # (huggingface/optimum-neuron PR #961); NxD Inference and the plugin read it too.
    return PodContribution(env={"NEURON_PLATFORM_TARGET_OVERRIDE": model.plan.family})


def vllm_compile(model: Model) -> PodContribution:
    """For the vLLM preset, the operator's compile step on the family's vLLM, in place of its
    compile program, with the engine arguments the serving pods give vLLM."""
    if vllm_nxd(model):
        # vLLM on NxD Inference: its compiled model, through NxD Inference's own API, for the
        # family's target (the Job has no device to detect it from), into the directory the
        # upload step uploads and the serving pods' NEURON_COMPILED_ARTIFACTS names.
        return PodContribution(
            env={"INFERENTIA_VLLM_ENGINE_ARGS": json.dumps(vllm_engine_args(model), sort_keys=True)},
            command=("python3", f"{PLAN_MOUNT}/{NXDI_COMPILE_PROGRAM}"),
        )
    if vllm_plugin(model):
        # The plugin's own compile at warm-up, on the CPU for the family's target, into the
        # directory the upload step uploads.
        return PodContribution(
            env={
                **VLLM_PLUGIN_COMPILE_ENV,
                "NEURON_LOGICAL_NC_CONFIG": str(model.plan.lnc),
                "VLLM_CACHE_ROOT": COMPILED_DIR,
                "INFERENTIA_VLLM_ENGINE_ARGS": json.dumps(vllm_engine_args(model), sort_keys=True),
            },
            command=("python3", f"{PLAN_MOUNT}/{VLLM_COMPILE_PROGRAM}"),
        )
    return NOTHING


def hub_snapshot(model: Model) -> PodContribution:
    """A vLLM model named by a Hugging Face id: the compile step downloads it once into the
    artefact (programs/hub_snapshot.py), and every serving pod reads it from there, offline."""
    if not keeps_hub_snapshot(model.spec):
        return NOTHING
    return PodContribution(env={"INFERENTIA_HUB_CACHE": HUB_CACHE_DIR})
