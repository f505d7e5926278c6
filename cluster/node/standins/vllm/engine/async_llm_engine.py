"""Stand-in for vLLM's AsyncLLMEngine (vllm.engine.async_llm_engine), as far as a multi-node
worker rank uses it: ``AsyncLLMEngine.from_engine_args(engine_args, usage_context=...)`` builds
the engine, whose ``engine.model_executor.driver_worker.execute_model()`` runs one step of the
model with the other ranks (vLLM's examples/neuron/multi_node/worker.py). Building it checks what
the Neuron runtime checks on this node and joins rank 0's root communicator
(neuron_collectives); a rank lost later makes execute_model raise.

That engine is V0's. From vLLM 0.11 (PR #25033, "Remove LLMEngine") AsyncLLMEngine is the V1
engine, which has no model_executor.driver_worker, and vllm-neuron's worker starts a world of one:
on such an image building one is refused with what the V1 engine lacks."""

from __future__ import annotations

import socket

from neuron_collectives import RankWorker, multi_node_config
from neuron_standin import runtime_checks
from standin_versions import VLLM_V0, installed, vllm_serving

from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.usage.usage_lib import UsageContext


class _DriverWorker:
    def __init__(self, rank: RankWorker) -> None:
        self.rank = rank

    def execute_model(self, execute_model_req=None):
        self.rank.run_step()
        return []


class _Executor:
    def __init__(self, rank: RankWorker) -> None:
        self.driver_worker = _DriverWorker(rank)


class _Engine:
    def __init__(self, rank: RankWorker) -> None:
        self.model_executor = _Executor(rank)


class AsyncLLMEngine:
    def __init__(self, engine: _Engine) -> None:
        self.engine = engine

    @classmethod
    def from_engine_args(
        cls,
        engine_args: AsyncEngineArgs,
        engine_config=None,
        start_engine_loop: bool = True,
        usage_context: UsageContext = UsageContext.ENGINE_CONTEXT,
        stat_loggers=None,
    ) -> AsyncLLMEngine:
        if vllm_serving() != VLLM_V0:
            raise AttributeError(
                f"vLLM {installed('vllm')}'s AsyncLLMEngine is the V1 engine: it has no engine.model_executor.driver_worker "
                "(V0's, removed in vLLM 0.11), and vllm-neuron serves one node"
            )
        layout = multi_node_config(engine_args.override_neuron_config)
        if layout is None or layout["node_rank"] == 0:
            raise RuntimeError(
                "this stand-in builds a multi-node worker rank's engine only; rank 0 runs vllm.entrypoints.openai.api_server"
            )
        found = runtime_checks(None, layout["local_ranks_size"])
        return cls(_Engine(RankWorker(layout, {"host": socket.gethostname(), "cores": found["cores"]})))
