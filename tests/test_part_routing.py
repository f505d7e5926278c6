"""The routing part alone (core/routing/part.py): with spec.routing.inferencePool, an
InferencePool of the Gateway API Inference Extension that selects the model's serving pods,
and the endpoint picker it names (its Deployment, Service, ServiceAccount and RoleBinding);
held while the cluster serves no InferencePools, and taken down when routing is turned off."""

from dataclasses import replace

import pytest

from inferentia_operator.core.names import TRAFFIC_LABEL
from inferentia_operator.core.pod.meta import selector
from inferentia_operator.core.pod.ports import process_base_port
from inferentia_operator.core.routing import pool as routing
from inferentia_operator.core.routing.part import routing_part
from inferentia_operator.core.settings import Settings
from test_decide import SETTINGS, Observed, built, live, model_body

VLLM = {
    "model.uri": "s3://models/llama-3.1-8b/", "model.architecture": "transformer", "model.precision": "bf16",
    "compute.family": "inf2", "compute.inf": 1, "processesPerReplica": 2, "compile.buckets": [[1024]],
    "serving.port": 8000, "serving.runtime": "vllm", "routing": {"inferencePool": {"failureMode": "FailOpen"}},
}  # fmt: skip


def by_kind(part):
    return {c["kind"]: c for c in part.children}


def args_of(deployment) -> dict[str, str]:
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    flags = {}
    for a in args:
        if a.startswith("--") and "=" in a:
            flags[a.split("=", 1)[0]] = a.split("=", 1)[1]
    for flag, value in zip(args, args[1:], strict=False):
        if flag.startswith("--") and "=" not in flag and not value.startswith("--"):
            flags[flag] = value
    return flags


def test_without_routing_nothing_is_written():
    body = model_body()
    part = routing_part(built(body), Observed(body), SETTINGS)
    assert (part.children, part.delete) == ((), ())


def test_a_pool_selects_the_serving_pods_and_names_its_picker():
    body = model_body(**VLLM)
    m = built(body)
    objects = by_kind(routing_part(m, Observed(body), SETTINGS))
    assert set(objects) == {"InferencePool", "Deployment", "Service", "ServiceAccount", "RoleBinding"}
    pool = objects["InferencePool"]
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1" and pool["metadata"]["name"] == "m"
    assert pool["spec"]["selector"] == {"matchLabels": {**selector(m), TRAFFIC_LABEL: "on"}}
    assert pool["spec"]["endpointPickerRef"] == {
        "kind": "Service", "name": "m-epp", "port": {"number": routing.EPP_GRPC_PORT}, "failureMode": "FailOpen",
    }  # fmt: skip
    # Every child is the model's: owned by it, with the standard labels.
    for child in objects.values():
        assert child["metadata"]["ownerReferences"][0]["uid"] == m.uid
        assert child["metadata"]["labels"]["inferentia.dev/model"] == "m"
    picker = objects["Deployment"]
    assert picker["metadata"]["name"] == "m-epp"
    flags = args_of(picker)
    assert (flags["--pool-name"], flags["--pool-namespace"]) == ("m", "ns")
    assert "queue-scorer" in flags["--config-text"]
    pod = picker["spec"]["template"]["spec"]
    # Its metrics port checks no caller, so it serves no Go profiles either.
    assert {"--metrics-endpoint-auth=false", "--enable-pprof=false"} <= set(pod["containers"][0]["args"])
    assert pod["serviceAccountName"] == "m-epp"
    assert pod["containers"][0]["image"] == SETTINGS.endpoint_picker_image
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["containers"][0]["securityContext"]["allowPrivilegeEscalation"] is False
    assert objects["Service"]["spec"]["ports"][0]["port"] == routing.EPP_GRPC_PORT
    assert objects["Service"]["spec"]["selector"] == picker["spec"]["selector"]["matchLabels"]
    binding = objects["RoleBinding"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": SETTINGS.endpoint_picker_role}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "m-epp", "namespace": "ns"}]


def test_each_vllm_process_is_an_endpoint_scraped_at_its_own_port():
    """vLLM runs one server a NeuronCore Group, each on its own port with its own /metrics:
    the pool lists every port, and the picker scrapes each at its own (its datastore does so
    when a pool has more than one target port)."""
    body = model_body(**VLLM)
    m = built(body)
    objects = by_kind(routing_part(m, Observed(body), Settings(endpoint_picker_image="example.com/epp:1")))
    base = process_base_port(m)
    assert objects["InferencePool"]["spec"]["targetPorts"] == [{"number": base}, {"number": base + 1}]
    assert objects["InferencePool"]["spec"]["endpointPickerRef"]["failureMode"] == "FailOpen"
    flags = args_of(objects["Deployment"])
    assert flags["--total-queued-requests-metric"] == "vllm:num_requests_waiting"
    assert "--model-server-metrics-port" not in flags
    assert objects["Deployment"]["spec"]["template"]["spec"]["containers"][0]["image"] == "example.com/epp:1"


def test_everything_is_held_while_the_cluster_serves_no_inference_pools():
    body = model_body(**VLLM)
    seen = Observed(body)
    part = routing_part(built(body), replace(seen, unserved=frozenset({"InferencePool"})), SETTINGS)
    assert part.to_write() == [] and len(part.children) == 5
    assert part.facts is not None and part.facts.served is False


def test_routing_turned_off_deletes_the_pool_and_parks_the_picker():
    """The operator deletes no Deployment (its RBAC has no such right): the picker is parked at
    no replica, and goes with the model; the pool goes at once, so a gateway stops routing to it."""
    on = model_body(**VLLM)
    objects = by_kind(routing_part(built(on), Observed(on), SETTINGS))
    off = model_body(**{k: v for k, v in VLLM.items() if k != "routing"})
    seen = Observed(off, others=[live(objects["InferencePool"]), live(objects["Deployment"])])
    part = routing_part(built(off), seen, SETTINGS)
    assert part.delete == (("InferencePool", "m"),)
    [parked] = part.to_write()
    assert parked["metadata"]["name"] == "m-epp" and parked["spec"]["replicas"] == 0


@pytest.mark.parametrize(
    "spec,field",
    [
        # The picker routes OpenAI requests only: the front end's JSON inputs it would refuse.
        ({"serving.batching": {"maxBatchSize": 4}, "routing": {"inferencePool": {}}}, "spec.routing.inferencePool"),
        ({**VLLM, "compute.inf": 6, "processesPerReplica": 12}, "spec.routing.inferencePool"),  # 12 ports, a pool takes 8
    ],
)
def test_a_pool_the_picker_cannot_use_is_refused_naming_the_field(spec, field):
    from inferentia_operator.core.model import check_model

    body = model_body(**spec)
    checked = check_model("m", "ns", body["spec"])
    assert checked.model is None
    assert any(field in str(e) for e in checked.errors), checked.errors
