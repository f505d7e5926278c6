"""The operator's Prometheus metrics, served on /metrics (``inferentia-operator run --metrics-port``)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

RECONCILE_SECONDS = Histogram(
    "inferentia_operator_reconcile_duration_seconds",
    "Time one reconcile of a model took: observe, decide, write what differs, report.",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
RECONCILES = Counter(
    "inferentia_operator_reconciles_total",
    "Reconciles by result: noop (nothing written), changed (something written), failed (retried later).",
    ["result"],
)
API_REQUESTS = Counter(
    "inferentia_operator_api_requests_total",
    "Requests the operator's reconciles sent to the Kubernetes API server (watches are kopf's and not counted).",
    ["verb", "resource", "code"],
)
QUEUE_WAIT_SECONDS = Histogram(
    "inferentia_operator_queue_wait_seconds",
    "Time a model waited in the work queue before a worker took it, by lane: urgent (created or "
    "its spec changed) or normal (its children's or pods' status changed, or a resync).",
    ["lane"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
QUEUE_DEPTH = Gauge("inferentia_operator_queue_depth", "Models waiting for a reconcile.")
GC_PAUSE_SECONDS = Histogram(
    "inferentia_operator_gc_pause_seconds",
    "Time each of Python's garbage collections took, by generation (0, 1, 2): while one runs, "
    "no thread of the operator runs, so a full collection over a large heap delays every reconcile.",
    ["generation"],
    buckets=(0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
GC_FROZEN_OBJECTS = Gauge(
    "inferentia_operator_gc_frozen_objects",
    "Objects moved out of the garbage collector's full collections when the work queue last drained after a burst (gc.freeze).",
)
MODELS = Gauge("inferentia_operator_models", "InferentiaModels by the status of their Ready condition.", ["ready"])


def observe_gc_pause(generation: int, seconds: float) -> None:
    GC_PAUSE_SECONDS.labels(str(generation)).observe(seconds)


def serve(port: int, address: str = "0.0.0.0") -> None:
    """Serves /metrics from a daemon thread."""
    start_http_server(port, addr=address)
