"""The model's doors: the ports its Services expose (the batching front end's, or each process's),
the holder's external scaler port, and which container ports Prometheus scrapes."""

from __future__ import annotations

from typing import Any

from inferentia_operator.core.pod.meta import HOLDER_SUFFIX, child_metadata
from inferentia_operator.core.pod.model import Model


def batching_front_end(model: Model) -> bool:
    """The plan says whether a batching front end runs beside the model processes."""
    return model.plan.front_end is not None


def process_base_port(model: Model) -> int:
    """Process i listens on this + i: the serving port, or the plan's when the batching
    front end takes the serving port."""
    return model.plan.front_end.process_base_port if model.plan.front_end else model.spec.serving.port


# Which container ports serve the pod's /metrics, by name: the batching front end's "batch"
# (the model processes behind it listen on serve-<i> too), the holder's first port, or with
# EVERY_PROCESS each vLLM process's serve-<i>.
METRICS_PORT_ANNOTATION = "inferentia.dev/metrics-port"
EVERY_PROCESS = "serve"
# What Prometheus keeps of a pod's per-port targets (kubernetes_sd's pod role makes one for
# each declared port): "<metrics-port annotation>;<container port name>" must match it, as the
# chart's PodMonitor and docs/autoscaling.md's scrape configuration relabel. RE2 has no
# back-reference, so the pairs are listed: the annotation's single names, and serve for all.
SCRAPED_PORTS = "batch;batch|serve-0;serve-0|serve;serve-[0-9]+"


def scrape_relabelings(meta: str = "__meta_kubernetes_pod_") -> list[dict[str, Any]]:
    """The relabelling that keeps the ports a pod's metrics-port annotation names, as Prometheus's
    relabel_configs (the local cluster's Prometheus and docs/autoscaling.md take it)."""
    return [
        {"source_labels": [f"{meta}annotation_prometheus_io_scrape"], "action": "keep", "regex": "true"},
        {
            "source_labels": [f"{meta}annotation_inferentia_dev_metrics_port", f"{meta}container_port_name"],
            "action": "keep",
            "regex": SCRAPED_PORTS,
        },
        {
            "source_labels": [f"{meta}annotation_prometheus_io_path"],
            "action": "replace",
            "target_label": "__metrics_path__",
            "regex": "(.+)",
        },
    ]


def scraped_at(port: int, port_name: str) -> dict[str, str]:
    """The annotations that say where Prometheus finds the pod's request gauges. The
    prometheus.io annotations, which Prometheus's example Kubernetes configuration relabels
    on, name one port, the first; the metrics-port annotation names them all (SCRAPED_PORTS)."""
    return {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(port),
        "prometheus.io/path": "/metrics",
        METRICS_PORT_ANNOTATION: port_name,
    }


def service_ports(model: Model) -> list[dict[str, Any]]:
    """The model's doors: the batching front end's port where it runs (its processes' ports are
    for it alone, on the pod's loopback), else each process's."""
    if batching_front_end(model):
        return [{"name": "batch", "port": model.spec.serving.port, "targetPort": "batch", "protocol": "TCP"}]
    base = process_base_port(model)
    return [{"name": f"serve-{i}", "port": base + i, "targetPort": f"serve-{i}", "protocol": "TCP"} for i in range(model.plan.groups)]


def named_service(model: Model, name: str, target: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_metadata(model, name, "serving"),
        "spec": {"selector": target, "ports": service_ports(model)},
    }


# The holder's port for KEDA's external scaler API (gRPC's customary port), or the first above it
# that none of the model's serving ports takes.
SCALER_PORT = 50051


def holder_scaler_port(model: Model) -> int:
    taken = {p["port"] for p in service_ports(model)}
    return next(port for port in range(SCALER_PORT, SCALER_PORT + len(taken) + 1) if port not in taken)


def holder_scaler_address(model: Model) -> str:
    """The holder Service's name in the cluster's DNS, from any namespace (``<service>.<namespace>.svc``
    resolves through the search path every pod gets, whatever the cluster domain)."""
    return f"{model.name}{HOLDER_SUFFIX}.{model.namespace}.svc:{holder_scaler_port(model)}"
