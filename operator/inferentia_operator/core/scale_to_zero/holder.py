"""Scale to zero (autoscaling.minReplicas 0): the holder, and the Service it forwards through."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from inferentia_operator.core import api
from inferentia_operator.core.autoscaling import target_in_flight
from inferentia_operator.core.placement import pod_placement
from inferentia_operator.core.pod.containers import BATCHER_RESOURCES, CONTAINER_SECURITY, non_root_pod_security, own_server_probes
from inferentia_operator.core.pod.meta import HOLDER_SUFFIX, REPLICAS_SUFFIX, child_metadata, holder_selector, labels, traffic_selector
from inferentia_operator.core.pod.model import Model
from inferentia_operator.core.pod.ports import holder_scaler_port, named_service, scraped_at, service_ports


def holder_service(model: Model) -> dict[str, Any]:
    """The holder's external scaler API, for the ScaledObject's external-push trigger."""
    port = holder_scaler_port(model)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_metadata(model, model.name + HOLDER_SUFFIX, "holder"),
        "spec": {
            "selector": holder_selector(model),
            "ports": [{"name": "scaler", "port": port, "targetPort": "scaler", "protocol": "TCP"}],
        },
    }


def holder_network_policy(model: Model) -> dict[str, Any] | None:
    """Who may reach the holder's pods: anyone its serving ports (the model's clients, through
    its Service, and Prometheus), and only KEDA, by its namespace, the external scaler port, which
    tells whoever listens when another client's request is held. Where the cluster's network
    enforces NetworkPolicies (https://kubernetes.io/docs/concepts/services-networking/network-policies/);
    elsewhere the scaler's own bounds are what holds (batching/scaler.py). The node's own
    traffic, the kubelet's probes among it, is always allowed."""
    if not model.keda_namespace:
        return None
    keda = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": model.keda_namespace}}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": child_metadata(model, model.name + HOLDER_SUFFIX, "holder"),
        "spec": {
            "podSelector": {"matchLabels": holder_selector(model)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"ports": [{"port": p["port"], "protocol": "TCP"} for p in service_ports(model)]},
                {"from": [keda], "ports": [{"port": holder_scaler_port(model), "protocol": "TCP"}]},
            ],
        },
    }


def replicas_service(model: Model) -> dict[str, Any]:
    """The serving pods alone, whatever the model's Service points at: what the holder forwards to."""
    return named_service(model, model.name + REPLICAS_SUFFIX, traffic_selector(model))


def parked_holder(model: Model) -> dict[str, Any]:
    """The holder of a model that no longer scales to zero, at no replica. Whole: a server-side
    apply of replicas alone would remove the selector and template the operator applied before
    (fields its apply no longer names), which a Deployment cannot be without (422). Built from
    the model as it is now; at no replica, a changed template starts no pod."""
    spec = model.spec
    if spec.autoscaling is None or (spec.serving.batching is None and spec.autoscaling.target_in_flight is None):
        spec = spec.model_copy(update={"autoscaling": api.Autoscaling(min_replicas=0, max_replicas=1, target_in_flight=1)})
    body = holder_deployment(replace(model, spec=spec))
    body["spec"]["replicas"] = 0
    return body


def holder_deployment(model: Model) -> dict[str, Any]:
    """The holder of a model that scales to zero (batching/holder.py), on no Neuron device.
    It forwards to the replicas Service, which it finds by name (batching/holder.py,
    ``upstream_host``): no address of a live cluster is in it, so ``render`` prints it as applied."""
    a = model.spec.autoscaling
    assert a is not None
    ports = service_ports(model)
    listen = ",".join(str(p["port"]) for p in ports)
    container = {
        "name": "hold",
        "image": model.operator_image,
        "args": [
            "hold",
            "--upstream-service",
            model.name + REPLICAS_SUFFIX,
            "--ports",
            listen,
            "--hold-seconds",
            str(a.hold_seconds),
            "--max-held",
            str(a.max_held_requests),
            # KEDA's external scaler API: a held request reaches KEDA at once (issue 41).
            "--scaler-port",
            str(holder_scaler_port(model)),
            "--target",
            str(target_in_flight(model.spec)),
        ],  # fmt: skip
        # The Service's target port names, so that it reaches the holder as it reaches a replica.
        "ports": [
            *({"name": p["targetPort"], "containerPort": p["port"], "protocol": "TCP"} for p in ports),
            {"name": "scaler", "containerPort": holder_scaler_port(model), "protocol": "TCP"},
        ],
        "resources": BATCHER_RESOURCES,
        **own_server_probes(ports[0]["targetPort"]),
        "securityContext": CONTAINER_SECURITY,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": child_metadata(model, model.name + HOLDER_SUFFIX, "holder"),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": holder_selector(model)},
            "template": {
                "metadata": {
                    "labels": labels(model, "holder"),
                    # Prometheus reads the requests it holds: the model's ScaledObject sums them.
                    "annotations": scraped_at(ports[0]["port"], ports[0]["targetPort"]),
                },
                "spec": {
                    "automountServiceAccountToken": False,
                    # Held requests are answered, or end at the hold, before the holder exits.
                    "terminationGracePeriodSeconds": a.hold_seconds + 10,
                    # The operator's own image: non-root whatever the model's runAsRoot says.
                    "securityContext": non_root_pod_security(),
                    "containers": [container],
                    **pod_placement(a.holder_placement),
                },
            },
        },
    }
