"""Stand-in for vLLM's package: its offline engine ``LLM``, as far as compiling goes (neuron_standin.llm)."""

from neuron_standin import llm


class LLM:
    """vLLM's offline engine: ``LLM(model, tensor_parallel_size=1, max_model_len=None, max_num_seqs=None, ...)``."""

    def __init__(
        self, model: str, tensor_parallel_size: int = 1, max_model_len: int | None = None, max_num_seqs: int | None = None, **_: object
    ) -> None:
        self.compiled = llm(model=model, tensor_parallel_size=tensor_parallel_size, max_model_len=max_model_len, max_num_seqs=max_num_seqs)
