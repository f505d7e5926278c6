"""The Neuron compilers' flags for one NeuronCore group, which the planner puts in the plan
(compiler_args, and NEURON_CC_FLAGS of every serving process).

Sources (public documentation):
- neuron-cc flags and static weights: the Neuron batching tech note and performance-tuning
  application note
  (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-features/neuroncore-batching.html,
  https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/appnotes/perf/neuron-cc/performance-tuning.html);
- neuronx-cc flags: its CLI reference and the mixed-precision application note
  (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/compiler/neuronx-cc/api-reference-guide/neuron-compiler-cli-reference-guide.html,
  https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/appnotes/neuronx-cc/neuronx-cc-training-mixed-precision.html).
"""

from __future__ import annotations

from .api import InferentiaModelSpec
from .catalogue import Family
from .cores import bytes_per_weight


def static_weights_on(spec: InferentiaModelSpec, fam: Family, group_size: int) -> bool:
    """neuron-cc only. true and false mean what they say; auto is on exactly when the
    weights are known to fit the group's share."""
    if fam.neuronx:
        return False  # neuronx-cc has no --static-weights
    choice = spec.compile.static_weights
    if isinstance(choice, bool):
        return choice
    weights = spec.model.weights
    if weights is None:
        return False
    return weights * bytes_per_weight(spec.model.precision) <= group_size * fam.memory_per_core_bytes(1)


def neuron_cc_args(spec: InferentiaModelSpec, group_size: int, static_weights: bool) -> list[str]:
    """The Inf1 compiler's flags: pipeline cores, the CNN batching flags, static weights, mixed precision."""
    args = ["--neuroncore-pipeline-cores", str(group_size)]
    b = spec.compile.batch_size
    if spec.model.architecture == "cnn" and b > 1:
        # The batching tech note's CNN flags, with the state-buffer size (b + 6) * 10.
        args += ["--batching_en", "--rematerialization_en", "--spill_dis", "--sb_size", str((b + 6) * 10)]
        args += ["--enable-replication", "True"]
    if static_weights:
        args.append("--static-weights")
    # neuron-cc casts every FP32 operator to BF16 by default (--fast-math all); --fast-math
    # none keeps FP32, and --fp32-cast=matmult (the same as --fast-math fp32-cast-matmult)
    # casts only matrix multiplications. The cast touches FP32 operators only, so fp16 and
    # bf16 models keep their own types without a flag
    # (https://awsdocs-neuron.readthedocs-hosted.com/en/v2.33.0/archive/appnotes/neuron-cc/mixed-precision.html,
    # https://awsdocs-neuron.readthedocs-hosted.com/en/latest/compiler/neuron-cc/command-line-reference.html).
    if spec.model.precision == "fp32":
        args += ["--fast-math", "none"]
    elif spec.model.precision == "mixed":
        args.append("--fp32-cast=matmult")
    return args


# neuronx-cc casts fp32 matrix multiplications to bf16 unless told otherwise, so every
# precision is spelled out: fp32 keeps fp32, fp16 and bf16 cast everything to that type,
# mixed casts matrix multiplications only.
AUTO_CAST = {
    "fp32": ["--auto-cast", "none"],
    "fp16": ["--auto-cast", "all", "--auto-cast-type", "fp16"],
    "bf16": ["--auto-cast", "all", "--auto-cast-type", "bf16"],
    "mixed": ["--auto-cast", "matmult", "--auto-cast-type", "bf16"],
}


def neuronx_cc_args(spec: InferentiaModelSpec, fam: Family, lnc: int) -> list[str]:
    """The Neuron 2.x compiler's flags: target, precision, model type, and the LNC on families that have one."""
    args = ["--target", fam.name, *AUTO_CAST[spec.model.precision]]
    if spec.model.architecture == "transformer":
        args += ["--model-type", "transformer"]
    if len(fam.lnc_values) > 1:
        # Must match the runtime's NEURON_LOGICAL_NC_CONFIG: the runtime refuses a mismatch.
        args += ["--lnc", str(lnc)]
    return args


def compiler_args(spec: InferentiaModelSpec, fam: Family, lnc: int, group_size: int, static_weights: bool) -> list[str]:
    planned = neuronx_cc_args(spec, fam, lnc) if fam.neuronx else neuron_cc_args(spec, group_size, static_weights)
    return planned + list(spec.compile.extra_args or [])
