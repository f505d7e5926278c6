"""The operator's configuration as the decision reads it: built once, by cli.py, from the
command line (`run` and `render` take the same flags), never carried in what was observed."""

from __future__ import annotations

from dataclasses import dataclass

from .autoscaling import NO_PROMETHEUS, Prometheus
from .names import DEFAULT_EPP_IMAGE, DEFAULT_OPERATOR_IMAGE, DEVICE_PLUGIN
from .proof import NO_PROVER, Prover


@dataclass(frozen=True)
class Settings:
    # --operator-image: the operator's own image, which compile and serving pods run to fetch
    # and upload artefacts, for the batching front end, and for the scale-to-zero holder.
    operator_image: str = DEFAULT_OPERATOR_IMAGE
    # --prometheus-*: where ScaledObjects read in-flight requests; no address, no ScaledObject.
    prometheus: Prometheus = NO_PROMETHEUS
    # --allocation: for models whose spec.compute.allocation says nothing.
    allocation: str = DEVICE_PLUGIN
    # --scheduler-name: the scheduler of serving pods that take devices from the device plugin
    # (my-scheduler, beside which the Neuron scheduler extension runs on EKS); "" the default.
    scheduler_name: str = ""
    # --no-push-activation turns it off: the ScaledObject of a model that scales to zero also
    # connects to its holder's external scaler, which pushes a held request to KEDA at once.
    push_activation: bool = True
    # --keda-namespace: where KEDA runs; with push activation, each holder's NetworkPolicy lets
    # only that namespace reach its external scaler. "" no policy.
    keda_namespace: str = ""
    # --prometheus-namespace: where the Prometheus that scrapes the models' pods runs; a
    # disaggregated model's pools admit that namespace to their port. "" the model's proxy alone.
    prometheus_namespace: str = ""
    # --node-cache-url: the node-local artefact cache (the chart's nodeCache DaemonSet, behind a
    # Service that routes to the pod's own node); serving pods' fetch asks it first. "" none.
    node_cache_url: str = ""
    # --node-cache-namespace: where the node cache's pods run (the operator's own namespace in the
    # chart): serving pods prefer nodes whose cache pod is labelled as holding their artefact.
    node_cache_namespace: str = ""
    # --node-views: the chart's node plugin runs beside the node cache (nodeCache.views.enabled):
    # serving pods mount the cache's views of what they fetch and link to them, copying nothing.
    node_views: bool = False
    # --endpoint-picker-image: the Gateway API Inference Extension's endpoint picker, which the
    # models with spec.routing.inferencePool run; --endpoint-picker-role: the ClusterRole (the
    # chart's) that each picker's RoleBinding grants, the one role the operator may bind.
    endpoint_picker_image: str = DEFAULT_EPP_IMAGE
    endpoint_picker_role: str = "inferentia-operator-endpoint-picker"
    # The key that proves which compile records and Jobs the operator made (core/proof.py);
    # `run` adds it once it has read the key Secret.
    prover: Prover = NO_PROVER


DEFAULT_SETTINGS = Settings()
