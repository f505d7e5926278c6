"""Stand-in for vLLM's AsyncLLMEngine (vllm.engine.async_llm_engine), as far as a multi-node
worker rank uses it: ``AsyncLLMEngine.from_engine_args(engine_args, usage_context=...)`` builds
the engine, whose ``engine.model_executor.driver_worker.execute_model()`` runs one step of the
model with the other ranks (vLLM's examples/neuron/multi_node/worker.py). Building it checks what
the Neuron runtime checks on this node and joins rank 0's root communicator
(neuron_collectives); a rank lost later makes execute_model raise."""

from __future__ import annotations

import socket

from neuron_collectives import RankWorker, multi_node_config
from neuron_standin import runtime_checks

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
        layout = multi_node_config(engine_args.override_neuron_config)
        if layout is None or layout["node_rank"] == 0:
            raise RuntimeError(
                "this stand-in builds a multi-node worker rank's engine only; rank 0 runs vllm.entrypoints.openai.api_server"
            )
        found = runtime_checks(None, layout["local_ranks_size"])
        return cls(_Engine(RankWorker(layout, {"host": socket.gethostname(), "cores": found["cores"]})))
