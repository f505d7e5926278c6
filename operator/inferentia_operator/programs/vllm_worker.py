"""A worker rank of vLLM's multi-node serving on Neuron (NxD Inference): every rank but 0.

Rank 0 runs vLLM's API server; each other rank builds the same engine from the same engine
arguments (its own --override-neuron-config start_rank_id) and then runs the model whenever the
leader's engine does, its ranks joining the leader's collectives through the Neuron runtime's
root communicator (NEURON_RT_ROOT_COMM_ID). That is the shape of vLLM's own example,
vllm-project/vllm examples/neuron/multi_node/worker.py, through vLLM's public engine API:
AsyncEngineArgs.add_cli_args / from_cli_args and AsyncLLMEngine.from_engine_args.

Run by the operator's multi-node serving command (core/children.multi_node_command) with
NEURON_RANK_ID set; it imports nothing of the operator."""

from __future__ import annotations

import argparse
import os
import sys


def main() -> int:
    rank = os.environ.get("NEURON_RANK_ID", "")
    if not rank.isdigit() or int(rank) == 0:
        print(f"vllm_worker.py: NEURON_RANK_ID is {rank!r}; rank 0 serves the API, this program runs the other ranks", file=sys.stderr)
        return 2
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.engine.async_llm_engine import AsyncLLMEngine
    from vllm.usage.usage_lib import UsageContext

    args = AsyncEngineArgs.add_cli_args(argparse.ArgumentParser(prog="vllm_worker.py")).parse_args()
    engine = AsyncLLMEngine.from_engine_args(AsyncEngineArgs.from_cli_args(args), usage_context=UsageContext.API_SERVER)
    worker = engine.engine.model_executor.driver_worker
    while True:  # the leader's engine drives every step; this rank follows until its pod stops
        worker.execute_model()


if __name__ == "__main__":
    sys.exit(main())
