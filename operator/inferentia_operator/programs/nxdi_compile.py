"""The compile program inferentia-operator runs in the compile Job of a vLLM model on inf2 and trn1,
inside your vLLM Neuron image (AWS's vllm-inference-neuronx, which has NxD Inference).

vLLM on inf2 and trn1 runs on NxD Inference. Given ``NEURON_COMPILED_ARTIFACTS``, its loader
loads the compiled model there, and compiles only when that fails ("Loading pre-compiled models /
Serialization Support",
https://awsdocs-neuron.readthedocs-hosted.com/en/latest/libraries/nxd-inference/developer_guides/vllm-user-guide-v1.html).
This program makes that compiled model, on an ordinary node, with NxD Inference's own API:

- the model class NxD Inference registers for the checkpoint's ``model_type``
  (``neuronx_distributed_inference.utils.constants.MODEL_TYPES``, as vLLM's loader picks it);
- the NeuronConfig vLLM's loader in this image would build from the serving pods' engine
  arguments, setting for setting, since a compiled model is loaded as it is ("any differing model
  configurations passed in to the vllm API will not trigger re-compilation", the guide above):
  on vllm-neuron (vLLM's V1 engine) its ``_get_default_neuron_config``
  (vllm-project/vllm-neuron, vllm_neuron/worker/neuronx_distributed_model_loader.py), including
  the paged KV cache's ``pa_num_blocks`` and ``pa_block_size`` as its platform sets them; on
  vLLM's V0 Neuron worker the guide's "Feature Configuration" (``tp_degree`` from
  ``tensor_parallel_size``, ``batch_size`` from ``max_num_seqs``, ``seq_len`` and
  ``max_context_length`` from ``max_model_len``, ``ctx_batch_size=1``, bucketing, continuous
  batching, right padding). Which one is the image's installed packages' to say
  (``importlib.metadata``), as it is for the server. Plus ``save_sharded_checkpoint=True``, so
  that the weights are sharded once here into ``weights/`` and the serving pods load them
  without the checkpoint
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
  ``NEURON_COMPILED_ARTIFACTS`` at it;
- ``INFERENTIA_HUB_CACHE``, when the model is a Hugging Face id: the folder inside the compiled
  model where the checkpoint's configuration and tokenizer are kept, in the Hub cache's layout,
  without its weights (sharded into ``weights/`` already), so that the serving pods read them
  offline (``hub_snapshot.py``, shipped beside this program). The commit goes into the
  termination message.

It needs only the image's Python, NxD Inference and huggingface_hub: it is shipped in the plan
ConfigMap and never imports inferentia_operator. Exit status 0 once the model is compiled, 1
with a message on stderr otherwise.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import hub_snapshot  # type: ignore[import-not-found]  # beside this program in the plan ConfigMap, not a package module

# The shape must be stated: vLLM's defaults for these are its own and change between releases,
# and a compiled model that differs from the server's engine is served as compiled.
REQUIRED = ("model", "tensor_parallel_size", "max_model_len", "max_num_seqs")
V0, V1 = "vLLM's V0 Neuron worker", "vllm-neuron"


def installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def vllm_loader() -> str:
    """Whose loader serves this image's vLLM on NxD Inference: vllm-neuron below 0.21 (0.21 on is
    the Trn2/Trn3 plugin, which has no NxD Inference), else vLLM's own V0 worker up to 0.10.1.1
    (removed by vllm-project/vllm PR #21159)."""
    vllm, plugin = installed("vllm"), installed("vllm-neuron")
    release = [int(x) for x in re.findall(r"\d+", (plugin or vllm or "").split("+")[0])]
    if plugin is not None and release < [0, 21]:
        return V1
    if plugin is None and vllm is not None and release < [0, 10, 2]:
        return V0
    raise ValueError(f"this image has no vLLM on NxD Inference (vllm {vllm}, vllm-neuron {plugin}); use AWS's vLLM image for inf2 and trn1")


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


def checkpoint_dtype(source: Path) -> str:
    """vLLM's dtype "auto": the checkpoint's own half type, float32 taken down to the platform's first supported
    dtype, bfloat16 ("Downcast for float32 models", vllm/config/model.py, _resolve_auto_dtype, vLLM 0.11.0)."""
    config = json.loads((source / "config.json").read_text())
    dtype = config.get("dtype") or config.get("torch_dtype")  # transformers 4.56 and later write "dtype"
    return dtype if dtype in ("bfloat16", "float16") else "bfloat16"


def neuron_config(args: dict[str, Any], loader: str, dtype: str) -> dict[str, Any]:
    """What ``loader`` builds for the server's engine arguments (the module's docstring)."""
    seqs, length = int(args["max_num_seqs"]), int(args["max_model_len"])
    config: dict[str, Any] = {
        "tp_degree": int(args["tensor_parallel_size"]), "ctx_batch_size": 1, "batch_size": seqs, "max_context_length": length,
        "seq_len": length, "enable_bucketing": True, "quantized": False, "padding_side": "right", "save_sharded_checkpoint": True,
    }  # fmt: skip
    from neuronx_distributed_inference.models.config import OnDeviceSamplingConfig

    # Both loaders sample on the device and pass vLLM's dtype: vLLM 0.9.2's V0 loader
    # (vllm/model_executor/model_loader/neuronx_distributed.py, _get_default_neuron_config) and
    # AWS's fork of it set torch_dtype and OnDeviceSamplingConfig(dynamic=True, deterministic=False)
    # as vllm-neuron does; without them NxD Inference would take the checkpoint's dtype, and AWS's
    # fork samples only on the device.
    config |= {"torch_dtype": dtype, "on_device_sampling_config": OnDeviceSamplingConfig(dynamic=True, deterministic=False)}
    if loader == V0:
        return {**config, "is_continuous_batching": True}
    # vllm-neuron's platform: without prefix caching, block_size = max_model_len ("Neuron requires
    # block_size = max_model_len when blockwise KV cache is disabled"), and one block more than
    # num_gpu_blocks_override for the null block; its loader then takes pa_num_blocks from it.
    prefix = args.get("enable_prefix_caching") is not False
    block = int(args.get("block_size") or 16) if prefix else length
    override = args.get("num_gpu_blocks_override")
    return {
        **config, "is_continuous_batching": seqs > 1,
        "pa_num_blocks": int(override) + 1 if override is not None else (length // block) * seqs, "pa_block_size": block,
        "is_block_kv_layout": prefix, "is_prefix_caching": prefix,
    }  # fmt: skip


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
        settings = neuron_config(args, vllm_loader(), checkpoint_dtype(source))
        config = model_cls.get_config_cls()(model_cls.get_neuron_config_cls()(**settings), load_config=load_pretrained_config(str(source)))
        model_cls(str(source), config).compile(str(out))
    except Exception as exc:  # noqa: BLE001 - every failure ends the Job with its reason
        print(f"NxD Inference compile failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if not (out / "model.pt").is_file() or not (out / "neuron_config.json").is_file():
        print(f"NxD Inference compile failed: {out} holds no model.pt and neuron_config.json", file=sys.stderr)
        return 1
    target = os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE", "this instance")
    print(f"compiled {model_type} {args['model']} for {target}, tensor parallel {args['tensor_parallel_size']}, into {out}")
    hub = hub_snapshot.hub_cache()
    if hub is not None and hub_snapshot.is_repo_id(str(args["model"])):
        # The weights are in weights/, sharded: only the configuration and tokenizer are kept.
        if not hub_snapshot.keep_and_report(source, str(args["model"]), hub, weights=False, failed="NxD Inference compile failed"):
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
