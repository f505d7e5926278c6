"""The rules of prefill and decode pools (spec.disaggregation, core/rules/disaggregation.py): the
plugin's runtime and families, what the pools cannot combine with, each pool's parallelism against
its cores, and the one artefact a compile ahead makes."""

from __future__ import annotations

import pytest

from inferentia_operator.core.api import InferentiaModelSpec
from inferentia_operator.core.rules import check_spec
from specs import PD_IMAGE as IMAGE
from specs import pd_spec


def messages(spec: dict) -> list[str]:
    return [str(f) for f in check_spec(InferentiaModelSpec.model_validate(spec)) if f.severity == "error"]


def test_the_sample_shape_is_valid():
    assert messages(pd_spec()) == []


def test_batching_with_vllm_is_its_max_num_seqs_in_both_pools():
    """With vLLM, serving.batching is --max-num-seqs and runs no front end: the pools take it."""
    assert messages(pd_spec(**{"serving.batching": {"maxBatchSize": 4}})) == []


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"serving.runtime": "custom"}, "spec.disaggregation"),
        ({"compute.family": "trn1", "compute.inf": 1}, "trn2 or trn3"),
        ({"autoscaling": {"minReplicas": 1, "maxReplicas": 2}}, "spec.autoscaling"),
        ({"routing": {"inferencePool": {}}}, "spec.routing.inferencePool"),
        ({"processesPerReplica": 2}, "spec.processesPerReplica"),
        ({"disaggregation.decode.tensorParallelSize": 3}, "spec.disaggregation.decode"),
        ({"disaggregation.prefill.dataParallelSize": 3}, "spec.disaggregation.prefill"),
    ],
)
def test_what_the_pools_cannot_combine_with_is_refused(overrides, words):
    found = messages(pd_spec(**overrides))
    assert any(words in m for m in found), found


def test_parallelism_that_does_not_fill_the_pools_cores_names_them():
    (message,) = [m for m in messages(pd_spec(**{"disaggregation.decode.tensorParallelSize": 3})) if "decode" in m]
    assert "3" in message and "8 NeuronCores" in message


def test_a_compile_ahead_needs_pools_of_the_computes_shape():
    found = messages(pd_spec(**{"compile.image": IMAGE, "compile.outputUri": "s3://b/c/"}))
    assert any("spec.compile.image" in m and "decode" in m for m in found), found
    same = {"prefill": {"replicas": 1}, "decode": {"replicas": 2}}
    assert messages(pd_spec(**{"compile.image": IMAGE, "compile.outputUri": "s3://b/c/", "disaggregation": same})) == []


def test_a_pool_on_chips_of_its_own_is_checked_as_a_replica_of_that_size():
    """70B in bf16 needs two trn2 chips: a decode pool of one is refused, under the pool."""
    big = {"model.weights": 70_600_000_000, "compute.inf": 2, "disaggregation": {"decode": {"inf": 1}}}
    # (and its TP 4 under the prefill's TP 8, which NIXL refuses: the next tests)
    found = messages(pd_spec(**big))
    assert any(m.startswith("spec.disaggregation.decode.inf: is 1, and on 1 chips spec.compute.inf:") for m in found), found
    assert messages(pd_spec(**{**big, "disaggregation": {"decode": {"inf": 4}}})) == []


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_data_parallel_pools_are_refused_until_memory_is_checked_per_engine(role):
    """Each data-parallel engine holds all the weights over its own TP cores, and vLLM gives each
    --num-gpu-blocks-override: the memory check, over the replica's chips as one engine, cannot
    judge that, so dataParallelSize above 1 is refused (a 70B bf16 decode DP16 over 16 chips
    passed it)."""
    big = {"model.weights": 70_600_000_000, "compute.inf": 2, "disaggregation": {role: {"inf": 16, "dataParallelSize": 16}}}
    found = messages(pd_spec(**big))
    assert any(m.startswith(f"spec.disaggregation.{role}.dataParallelSize: is 16") and "valid values are 1" in m for m in found), found


def test_pools_with_dra_allocation_are_refused_written_or_by_the_operators_default():
    """With allocation dra a pool's own inf names ResourceClaimTemplates nothing writes: the pools
    take devices from the device plugin only, whether the spec or the operator's --allocation
    says dra."""
    from inferentia_operator.core.model import check_model

    found = messages(pd_spec(**{"compute.allocation": "dra"}))
    assert any(m.startswith("spec.compute.allocation: is dra") and "devicePlugin" in m for m in found), found
    checked = check_model("m", "ns", pd_spec(), allocation="dra")
    assert any(f.path == "spec.compute.allocation" for f in checked.findings if f.severity == "error"), checked.findings
    assert check_model("m", "ns", pd_spec(), allocation="devicePlugin").model is not None


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_an_empty_pool_is_refused_while_the_proxy_serves(role):
    """The proxy would send every request to a pool with no server: 0 only with spec.replicas 0."""
    found = messages(pd_spec(**{f"disaggregation.{role}.replicas": 0}))
    assert any(m.startswith(f"spec.disaggregation.{role}.replicas: is 0") and "valid values are 1" in m for m in found), found
    assert messages(pd_spec(**{f"disaggregation.{role}.replicas": 0, "replicas": 0})) == []


def test_the_serving_port_may_not_be_nixls_side_channel():
    found = messages(pd_spec(**{"serving.port": 5557}))
    assert any(m.startswith("spec.serving.port: is 5557") for m in found), found


@pytest.mark.parametrize(
    "flag",
    ["--tensor-parallel-size", "--tensor_parallel_size", "-tp", "--data-parallel-size", "--data_parallel_size", "-dp",
     "--kv-transfer-config", "--kv_transfer_config", "--tensor-parallel-size=8"],
)  # fmt: skip
def test_serving_args_may_not_set_what_each_pool_sets(flag):
    """Each pool's --tensor-parallel-size, --data-parallel-size and --kv-transfer-config are its
    own: serving.args come last and would override them in both pools."""
    found = messages(pd_spec(**{"serving.args": [flag, "8"] if "=" not in flag else [flag]}))
    assert any(m.startswith(f"spec.serving.args: {flag} ") for m in found), found
    assert messages(pd_spec(**{"serving.args": ["--max-model-len", "4096"]})) == []


def test_autoscaling_the_whole_model_is_refused_pointing_at_each_pools_own():
    (message,) = messages(pd_spec(autoscaling={"minReplicas": 1, "maxReplicas": 2, "targetInFlight": 4}))
    assert message.startswith("spec.autoscaling: cannot be combined with spec.disaggregation")
    assert "spec.disaggregation.prefill.autoscaling" in message and "spec.disaggregation.decode.autoscaling" in message


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_a_pool_does_not_scale_to_zero(role):
    target = {"prefill": {"targetWaiting": 2}, "decode": {"targetRunning": 2}}[role]
    spec = pd_spec(**{f"disaggregation.{role}.autoscaling": {"minReplicas": 0, "maxReplicas": 3, **target}})
    assert messages(spec) == [
        f"spec.disaggregation.{role}.autoscaling.minReplicas: is 0: a pool does not scale to zero, since the proxy would send "
        "every request to a pool with no server while one starts; valid values are 1 to maxReplicas (3)"
    ]


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_a_pools_range_must_be_one(role):
    target = {"prefill": {"targetWaiting": 2}, "decode": {"targetRunning": 2}}[role]
    spec = pd_spec(**{f"disaggregation.{role}.autoscaling": {"minReplicas": 4, "maxReplicas": 3, **target}})
    assert messages(spec) == [
        f"spec.disaggregation.{role}.autoscaling.minReplicas: 4 is larger than maxReplicas 3; valid values are 1 to maxReplicas"
    ]


@pytest.mark.parametrize(("role", "field"), [("prefill", "targetWaiting"), ("decode", "targetRunning")])
def test_a_pools_target_is_named_or_follows_from_the_batch(role, field):
    spec = pd_spec(**{f"disaggregation.{role}.autoscaling": {"maxReplicas": 3}})
    (message,) = messages(spec)
    assert message.startswith(f"spec.disaggregation.{role}.autoscaling.{field}: is required without spec.serving.batching")
    assert messages(pd_spec(**{f"disaggregation.{role}.autoscaling": {"maxReplicas": 3, field: 2}})) == []
    assert messages(pd_spec(**{"serving.batching": {"maxBatchSize": 4}, f"disaggregation.{role}.autoscaling": {"maxReplicas": 3}})) == []


def test_an_autoscaled_pool_is_not_an_empty_pool_whatever_its_replicas():
    scaled = {"replicas": 0, "autoscaling": {"maxReplicas": 2, "targetWaiting": 1}}
    assert messages(pd_spec(**{"disaggregation.prefill": scaled})) == []


def test_each_pools_autoscaling_takes_only_its_own_signals_target():
    from inferentia_operator.core.parsing import parse_spec

    _, found = parse_spec(pd_spec(**{"disaggregation.prefill.autoscaling": {"maxReplicas": 2, "targetRunning": 2}}))
    assert any("targetRunning" in str(f) for f in found), found


def test_efa_required_needs_an_instance_type_whose_efa_count_is_known():
    """trn3's types have no EFA count the operator knows: required is refused there, naming the
    field, its value and what is valid; auto and off pass (auto with a warning)."""
    (message,) = messages(pd_spec(**{"compute.family": "trn3", "disaggregation.efa": "required"}))
    assert message.startswith(
        "spec.disaggregation.efa: is required, and no trn3 instance type the pools may use (trn3e.24xlarge, trn3.48xlarge)"
    )
    assert "valid values: auto or off" in message and "trn2.48xlarge, trn2u.48xlarge" in message
    for efa in ("auto", "off"):
        assert messages(pd_spec(**{"compute.family": "trn3", "disaggregation.efa": efa})) == []
    # On trn2, required holds where the listed types include one with a count, not where they do not.
    assert messages(pd_spec(**{"disaggregation.efa": "required"})) == []
    one_chip = {"disaggregation": {"efa": "required", "decode": {"inf": 1}}, "compute.instanceTypes": ["trn2.3xlarge"]}
    (listed,) = messages(pd_spec(**one_chip))
    assert listed.startswith(
        "spec.disaggregation.efa: is required, and no trn2 instance type the pools may use (spec.compute.instanceTypes)"
    )


def test_auto_on_a_family_of_no_known_efa_count_warns_and_off_silences_it():
    def warnings(spec: dict) -> list[str]:
        return [str(f) for f in check_spec(InferentiaModelSpec.model_validate(spec)) if f.severity == "warning"]

    assert [w for w in warnings(pd_spec(**{"compute.family": "trn3"})) if "spec.disaggregation.efa" in w]
    assert not [w for w in warnings(pd_spec(**{"compute.family": "trn3", "disaggregation.efa": "off"})) if "efa" in w]
    assert not [w for w in warnings(pd_spec()) if "efa" in w]


def test_every_efa_type_of_the_plugins_families_holds_its_familys_most_chips():
    """What EFA_REQUIRED's CEL relies on: a pool that fits its family fits each such type."""
    from inferentia_operator.core.catalogue import FAMILIES
    from inferentia_operator.core.rules.disaggregation import EFA_TYPES

    assert EFA_TYPES == ["trn2.48xlarge", "trn2u.48xlarge"]
    for itype in EFA_TYPES:
        [family] = [f for f in FAMILIES.values() if itype in f.instance_chips]
        assert family.instance_chips[itype] == family.max_chips


def test_an_efa_share_is_a_pods_chips_share_of_its_instances_devices():
    from inferentia_operator.core.catalogue import efa_share

    assert [efa_share("trn2.48xlarge", n) for n in (1, 2, 16)] == [1, 2, 16]
    assert efa_share("trn2u.48xlarge", 4) == 4
    # trn1.32xlarge: 8 devices for 16 chips, rounded up so that a one-chip pod still gets one.
    assert [efa_share("trn1.32xlarge", n) for n in (1, 2, 16)] == [1, 1, 8]
    assert efa_share("trn2.3xlarge", 1) is None and efa_share("trn3.48xlarge", 16) is None


@pytest.mark.parametrize(("prefill", "decode"), [(2, 1), (2, 3), (4, 2)])
def test_a_decode_pool_whose_tp_is_no_multiple_of_the_prefills_is_refused_as_nixl_refuses_it(prefill, decode):
    """vLLM's NixlConnector reads a prefill's KV only into a decode whose tensor-parallel size is
    a multiple of the prefill's: ``tp_ratio = divide(decode_tp, prefill_tp)`` (vllm.distributed's
    divide asserts divisibility) and ``assert tp_ratio > 0, "Decode TP cannot be smaller than
    prefill TP"`` at the first read, so a narrower or uneven decode pool would fail every request
    on hardware. trn2 at LNC 2: 4 logical cores a chip."""
    found = messages(pd_spec(disaggregation={"prefill": {"inf": prefill}, "decode": {"inf": decode}}))
    expected = (
        f"spec.disaggregation.decode.tensorParallelSize: is {decode * 4}, and the prefill pool's is {prefill * 4}: vLLM's NixlConnector"
    )
    assert any(m.startswith(expected) and f"valid values are multiples of {prefill * 4}" in m for m in found), found


@pytest.mark.parametrize(("prefill", "decode"), [(1, 1), (1, 2), (2, 2), (2, 4), (1, 3)])
def test_a_decode_pool_of_the_prefills_tp_or_a_multiple_of_it_is_valid(prefill, decode):
    """The DI design page's own pair is a TP 4 prefill and a TP 8 decode."""
    assert messages(pd_spec(disaggregation={"prefill": {"inf": prefill}, "decode": {"inf": decode}})) == []
