"""The compile program inferentia-operator runs in the compile Job of a vLLM model on inf2 and trn1,
inside your vLLM Neuron image (AWS's vllm-inference-neuronx, which has NxD Inference).

vLLM on inf2 and trn1 runs on NxD Inference. Given ``NEURON_COMPILED_ARTIFACTS``, its loader
loads the compiled model there, and compiles only when that fails ("Loading pre-compiled models /
Serialization Support",
https://awsdocs-neuron.readthedocs-hosted.com/en/latest/libraries/nxd-inference/developer_guides/vllm-user-guide-v1.html).
This program makes that compiled model, on an ordinary node, with NxD Inference's own API:

- the model class NxD Inference registers for the checkpoint's ``model_type``
  (``neuronx_distributed_inference.utils.constants.MODEL_TYPES``, as vLLM's loader picks it);
- the NeuronConfig vLLM derives from its engine arguments (the same guide, "Feature
  Configuration": ``tp_degree`` from ``tensor_parallel_size``, ``batch_size`` from
  ``max_num_seqs``, ``seq_len`` and ``max_context_length`` from ``max_model_len``,
  ``ctx_batch_size=1``, bucketing, continuous batching, right padding), plus
  ``save_sharded_checkpoint=True``, so that the weights are sharded once here into
  ``weights/`` and the serving pods load them without the checkpoint
  (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/libraries/nxd-inference/developer_guides/weights-sharding-guide.html);
- ``load_pretrained_config`` on the checkpoint, then the application's ``compile(path)``
  (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/libraries/nxd-inference/developer_guides/onboarding-models.html).

The operator runs it with:

- ``NEURON_PLATFORM_TARGET_OVERRIDE`` (the family): the Job has no Neuron device to detect the
  target from ("CPU Compilation",
  https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/design/compilation/cpu_compilation.html);
- ``INFERENTIA_VLLM_ENGINE_ARGS``: the serving pods' engine arguments, as JSON;
- ``INFERENTIA_MODEL_PATH``: the checkpoint the Job fetched from a store, when it did;
  otherwise the engine's model is a local path or a Hugging Face id, downloaded first with
  ``huggingface_hub.snapshot_download`` (``HF_TOKEN`` from your serving.env for a gated model);
- ``INFERENTIA_COMPILED_MODEL_DIR``: where the compiled model goes; the operator's upload step
  then uploads it, completion marker last, and the serving pods fetch it and point
  ``NEURON_COMPILED_ARTIFACTS`` at it.

It needs only the image's Python, NxD Inference and huggingface_hub: it is shipped in the plan
ConfigMap and never imports inferentia_operator. Exit status 0 once the model is compiled, 1
with a message on stderr otherwise.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

# vLLM's own values for the settings it does not take from its engine arguments.
VLLM_NEURON_CONFIG = {
    "ctx_batch_size": 1,
    "enable_bucketing": True,
    "is_continuous_batching": True,
    "quantized": False,
    "padding_side": "right",
}
# The shape must be stated: vLLM's defaults for these are its own and change between releases,
# and a compiled model that differs from the server's engine is served as compiled.
REQUIRED = ("model", "tensor_parallel_size", "max_model_len", "max_num_seqs")


def engine_args() -> dict[str, Any]:
    args = json.loads(os.environ["INFERENTIA_VLLM_ENGINE_ARGS"])
    if not isinstance(args, dict):
        raise ValueError(f"INFERENTIA_VLLM_ENGINE_ARGS is not an object: {args!r}")
    missing = [k for k in REQUIRED if not args.get(k)]
    if missing:
        raise ValueError(f"the engine arguments lack {', '.join(missing)}: the compiled shape must be the server's")
    return args


def checkpoint(args: dict[str, Any]) -> Path:
    """The local checkpoint: the fetched copy, a path, or a Hugging Face id downloaded now."""
    fetched = os.environ.get("INFERENTIA_MODEL_PATH")
    if fetched and Path(fetched).is_dir():
        return Path(fetched)
    model = str(args["model"]).removeprefix("file://")
    if Path(model).is_dir():
        return Path(model)
    from huggingface_hub import snapshot_download  # the image's Hub client; HF_TOKEN from the environment

    return Path(snapshot_download(repo_id=model))


def neuron_config(args: dict[str, Any]) -> dict[str, Any]:
    return {
        **VLLM_NEURON_CONFIG,
        "tp_degree": int(args["tensor_parallel_size"]),
        "batch_size": int(args["max_num_seqs"]),
        "max_context_length": int(args["max_model_len"]),
        "seq_len": int(args["max_model_len"]),
        "save_sharded_checkpoint": True,
    }


def main() -> int:
    try:
        args = engine_args()
        out = Path(os.environ["INFERENTIA_COMPILED_MODEL_DIR"])
        source = checkpoint(args)
        model_type = json.loads((source / "config.json").read_text()).get("model_type")
        from neuronx_distributed_inference.utils.constants import MODEL_TYPES
        from neuronx_distributed_inference.utils.hf_adapter import load_pretrained_config

        tasks = MODEL_TYPES.get(model_type) or {}
        if "causal-lm" not in tasks:
            known = ", ".join(sorted(t for t, v in MODEL_TYPES.items() if "causal-lm" in v))
            raise ValueError(f"NxD Inference has no causal-lm model for model_type {model_type!r}; it has {known}")
        model_cls = tasks["causal-lm"]
        config = model_cls.get_config_cls()(
            model_cls.get_neuron_config_cls()(**neuron_config(args)), load_config=load_pretrained_config(str(source))
        )
        model_cls(str(source), config).compile(str(out))
    except Exception as exc:  # noqa: BLE001 - every failure ends the Job with its reason
        print(f"NxD Inference compile failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if not (out / "model.pt").is_file() or not (out / "neuron_config.json").is_file():
        print(f"NxD Inference compile failed: {out} holds no model.pt and neuron_config.json", file=sys.stderr)
        return 1
    target = os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE", "this instance")
    print(f"compiled {model_type} {args['model']} for {target}, tensor parallel {args['tensor_parallel_size']}, into {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
