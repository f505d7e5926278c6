"""Routing (spec.routing.inferencePool): a pool whose requests and endpoints the endpoint picker can handle."""

from __future__ import annotations

from inferentia_operator.core.api import InferentiaModelSpec
from inferentia_operator.core.catalogue import Family
from inferentia_operator.core.cel import CrossFieldRule
from inferentia_operator.core.findings import Finding

# The picker routes OpenAI-style requests only: it refuses (400) a body without "model"
# ("model not found in request body") and one that is neither a completion ("prompt") nor a
# chat completion ("messages"): gateway-api-inference-extension v1.1.0,
# pkg/epp/requestcontrol/director.go and pkg/epp/util/request/body.go. vLLM's server takes
# those; the batching front end's JSON inputs are neither, so a pool of its pods would refuse
# every request.
_VLLM = "(has(self.serving.runtime) && self.serving.runtime == 'vllm')"
ROUTING_API = CrossFieldRule(
    "spec.routing.inferencePool",
    "spec",
    "needs an OpenAI-compatible server: the endpoint picker routes only completions and chat completions, which name "
    "their model; valid specs set spec.serving.runtime: vllm",
    f"!has(self.routing) || !has(self.routing.inferencePool) || {_VLLM}",
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
    if not vllm:
        found.append(ROUTING_API.finding())
    if vllm and spec.processes_per_replica > MAX_POOL_PORTS:
        found.append(ROUTING_PORTS.finding(spec.processes_per_replica))
    return found


RULES: list[CrossFieldRule] = [ROUTING_API, ROUTING_PORTS]
CHECKS = (_check_routing,)
