"""Prefill and decode pools (spec.disaggregation): a Deployment and a Service per pool, and the
proxy, the model's own Deployment, which the model's Service points at.

Each pool replica is one vLLM server as AWS's tutorial starts it ("Tutorial: Configure
disaggregated inference with 1P1D and xPyD",
https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/tutorials/tutorial-di-1p1d-xpyd.html,
Steps 1 and 2): the serving pod of any vLLM model on the pool's chips (pod/pools.py), with the
pool's --tensor-parallel-size and --data-parallel-size, and --kv-transfer-config naming the
connector and the pool's kv_role. NixlConnector is the plugin's for standard tensor-parallel
models ("Neuron DI uses the upstream NixlConnector for standard TP topologies"; NeuronNixlConnector
is for DCP and sliding-window models such as GPT-OSS: the DI design page,
https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/design/vllm/disaggregated-inference.html).

How the proxy finds the servers: through one ClusterIP Service per pool, which it is given as the
toy proxy's --prefiller-host and --decoder-host. The proxy opens a connection per request
(programs/pd_proxy.py), and kube-proxy spreads connections over the pool's ready pods, so a pool
scales, and its pods come and go, without the proxy being told or restarted; the tutorial's way,
a host list per pod, would roll the proxy at every change of a pool. The decode server reaches
the prefill server that made a request's KV cache directly, at the address that server's
kv_transfer_params name: its side channel on its pod's IP.

EFA: the tutorial moves KV over NIXL's LIBFABRIC backend, EFA between instances ("Read-mode KV
transfer between instances rides NIXL over LIBFABRIC, which requires EFA", Step 5). Each pool's
pods request their chips' share of their instance's EFA devices from AWS's EFA device plugin
(vpc.amazonaws.com/efa), and a pool is held to the instance types whose EFA count the catalogue
has (spec.disaggregation.efa; planner.plan_pool_efa, catalogue.efa_share, which says why a share).

One network part: the tutorial places its instances "in the same subnet and placement group so
RDMA traffic stays on the EFA fabric" (Step 5), which is the node group's to do; here each pool's
pods prefer nodes that share EKS's network topology labels with the model's other pool pods
(NETWORK_LAYERS), so that a decode server reads KV over the fewest hops.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from inferentia_operator.core.names import PLAN_HASH_ANNOTATION, POOL_LABEL, TRAFFIC_LABEL, TRAFFIC_ON
from inferentia_operator.core.placement import pod_placement
from inferentia_operator.core.pod.containers import BATCHER_RESOURCES, CONTAINER_SECURITY, non_root_pod_security
from inferentia_operator.core.pod.meta import child_metadata, labels, proxy_selector, selector
from inferentia_operator.core.pod.model import Model, plan_configmap_name
from inferentia_operator.core.pod.pools import KV_ROLES, ROLES, Role, pool_name
from inferentia_operator.core.pod.ports import named_service, process_base_port, service_ports
from inferentia_operator.core.rules.disaggregation import SIDE_CHANNEL_PORT
from inferentia_operator.core.serving.deployment import serving_deployment
from inferentia_operator.core.serving.service import plan_configmap

# EKS labels each node with its place in the AWS network, layer 1 the top and layer 3 the bottom
# for every Neuron type that has one: nodes that share topology.k8s.aws/network-node-layer-3 are
# "physically closest to each other" ("Place distributed AI/ML workloads with network topology
# labels", https://docs.aws.amazon.com/eks/latest/userguide/ml-workload-topology.html; trn1,
# trn2.48xlarge and trn2u.48xlarge return 3 network nodes, EC2's "Prerequisites for Amazon EC2
# topology", https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-instance-topology-prerequisites.html).
# Preferred, not required: a node without the labels (a type EC2 gives no topology, trn3 among
# them on that page; a cluster off EKS) would otherwise take no pool pod, and a required term
# would hold every pod to the first one's part however full it is. Layer 2 weighs less: the next
# fewest hops when layer 3's part is full. Both below the spread of the model's pods over nodes
# (weight 100, pod/affinity.py), so pods still take a node each where they can.
NETWORK_LAYERS = (("topology.k8s.aws/network-node-layer-3", 50), ("topology.k8s.aws/network-node-layer-2", 25))
# NIXL's side channel (SIDE_CHANNEL_PORT, rules/disaggregation.py, which keeps serving.port off
# it). One server a pod, so every pod may use the same port; the tutorial moves it only for two
# servers on one host.
# As the tutorial writes it: the buffer device and the LIBFABRIC backend (Steps 1 and 2).
KV_TRANSFER = {"kv_buffer_device": "cuda", "kv_connector_extra_config": {"backends": ["LIBFABRIC"]}}
KV_CONNECTOR = "NixlConnector"
PROXY_PROGRAM = ["python3", "-m", "inferentia_operator.programs.pd_proxy"]
# The longest one request may take through the proxy: its default deadline (programs/pd_proxy.py).
PROXY_DEADLINE_SECONDS = 300


def pool_selector(model: Model, role: Role) -> dict[str, str]:
    return {**selector(model), POOL_LABEL: role}


def kv_transfer_config(role: Role) -> str:
    return json.dumps({"kv_connector": KV_CONNECTOR, "kv_role": KV_ROLES[role], **KV_TRANSFER})


def _pool_flags(model: Model, role: Role, args: list[str]) -> list[str]:
    """The serving args with the pool's parallelism and its role: vLLM's --tensor-parallel-size
    takes the pool's (the plan gave the replica's cores), then --data-parallel-size and
    --kv-transfer-config, before serving.args, which may still set any other flag."""
    assert model.plan.disaggregation is not None
    pool = getattr(model.plan.disaggregation, role)
    at = args.index("--tensor-parallel-size") + 1
    extra = ["--data-parallel-size", str(pool.data_parallel_size)] if pool.data_parallel_size > 1 else []
    return [*args[:at], str(pool.tensor_parallel_size), *extra, "--kv-transfer-config", kv_transfer_config(role), *args[at + 1 :]]


def _one_network_part(model: Model) -> list[dict[str, Any]]:
    """Preferences for nodes that share each of NETWORK_LAYERS with the model's pool pods, both
    pools' (selector: the model's serving pods, which with pools are theirs alone)."""
    return [
        {"weight": weight, "podAffinityTerm": {"topologyKey": key, "labelSelector": {"matchLabels": selector(model)}}}
        for key, weight in NETWORK_LAYERS
    ]


def pool_deployment(model: Model, role: Role, compiled_model: Model | None = None, replicas: int | None = None) -> dict[str, Any]:
    """The pool's Deployment: its servers, selected apart from the other pool's, carrying the
    model's plan hash (the plan holds both pools, so a change of either rolls the one it changes
    and status reads every Deployment against one plan). ``replicas``: what the pool's
    autoscaling leaves it (scaling/part.py), else the pool's replicas. A replica scaled away
    drains as the serving Deployment's do (serving/drain.py: preStop and grace)."""
    pool = compiled_model or model.pools[ROLES.index(role)]
    body = serving_deployment(pool, pool.spec.replicas if replicas is None else replicas)
    body["metadata"] = child_metadata(model, pool_name(model, role), "serving")
    spec, template = body["spec"], body["spec"]["template"]
    spec["selector"] = {"matchLabels": pool_selector(model, role)}
    template["metadata"]["labels"][POOL_LABEL] = role
    template["metadata"]["annotations"][PLAN_HASH_ANNOTATION] = model.plan_hash
    affinity = template["spec"].setdefault("affinity", {}).setdefault("podAffinity", {})
    affinity.setdefault("preferredDuringSchedulingIgnoredDuringExecution", []).extend(_one_network_part(model))
    container = template["spec"]["containers"][0]
    container["args"] = _pool_flags(model, role, container["args"])
    # The side channel's address is the one its kv_transfer_params name to the decode servers:
    # the pod's own IP (the tutorial's 0.0.0.0 is for servers on hosts that reach one another as
    # themselves). FI_EFA_ENABLE_SHM_TRANSFER=0: the tutorial's "required for single-node DI",
    # and two pools' pods may share a node.
    container["env"] = [
        *container["env"],
        {"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": str(SIDE_CHANNEL_PORT)},
        {"name": "FI_EFA_ENABLE_SHM_TRANSFER", "value": "0"},
    ]
    container["ports"] = [*container["ports"], {"name": "nixl", "containerPort": SIDE_CHANNEL_PORT, "protocol": "TCP"}]
    return body


def pool_service(model: Model, role: Role) -> dict[str, Any]:
    """What the proxy sends a pool's requests to: its ready servers, on the serving port (the
    model's one process a replica, rules/disaggregation.py, and no batching front end)."""
    return named_service(model, pool_name(model, role), {**pool_selector(model, role), TRAFFIC_LABEL: TRAFFIC_ON})


def pools_policy_name(model: Model) -> str:
    return model.name + "-pools"


def pools_network_policy(model: Model) -> dict[str, Any]:
    """Who may reach the pools' servers, where the cluster enforces NetworkPolicies
    (https://kubernetes.io/docs/concepts/services-networking/network-policies/): their serving
    port the model's proxy alone (and the namespace of the Prometheus that scrapes them, the
    operator's --prometheus-namespace), and the model's decode pods every port: NIXL's side
    channel (SIDE_CHANNEL_PORT) and, where libfabric moves the KV cache over TCP rather than EFA
    (no EFA device requested, spec.disaggregation.efa), its data connections, on ports it picks.

    Why closed: a client that reached a decode server directly could send it kv_transfer_params
    naming any remote_host and remote_port, and the server would connect there to read a KV
    cache (NixlConnector's handshake; the proxy drops a client's kv_transfer_params,
    programs/pd_proxy.py), and would skip the proxy's limits. The node's own traffic, the
    kubelet's probes among it, is always allowed; policies add up, so a namespace's own can
    admit more."""
    port = [{"port": p["port"], "protocol": "TCP"} for p in service_ports(model)]
    serving = [{"podSelector": {"matchLabels": proxy_selector(model)}}]
    if model.prometheus_namespace:
        serving.append({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": model.prometheus_namespace}}})
    decode = [{"podSelector": {"matchLabels": pool_selector(model, "decode")}}]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": child_metadata(model, pools_policy_name(model), "serving"),
        "spec": {
            "podSelector": {"matchLabels": selector(model), "matchExpressions": [{"key": POOL_LABEL, "operator": "Exists"}]},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": serving, "ports": port}, {"from": decode}],
        },
    }


def proxy_deployment(model: Model, replicas: int) -> dict[str, Any]:
    """The model's Deployment: the operator's proxy (programs/pd_proxy.py) in its own image, on no
    Neuron device, listening on the serving port that the model's Service targets."""
    port = process_base_port(model)
    endpoints = [
        *("--prefiller-host", pool_name(model, "prefill"), "--prefiller-port", str(port)),
        *("--decoder-host", pool_name(model, "decode"), "--decoder-port", str(port)),
    ]
    health = {"httpGet": {"path": "/healthcheck", "port": "serve-0"}}
    container = {
        "name": "proxy",
        "image": model.operator_image,
        "command": PROXY_PROGRAM,
        "args": ["--host", "0.0.0.0", "--port", str(port), *endpoints],
        "ports": [{"name": "serve-0", "containerPort": port, "protocol": "TCP"}],
        "resources": BATCHER_RESOURCES,
        "readinessProbe": {**health, "periodSeconds": 5},
        "livenessProbe": {**health, "periodSeconds": 10, "failureThreshold": 6},
        "securityContext": CONTAINER_SECURITY,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": child_metadata(model, model.name, "proxy"),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": proxy_selector(model)},
            "template": {
                "metadata": {"labels": labels(model, "proxy"), "annotations": {PLAN_HASH_ANNOTATION: model.plan_hash}},
                "spec": {
                    "automountServiceAccountToken": False,
                    # On SIGTERM the proxy stops accepting and finishes what it relays, each
                    # request within its deadline (pd_proxy's INFERENTIA_PD_PROXY_DEADLINE_S).
                    "terminationGracePeriodSeconds": PROXY_DEADLINE_SECONDS + 10,
                    # The operator's own image: non-root whatever the model's runAsRoot says.
                    "securityContext": non_root_pod_security(),
                    "containers": [container],
                    **pod_placement(model.spec.placement),
                },
            },
        },
    }


def pools(model: Model, replicas: Mapping[str, int] | None = None) -> tuple[tuple[dict[str, Any], ...], tuple[dict[str, Any], ...]]:
    """Each pool's plan ConfigMap (one where both pools plan alike) and Service, the pools'
    NetworkPolicy, then each pool's Deployment, which waits for the compiled artefact as the
    serving Deployment does. ``replicas``: each pool's, by role, as autoscaling leaves them
    (else the pools' own)."""
    configmaps = {plan_configmap_name(m): plan_configmap(m) for m in model.pools}
    services = tuple(pool_service(model, role) for role in ROLES)
    counts = replicas or {}
    deployments = tuple(pool_deployment(model, role, m, counts.get(role)) for role, m in zip(ROLES, model.pools, strict=True))
    return (*configmaps.values(), *services, pools_network_policy(model)), deployments
