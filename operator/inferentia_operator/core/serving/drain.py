"""How a serving pod stops: each container keeps serving while the pod leaves its Service's
endpoints, then stops gracefully, within the pod's grace period."""

from __future__ import annotations

import math
from typing import Any

from inferentia_operator.core.pod.model import Model
from inferentia_operator.core.pod.ports import batching_front_end

# A pod being deleted is taken out of its Service's endpoints at the same time as its
# containers are told to stop; the endpoints controller and every node's kube-proxy take a
# moment to stop sending it new connections. A preStop sleep keeps each container serving
# for that moment (the Kubernetes docs' "Pod termination" flow; the sleep action is GA
# since Kubernetes 1.34), and only then does SIGTERM start the graceful stop.
DRAIN_SECONDS = 5
# The longest request a process may hold when no batching budget bounds it.
UNBOUNDED_REQUEST_SECONDS = 30


def longest_request_seconds(model: Model) -> int:
    """With the batching front end, a request is answered within maxLatencyMs or refused."""
    front = model.plan.front_end
    return math.ceil(front.max_latency_ms / 1000) + 1 if front else UNBOUNDED_REQUEST_SECONDS


def termination_grace_seconds(model: Model) -> int:
    """The drain, the longest request, and ten seconds for the processes to exit."""
    return DRAIN_SECONDS + longest_request_seconds(model) + 10


def pre_stop_sleep(seconds: int) -> dict[str, Any]:
    return {"preStop": {"sleep": {"seconds": seconds}}}


def serving_pre_stop(model: Model) -> dict[str, Any]:
    """The serve container's drain."""
    # Behind the front end, the processes outlive its drain and the requests it holds;
    # alone, they drain as it would, then the launcher passes SIGTERM on to each.
    return pre_stop_sleep(DRAIN_SECONDS + (longest_request_seconds(model) if batching_front_end(model) else 0))
