"""Routing by queue (spec.routing.inferencePool): the model's InferencePool of the Gateway API
Inference Extension, and the endpoint picker it names. Pure, no API client.

A gateway that implements the Extension sends each request for the pool to its endpoint picker
over Envoy's ext_proc API, and the picker names the endpoint to take it, ranking the pool's
endpoints by what each reports in its own metrics (the Extension's model server protocol:
https://github.com/kubernetes-sigs/gateway-api-inference-extension/tree/main/docs/proposals/003-model-server-protocol),
vLLM's ``vllm:num_requests_waiting`` first. It routes OpenAI-style requests only
(rules/routing.py), so a pool is for vLLM models.

The shapes follow the Extension's v1.1.0 release: the InferencePool API
(``api/v1/inferencepool_types.go``) and its ``inferencepool`` Helm chart's endpoint picker
(``config/charts/inferencepool/templates/epp-deployment.yaml``), whose flags are the picker's
own (``cmd/epp/runner/runner.go``).
"""

from __future__ import annotations

import json
from typing import Any

from inferentia_operator.core import api
from inferentia_operator.core.autoscaling import VLLM_GAUGES
from inferentia_operator.core.names import COMPONENT_LABEL, INFERENCE_POOL_KIND, MODEL_LABEL
from inferentia_operator.core.objects import Obj
from inferentia_operator.core.pod.containers import CONTAINER_SECURITY, non_root_pod_security
from inferentia_operator.core.pod.meta import answering_selector, child_metadata, labels
from inferentia_operator.core.pod.model import Model
from inferentia_operator.core.pod.ports import process_base_port

INFERENCE_POOL_API_VERSION = "inference.networking.k8s.io/v1"
EPP_SUFFIX = "-epp"
EPP_COMPONENT = "endpoint-picker"
# The picker's ports (runserver.DefaultGrpcPort, DefaultGrpcHealthPort, DefaultMetricsPort).
EPP_GRPC_PORT = 9002
EPP_HEALTH_PORT = 9003
EPP_METRICS_PORT = 9090
# Its gRPC health service's name, as the Extension's chart probes it with one replica.
EPP_HEALTH_SERVICE = "inference-extension"
EPP_RESOURCES = {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}}


def picker_name(model: Model) -> str:
    return model.name + EPP_SUFFIX


def picker_selector(model: Model) -> dict[str, str]:
    return {MODEL_LABEL: model.name, COMPONENT_LABEL: EPP_COMPONENT}


def target_ports(model: Model) -> list[int]:
    """The pool's endpoints in a pod: each vLLM process's own port (the picker scrapes each at
    its own /metrics when a pool has more than one; its datastore, PodUpdateOrAddIfNotExist)."""
    base = process_base_port(model)
    return [base + i for i in range(model.plan.groups)]


# The picker's scheduling profile, as the Extension's chart configures it (default-plugins.yaml):
# the queue, the KV cache's use and the prefix cache, each read from vLLM's own metrics.
PICKER_SCORERS = ("queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer")
PICKER_CONFIG = json.dumps(
    {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [{"type": s} for s in PICKER_SCORERS],
        "schedulingProfiles": [{"name": "default", "plugins": [{"pluginRef": s} for s in PICKER_SCORERS]}],
    },
    separators=(",", ":"),
)


def inference_pool(model: Model) -> dict[str, Any]:
    options = model.spec.routing.inference_pool if model.spec.routing else None
    assert options is not None
    return {
        "apiVersion": INFERENCE_POOL_API_VERSION,
        "kind": INFERENCE_POOL_KIND,
        "metadata": child_metadata(model, model.name, "serving"),
        "spec": {
            "selector": {"matchLabels": answering_selector(model)},
            "targetPorts": [{"number": p} for p in target_ports(model)],
            "endpointPickerRef": {
                "kind": "Service",
                "name": picker_name(model),
                "port": {"number": EPP_GRPC_PORT},
                "failureMode": options.failure_mode,
            },  # fmt: skip
        },
    }


def picker_deployment(model: Model, image: str) -> dict[str, Any]:
    grpc_probe = {"grpc": {"port": EPP_HEALTH_PORT, "service": EPP_HEALTH_SERVICE}}
    container = {
        "name": "epp",
        "image": image,
        "args": [
            "--pool-name",
            model.name,
            "--pool-namespace",
            model.namespace,
            "--total-queued-requests-metric",
            VLLM_GAUGES[0],
            "--config-text",
            PICKER_CONFIG,
            # Its /metrics without the TokenReview and SubjectAccessReview rights that checking
            # callers would need cluster-wide; the Service does not expose that port.
            "--metrics-endpoint-auth=false",
            # Nor Go's profiles on that port (on by default, cmd/epp/runner/runner.go in v1.1.0):
            # any pod can reach a pod's address, and the block and mutex profiles record every event.
            "--enable-pprof=false",
            "--tracing=false",
        ],  # fmt: skip
        "env": [{"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}],
        "ports": [
            {"name": "grpc", "containerPort": EPP_GRPC_PORT, "protocol": "TCP"},
            {"name": "grpc-health", "containerPort": EPP_HEALTH_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": EPP_METRICS_PORT, "protocol": "TCP"},
        ],
        "livenessProbe": {**grpc_probe, "initialDelaySeconds": 5, "periodSeconds": 10},
        "readinessProbe": {**grpc_probe, "periodSeconds": 2},
        "resources": EPP_RESOURCES,
        "securityContext": CONTAINER_SECURITY,
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": child_metadata(model, picker_name(model), EPP_COMPONENT),
        "spec": {
            "replicas": 1,
            # One active picker, as the Extension's chart runs it: Recreate, so an old one never
            # outlives the new (its state is per replica).
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": picker_selector(model)},
            "template": {
                "metadata": {"labels": labels(model, EPP_COMPONENT)},
                "spec": {
                    "serviceAccountName": picker_name(model),
                    "securityContext": non_root_pod_security(),
                    "containers": [container],
                },
            },
        },
    }


def parked_picker(model: Model, image: str) -> dict[str, Any]:
    """The picker of a model whose routing was turned off, at no replica (the operator deletes
    no Deployment); it goes with the model. Whole, as scale_to_zero.holder.parked_holder says why."""
    body = picker_deployment(model, image)
    body["spec"]["replicas"] = 0
    return body


def picker_service(model: Model) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_metadata(model, picker_name(model), EPP_COMPONENT),
        "spec": {
            "selector": picker_selector(model),
            "ports": [{"name": "grpc-ext-proc", "port": EPP_GRPC_PORT, "targetPort": "grpc", "protocol": "TCP", "appProtocol": "http2"}],
        },
    }


def picker_service_account(model: Model) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": child_metadata(model, picker_name(model), EPP_COMPONENT)}


def picker_role_binding(model: Model, cluster_role: str) -> dict[str, Any]:
    """The picker's reads (pods and InferencePools in its namespace), granted by binding the
    ClusterRole the chart installs for it: the operator may bind that one role and no other."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": child_metadata(model, picker_name(model), EPP_COMPONENT),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
        "subjects": [{"kind": "ServiceAccount", "name": picker_name(model), "namespace": model.namespace}],
    }


def routing_child(kind: str, name: str, model: str) -> bool:
    """Whether the child (kind, name) of ``model`` is its pool or part of its endpoint picker."""
    return kind in (INFERENCE_POOL_KIND, "ServiceAccount", "RoleBinding") or (
        kind in ("Deployment", "Service") and name == model + EPP_SUFFIX
    )


def routing_condition(
    model: str, *, served: bool, conflict: str | None, refused: str | None, picker: dict[str, Any] | None, pool: str | None
) -> api.Condition:
    """The Routing condition of a model with spec.routing.inferencePool. It never holds back
    Ready: the model's Service serves whatever becomes of the pool."""
    meanwhile = "the model serves through its Service meanwhile"
    if not served:
        return api.Condition(
            type="Routing", status="False", reason="InferencePoolNotInstalled",
            message=f"this cluster does not serve the Gateway API Inference Extension's InferencePool ({INFERENCE_POOL_API_VERSION}); "
            f"install its CRDs (docs/install.md) and the operator writes the pool within a resync; {meanwhile}",
        )  # fmt: skip
    if conflict is not None:
        return api.Condition(type="Routing", status="False", reason="RoutingConflict", message=f"{conflict}; {meanwhile}")
    if refused is not None:
        return api.Condition(
            type="Routing", status="False", reason="RoutingRefused", message=f"the API server refused {refused}; {meanwhile}"
        )
    available = Obj(picker).status.get("availableReplicas", 0)
    if pool is None or picker is None:
        return api.Condition(
            type="Routing", status="Unknown", reason="Pending", message=f"InferencePool {model} and its endpoint picker are being written"
        )
    if isinstance(available, int) and available > 0:
        return api.Condition(
            type="Routing", status="True", reason="EndpointPickerAvailable",
            message=f"InferencePool {model} selects the serving pods; its endpoint picker {model + EPP_SUFFIX} routes each request by queue",
        )  # fmt: skip
    return api.Condition(
        type="Routing", status="False", reason="EndpointPickerUnavailable",
        message=f"endpoint picker {model + EPP_SUFFIX} has no available replica; a gateway routing by InferencePool {model} "
        f"cannot pick an endpoint ({meanwhile})",
    )  # fmt: skip
