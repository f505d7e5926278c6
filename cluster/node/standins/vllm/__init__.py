"""Stand-in for vLLM's package: its offline engine ``LLM``, as far as compiling goes (neuron_standin.llm).

An image without vLLM has no ``vllm`` to import: the stand-in's files are in every stand-in
image, and the image's installed vllm distribution (importlib.metadata) says whether vLLM is there."""

from standin_versions import installed

if installed("vllm") is None:
    raise ModuleNotFoundError("No module named 'vllm'", name="vllm")

from neuron_standin import PLUGIN_GPU_MEMORY_UTILIZATION, llm

__version__ = installed("vllm")


class LLM:
    """vLLM's offline engine: ``LLM(model, tensor_parallel_size=1, max_model_len=None, max_num_seqs=None, block_size=None,
    num_gpu_blocks_override=None, gpu_memory_utilization=0.9, speculative_config=None, async_scheduling=None, ...)``,
    0.9 as the plugin's budget assumes (neuron_standin.PLUGIN_GPU_MEMORY_UTILIZATION)."""

    def __init__(
        self,
        model: str,
        tensor_parallel_size: int = 1,
        max_model_len: int | None = None,
        max_num_seqs: int | None = None,
        block_size: int | None = None,
        num_gpu_blocks_override: int | None = None,
        gpu_memory_utilization: float = PLUGIN_GPU_MEMORY_UTILIZATION,
        speculative_config: dict | None = None,
        async_scheduling: bool | None = None,
        **_: object,
    ) -> None:
        self.compiled = llm(
            model=model, tensor_parallel_size=tensor_parallel_size, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
            block_size=block_size, num_gpu_blocks_override=num_gpu_blocks_override, gpu_memory_utilization=gpu_memory_utilization,
            speculative_config=speculative_config, async_scheduling=async_scheduling,
        )  # fmt: skip
