"""A stand-in model process for the batching front end's tests and benchmark, following
the front end's contract: ``POST /`` with a JSON list of inputs, answered with a JSON list of
outputs; ``GET /healthz`` once loaded.

``--stand-in FIXED_MS,PER_ITEM_MS``: no model; a batch of n takes FIXED + PER_ITEM * n
milliseconds and each output is its input (with ``--floats``, its shape with every number a
float of full precision: the costliest answer a front end can be sent for an input). One batch
runs at a time, as on a NeuronCore Group. Real models are served by the operator's model server
(programs/neuron_serve.py).
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from .limits import MAX_DEPTH, BadInput, parse_input

Predict = Callable[[list[Any]], Awaitable[list[Any]]]


def stand_in(fixed_ms: float, per_item_ms: float, floats: bool = False) -> Predict:
    async def predict(inputs: list[Any]) -> list[Any]:
        await asyncio.sleep((fixed_ms + per_item_ms * len(inputs)) / 1000)
        return [_as_floats(i) for i in inputs] if floats else inputs

    return predict


def _as_floats(value: Any) -> Any:
    """``value``'s shape, each number a distinct float of 17 significant digits."""
    if isinstance(value, list):
        return [_as_floats(v) for v in value]
    return 0.12345678901234567 + value if isinstance(value, (int, float)) and not isinstance(value, bool) else value


async def _healthy(_request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


def app(predict: Predict) -> web.Application:
    lock = asyncio.Lock()

    async def batch(request: web.Request) -> web.Response:
        # Refused as the operator's model server refuses it (400): an input it cannot take.
        try:
            inputs = parse_input(await request.read(), MAX_DEPTH + 1)  # the list, then each input
        except BadInput as exc:
            return web.json_response({"error": str(exc)}, status=400)
        if not isinstance(inputs, list):
            return web.json_response({"error": "a JSON list of inputs is expected"}, status=400)
        async with lock:
            outputs = await predict(inputs)
        return web.json_response(outputs)

    application = web.Application(client_max_size=64 * 1024 * 1024)
    application.router.add_post("/", batch)
    application.router.add_get("/healthz", _healthy)
    return application


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8080")))
    # Every address of the pod by default: the Service reaches a process directly when no
    # front end runs.
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--stand-in", metavar="FIXED_MS,PER_ITEM_MS", required=True)
    parser.add_argument("--floats", action="store_true", help="answer each number of an input as a float of full precision")
    args = parser.parse_args(argv)
    fixed, per_item = (float(x) for x in args.stand_in.split(","))
    predict = stand_in(fixed, per_item, args.floats)
    web.run_app(app(predict), host=args.host, port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
