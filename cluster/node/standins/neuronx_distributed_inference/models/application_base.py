"""NeuronApplicationBase, as NxD Inference defines it (models/application_base.py): the model
classes' compile and load."""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path
from typing import Any

import standin_safetensors

from .config import InferenceConfig, NeuronConfig

COMPILED_MODEL_FILE_NAME = "model.pt"
# The checkpoint files NxD Inference reads ("Checkpoint support", the NxD Inference Features
# Configuration Guide).
CHECKPOINTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
# What each Neuron device's instance family is called as a compile target (neuronx-cc --target).
TARGETS = ("inf2", "trn1", "trn1n", "trn2", "trn3")


def platform_target() -> str:
    """The target to compile for: NEURON_PLATFORM_TARGET_OVERRIDE, else the node's devices'
    (the stand-in device plugin says which in NEURON_STANDIN_PLATFORM)."""
    target = os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE")
    if not target:
        if not glob.glob("/dev/neuron[0-9]*"):
            raise RuntimeError(
                "Unable to determine the platform target: no Neuron device is present. To compile on CPU, set "
                f"NEURON_PLATFORM_TARGET_OVERRIDE to one of {', '.join(TARGETS)}"
            )
        target = os.environ.get("NEURON_STANDIN_PLATFORM", "trn1")
    if target not in TARGETS:
        raise ValueError(f"NEURON_PLATFORM_TARGET_OVERRIDE={target!r} is not a target; valid values are {', '.join(TARGETS)}")
    return target


class NeuronApplicationBase:
    _model_cls: Any = None

    def __init__(self, model_path: str, config: InferenceConfig | None = None, neuron_config: NeuronConfig | None = None) -> None:
        if config is None:
            config = self.get_config_cls().load(model_path)
        if neuron_config is not None:
            config.neuron_config = neuron_config
        self.config = config
        self.neuron_config = config.neuron_config
        self.model_path = str(model_path)
        self.is_compiled = (Path(model_path) / COMPILED_MODEL_FILE_NAME).is_file()
        self.is_loaded_to_neuron = False
        self.traced_model: dict | None = None

    @classmethod
    def get_config_cls(cls) -> type[InferenceConfig]:
        raise NotImplementedError

    @classmethod
    def get_neuron_config_cls(cls) -> type[NeuronConfig]:
        return NeuronConfig

    def _checkpoint(self) -> Path:
        where = Path(getattr(self.config, "_name_or_path", "") or self.model_path)
        if not where.is_dir():
            where = Path(self.model_path)
        for name in CHECKPOINTS:
            if (where / name).is_file():
                return where / name
        raise FileNotFoundError(f"Can not find model.safetensors or pytorch_model.bin in {where}")

    def compile(self, compiled_model_path: str, debug: bool = False, pre_shard_weights_hook: Any = None, dry_run: bool = False) -> None:
        """Compiles this model and saves it to the given path."""
        target = platform_target()
        out = Path(compiled_model_path)
        checkpoint = self._checkpoint()
        tensors = standin_safetensors.header(checkpoint) if checkpoint.suffix == ".safetensors" else {}
        self.config.save(out)
        if dry_run:
            return
        n = self.neuron_config
        traced = {
            "target": target, "tp_degree": n.tp_degree, "batch_size": n.batch_size, "seq_len": n.seq_len,
            "logical_nc_config": n.logical_nc_config, "compiler": "neuronx-cc", "model_type": getattr(self.config, "model_type", None),
        }  # fmt: skip
        (out / COMPILED_MODEL_FILE_NAME).write_text(json.dumps(traced, sort_keys=True))
        if n.save_sharded_checkpoint and not n.skip_sharding:
            (out / "weights").mkdir(exist_ok=True)
            for rank in range(n.tp_degree):
                shard = {name: [[0.0] * max(1, t["shape"][-1] // n.tp_degree if t["shape"] else 1)] for name, t in tensors.items()}
                standin_safetensors.write(out / "weights" / f"tp{rank}_sharded_checkpoint.safetensors", shard, {"rank": str(rank)})
        self.is_compiled = True

    def load(self, compiled_model_path: str, start_rank_id: int | None = None, local_ranks_size: int | None = None,
             skip_warmup: bool = False) -> None:  # fmt: skip
        """Loads the compiled model and its weights: presharded from the compiled path, or sharded
        from the checkpoint now."""
        path = Path(compiled_model_path)
        traced_file = path / COMPILED_MODEL_FILE_NAME
        if not traced_file.is_file():
            raise FileNotFoundError(f"[Errno 2] No such file or directory: '{traced_file}'")
        traced = json.loads(traced_file.read_text())
        target = platform_target()
        if traced["target"] != target and {traced["target"], target} != {"inf2", "trn1"}:
            # inf2 and trn1 share NeuronCore-v2; any other pair cannot run each other's NEFFs.
            raise ValueError(f"the compiled model targets {traced['target']}, this instance is {target}")
        n = self.neuron_config
        first = n.start_rank_id if start_rank_id is None else start_rank_id
        ranks = n.local_ranks_size if local_ranks_size is None else local_ranks_size
        if n.save_sharded_checkpoint:
            for rank in range(first, first + ranks):
                shard = path / "weights" / f"tp{rank}_sharded_checkpoint.safetensors"
                if not shard.is_file():
                    raise FileNotFoundError(f"[Errno 2] No such file or directory: '{shard}'")
                standin_safetensors.header(shard)
        else:
            self._checkpoint()  # sharded on load, from the checkpoint the compile read
        self.traced_model = traced
        self.is_loaded_to_neuron = True
