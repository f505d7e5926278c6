"""The batching front end: the bounds every process of a model with serving.batching reads, and,
where the plan puts a front end beside the processes, its container and its metrics."""

from __future__ import annotations

import json
from typing import Any

from inferentia_operator.core.pod.containers import BATCHER_RESOURCES, CONTAINER_SECURITY, own_server_probes
from inferentia_operator.core.pod.contribution import PodContribution
from inferentia_operator.core.pod.model import Model
from inferentia_operator.core.pod.ports import scraped_at
from inferentia_operator.core.serving.drain import DRAIN_SECONDS, pre_stop_sleep


def batching(model: Model) -> PodContribution:
    """serving.batching's bounds, for every process, and the plan's front end beside them."""
    bounds, front = model.spec.serving.batching, model.plan.front_end
    env = {}
    if bounds:
        env["INFERENTIA_MAX_BATCH_SIZE"] = str(bounds.max_batch_size)
        env["INFERENTIA_MAX_LATENCY_MS"] = str(bounds.max_latency_ms)
    if front is None:
        return PodContribution(env=env)
    return PodContribution(
        env=env,
        containers=(batcher_container(model),),
        # Where Prometheus finds the pod's request gauges: the batching front end's
        # inferentia_num_requests_waiting and _running on its one port.
        annotations=scraped_at(front.port, "batch"),
    )


def batcher_container(model: Model) -> dict[str, Any]:
    front, batching = model.plan.front_end, model.spec.serving.batching
    assert front is not None and batching is not None
    args = [
        "batch", "--port", str(front.port),
        "--processes", str(model.plan.groups), "--process-base-port", str(front.process_base_port),
        "--max-batch-size", str(front.max_batch_size), "--max-latency-ms", str(front.max_latency_ms),
    ]  # fmt: skip
    if model.plan.buckets:
        args += ["--buckets", json.dumps(model.plan.buckets)]
    return {
        "name": "batcher",
        "image": batching.image or model.operator_image,
        "args": args,
        "ports": [{"name": "batch", "containerPort": front.port, "protocol": "TCP"}],
        "resources": BATCHER_RESOURCES,
        # Ready only when every model process answers: the pod's readiness is the front end's.
        **own_server_probes("batch"),
        "securityContext": CONTAINER_SECURITY,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        # Serve through the drain; then SIGTERM: stop listening, answer what it holds, exit.
        "lifecycle": pre_stop_sleep(DRAIN_SECONDS),
    }
