"""NeuronConfig and InferenceConfig, as NxD Inference defines them (models/config.py)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

CONFIG_FILE = "neuron_config.json"


class OnDeviceSamplingConfig:
    """Sampling on the device (NxD Inference's models/config.py; vllm-neuron's loader passes
    ``OnDeviceSamplingConfig(dynamic=True, deterministic=False)``)."""

    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)


class NeuronConfig:
    """Neuron-specific settings. The defaults are the library's for the settings vLLM passes."""

    def __init__(self, **kwargs: Any) -> None:
        self.tp_degree = int(kwargs.pop("tp_degree", 1))
        self.batch_size = int(kwargs.pop("batch_size", 1))
        self.ctx_batch_size = int(kwargs.pop("ctx_batch_size", self.batch_size))
        self.seq_len = int(kwargs.pop("seq_len", 128))
        self.max_context_length = int(kwargs.pop("max_context_length", self.seq_len))
        # Given, torch_dtype wins over the checkpoint's (load_pretrained_config reads this flag).
        self.overrides_torch_dtype = "torch_dtype" in kwargs or kwargs.pop("overrides_torch_dtype", False)
        self.torch_dtype = kwargs.pop("torch_dtype", "bfloat16")
        self.enable_bucketing = bool(kwargs.pop("enable_bucketing", False))
        self.is_continuous_batching = bool(kwargs.pop("is_continuous_batching", False))
        self.padding_side = kwargs.pop("padding_side", "right")
        self.quantized = bool(kwargs.pop("quantized", False))
        self.save_sharded_checkpoint = bool(kwargs.pop("save_sharded_checkpoint", False))
        self.skip_sharding = bool(kwargs.pop("skip_sharding", False))
        self.start_rank_id = int(kwargs.pop("start_rank_id", 0))
        self.local_ranks_size = int(kwargs.pop("local_ranks_size", self.tp_degree))
        self.logical_nc_config = int(kwargs.pop("logical_nc_config", os.environ.get("NEURON_LOGICAL_NC_CONFIG", 1)))
        self.skip_warmup = bool(kwargs.pop("skip_warmup", False))
        sampling = kwargs.pop("on_device_sampling_config", None)
        # Saved in neuron_config.json as its fields, as NxD Inference writes it.
        self.on_device_sampling_config = vars(sampling) if isinstance(sampling, OnDeviceSamplingConfig) else sampling
        # Every other documented setting is kept as given.
        for key, value in kwargs.items():
            setattr(self, key, value)
        if self.max_context_length > self.seq_len:
            raise ValueError(f"max_context_length ({self.max_context_length}) cannot exceed seq_len ({self.seq_len})")


class InferenceConfig:
    """A model's configuration: its Hugging Face settings (through load_config) and its NeuronConfig."""

    def __init__(self, neuron_config: NeuronConfig, fused_spec_config: Any = None, load_config: Callable | None = None,
                 metadata: dict | None = None, **kwargs: Any) -> None:  # fmt: skip
        self.neuron_config = neuron_config
        self.fused_spec_config = fused_spec_config
        if load_config is not None:
            load_config(self)
        self.metadata = metadata
        for key, value in kwargs.items():
            setattr(self, key, value)
        missing = [x for x in self.get_required_attributes() if not hasattr(self, x)]
        assert not missing, f"Config must define {missing}"

    def get_required_attributes(self) -> list[str]:
        return []

    @classmethod
    def get_neuron_config_cls(cls) -> type[NeuronConfig]:
        return NeuronConfig

    def to_json_string(self) -> str:
        return json.dumps({k: (vars(v) if isinstance(v, NeuronConfig) else v) for k, v in vars(self).items()}, indent=2, sort_keys=True)

    def save(self, model_path: str | os.PathLike) -> None:
        Path(model_path).mkdir(parents=True, exist_ok=True)
        (Path(model_path) / CONFIG_FILE).write_text(self.to_json_string() + "\n")

    @classmethod
    def load(cls, model_path: str | os.PathLike, **kwargs: Any) -> InferenceConfig:
        merged = json.loads((Path(model_path) / CONFIG_FILE).read_text()) | kwargs
        neuron = merged.pop("neuron_config")
        merged.pop("overrides_torch_dtype", None)
        return cls(cls.get_neuron_config_cls()(**neuron), **merged)
