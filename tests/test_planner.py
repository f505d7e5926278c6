"""Every plan field, table-driven, plus the properties that must hold for every valid spec."""

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferentia_operator.core.api import InferentiaModelSpec
from inferentia_operator.core.catalogue import FAMILIES, GIB
from inferentia_operator.core.cores import divisors, tensor_parallel_processes
from inferentia_operator.core.findings import errors
from inferentia_operator.core.parsing import parse_spec
from inferentia_operator.core.planner import InvalidSpec, plan
from specs import DROP, make_spec


def plan_of(**overrides):
    return plan(InferentiaModelSpec.model_validate(make_spec(**overrides)))


def test_plan_of_a_throughput_cnn():
    p = plan_of(
        **{
            "model.architecture": "cnn",
            "model.weights": 25_000_000,
            "processesPerReplica": 4,
            "compile.batchSize": 4,
            "compute.cpu": "2",
            "compute.memory": "4Gi",
        }
    )
    assert (p.family, p.chips, p.cores_per_chip, p.total_cores, p.group_size, p.groups) == ("inf1", 1, 4, 4, 1, 4)
    assert p.visible_cores == ["0", "1", "2", "3"]
    assert p.device_memory_per_group_bytes == 8 * GIB  # a one-core group sees its whole chip...
    assert p.device_memory_share_per_group_bytes == 2 * GIB  # ...and owns a quarter of it
    assert p.static_weights is True  # auto: 50 MB of fp16 weights fit 2 GiB
    assert p.compiler_args == [
        "--neuroncore-pipeline-cores", "1",
        "--batching_en", "--rematerialization_en", "--spill_dis", "--sb_size", "100",
        "--enable-replication", "True",
        "--static-weights",
    ]  # fmt: skip
    assert p.resources.requests == {"aws.amazon.com/neuron": "1", "cpu": "2", "memory": "4Gi"}
    assert p.resources.limits == {"aws.amazon.com/neuron": "1", "memory": "4Gi"}
    assert p.instance_types == ["inf1.xlarge", "inf1.2xlarge", "inf1.6xlarge", "inf1.24xlarge"]
    assert p.env[2] == {
        "NEURON_RT_VISIBLE_CORES": "2",
        "NEURON_RT_NUM_CORES": "1",
        "NEURONCORE_GROUP_SIZES": "1",
        "NEURON_MAX_NUM_INFERS": "4",
        "NEURON_CC_FLAGS": " ".join(p.compiler_args),
        "INFERENTIA_PROCESS_INDEX": "2",
        "INFERENTIA_THREADS": "4",
    }


@pytest.mark.parametrize(
    "overrides,visible,seen_gib",
    [
        ({"compute.inf": 2, "processesPerReplica": 1}, ["0-7"], 16),
        ({"compute.inf": 2, "processesPerReplica": 2}, ["0-3", "4-7"], 8),
        ({"compute.inf": 2, "processesPerReplica": 4}, ["0-1", "2-3", "4-5", "6-7"], 8),
        ({"compute.inf": 3, "processesPerReplica": 4}, ["0-2", "3-5", "6-8", "9-11"], 16),  # straddles: warned
        ({"compute.family": "inf2", "compute.inf": 12, "processesPerReplica": 3}, ["0-7", "8-15", "16-23"], 128),
        ({"compute.family": "trn2", "processesPerReplica": 2}, ["0-1", "2-3"], 96),  # lnc 2: 4 logical cores a chip
        ({"compute.family": "trn2", "compute.lnc": 1, "processesPerReplica": 2}, ["0-3", "4-7"], 96),
    ],
)
def test_groups_and_their_memory(overrides, visible, seen_gib):
    p = plan_of(**overrides)
    assert p.visible_cores == visible
    assert p.device_memory_per_group_bytes == seen_gib * GIB


@pytest.mark.parametrize(
    "overrides,expected_tail",
    [
        ({"model.precision": "mixed"}, ["--fp32-cast=matmult"]),
        ({"compile.staticWeights": True}, ["--static-weights"]),
        ({"compile.extraArgs": ["--verbose", "35"], "model.precision": "mixed"}, ["--fp32-cast=matmult", "--verbose", "35"]),
        ({"model.architecture": "transformer", "compile.batchSize": 4}, []),  # batching flags are CNN-only
        ({"model.architecture": "cnn", "compile.batchSize": 1}, []),
    ],
)
def test_compiler_args(overrides, expected_tail):
    p = plan_of(**overrides)
    assert p.compiler_args == ["--neuroncore-pipeline-cores", "4", *expected_tail]


@pytest.mark.parametrize(
    "overrides,static",
    [
        ({"model.weights": 4 * GIB}, True),  # 2-byte fp16 weights exactly fill a 4-core group's 8 GiB share
        ({"model.weights": 4 * GIB + 1}, False),
        ({"model.weights": 2 * GIB // 4, "model.precision": "fp32", "processesPerReplica": 4}, True),
        ({"model.weights": 2 * GIB // 4 + 1, "model.precision": "fp32", "processesPerReplica": 4}, False),
        ({}, False),  # unknown weights: auto stays off
        ({"compile.staticWeights": False, "model.weights": 10}, False),
    ],
)
def test_static_weights_auto(overrides, static):
    # No buckets: at these sizes the bucket-count bound would refuse even one.
    assert plan_of(**{"compile.buckets": DROP, **overrides}).static_weights is static


def test_instance_types_follow_chips_and_the_users_list():
    assert plan_of(**{"compute.inf": 4}).instance_types == ["inf1.6xlarge", "inf1.24xlarge"]
    assert plan_of(**{"compute.inf": 4, "compute.instanceTypes": ["inf1.24xlarge", "inf1.xlarge"]}).instance_types == ["inf1.24xlarge"]
    assert plan_of(**{"compute.family": "inf2", "compute.inf": 6}).instance_types == ["inf2.24xlarge", "inf2.48xlarge"]


@pytest.mark.parametrize("family", ["inf1", "inf2", "trn1", "trn2"])
def test_no_family_requests_hugepages_unless_the_model_asks(family):
    """The Neuron Runtime 2.x needs no hugepages; a request no node reserves is unschedulable."""
    for request in ({"compute.inf": 1}, {"compute.inf": DROP, "compute.cores": 1, **({"compute.lnc": 1} if family == "trn2" else {})}):
        p = plan_of(**{"compute.family": family, **request})
        assert "hugepages-2Mi" not in p.resources.requests and "hugepages-2Mi" not in p.resources.limits
        asked = plan_of(**{"compute.family": family, **request, "compute.hugepages": "256Mi"})
        assert asked.resources.requests["hugepages-2Mi"] == asked.resources.limits["hugepages-2Mi"] == "256Mi"


def test_threads():
    p = plan_of(**{"compute.inf": 4, "processesPerReplica": 2, "serving.threadsPerProcess": 12})
    assert p.threads_per_process == 12
    assert {e["NEURON_MAX_NUM_INFERS"] for e in p.env} == {"11"}  # 8 cores per group + 3


def test_plan_refuses_an_invalid_spec():
    spec = InferentiaModelSpec.model_validate(make_spec(processesPerReplica=3))
    with pytest.raises(InvalidSpec) as caught:
        plan(spec)
    assert "valid values are 1, 2, 4" in str(caught.value)


def test_warnings_reach_the_plan():
    assert any("straddle" in w for w in plan_of(**{"compute.inf": 3, "processesPerReplica": 4}).warnings)


def _range(text):
    first, _, last = text.partition("-")
    return range(int(first), int(last or first) + 1)


family_lnc_and_chips = st.sampled_from(list(FAMILIES.values())).flatmap(
    lambda f: st.tuples(
        st.just(f),
        st.sampled_from(f.lnc_values),
        st.sampled_from(f.allowed_chip_counts or range(1, f.max_chips + 1)),
    )
)


def spec_of(fam, lnc, chips, processes):
    overrides = {"compute.family": fam.name, "compute.inf": chips, "processesPerReplica": processes}
    if lnc != fam.default_lnc or fam.name == "trn2":
        overrides["compute.lnc"] = lnc  # trn2 both spelled out and defaulted below
    return make_spec(**overrides)


@settings(max_examples=400, deadline=None)
@given(family_lnc_and_chips, st.data())
def test_every_divisor_gives_a_complete_disjoint_ordered_layout(fc, data):
    fam, lnc, chips = fc
    per_chip = fam.cores_per_chip(lnc)
    total = per_chip * chips
    processes = data.draw(st.sampled_from(divisors(total)))
    parsed, found = parse_spec(spec_of(fam, lnc, chips, processes))
    if not fam.tensor_parallel_ok(total // processes):
        # trn1: a group size its runtime cannot run is refused, naming the sizes it can
        assert [f.path for f in errors(found)] == ["spec.processesPerReplica"]
        assert processes not in tensor_parallel_processes(fam, total)
        return
    assert errors(found) == []
    p = plan(parsed)
    assert p.groups * p.group_size == p.total_cores == total
    ranges = [_range(v) for v in p.visible_cores]
    assert [c for r in ranges for c in r] == list(range(total))  # ordered, disjoint, complete
    assert all(len(r) == p.group_size for r in ranges)
    if per_chip % p.group_size == 0:  # a group that fits in a chip stays in it
        assert all(r[0] // per_chip == r[-1] // per_chip for r in ranges)
    assert [e["NEURON_RT_VISIBLE_CORES"] for e in p.env] == p.visible_cores
    assert p.compiler == ("neuronx-cc" if fam.neuronx else "neuron-cc")
    if fam.neuronx:
        assert p.lnc == lnc and p.tensor_parallel_size == p.group_size
        assert {e["NEURON_LOGICAL_NC_CONFIG"] for e in p.env} == {str(lnc)}
        assert {e["INFERENTIA_TENSOR_PARALLEL_SIZE"] for e in p.env} == {str(p.group_size)}
        assert fam.tensor_parallel_ok(p.group_size)
        assert p.device_memory_share_per_group_bytes * p.groups == fam.memory_per_chip_bytes * chips
    else:
        assert p.lnc is None and p.tensor_parallel_size is None


@settings(max_examples=300, deadline=None)
@given(family_lnc_and_chips, st.integers(min_value=1, max_value=300))
def test_every_non_divisor_is_refused_with_every_divisor(fc, processes):
    fam, lnc, chips = fc
    total = fam.cores_per_chip(lnc) * chips
    spec = spec_of(fam, lnc, chips, processes)
    messages = [f.message for f in errors(parse_spec(spec)[1])]
    if total % processes == 0:
        assert messages == [] or not fam.tensor_parallel_ok(total // processes)
    else:
        expected = ", ".join(str(d) for d in divisors(total))
        assert any(m.endswith(f"over {processes} processes; valid values are {expected}") for m in messages), messages


@pytest.mark.parametrize(
    "family,precision,architecture,lnc,expected",
    [
        ("inf2", "fp32", "other", None, ["--target", "inf2", "--auto-cast", "none"]),
        ("inf2", "fp16", "other", None, ["--target", "inf2", "--auto-cast", "all", "--auto-cast-type", "fp16"]),
        ("inf2", "bf16", "transformer", None,
         ["--target", "inf2", "--auto-cast", "all", "--auto-cast-type", "bf16", "--model-type", "transformer"]),
        ("inf2", "mixed", "cnn", None, ["--target", "inf2", "--auto-cast", "matmult", "--auto-cast-type", "bf16"]),
        ("trn1", "fp32", "transformer", None, ["--target", "trn1", "--auto-cast", "none", "--model-type", "transformer"]),
        ("trn1", "bf16", "other", None, ["--target", "trn1", "--auto-cast", "all", "--auto-cast-type", "bf16"]),
        ("trn2", "fp16", "other", None, ["--target", "trn2", "--auto-cast", "all", "--auto-cast-type", "fp16", "--lnc", "2"]),
        ("trn2", "fp32", "transformer", 1,
         ["--target", "trn2", "--auto-cast", "none", "--model-type", "transformer", "--lnc", "1"]),
        ("trn2", "mixed", "other", 2, ["--target", "trn2", "--auto-cast", "matmult", "--auto-cast-type", "bf16", "--lnc", "2"]),
    ],
)  # fmt: skip
def test_neuronx_cc_flags_per_family_and_precision(family, precision, architecture, lnc, expected):
    overrides = {"compute.family": family, "model.precision": precision, "model.architecture": architecture,
                 "compile.batchSize": 4, "compile.extraArgs": ["-O", "2"]}  # fmt: skip
    if lnc:
        overrides["compute.lnc"] = lnc
    p = plan_of(**overrides)
    assert p.compiler == "neuronx-cc"
    assert p.compiler_args == [*expected, "-O", "2"]  # never a neuron-cc flag, extraArgs last
    assert p.static_weights is False
    assert {e["NEURON_CC_FLAGS"] for e in p.env} == {" ".join(p.compiler_args)}
    assert all("NEURONCORE_GROUP_SIZES" not in e and "NEURON_MAX_NUM_INFERS" not in e for e in p.env)


def test_trn2_counts_logical_cores():
    p = plan_of(**{"compute.family": "trn2", "compute.inf": 2, "processesPerReplica": 2})
    assert (p.lnc, p.cores_per_chip, p.total_cores, p.group_size, p.tensor_parallel_size) == (2, 4, 8, 4, 4)
    assert p.visible_cores == ["0-3", "4-7"]
    assert p.device_memory_share_per_group_bytes == 96 * GIB  # 24 GiB per logical core
    assert p.env[1]["NEURON_LOGICAL_NC_CONFIG"] == "2"
    assert p.compiler_args[-2:] == ["--lnc", "2"]  # the compiler's LNC matches the runtime's


GOLDEN = Path(__file__).parent / "golden" / "inf1-plans.json"


def test_inf1_plans_are_byte_for_byte_what_they_were():
    """tests/golden/inf1-plans.json was written by the planner before Neuron 2.x planning:
    every inf1 plan keeps every field and value, gains only compiler: neuron-cc, with these
    deliberate exceptions: fp32 models now compile with --fast-math none, which keeps them in
    FP32 where neuron-cc's default cast them to BF16; no plan requests hugepages-2Mi any more
    (AWS's examples for the Neuron Runtime 2.x request none); and every golden case, a
    TensorFlow model with a compile image, is now refused (the operator's compile program
    traces PyTorch; tensorflow-neuron is archived by AWS), so each is planned as the same model
    in PyTorch, which gains the compile program's inputDtype and a new compile hash (its
    artefact is now TorchScript per bucket with a manifest and a completion marker); and every
    plan gains the pods' sizes (issue 40), which tests/test_sizing.py checks."""
    from inferentia_operator.core.planner import InvalidSpec
    from inferentia_operator.core.pod.artefact import compile_hash
    from inferentia_operator.core.pod.model import Model, plan_document

    cases = json.loads(GOLDEN.read_text())
    assert len(cases) > 50
    fp32 = 0
    for case in cases:
        with pytest.raises(InvalidSpec, match="tensorflow cannot be compiled by the operator"):
            plan(InferentiaModelSpec.model_validate(case["spec"]))
        as_pytorch = {**case["spec"], "model": {**case["spec"]["model"], "framework": "pytorch"}}
        spec = InferentiaModelSpec.model_validate(as_pytorch)
        p = plan(spec)
        document = plan_document(p)
        assert document.pop("compiler") == "neuron-cc"
        assert document.pop("sizes") == p.sizes.model_dump(by_alias=True, exclude_none=True)
        assert document.pop("inputDtype") == ("int64" if spec.model.architecture == "transformer" else "float32")
        # Golden specs have no buckets: as PyTorch models, the compile program warns that it needs them.
        document["warnings"] = [w for w in document["warnings"] if "the operator's compile program (without compile.image" not in w]
        # Host memory below what the processes' weights need is warned of now (pods sized from the model).
        document["warnings"] = [w for w in document["warnings"] if "a replica of this model needs to" not in w]
        expected = case["plan"]
        assert expected["resources"]["requests"].pop("hugepages-2Mi") == expected["resources"]["limits"].pop("hugepages-2Mi")
        if spec.model.precision == "fp32":
            fp32 += 1
            args = [*expected["compilerArgs"], "--fast-math", "none"]
            env = [{**e, "NEURON_CC_FLAGS": " ".join(args)} for e in expected["env"]]
            expected = {**expected, "compilerArgs": args, "env": env}
        assert json.dumps(document, sort_keys=True) == json.dumps(expected, sort_keys=True)
        assert compile_hash(Model("m", "default", "u", spec, p)) != case["compileHash"]
    assert fp32 > 0


def test_a_core_request_shares_its_chip_and_sees_only_its_cores_memory():
    p = plan_of(**{"compute.inf": DROP, "compute.family": "inf2", "compute.cores": 1, "compute.cpu": "1", "compute.memory": "4Gi"})
    assert (p.chips, p.total_cores, p.group_size, p.groups, p.visible_cores) == (None, 1, 1, 1, ["0"])
    assert p.shares_chip is True
    assert p.chip_memory_share_bytes == p.device_memory_per_group_bytes == p.device_memory_share_per_group_bytes == 16 * GIB
    assert p.resources.requests["aws.amazon.com/neuroncore"] == "1" and "aws.amazon.com/neuron" not in p.resources.requests
    assert p.resources.limits["aws.amazon.com/neuroncore"] == "1"
    assert "hugepages-2Mi" not in p.resources.requests
    # By cores an inf2.xlarge holds 2 such replicas, an inf2.48xlarge 24; by CPU fewer may fit.
    assert p.replicas_per_instance == {"inf2.xlarge": 2, "inf2.8xlarge": 2, "inf2.24xlarge": 12, "inf2.48xlarge": 24}
    cpu_bound = plan_of(**{"compute.inf": DROP, "compute.family": "inf2", "compute.cores": 1, "compute.cpu": "3"})
    assert cpu_bound.replicas_per_instance is not None and cpu_bound.replicas_per_instance["inf2.xlarge"] == 1


def test_whole_chip_plans_are_unchanged_by_core_requests():
    p = plan_of(**{"compute.family": "inf2"})
    assert (p.chips, p.shares_chip, p.chip_memory_share_bytes, p.replicas_per_instance) == (1, None, None, None)
    assert p.resources.requests["aws.amazon.com/neuron"] == "1"


def test_a_core_request_divides_among_processes_like_chips_do():
    p = plan_of(**{"compute.inf": DROP, "compute.cores": 3, "processesPerReplica": 3})
    assert (p.total_cores, p.group_size, p.visible_cores) == (3, 1, ["0", "1", "2"])
    assert p.device_memory_per_group_bytes == 2 * GIB  # one inf1 core's share, not the chip's 8 GiB
    assert [e["NEURON_RT_VISIBLE_CORES"] for e in p.env] == ["0", "1", "2"]
