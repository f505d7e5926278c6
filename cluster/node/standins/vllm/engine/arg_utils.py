"""Stand-in for vLLM's engine arguments (vllm.engine.arg_utils), as far as a multi-node worker
rank uses them: ``AsyncEngineArgs.add_cli_args(parser)`` adds the engine's flags to a parser and
returns it, ``AsyncEngineArgs.from_cli_args(args)`` builds the arguments from what it parsed
(vLLM's own signatures; examples/neuron/multi_node/worker.py calls both).

--override-neuron-config is the V0 Neuron worker's flag (vllm/engine/arg_utils.py up to 0.10.1.1);
from 0.10.2 it is gone, and an override is --additional-config's, so a parser built here on a V1
image refuses it as vLLM's does ("unrecognized arguments")."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, fields

from standin_versions import VLLM_V0, vllm_serving


@dataclass
class EngineArgs:
    model: str = "facebook/opt-125m"
    tensor_parallel_size: int = 1
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    served_model_name: list[str] | None = None
    block_size: int | None = None
    num_gpu_blocks_override: int | None = None
    enable_prefix_caching: bool | None = None
    # vLLM's flag for Neuron: a JSON object that overrides the model's NeuronConfig.
    override_neuron_config: dict | None = None
    additional_config: dict | None = None

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        parser.add_argument("--model", type=str, default=EngineArgs.model)
        parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=EngineArgs.tensor_parallel_size)
        parser.add_argument("--max-model-len", type=int, default=None)
        parser.add_argument("--max-num-seqs", type=int, default=None)
        parser.add_argument("--served-model-name", nargs="+", default=None)
        parser.add_argument("--block-size", type=int, choices=(1, 8, 16, 32, 64, 128), default=None)
        parser.add_argument("--num-gpu-blocks-override", type=int, default=None)
        parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
        if vllm_serving() == VLLM_V0:
            parser.add_argument("--override-neuron-config", type=json.loads, default=None)
        else:
            parser.add_argument("--additional-config", type=json.loads, default=None)
        return parser

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace):
        return cls(**{f.name: getattr(args, f.name, None) for f in fields(cls)})


@dataclass
class AsyncEngineArgs(EngineArgs):
    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser, async_args_only: bool = False) -> argparse.ArgumentParser:
        return parser if async_args_only else EngineArgs.add_cli_args(parser)
