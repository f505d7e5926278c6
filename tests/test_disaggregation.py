"""Prefill and decode pools (spec.disaggregation): the objects a disaggregated model renders,
the flags its vLLM servers get, checked against AWS's tutorial, and what its status reports.

The tutorial ("Tutorial: Configure disaggregated inference with 1P1D and xPyD",
https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/tutorials/tutorial-di-1p1d-xpyd.html)
runs the prefill server with ``--kv-transfer-config '{"kv_connector": ..., "kv_role": "kv_producer",
"kv_buffer_device": "cuda", "kv_connector_extra_config": {"backends": ["LIBFABRIC"]}}'`` and
``VLLM_NIXL_SIDE_CHANNEL_PORT``, the decode server the same with ``kv_consumer`` (Steps 1 and 2),
``FI_EFA_ENABLE_SHM_TRANSFER=0`` in both ("Prepare your environment"), and the proxy with
``--prefiller-host``/``--prefiller-port`` and ``--decoder-host``/``--decoder-port`` (Step 5).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from inferentia_operator.core.api import InferentiaModelSpec
from inferentia_operator.core.decide import decide, rendered
from inferentia_operator.core.observed import Observed
from inferentia_operator.core.planner import plan
from inferentia_operator.core.pod.model import Model, plan_hash
from inferentia_operator.programs import pd_proxy
from specs import pd_spec

STANDINS = Path(__file__).resolve().parent.parent / "cluster" / "node" / "standins"


def standin_disagg():
    """The stand-ins' vllm_disagg, with their folder on the path only while it is imported: left
    there, it would hand every later test of this process the stand-ins' vllm and huggingface_hub."""
    sys.path.insert(0, str(STANDINS))
    try:
        import vllm_disagg
    finally:
        sys.path.remove(str(STANDINS))
    return vllm_disagg


UID = "0c6a1d2e-0000-4000-8000-000000000001"


def pd_model(**overrides) -> Model:
    spec = InferentiaModelSpec.model_validate(pd_spec(**overrides))
    return Model("m", "ns", UID, spec, plan(spec))


def children(model: Model) -> dict[tuple[str, str], dict]:
    return {(c["kind"], c["metadata"]["name"]): c for c in rendered(model)}


def serve_args(deployment: dict) -> list[str]:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return container["args"]


def env_of(deployment: dict) -> dict[str, dict]:
    return {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}


def flag(args: list[str], name: str) -> str:
    assert args.count(name) == 1, (name, args)
    return args[args.index(name) + 1]


def test_the_model_renders_a_deployment_and_a_service_per_pool_and_the_proxy():
    kids = children(pd_model())
    for name in ("m", "m-prefill", "m-decode"):
        assert ("Deployment", name) in kids and ("Service", name) in kids
    # The model's Service answers through the proxy alone; each pool's Service selects its pool.
    selectors = {name: kids[("Service", name)]["spec"]["selector"] for name in ("m", "m-prefill", "m-decode")}
    assert selectors["m"]["app.kubernetes.io/component"] == "proxy"
    assert selectors["m-prefill"]["inferentia.dev/pool"] == "prefill"
    assert selectors["m-decode"]["inferentia.dev/pool"] == "decode"
    # The three Deployments select disjoint pods.
    matches = [kids[("Deployment", n)]["spec"]["selector"]["matchLabels"] for n in ("m", "m-prefill", "m-decode")]
    assert len({json.dumps(m, sort_keys=True) for m in matches}) == 3


def test_each_pool_runs_its_replicas_on_its_chips():
    kids = children(pd_model())
    prefill, decode = kids[("Deployment", "m-prefill")], kids[("Deployment", "m-decode")]
    assert (prefill["spec"]["replicas"], decode["spec"]["replicas"]) == (2, 1)
    requests = [d["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"] for d in (prefill, decode)]
    assert [r["aws.amazon.com/neuron"] for r in requests] == ["1", "2"]


@pytest.mark.parametrize(("pool", "role", "tp"), [("prefill", "kv_producer", "4"), ("decode", "kv_consumer", "8")])
def test_each_pools_servers_get_the_tutorials_flags(pool, role, tp):
    args = serve_args(children(pd_model())[("Deployment", f"m-{pool}")])
    assert flag(args, "--tensor-parallel-size") == tp
    assert "--data-parallel-size" not in args  # one engine a server while dataParallelSize is 1
    config = json.loads(flag(args, "--kv-transfer-config"))
    assert config == {
        "kv_connector": "NixlConnector",
        "kv_role": role,
        "kv_buffer_device": "cuda",
        "kv_connector_extra_config": {"backends": ["LIBFABRIC"]},
    }
    # The stand-in parses it as vLLM's KVTransferConfig does and takes it as the plugin would.
    vllm_disagg = standin_disagg()
    parsed = vllm_disagg.parse_kv_transfer_config(flag(args, "--kv-transfer-config"))
    vllm_disagg.check_connector(parsed, plugin=True)
    assert parsed.kv_role == role


def test_each_pools_servers_advertise_their_side_channel_on_the_pods_address():
    for pool in ("prefill", "decode"):
        deployment = children(pd_model())[("Deployment", f"m-{pool}")]
        env = env_of(deployment)
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
        assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"]["value"] == "5557"
        assert env["FI_EFA_ENABLE_SHM_TRANSFER"]["value"] == "0"
        ports = deployment["spec"]["template"]["spec"]["containers"][0]["ports"]
        assert {"name": "nixl", "containerPort": 5557, "protocol": "TCP"} in ports


def test_the_proxy_is_the_operators_program_given_each_pools_service():
    kids = children(pd_model())
    container = kids[("Deployment", "m")]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:3] == ["python3", "-m", "inferentia_operator.programs.pd_proxy"]
    args = pd_proxy.parse_args(container["args"])
    assert (args.host, args.port) == ("0.0.0.0", 8000)
    assert (args.prefiller_hosts, args.prefiller_ports) == (["m-prefill"], [8000])
    assert (args.decoder_hosts, args.decoder_ports) == (["m-decode"], [8000])
    assert "aws.amazon.com/neuron" not in container["resources"]["requests"]
    # A request in flight at SIGTERM is relayed to its end, within the proxy's deadline.
    grace = kids[("Deployment", "m")]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > pd_proxy.DEADLINE
    pool_ports = [p["port"] for p in kids[("Service", "m-prefill")]["spec"]["ports"]]
    assert pool_ports == [8000]


def test_the_plan_says_each_pools_parallelism():
    p = pd_model().plan.disaggregation
    assert (p.prefill.chips, p.prefill.tensor_parallel_size, p.prefill.data_parallel_size) == (1, 4, 1)
    assert (p.decode.chips, p.decode.tensor_parallel_size, p.decode.data_parallel_size) == (2, 8, 1)


def test_a_model_without_pools_renders_as_before():
    spec = InferentiaModelSpec.model_validate({k: v for k, v in pd_spec().items() if k != "disaggregation"})
    kinds = [(c["kind"], c["metadata"]["name"]) for c in rendered(Model("m", "ns", UID, spec, plan(spec)))]
    assert ("Deployment", "m-prefill") not in kinds and ("Deployment", "m") in kinds


# --- EFA and one network part ----------------------------------------------------------------


def pod_spec_of(model: Model, pool: str) -> dict:
    return children(model)[("Deployment", f"m-{pool}")]["spec"]["template"]["spec"]


def instance_types_of(pod_spec: dict) -> list[str]:
    [term] = pod_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    [expression] = [e for e in term["matchExpressions"] if e["key"] == "node.kubernetes.io/instance-type"]
    return expression["values"]


def test_each_pools_pods_request_their_chips_share_of_their_instances_efa_devices():
    """trn2.48xlarge and trn2u.48xlarge have 16 EFA devices and 16 chips: a pod takes one a chip,
    requests equal to limits, and its pool is held to those types (trn2.3xlarge's count is unknown)."""
    model = pd_model()
    for pool, chips in (("prefill", "1"), ("decode", "2")):
        spec = pod_spec_of(model, pool)
        resources = spec["containers"][0]["resources"]
        assert resources["requests"]["vpc.amazonaws.com/efa"] == resources["limits"]["vpc.amazonaws.com/efa"] == chips
        assert instance_types_of(spec) == ["trn2.48xlarge", "trn2u.48xlarge"]
    p = model.plan.disaggregation
    assert (p.prefill.efa_devices, p.decode.efa_devices) == (1, 2)
    # The pools' own plans, which their ConfigMaps hold, say the same.
    assert [(m.plan.efa_devices, m.plan.instance_types) for m in model.pools] == [(n, ["trn2.48xlarge", "trn2u.48xlarge"]) for n in (1, 2)]


def test_a_pool_of_a_whole_instance_takes_every_efa_device():
    spec = pod_spec_of(pd_model(**{"disaggregation.decode.inf": 16}), "decode")
    assert spec["containers"][0]["resources"]["limits"]["vpc.amazonaws.com/efa"] == "16"


def test_efa_off_requests_none_and_keeps_every_instance_type():
    model = pd_model(**{"disaggregation.efa": "off"})
    prefill = pod_spec_of(model, "prefill")
    assert "vpc.amazonaws.com/efa" not in prefill["containers"][0]["resources"]["requests"]
    assert "vpc.amazonaws.com/efa" not in prefill["containers"][0]["resources"]["limits"]
    assert instance_types_of(prefill) == ["trn2.3xlarge", "trn2.48xlarge", "trn2u.48xlarge"]
    assert model.plan.disaggregation.prefill.efa_devices is None


def test_efa_is_part_of_the_plan_so_changing_it_rolls_the_pools():
    assert plan_hash(pd_model().plan) != plan_hash(pd_model(**{"disaggregation.efa": "off"}).plan)


def test_on_a_family_of_no_known_efa_count_auto_requests_none_and_says_so():
    model = pd_model(**{"compute.family": "trn3"})
    spec = pod_spec_of(model, "decode")
    assert "vpc.amazonaws.com/efa" not in spec["containers"][0]["resources"]["limits"]
    assert instance_types_of(spec) == ["trn3e.24xlarge", "trn3.48xlarge"]
    [warning] = model.plan.warnings
    assert warning.startswith("warning: spec.disaggregation.efa: is auto, and no trn3 instance type the pools may use")
    assert not pd_model(**{"compute.family": "trn3", "disaggregation.efa": "off"}).plan.warnings


def test_the_proxy_requests_no_efa_device_and_prefers_no_network_part():
    spec = children(pd_model())[("Deployment", "m")]["spec"]["template"]["spec"]
    assert "vpc.amazonaws.com/efa" not in spec["containers"][0]["resources"]["requests"]
    assert "podAffinity" not in spec.get("affinity", {})


def test_each_pools_pods_prefer_the_network_part_of_the_models_pool_pods():
    """A preference, never a requirement, for nodes sharing EKS's bottom network layer (then the
    one above) with either pool's pods: a node without the labels still takes them."""
    model = pd_model()
    for pool in ("prefill", "decode"):
        affinity = pod_spec_of(model, pool)["affinity"]
        assert "requiredDuringSchedulingIgnoredDuringExecution" not in affinity["podAffinity"]
        terms = affinity["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        by_key = {t["podAffinityTerm"]["topologyKey"]: t for t in terms}
        layer3, layer2 = by_key["topology.k8s.aws/network-node-layer-3"], by_key["topology.k8s.aws/network-node-layer-2"]
        assert layer3["weight"] > layer2["weight"]
        # Both pools' pods match: the model's serving pods, which with pools are theirs alone.
        for term in (layer3, layer2):
            selector = term["podAffinityTerm"]["labelSelector"]["matchLabels"]
            assert selector == {"inferentia.dev/model": "m", "app.kubernetes.io/component": "serving"}
        # Spreading the model's pods over nodes still weighs most.
        [spread] = affinity["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        assert spread["weight"] > layer3["weight"] + layer2["weight"]


def test_a_pools_network_preference_joins_the_users_own():
    affinity = {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 7, "podAffinityTerm": {"topologyKey": "topology.kubernetes.io/zone", "labelSelector": {"matchLabels": {"app": "cache"}}}}
    ]}}  # fmt: skip
    terms = pod_spec_of(pd_model(placement={"affinity": affinity}), "prefill")["affinity"]["podAffinity"]
    keys = [t["podAffinityTerm"]["topologyKey"] for t in terms["preferredDuringSchedulingIgnoredDuringExecution"]]
    assert "topology.kubernetes.io/zone" in keys and "topology.k8s.aws/network-node-layer-3" in keys


def test_an_efa_shortage_is_named_in_the_scheduled_condition():
    """Without AWS's EFA device plugin (or with its devices taken), a pool's pod stays Pending and
    the status quotes the scheduler: the resource it lacks is named."""
    model = pd_model()
    message = "0/3 nodes are available: 3 Insufficient vpc.amazonaws.com/efa."
    pending = {
        "metadata": {"name": "m-decode-0", "namespace": "ns", "labels": {"inferentia.dev/model": "m", "app.kubernetes.io/component": "serving", "inferentia.dev/pool": "decode"}},
        "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]},
    }  # fmt: skip
    observed = dataclasses.replace(observe(model, {"m-decode": 0}), pods=[pending])
    conditions = {c.type: c for c in decide(observed, "2026-01-01T00:00:00Z").report.status.conditions}
    assert (conditions["Scheduled"].status, conditions["Scheduled"].reason) == ("False", "Unschedulable")
    assert "Insufficient vpc.amazonaws.com/efa" in conditions["Scheduled"].message


# --- status ------------------------------------------------------------------------------------


def live(obj: dict, replicas: int, ready: int) -> dict:
    meta = {**obj["metadata"], "generation": 1, "uid": "u-" + obj["metadata"]["name"]}
    conditions = [{"type": "Available", "status": "True"}, {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}]
    status = {"observedGeneration": 1, "replicas": replicas, "readyReplicas": ready, "updatedReplicas": replicas}
    return {**obj, "metadata": meta, "status": {**status, "availableReplicas": ready, "conditions": conditions}}


def observe(model: Model, ready: dict[str, int]) -> Observed:
    body = {"metadata": {"name": "m", "namespace": "ns", "uid": UID, "generation": 1}, "spec": pd_spec(), "status": {}}
    objs = []
    for child in rendered(model):
        name = child["metadata"]["name"]
        if child["kind"] == "Deployment":
            want = child["spec"]["replicas"]
            objs.append(live(child, want, ready.get(name, want)))
        else:
            objs.append({**child, "metadata": {**child["metadata"], "uid": "u-" + name}})
    return Observed.of(body, *objs)


def test_status_reports_each_pools_replicas_and_is_ready_once_both_are():
    model = pd_model()
    decision = decide(observe(model, {}), "2026-01-01T00:00:00Z")
    status = decision.report.status
    assert (status.pools.prefill.replicas, status.pools.prefill.ready_replicas) == (2, 2)
    assert (status.pools.decode.replicas, status.pools.decode.ready_replicas) == (1, 1)
    assert {c.type: c.status for c in status.conditions}["Ready"] == "True"
    # The counts and selector of the scale subresource are the proxy's, which spec.replicas scales.
    assert (status.replicas, status.ready_replicas, status.selector) == (1, 1, "inferentia.dev/model=m,app.kubernetes.io/component=proxy")


def test_a_pool_short_of_ready_replicas_holds_back_ready():
    status = decide(observe(pd_model(), {"m-prefill": 1}), "2026-01-01T00:00:00Z").report.status
    assert status.pools.prefill.ready_replicas == 1
    assert {c.type: c.status for c in status.conditions}["Ready"] == "False"


@pytest.mark.parametrize("empty", ["m-prefill", "m-decode"])
def test_a_pool_with_no_available_server_is_not_available(empty):
    """A one-replica Deployment counts itself Available with no pod (maxUnavailable 1), and the
    other Deployments' pods would carry the sum: the model is Available and Ready only when every
    Deployment that should run a pod has one available."""
    status = decide(observe(pd_model(), {empty: 0}), "2026-01-01T00:00:00Z").report.status
    conditions = {c.type: c.status for c in status.conditions}
    assert (conditions["Available"], conditions["Ready"]) == ("False", "False"), status.conditions


def test_a_converged_pooled_model_writes_and_deletes_nothing():
    """Every child live as rendered, with what the API server defaults (a fieldRef's apiVersion):
    the next reconcile writes nothing, and the clean-up keeps every pool's plan ConfigMap."""
    observed = observe(pd_model(), {})
    for deployment in observed.children["Deployment"]:
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            for env in container.get("env", []):
                if "fieldRef" in env.get("valueFrom", {}):
                    env["valueFrom"]["fieldRef"]["apiVersion"] = "v1"
    decision = decide(observed, "2026-01-01T00:00:00Z")
    assert (decision.apply, decision.delete) == ([], [])


def test_every_deployment_carries_the_models_plan():
    model = pd_model()
    for name in ("m", "m-prefill", "m-decode"):
        template = children(model)[("Deployment", name)]["spec"]["template"]
        assert template["metadata"]["annotations"]["inferentia.dev/plan-hash"] == plan_hash(model.plan)


def test_the_pools_plan_configmaps_are_kept_before_any_pod_mounts_them():
    from inferentia_operator.core.cleanup.part import cleanup_part
    from inferentia_operator.core.settings import DEFAULT_SETTINGS

    model = pd_model()
    maps = [c for c in rendered(model) if c["kind"] == "ConfigMap"]
    assert len(maps) >= 2  # the model's, and the pools' (one where both plan alike)
    body = {"metadata": {"name": "m", "namespace": "ns", "uid": UID}, "spec": pd_spec(), "status": {}}
    assert cleanup_part(model, Observed.of(body, *maps), DEFAULT_SETTINGS).delete == ()


def single_spec() -> dict:
    """pd_spec() as one Deployment: no pools, the replica on one chip."""
    spec = pd_spec()
    del spec["disaggregation"]
    spec["compute"]["inf"] = 1
    return spec


def switched(was: dict, now: dict) -> Observed:
    """A model converged on ``was`` (each child live as rendered, what the API server defaults
    added) whose spec is now ``now``."""
    old = Model("m", "ns", UID, InferentiaModelSpec.model_validate(was), plan(InferentiaModelSpec.model_validate(was)))
    body = {"metadata": {"name": "m", "namespace": "ns", "uid": UID, "generation": 2}, "spec": now, "status": {}}
    objs = []
    for child in rendered(old):
        name = child["metadata"]["name"]
        if child["kind"] == "Deployment":
            child = live(child, child["spec"]["replicas"], child["spec"]["replicas"])
            for container in child["spec"]["template"]["spec"]["containers"]:
                for env in container.get("env", []):
                    if "fieldRef" in env.get("valueFrom", {}):
                        env["valueFrom"]["fieldRef"]["apiVersion"] = "v1"
        else:
            child = {**child, "metadata": {**child["metadata"], "uid": "u-" + name}}
        objs.append(child)
    return Observed.of(body, *objs)


def progressing(decision) -> tuple[str, str]:
    said = {c.type: c for c in decision.report.status.conditions}["Progressing"]
    return said.status, said.reason


def test_a_live_model_given_pools_deletes_its_deployment_and_creates_the_proxy_once_it_is_gone():
    """A Deployment's selector cannot change: the serving pods' Deployment is deleted rather than
    re-applied with the proxy's selector, and the proxy is created on the pass that sees it gone."""
    observed = switched(single_spec(), pd_spec())
    decision = decide(observed, "2026-01-01T00:00:00Z")
    assert ("Deployment", "m") in decision.delete
    assert ("Deployment", "m") not in {(c["kind"], c["metadata"]["name"]) for c in decision.apply}
    assert progressing(decision) == ("True", "ReplacingDeployment")
    # Once the delete is seen, the proxy is created with its own selector.
    observed.children["Deployment"] = [d for d in observed.children["Deployment"] if d["metadata"]["name"] != "m"]
    decision = decide(observed, "2026-01-01T00:00:00Z")
    assert ("Deployment", "m") not in decision.delete
    proxy = [c for c in decision.apply if (c["kind"], c["metadata"]["name"]) == ("Deployment", "m")]
    assert proxy and proxy[0]["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "proxy"


def test_a_live_pooled_model_without_pools_deletes_the_proxy_and_each_pools_deployment_and_service():
    observed = switched(pd_spec(), single_spec())
    decision = decide(observed, "2026-01-01T00:00:00Z")
    for name in ("m-prefill", "m-decode"):
        assert {("Deployment", name), ("Service", name)} <= set(decision.delete)
    assert ("NetworkPolicy", "m-pools") in decision.delete
    assert ("Deployment", "m") in decision.delete
    assert ("Deployment", "m") not in {(c["kind"], c["metadata"]["name"]) for c in decision.apply}
    assert progressing(decision) == ("True", "ReplacingDeployment")
    # The plan ConfigMaps the live pools' Deployments mount stay until those are gone.
    mounted = {
        v["configMap"]["name"]
        for d in observed.children["Deployment"] if d["metadata"]["name"] in ("m-prefill", "m-decode")
        for v in d["spec"]["template"]["spec"]["volumes"] if "configMap" in v
    }  # fmt: skip
    assert mounted and not mounted & {name for kind, name in decision.delete if kind == "ConfigMap"}
    # Once the proxy is gone, the serving Deployment is created with the serving pods' selector.
    observed.children["Deployment"] = [d for d in observed.children["Deployment"] if d["metadata"]["name"] != "m"]
    decision = decide(observed, "2026-01-01T00:00:00Z")
    serving = [c for c in decision.apply if (c["kind"], c["metadata"]["name"]) == ("Deployment", "m")]
    assert serving and serving[0]["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "serving"


def test_someone_elses_deployment_and_service_named_like_a_pool_are_left_alone():
    foreign = [
        {"apiVersion": api_version, "kind": kind, "metadata": {"name": "m-prefill", "namespace": "ns", "uid": "x"}, "spec": {}}
        for kind, api_version in (("Deployment", "apps/v1"), ("Service", "v1"))
    ] + [
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": "m-pools", "namespace": "ns", "uid": "y"},
            "spec": {},
        }
    ]
    body = {"metadata": {"name": "m", "namespace": "ns", "uid": UID, "generation": 1}, "spec": single_spec(), "status": {}}
    decision = decide(Observed.of(body, *foreign), "2026-01-01T00:00:00Z")
    assert not {("Deployment", "m-prefill"), ("Service", "m-prefill"), ("NetworkPolicy", "m-pools")} & set(decision.delete)


def test_a_pools_plan_configmap_is_kept_while_a_live_pool_deployment_mounts_it():
    """Clean-up keeps a plan ConfigMap that a pool's live Deployment mounts, though the model
    has no pools any more (its Deployments not yet gone) or plans otherwise now."""
    from inferentia_operator.core.cleanup.part import cleanup_part
    from inferentia_operator.core.settings import DEFAULT_SETTINGS

    observed = switched(pd_spec(), single_spec())
    single = Model(
        "m", "ns", UID, InferentiaModelSpec.model_validate(single_spec()), plan(InferentiaModelSpec.model_validate(single_spec()))
    )
    deleted = {name for kind, name in cleanup_part(single, observed, DEFAULT_SETTINGS).delete if kind == "ConfigMap"}
    mounted = {
        v["configMap"]["name"]
        for d in observed.children["Deployment"] if d["metadata"]["name"] in ("m-prefill", "m-decode")
        for v in d["spec"]["template"]["spec"]["volumes"] if "configMap" in v
    }  # fmt: skip
    # Not empty: with no pool Deployment or no mounted map the check below would hold of nothing.
    assert mounted and not mounted & deleted


# --- the rendered servers and proxy, run ---------------------------------------------------------


def start_pools(kids, cluster, tmp_path: Path, cores: dict[str, str]) -> dict[str, int]:
    """Each pool's one server as its Deployment renders it (the engine's flags and the planned
    environment), on the given NeuronCores and a free port; the pools' ports by pool."""
    from ports import free_port
    from test_disaggregated import PLUGIN, environment

    ports = {}
    for pool, visible in cores.items():
        deployment = kids[("Deployment", f"m-{pool}")]
        flags = serve_args(deployment)[4:]  # after /bin/sh -c '<script>' vllm: the engine's flags
        flags[flags.index("--model") + 1] = str(cluster.model)
        port, side = free_port(), free_port()
        planned = {k: v["value"] for k, v in env_of(deployment).items() if "value" in v}
        env = environment(tmp_path, PLUGIN, visible, side, FI_EFA_ENABLE_SHM_TRANSFER=planned["FI_EFA_ENABLE_SHM_TRANSFER"])
        cluster.start([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--port", str(port), *flags], env, port)
        ports[pool] = port
    return ports


def start_proxy(kids, cluster, ports: dict[str, int]) -> int:
    """The proxy's rendered command line with the pools' Services and its own address swapped for
    loopback ports; its port once it answers."""
    from ports import free_port

    proxy = kids[("Deployment", "m")]["spec"]["template"]["spec"]["containers"][0]["args"]
    argv = ["127.0.0.1" if a in ("m-prefill", "m-decode") else a for a in proxy]
    listen = free_port()
    argv[argv.index("--port") + 1] = str(listen)
    argv[argv.index("--host") + 1] = "127.0.0.1"
    argv[argv.index("--prefiller-port") + 1] = str(ports["prefill"])
    argv[argv.index("--decoder-port") + 1] = str(ports["decode"])
    cluster.start(
        [sys.executable, "-m", "inferentia_operator.programs.pd_proxy", *argv],
        {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parent.parent / "operator")},
        listen,
        "/healthcheck",
    )
    return listen


def test_the_rendered_pools_and_proxy_serve_a_completion(tmp_path):
    """The flags and environment rendered for each pool start the plugin's stand-in servers in
    their roles, and the proxy's rendered command line, pointed at them, serves a completion that
    the decode server generated from the prefill's KV cache (tests/test_disaggregated.py runs the
    tutorial's own commands the same way). Only the addresses are the test's: the Services' names
    and the pods' IPs become loopback ports."""
    from test_disaggregated import PLUGIN, Cluster, get, metric, post

    # Each pool one chip, TP4 (the decode pool of two DP ranks is the test below).
    model = pd_model(**{"disaggregation.decode": {}, "serving.image": PLUGIN})
    kids, cluster = children(model), Cluster(tmp_path)
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "neuron1").touch()
    try:
        ports = start_pools(kids, cluster, tmp_path, {"prefill": "0-3", "decode": "4-7"})
        listen = start_proxy(kids, cluster, ports)
        status, text = post(listen, "/v1/completions", {"model": str(cluster.model), "prompt": "one two three", "max_tokens": 3})
        assert status == 200, text
        assert metric(get(ports["decode"], "/metrics")[1], "vllm:nixl_bytes_transferred_count") == 1
        assert metric(get(ports["prefill"], "/metrics")[1], "vllm:generation_tokens_total") == 1
    finally:
        cluster.stop()


def selects(selector: dict, labels: dict) -> bool:
    """A LabelSelector's matchLabels and Exists expressions, as the API server reads them."""
    exists = all(e["key"] in labels for e in selector.get("matchExpressions", []) if e["operator"] == "Exists")
    assert all(e["operator"] == "Exists" for e in selector.get("matchExpressions", [])), selector
    return exists and all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def pod_labels(deployment: dict) -> dict:
    return deployment["spec"]["template"]["metadata"]["labels"]


def test_the_pools_admit_the_proxy_to_their_port_and_the_decode_pods_to_the_kv_transfer():
    """A client that reached a decode server itself could name any remote_host in its
    kv_transfer_params; the pools' NetworkPolicy leaves their serving port to the proxy and
    NIXL's side channel to the decode pods."""
    made = children(pd_model())
    policy = made[("NetworkPolicy", "m-pools")]["spec"]
    proxy, prefill, decode = (made[("Deployment", n)] for n in ("m", "m-prefill", "m-decode"))
    assert selects(policy["podSelector"], pod_labels(prefill)) and selects(policy["podSelector"], pod_labels(decode))
    assert not selects(policy["podSelector"], pod_labels(proxy))
    serving, side = policy["ingress"]
    [port] = [p["containerPort"] for p in prefill["spec"]["template"]["spec"]["containers"][0]["ports"] if p["name"] == "serve-0"]
    assert serving["ports"] == [{"port": port, "protocol": "TCP"}]
    assert [selects(f["podSelector"], pod_labels(proxy)) for f in serving["from"]] == [True]
    assert not selects(serving["from"][0]["podSelector"], pod_labels(decode))
    # Every port: the side channel, and libfabric's own where it moves the KV cache over TCP.
    assert "ports" not in side
    assert [selects(f["podSelector"], pod_labels(decode)) for f in side["from"]] == [True]
    assert not selects(side["from"][0]["podSelector"], pod_labels(prefill))


def test_the_pools_admit_the_namespace_of_the_prometheus_that_scrapes_them():
    from inferentia_operator.core.settings import Settings

    made = rendered(pd_model(), Settings(prometheus_namespace="monitoring"))
    [policy] = [c["spec"] for c in made if (c["kind"], c["metadata"]["name"]) == ("NetworkPolicy", "m-pools")]
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}} in policy["ingress"][0]["from"]
    assert len(policy["ingress"][1]["from"]) == 1  # the KV transfer: still the decode pods alone


def test_the_operators_prometheus_namespace_reaches_the_pools_policy():
    from inferentia_operator.core.settings import Settings

    body = {"metadata": {"name": "m", "namespace": "ns", "uid": UID, "generation": 1}, "spec": pd_spec(), "status": {}}
    decision = decide(Observed.of(body), "2026-01-01T00:00:00Z", Settings(prometheus_namespace="monitoring"))
    [policy] = [c for c in decision.apply if (c["kind"], c["metadata"]["name"]) == ("NetworkPolicy", "m-pools")]
    assert policy["spec"]["ingress"][0]["from"][1]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "monitoring"}
