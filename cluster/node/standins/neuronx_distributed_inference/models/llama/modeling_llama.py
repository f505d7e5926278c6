"""The Llama model classes, as NxD Inference names them (models/llama/modeling_llama.py)."""

from __future__ import annotations

from neuronx_distributed_inference.models.application_base import NeuronApplicationBase
from neuronx_distributed_inference.models.config import InferenceConfig


class LlamaInferenceConfig(InferenceConfig):
    def get_required_attributes(self) -> list[str]:
        return ["hidden_size", "num_hidden_layers", "num_key_value_heads"]


class NeuronLlamaForCausalLM(NeuronApplicationBase):
    @classmethod
    def get_config_cls(cls) -> type[InferenceConfig]:
        return LlamaInferenceConfig
