"""Routing (spec.routing.inferencePool): a pool whose endpoints the endpoint picker can rank."""

from __future__ import annotations

from inferentia_operator.core.api import InferentiaModelSpec
from inferentia_operator.core.catalogue import Family
from inferentia_operator.core.cel import CrossFieldRule
from inferentia_operator.core.findings import Finding

# The picker ranks endpoints by each one's queue, read from its metrics
# (https://gateway-api-inference-extension.sigs.k8s.io/, model server protocol): only the
# batching front end and vLLM export one.
_VLLM = "(has(self.serving.runtime) && self.serving.runtime == 'vllm')"
ROUTING_SIGNAL = CrossFieldRule(
    "spec.routing.inferencePool",
    "spec",
    "needs each replica's queue of requests, which only the batching front end and vLLM export; "
    "valid specs also set spec.serving.batching, or spec.serving.runtime: vllm",
    f"!has(self.routing) || !has(self.routing.inferencePool) || has(self.serving.batching) || {_VLLM}",
    (),
)
# inference.networking.k8s.io/v1 InferencePoolSpec.targetPorts: "MaxItems=8", each port a
# distinct endpoint. Each vLLM process serves on its own port; the front end on one.
MAX_POOL_PORTS = 8
ROUTING_PORTS = CrossFieldRule(
    "spec.routing.inferencePool",
    "spec",
    f"with vLLM makes each serving process an endpoint, and an InferencePool lists at most {MAX_POOL_PORTS} ports; "
    f"processesPerReplica is %d, valid values are 1 to {MAX_POOL_PORTS}",
    f"!has(self.routing) || !has(self.routing.inferencePool) || !{_VLLM} || !has(self.processesPerReplica)"
    f" || self.processesPerReplica <= {MAX_POOL_PORTS}",
    ("self.processesPerReplica",),
)


def _check_routing(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    if spec.routing is None or spec.routing.inference_pool is None:
        return []
    vllm = spec.serving.runtime == "vllm"
    found = []
    if spec.serving.batching is None and not vllm:
        found.append(ROUTING_SIGNAL.finding())
    if vllm and spec.processes_per_replica > MAX_POOL_PORTS:
        found.append(ROUTING_PORTS.finding(spec.processes_per_replica))
    return found


RULES: list[CrossFieldRule] = [ROUTING_SIGNAL, ROUTING_PORTS]
CHECKS = (_check_routing,)
