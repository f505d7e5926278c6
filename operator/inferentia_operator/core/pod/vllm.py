"""The vLLM preset (spec.serving.runtime: vllm): which of AWS's two ways runs it on the
family, and the engine arguments the serving pods' flags and the compile step both give it."""

from __future__ import annotations

from typing import Any

from inferentia_operator.core import neuron_images
from inferentia_operator.core.cores import user_block_size, user_gpu_memory_utilization
from inferentia_operator.core.pod.dirs import MODEL_DIR, remote_model
from inferentia_operator.core.pod.model import Model, vllm_nxd, vllm_plugin

# The vLLM preset (spec.serving.runtime: vllm), on what AWS supports for the family
# (catalogue.Family.vllm). Its OpenAI-compatible server answers /health once the model is loaded.
VLLM_SERVER = ["python3", "-m", "vllm.entrypoints.openai.api_server"]
# - inf2 and trn1: vLLM on NxD Inference. VLLM_NEURON_FRAMEWORK selects it, and
#   NEURON_COMPILED_ARTIFACTS points it at a pre-compiled model, which it loads instead of
#   compiling at start
#   (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/libraries/nxd-inference/developer_guides/migrate-from-tnx-to-nxdi.html,
#   https://awsdocs-neuron.readthedocs-hosted.com/en/latest/libraries/nxd-inference/developer_guides/vllm-user-guide-v1.html).
#   The compile Job makes that model with the operator's program (nxdi_compile.py), through NxD
#   Inference's own API, for the family's target on an ordinary node.
VLLM_ENV = {"VLLM_NEURON_FRAMEWORK": "neuronx-distributed-inference"}
# - trn2 and trn3: the vLLM Neuron plugin, which "registers itself with vLLM via its entry
#   point" (no VLLM_NEURON_FRAMEWORK, no --device neuron) and compiles at warm-up, one graph per
#   bucket, into its local cache under $VLLM_CACHE_ROOT/neuron/compile_cache/<hash>/
#   (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/getting-started/migration-nxdi-to-vllm-neuron.html,
#   https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/design/compilation/compilation_cache.html).
#   The compile Job fills that cache on an ordinary node: CPU compilation for the family's
#   target (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/design/compilation/cpu_compilation.html).
VLLM_PLUGIN_COMPILE_ENV = {"VLLM_NEURON_CPU_COMPILE": "1"}
# With a compiled artefact, a cache miss must end the server, never start a compile in the
# serving pod: VLLM_NEURON_DISABLE_WARMUP_COMPILE=1 "treats a local cache miss as a fatal
# error" (the Compilation Cache page above).
VLLM_PRECOMPILED_ENV = {"VLLM_NEURON_DISABLE_WARMUP_COMPILE": "1"}


def vllm_engine_args(model: Model) -> dict[str, Any]:
    """vLLM's engine arguments, as the serving pods' flags and the plugin's compile step give
    them: the model, tensor parallel over the group's (logical) cores, the largest bucket's
    last dimension as the sequence length, and serving.batching.maxBatchSize as the sequences."""
    args: dict[str, Any] = {"model": model.spec.model.uri}
    if remote_model(model):
        # Fetched into the pod first (serving_fetches_model, compile_fetches_model), and served
        # under its URI, which clients name.
        args = {"model": MODEL_DIR, "served_model_name": model.spec.model.uri}
    if not model.plan.nodes:
        # Across nodes the degree is the override config's (multi_node_command), as vLLM's launcher gives it.
        args["tensor_parallel_size"] = model.plan.tensor_parallel_size
    if model.plan.buckets:
        args["max_model_len"] = max(b[-1] for b in model.plan.buckets)
    if model.spec.serving.batching:
        args["max_num_seqs"] = model.spec.serving.batching.max_batch_size
    if vllm_plugin(model):
        # The vLLM Neuron plugin: its KV cache blocks, which it compiles into every graph, so the
        # compile step and the server must agree; its features guide asks for both on Neuron
        # (cores.kv_cache says what the plan gives and why). The user's own --block-size and
        # --gpu-memory-utilization (serving.args) go to the compile step too: the first is the
        # cache's shape, the second the budget the plugin's CPU compile sizes it from and checks
        # against its minimum, which must be the budget the server has.
        if model.plan.kv_cache:
            args["block_size"] = model.plan.kv_cache.block_size
            args["num_gpu_blocks_override"] = model.plan.kv_cache.blocks
        elif (size := user_block_size(model.spec)) is not None:
            args["block_size"] = size
        if (utilization := user_gpu_memory_utilization(model.spec)) is not None:
            args["gpu_memory_utilization"] = utilization
        args |= speculation_args(model)
    if vllm_nxd(model):
        # vLLM on NxD Inference, as its guide's known issues ask: "Users are required to provide a
        # num_gpu_blocks_override arg, which should be at least ceil(max_model_len // block_size) *
        # max_num_seqs ... to avoid a potential OOB error"; without prefix caching vllm-neuron's
        # platform makes block_size max_model_len, so that is max_num_seqs
        # (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/libraries/nxd-inference/developer_guides/vllm-user-guide-v1.html;
        # vllm-project/vllm-neuron, vllm_neuron/platform.py). Prefix caching stays off: its KV
        # layout would have to be compiled in, and the guide's known issues say it "generates
        # incorrect outputs" at batch size 1. The compile program builds the same NeuronConfig
        # from these arguments (nxdi_compile.py).
        # Off whatever else is set: on, vllm-neuron's platform asserts "When prefix caching is
        # enabled, block_size must be set". vLLM's V0 worker asserts num_gpu_blocks ==
        # max_num_seqs + 1 (vllm/worker/neuron_worker.py, 0.9.2 to 0.10.1.1), so no override there.
        args["enable_prefix_caching"] = False
        # Across nodes the worker is V0's whatever the image (rules/nodes.py, NODES_IMAGE).
        image = neuron_images.lookup(model.spec.serving.image)
        v0 = bool(model.plan.nodes) or (image is not None and image.vllm_serving == neuron_images.VLLM_V0)
        if "max_num_seqs" in args and "max_model_len" in args and not v0:
            args["num_gpu_blocks_override"] = args["max_num_seqs"]
    return args


def speculation_args(model: Model) -> dict[str, Any]:
    """EAGLE3 speculative decoding (spec.serving.speculation), as the vLLM Neuron plugin documents it:
    vLLM's speculative_config with "method": "eagle3", the draft's "model" and
    "num_speculative_tokens" (the EAGLE3 tutorial for Llama 3.1,
    https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/tutorials/tutorial-eagle3-speculative-decoding-llama-3-1.html,
    and the design page's "speculative_config fields",
    https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/design/speculation/speculative_decoding_design.html).
    Async scheduling off: "Mutually exclusive with async scheduling. Setting --speculative-config
    disables async scheduling automatically with a startup warning" (the features guide,
    https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/guides/features-guide.html);
    said here, so that the engine served is the engine asked for, and the compile step's is the same.
    The same arguments go to the compile step: the plugin's warm-up compiles the draft's graphs and
    the target's verification graphs, which the serving pods must find in the artefact."""
    speculation = model.spec.serving.speculation
    if speculation is None:
        return {}
    config = {"method": "eagle3", "model": speculation.draft.uri, "num_speculative_tokens": speculation.num_speculative_tokens}
    return {"speculative_config": config, "async_scheduling": False}
