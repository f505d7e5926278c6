"""MODEL_TYPES, as NxD Inference defines it (utils/constants.py): model type, then task, then
the model class. The stand-in has the Llama family only."""

from neuronx_distributed_inference.models.llama.modeling_llama import NeuronLlamaForCausalLM

MODEL_TYPES = {
    "llama": {"causal-lm": NeuronLlamaForCausalLM},
}
