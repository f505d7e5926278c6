"""What the runtime, the compilers and the operator's own compile program and model server accept."""

from __future__ import annotations

from inferentia_operator.core import neuron_images
from inferentia_operator.core.api import InferentiaModelSpec
from inferentia_operator.core.catalogue import Family
from inferentia_operator.core.cel import (
    CEL_FAMILY,
    NEURON_CC_FAMILIES,
    CrossFieldRule,
    literal,
)
from inferentia_operator.core.cores import flag_name
from inferentia_operator.core.findings import Finding

# The vLLM preset: the operator runs vLLM on NxD Inference on inf2 and trn1
# (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/libraries/nxd-inference/vllm/index.html),
# and on the vLLM Neuron plugin on Trn2 and Trn3, where NxD Inference's support ends with Neuron 2.34
# (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/model-recipes/index.html;
# catalogue.Family.vllm). inf1 has neither.
VLLM_FAMILY = CrossFieldRule(
    "spec.serving.runtime",
    "spec",
    "vllm does not run on %s: vLLM on Neuron runs on NxD Inference (inf2, trn1) and the vLLM Neuron plugin "
    "(trn2, trn3) only; "
    "valid values on %s are custom",
    f"!has(self.serving.runtime) || self.serving.runtime != 'vllm' || !({CEL_FAMILY} in {literal(NEURON_CC_FAMILIES)})",
    (CEL_FAMILY, CEL_FAMILY),
)


# What changes the model vLLM on NxD Inference builds (the NeuronConfig of vllm-neuron's loader,
# nxdi_compile.py): its flags, and the variable that turns chunked prefill on
# (DISABLE_NEURON_CUSTOM_SCHEDULER, the vLLM user guide for NxD Inference, known issues).
NXDI_SHAPE_FLAGS = (
    "--tensor-parallel-size", "-tp", "--max-model-len", "--max-num-seqs", "--dtype", "--block-size", "--enable-prefix-caching",
    "--num-gpu-blocks-override", "--enable-chunked-prefill", "--max-num-batched-tokens", "--additional-config",
    "--override-neuron-config", "--speculative-config",
)  # fmt: skip
NXDI_SHAPE_ENV = ("DISABLE_NEURON_CUSTOM_SCHEDULER", "NEURON_ON_DEVICE_SAMPLING_DISABLED")


def _check_compiled_shape(spec: InferentiaModelSpec) -> list[Finding]:
    """A compiled NxD Inference model is loaded as it is ("any differing model configurations passed
    in to the vllm API will not trigger re-compilation"): serving.args or serving.env that change
    what the loader builds serve a model compiled for another engine."""
    given = [flag_name(a) for a in spec.serving.args or [] if a.startswith("-")]
    flags = sorted(
        {a for a in given if a in NXDI_SHAPE_FLAGS or a.removeprefix("--no-") in {f.removeprefix("--") for f in NXDI_SHAPE_FLAGS}}
    )
    env = sorted({e.name for e in spec.serving.env or [] if e.name in NXDI_SHAPE_ENV})
    if not flags and not env:
        return []
    what = ", ".join([*flags, *env])
    return [
        Finding(
            "spec.serving.args" if flags else "spec.serving.env",
            f"{what} change the model vLLM on NxD Inference builds, and the compile Job compiles the model the spec plans "
            "(compile.buckets, serving.batching, the group's cores), which vLLM then loads as it is; set the shape in the "
            "spec, or leave compile.image unset to compile at start",
            "warning",
        )
    ]


def _check_runtime(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    if spec.serving.runtime == "vllm" and not fam.neuronx:
        return [VLLM_FAMILY.finding(fam.name, fam.name)]
    if spec.serving.runtime != "vllm" or fam.vllm != "nxd-inference" or spec.compile.image is None:
        return []
    found = _check_compiled_shape(spec)
    if not spec.compile.buckets or not spec.serving.batching:
        # The operator's NxD Inference program compiles vLLM's model for the server's engine
        # arguments; vLLM's own defaults for these two are its release's, not the operator's.
        found.append(
            Finding(
                "spec.compile.buckets",
                f"vLLM on NxD Inference ({fam.name}) is compiled ahead for one sequence length and number of sequences, "
                "and the spec leaves compile.buckets (the largest is --max-model-len) or "
                "serving.batching.maxBatchSize (--max-num-seqs) unset, so the compile Job fails; set both",
                "warning",
            )
        )
    return found


# A compile step traces the model with the operator's compile program, which uses the PyTorch
# Neuron frameworks. TensorFlow on Neuron is not supported by it: tensorflow-neuron (TensorFlow
# on inf1) is archived by AWS, and a TensorFlow model is compiled in the user's own image.
_HAS_COMPILE_IMAGE = "has(self.compile) && has(self.compile.image)"


TENSORFLOW_COMPILE = CrossFieldRule(
    "spec.model.framework",
    "spec",
    "tensorflow cannot be compiled by the operator: its compile program traces PyTorch models with torch-neuron and "
    "torch-neuronx, and tensorflow-neuron (TensorFlow on inf1) is archived by AWS; valid values with compile.image "
    "are pytorch, or leave compile.image unset and compile in your serving image",
    f"!(self.model.framework == 'tensorflow' && {_HAS_COMPILE_IMAGE})",
    (),
)
# The compile Job uploads its artefact to S3 and serving pods fetch it from there.
COMPILE_STORE = CrossFieldRule(
    "spec.compile.outputUri",
    "spec",
    "compiled artefacts are uploaded to S3, and %s is not an s3:// URI; valid values start with s3:// "
    "(set compile.outputUri when the model's uri is not in S3)",
    f"!({_HAS_COMPILE_IMAGE}) || (has(self.compile.outputUri) ? self.compile.outputUri.startsWith('s3://') "
    ": self.model.uri.startsWith('s3://'))",
    ("has(self.compile.outputUri) ? self.compile.outputUri : self.model.uri",),
)


def _check_programs(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    """What the operator's compile program and model server need, and what starts without them."""
    found = []
    if spec.model.framework == "tensorflow" and spec.compile.image:
        found.append(TENSORFLOW_COMPILE.finding())
    if spec.compile.image:
        store = spec.compile.output_uri or spec.model.uri
        if not store.startswith("s3://"):
            found.append(COMPILE_STORE.finding(store))
    programs = spec.compiles_with_program or (spec.serves_with_program and not spec.compile.image)
    if programs and not spec.compile.buckets:
        found.append(
            Finding(
                "spec.compile.buckets",
                "the operator's compile program (without compile.image, its model server at start) traces the model with "
                "example inputs of each bucket's shape, and none is set, so it fails; set the input shape without the batch "
                "dimension, for example [[3, 224, 224]]",
                "warning",
            )
        )
    uri = spec.model.uri
    if programs and not uri.startswith(("s3://", "https://", "/", "file:///")):
        found.append(
            Finding(
                "spec.model.uri",
                f"'{uri}' is neither s3://, https:// nor an absolute path in the image, so the compile program cannot read "
                "the model; valid values look like s3://bucket/model.pt, https://host/model.pt or /models/model.pt",
                "warning",
            )
        )
    if not spec.serving.args and spec.serving.runtime == "custom" and not spec.serves_with_program and spec.processes_per_replica > 1:
        found.append(
            Finding(
                "spec.serving.args",
                f"with {spec.processes_per_replica} processes, no args and a {spec.model.framework} model (the operator's "
                "model server runs PyTorch only), the image's own entry point runs once and must start every process "
                "itself from /etc/inferentia/env-<i>, which AWS's images do not; set args to the per-process command",
                "warning",
            )
        )
    return found


# Rule 4: CNN batch limits of neuron-cc, the Inf1 compiler (the Neuron batching tech note,
# https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-features/neuroncore-batching.html).
FP16_CNN_MAX_BATCH = 5


FP32_CNN_BATCH = CrossFieldRule(
    "spec.compile.batchSize",
    "spec",
    "a CNN in fp32 compiles only at batch size 1, got %d; valid values are 1 "
    f"(or use precision fp16 for batch sizes up to {FP16_CNN_MAX_BATCH})",
    f"!({CEL_FAMILY} in {literal(NEURON_CC_FAMILIES)} && self.model.architecture == 'cnn' && self.model.precision == 'fp32'"
    " && self.compile.batchSize > 1)",
    ("self.compile.batchSize",),
)


def _check_cnn_batch(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    model, b = spec.model, spec.compile.batch_size
    if fam.neuronx or model.architecture != "cnn" or b <= 1:
        return []  # the CNN batch limits are neuron-cc's
    if model.precision == "fp32":
        return [FP32_CNN_BATCH.finding(b)]
    if model.precision == "fp16" and b > FP16_CNN_MAX_BATCH:
        return [
            Finding(
                "spec.compile.batchSize",
                f"an fp16 CNN above batch size {FP16_CNN_MAX_BATCH} may not compile (the compiler supports FP16 "
                f"ResNet-50 up to batch {FP16_CNN_MAX_BATCH}), got {b}",
                "warning",
            )
        ]
    return []


def _check_neuron_cc_options(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    """Options that only neuron-cc (inf1) has: set on a neuronx-cc family, they mean nothing."""
    if not fam.neuronx or isinstance(spec.compile.static_weights, str):
        return []
    return [
        Finding(
            "spec.compile.staticWeights",
            f"{str(spec.compile.static_weights).lower()} has no effect on {fam.name}: static weights are a neuron-cc "
            "(inf1) option, and neuronx-cc has no --static-weights; remove it or leave it at auto",
            "warning",
        )
    ]


def _check_images(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    """What AWS publishes of the images (neuron_images) against what the paths need. Warnings:
    an image of another name, or a tag not catalogued, may carry anything."""
    found = []
    compile_image, serving_image = spec.compile.image, spec.serving.image
    sdk = neuron_images.sdk_of(compile_image)
    # torch-neuronx for torch 1.13 (the tag's first part) traces on any machine (aws-neuron-sdk#910).
    torch_2 = not str(compile_image).rpartition(":")[2].startswith("1.")
    if spec.compiles_with_program and fam.neuronx and torch_2 and sdk is not None and sdk < neuron_images.CPU_BACKEND_SDK:
        found.append(
            Finding(
                "spec.compile.image",
                f"{compile_image} is of Neuron {'.'.join(map(str, sdk))}, whose torch-neuronx cannot trace without a Neuron "
                "device (torch_neuronx.trace's cpu_backend came with Neuron 2.21), and the compile Job runs on a node without "
                "one, so it fails; use an image of Neuron 2.21 or later",
                "warning",
            )
        )
    compiled, served = neuron_images.lookup(compile_image), neuron_images.lookup(serving_image)
    if compiled and served and compile_image != serving_image:
        differ = [
            f"{name} {compiled.compile_key_versions[name]} against {version}"
            for name, version in served.compile_key_versions.items()
            if version and compiled.compile_key_versions[name] and compiled.compile_key_versions[name] != version
        ]
        if differ:
            # A NEFF is its compiler's: the plugin's cache key hashes these versions (its
            # Compilation Cache page), and NxD Inference and torch-neuronx load what that compiler made.
            found.append(
                Finding(
                    "spec.compile.image",
                    f"compiles with other Neuron versions than serving.image runs ({'; '.join(differ)}), so the serving pods "
                    "miss every compiled graph and stop at start; use the same image for both",
                    "warning",
                )
            )
    for field, versions in (("spec.compile.image", compiled), ("spec.serving.image", served)):
        if spec.serving.runtime != "vllm" or not fam.neuronx or not versions or not versions.vllm_serving:
            continue
        if fam.vllm == "vllm-neuron-plugin" and versions.vllm_serving != neuron_images.VLLM_NEURON_PLUGIN:
            # The operator runs the vLLM Neuron plugin on trn2 and trn3 (its CPU compile in the
            # Job, its compile cache in the pods), which AWS's NxD Inference images do not carry.
            found.append(
                Finding(
                    field,
                    f"{versions.image} carries vLLM {versions.vllm} on NxD Inference, and vLLM on {fam.name} runs on the vLLM "
                    "Neuron plugin (its CPU compile and compile cache), which that image lacks; use AWS's vLLM Neuron plugin "
                    f"image, for example {neuron_images.newest(neuron_images.VLLM_NEURON_PLUGIN)}",
                    "warning",
                )
            )
        elif fam.name not in versions.families:
            found.append(
                Finding(
                    field,
                    f"{versions.image} carries vLLM for {', '.join(versions.families)}, not {fam.name}; use AWS's vLLM image "
                    f"for {fam.name}",
                    "warning",
                )
            )
    return found


RULES: list[CrossFieldRule] = [
    VLLM_FAMILY,
    TENSORFLOW_COMPILE,
    COMPILE_STORE,
    FP32_CNN_BATCH,
]
CHECKS = (_check_runtime, _check_programs, _check_neuron_cc_options, _check_cnn_batch, _check_images)
