"""Table-driven tests of every validation rule, messages included."""

import pkgutil

import pytest

from inferentia_operator.core import rules
from inferentia_operator.core.findings import errors
from inferentia_operator.core.parsing import parse_spec
from specs import DROP, make_spec


def findings_of(spec):
    _, found = parse_spec(spec)
    return [str(f) for f in found]


def error_lines(spec):
    _, found = parse_spec(spec)
    return [str(f) for f in errors(found)]


VALID = [
    pytest.param(make_spec(), id="minimal"),
    pytest.param(make_spec(**{"compute.inf": 16}), id="inf1-largest"),
    pytest.param(make_spec(**{"compute.inf": 2, "processesPerReplica": 8}), id="two-chips-eight-processes"),
    pytest.param(make_spec(**{"compute.family": "trn1", "compute.inf": 8}), id="trn1-eight"),
    pytest.param(make_spec(**{"compute.family": "inf2", "compute.inf": 12, "processesPerReplica": 24}), id="inf2-largest"),
    pytest.param(make_spec(**{"compile.staticWeights": True}), id="static-true-unknown-weights"),
    pytest.param(make_spec(**{"compile.buckets": [[500, 500], [600, 600]]}), id="image-buckets"),
    pytest.param(make_spec(**{"compute.cpu": 2, "compute.memory": "4Gi"}), id="int-cpu"),
    *[pytest.param(make_spec(**{"compute.hugepages": h}), id=f"hugepages-{h}") for h in ("2Mi", "256Mi", "1Gi", "2097152", 4194304)],
]


@pytest.mark.parametrize("spec", VALID)
def test_valid_specs_have_no_errors(spec):
    assert error_lines(spec) == []


INVALID = [
    # Rule 1: inf is a whole number of at least 1.
    ({"compute.inf": 0}, "spec.compute.inf: 0 is too small; valid values are at least 1"),
    ({"compute.inf": -2}, "spec.compute.inf: -2 is too small; valid values are at least 1"),
    ({"compute.inf": 1.5}, "spec.compute.inf: 1.5 is not a whole number; valid values are whole numbers"),
    ({"compute.inf": "2"}, "spec.compute.inf: '2' is not a whole number; valid values are whole numbers"),
    ({"compute.inf": True}, "spec.compute.inf: true is not a whole number; valid values are whole numbers"),
    # Rule 2: inf fits the family's largest instance.
    (
        {"compute.inf": 17},
        "spec.compute.inf: 17 chips do not fit any inf1 instance: the largest, inf1.24xlarge, has 16; valid values are 1 to 16",
    ),
    (
        {"compute.family": "inf2", "compute.inf": 13},
        "spec.compute.inf: 13 chips do not fit any inf2 instance: the largest, inf2.48xlarge, has 12; valid values are 1 to 12",
    ),
    # Rule 3: processes divide the NeuronCores.
    (
        {"processesPerReplica": 3},
        "spec.processesPerReplica: cannot evenly distribute 1 inf1 chip (4 NeuronCores) over 3 processes; valid values are 1, 2, 4",
    ),
    (
        {"compute.inf": 2, "processesPerReplica": 3},
        "spec.processesPerReplica: cannot evenly distribute 2 inf1 chips (8 NeuronCores) over 3 processes; valid values are 1, 2, 4, 8",
    ),
    (
        {"compute.family": "inf2", "processesPerReplica": 4},
        "spec.processesPerReplica: cannot evenly distribute 1 inf2 chip (2 NeuronCores) over 4 processes; valid values are 1, 2",
    ),
    (
        {"compute.family": "trn2", "processesPerReplica": 3},
        "spec.processesPerReplica: cannot evenly distribute 1 trn2 chip (4 NeuronCores) over 3 processes; valid values are 1, 2, 4",
    ),
    (
        {"compute.family": "trn3", "compute.inf": 2, "processesPerReplica": 3},
        "spec.processesPerReplica: cannot evenly distribute 2 trn3 chips (8 NeuronCores) over 3 processes; valid values are 1, 2, 4, 8",
    ),
    (
        {"compute.family": "trn3", "compute.inf": 17},
        "spec.compute.inf: 17 chips do not fit any trn3 instance: the largest, trn3.48xlarge, has 16; valid values are 1 to 16",
    ),
    ({"processesPerReplica": 0}, "spec.processesPerReplica: 0 is too small; valid values are at least 1"),
    # Rule 4: CNN batch limits.
    (
        {"model.architecture": "cnn", "model.precision": "fp32", "compile.batchSize": 2},
        "spec.compile.batchSize: a CNN in fp32 compiles only at batch size 1, got 2; valid values are 1 (or use precision fp16 for batch sizes up to 5)",
    ),
    # Rule 5: weights.
    (
        {"model.weights": 500_000_000, "processesPerReplica": 4, "compile.buckets": [[1], [2], [3]]},
        "spec.compile.buckets: 3 buckets do not fit: a group of 1 NeuronCores holds at most 2 bucketed models of 500000000 weights (round(1000000000 / weights) per NeuronCore)",
    ),
    (
        {"model.weights": 3_000_000_000, "compile.buckets": [[1]]},
        "spec.compile.buckets: 1 buckets do not fit: a group of 4 NeuronCores holds at most 0 bucketed models of 3000000000 weights (round(1000000000 / weights) per NeuronCore)",
    ),
    (
        {"model.weights": 3_000_000_000, "processesPerReplica": 2, "compile.staticWeights": True},
        "spec.compile.staticWeights: true needs 5.59 GiB for 3000000000 fp16 weights, but a group of 2 NeuronCores has a 4 GiB share of device memory; use auto or false, or fewer processesPerReplica",
    ),
    ({"compile.staticWeights": "yes"}, "spec.compile.staticWeights: 'yes' is not valid: valid values are auto, true, false"),
    # Rule 6: bucket shapes.
    (
        {"compile.buckets": [[64], [128, 128]]},
        "spec.compile.buckets: buckets have different numbers of dimensions [1, 2]; every bucket needs as many as the first (1)",
    ),
    (
        {"compile.buckets": [[64], [128], [64]]},
        "spec.compile.buckets: bucket [64] appears more than once; every bucket must be different",
    ),
    ({"compile.buckets": [[64], [0]]}, "spec.compile.buckets[1][0]: 0 is too small; valid values are at least 1"),
    ({"compile.buckets": [[]]}, "spec.compile.buckets[0]: must not be empty"),
    # Rule 7: trn1 device counts.
    (
        {"compute.family": "trn1", "compute.inf": 2},
        "spec.compute.inf: trn1 containers may use only 1, 4, 8 or 16 chips, got 2; valid values are 1, 4, 8, 16",
    ),
    # Instance types.
    (
        {"compute.instanceTypes": ["inf2.xlarge"]},
        "spec.compute.instanceTypes: 'inf2.xlarge' is not one of the inf1 instance types; valid values are inf1.xlarge, inf1.2xlarge, inf1.6xlarge, inf1.24xlarge",
    ),
    (
        {"compute.inf": 4, "compute.instanceTypes": ["inf1.xlarge"]},
        "spec.compute.instanceTypes: none of the listed instance types has 4 chips; inf1 types with at least 4 chips: inf1.6xlarge, inf1.24xlarge",
    ),
    # Enums and unknown fields.
    ({"model.framework": "jax"}, "spec.model.framework: 'jax' is not valid; valid values are tensorflow, pytorch"),
    ({"compute.family": "inf3"}, "spec.compute.family: 'inf3' is not valid; valid values are inf1, inf2, trn1, trn2, trn3"),
    (
        {"compute.chips": 1},
        "spec.compute.chips: is not a field of this object; check its spelling (kubectl explain inferentiamodel.spec lists the fields)",
    ),
    (
        {"compute.memory": "lots"},
        "spec.compute.memory: 'lots' is not a Kubernetes quantity; valid values are a non-negative number with an "
        "optional suffix (m, k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei, or an exponent such as e3), for example 500m, 2 or 4Gi",
    ),
    # Logical NeuronCores: trn2 takes 1 or 2, every other family only 1.
    ({"compute.family": "trn1", "compute.lnc": 2}, "spec.compute.lnc: 2 is not supported on trn1; valid values are 1"),
    ({"compute.family": "inf2", "compute.lnc": 2}, "spec.compute.lnc: 2 is not supported on inf2; valid values are 1"),
    ({"compute.family": "trn2", "compute.lnc": 4}, "spec.compute.lnc: 4 is not supported on trn2; valid values are 1, 2"),
    ({"compute.family": "trn3", "compute.lnc": 4}, "spec.compute.lnc: 4 is not supported on trn3; valid values are 1, 2"),
    (
        {"compute.family": "trn3", "compute.lnc": 1, "processesPerReplica": 3},
        "spec.processesPerReplica: cannot evenly distribute 1 trn3 chip (8 NeuronCores) over 3 processes; valid values are 1, 2, 4, 8",
    ),
    ({"compute.lnc": 0}, "spec.compute.lnc: 0 is too small; valid values are at least 1"),
    (
        {"compute.family": "trn2", "compute.lnc": 1, "processesPerReplica": 3},
        "spec.processesPerReplica: cannot evenly distribute 1 trn2 chip (8 NeuronCores) over 3 processes; valid values are 1, 2, 4, 8",
    ),
    # trn1 tensor-parallel groups: 1, 2, 8, 16 or a multiple of 32 cores.
    (
        {"compute.family": "trn1", "compute.inf": 4, "processesPerReplica": 2},
        "spec.processesPerReplica: a trn1 group of 4 NeuronCores cannot run one model tensor parallel: the runtime "
        "loads collectives only on 1, 2, 8, 16 or a multiple of 32 cores (huggingface/optimum-neuron#619); "
        "valid values for 8 NeuronCores are 1, 4, 8",
    ),
    (
        {"compute.family": "trn1", "compute.inf": 16, "processesPerReplica": 8},
        "spec.processesPerReplica: a trn1 group of 4 NeuronCores cannot run one model tensor parallel: the runtime "
        "loads collectives only on 1, 2, 8, 16 or a multiple of 32 cores (huggingface/optimum-neuron#619); "
        "valid values for 32 NeuronCores are 1, 2, 4, 16, 32",
    ),
    # The vLLM preset needs a neuronx family.
    (
        {"serving.runtime": "vllm"},
        "spec.serving.runtime: vllm does not run on inf1: vLLM on Neuron runs on NxD Inference (inf2, trn1) and "
        "the vLLM Neuron plugin (trn2, trn3) only; valid values on inf1 are custom",
    ),
    ({"serving.runtime": "tgi"}, "spec.serving.runtime: 'tgi' is not valid; valid values are custom, vllm"),
    # NeuronCore requests (spec.compute.cores) instead of whole chips.
    ({"compute.inf": DROP}, "spec.compute: set exactly one of inf (whole Neuron chips) and cores (NeuronCores): neither is set"),
    ({"compute.cores": 2}, "spec.compute: set exactly one of inf (whole Neuron chips) and cores (NeuronCores): both are set"),
    ({"compute.inf": DROP, "compute.cores": 0}, "spec.compute.cores: 0 is too small; valid values are at least 1"),
    (
        {"compute.inf": DROP, "compute.cores": 3, "processesPerReplica": 2},
        "spec.processesPerReplica: cannot evenly distribute 3 inf1 NeuronCores over 2 processes; valid values are 1, 3",
    ),
    (
        {"compute.inf": DROP, "compute.family": "inf2", "compute.cores": 25},
        "spec.compute.cores: 25 NeuronCores do not fit any inf2 instance: the largest, inf2.48xlarge, has 24; valid values are 1 to 24",
    ),
    (
        {"compute.inf": DROP, "compute.family": "trn1", "compute.cores": 4},
        "spec.compute.cores: trn1 containers may use one chip's NeuronCores or whole chips in groups of 1, 4, 8 or 16 "
        "(the Neuron scheduler extension), got 4 NeuronCores; valid values are 1, 2, 8, 16, 32",
    ),
    (
        {"compute.inf": DROP, "compute.family": "trn2", "compute.cores": 2},
        "spec.compute.cores: NeuronCore requests are planned at lnc 1 only, and this trn2 replica has lnc 2: how the Neuron "
        "device plugin counts aws.amazon.com/neuroncore under a logical NeuronCore configuration is not documented; valid "
        "values are cores with lnc: 1, or whole chips with inf",
    ),
    (
        {"compute.inf": DROP, "compute.family": "inf2", "compute.cores": 4, "compute.instanceTypes": ["inf2.xlarge"]},
        "spec.compute.instanceTypes: none of the listed instance types has 2 chips; inf2 types with at least 2 chips: "
        "inf2.24xlarge, inf2.48xlarge",
    ),
    (
        {"compute.inf": DROP, "compute.family": "trn1", "compute.cores": 8, "processesPerReplica": 2},
        "spec.processesPerReplica: a trn1 group of 4 NeuronCores cannot run one model tensor parallel: the runtime "
        "loads collectives only on 1, 2, 8, 16 or a multiple of 32 cores (huggingface/optimum-neuron#619); "
        "valid values for 8 NeuronCores are 1, 4, 8",
    ),
]


@pytest.mark.parametrize("overrides,expected", INVALID, ids=lambda v: str(v)[:60])
def test_invalid_specs_are_refused_with_the_message(overrides, expected):
    assert expected in error_lines(make_spec(**overrides))


@pytest.mark.parametrize(
    "overrides",
    [
        # These fit their group's share, so they are valid: listed to pin the boundary.
        {"model.weights": 2_000_000_000, "model.precision": "fp32", "compile.staticWeights": True},
        {"model.weights": 1_500_000_000, "processesPerReplica": 2, "compile.staticWeights": True},
        {"model.weights": 500_000_000, "processesPerReplica": 4, "compile.buckets": [[1], [2]]},
        {"model.weights": 500_000_000, "compile.buckets": [[1], [2], [3]]},
    ],
)
def test_boundaries_that_fit_are_valid(overrides):
    assert error_lines(make_spec(**overrides)) == []


@pytest.mark.parametrize(
    "overrides",
    [
        {"compute.inf": DROP, "compute.cores": 1},
        {"compute.inf": DROP, "compute.cores": 3, "processesPerReplica": 3},
        {"compute.inf": DROP, "compute.family": "inf2", "compute.cores": 24},
        {"compute.inf": DROP, "compute.family": "trn1", "compute.cores": 32, "processesPerReplica": 1},
        {"compute.inf": DROP, "compute.family": "trn2", "compute.lnc": 1, "compute.cores": 8, "processesPerReplica": 8},
    ],
)
def test_core_requests_that_can_be_placed_are_valid(overrides):
    assert error_lines(make_spec(**overrides)) == []


def test_missing_required_fields_are_named():
    lines = error_lines({"compute": {"inf": 1}})
    assert "spec.model: is required" in lines
    assert "spec.serving: is required" in lines


def test_a_spec_that_is_not_a_mapping_is_refused():
    assert error_lines(["not", "a", "mapping"]) == ["spec: must be a mapping of fields, not a list"]


WARNINGS = [
    (
        {"model.architecture": "cnn", "compile.batchSize": 6},
        "warning: spec.compile.batchSize: an fp16 CNN above batch size 5 may not compile (the compiler supports FP16 ResNet-50 up to batch 5), got 6",
    ),
    (
        {"compute.inf": 3, "processesPerReplica": 4},
        "warning: spec.processesPerReplica: groups of 3 NeuronCores straddle chip boundaries (4 cores per chip); values giving whole-chip or in-chip groups: 1, 3, 6, 12",
    ),
    (
        {"serving.threadsPerProcess": 2, "processesPerReplica": 2},
        "warning: spec.serving.threadsPerProcess: 2 threads cannot keep a group of 2 NeuronCores busy; use more than 2",
    ),
    (
        {"serving.batching": {"maxBatchSize": 8}, "compile.batchSize": 2},
        "warning: spec.serving.batching.maxBatchSize: 8 is larger than the compiled batch size 2; set spec.compile.dynamicBatchSize: true so the model accepts larger batches",
    ),
    (
        {"compile.optimizeFor": "throughput"},
        "warning: spec.processesPerReplica: throughput is usually best with one NeuronCore per group (processesPerReplica: 4); 1 gives groups of 4",
    ),
    (
        {"compile.optimizeFor": "latency", "processesPerReplica": 4},
        "warning: spec.processesPerReplica: latency usually improves with larger groups (NeuronCore pipeline); 4 gives groups of 1 core",
    ),
    (
        {"compile.staticWeights": True},
        "warning: spec.compile.staticWeights: true cannot be checked against the group's memory without spec.model.weights; the compile fails if the weights do not fit",
    ),
]


@pytest.mark.parametrize("overrides,expected", WARNINGS, ids=lambda v: str(v)[:60])
def test_warnings_do_not_block(overrides, expected):
    spec = make_spec(**overrides)
    assert expected in findings_of(spec)
    assert error_lines(spec) == []


NEURONX_VALID = [
    # neuron-cc's CNN batch limits do not apply to neuronx-cc families.
    {"compute.family": "inf2", "model.architecture": "cnn", "model.precision": "fp32", "compile.batchSize": 8},
    {"compute.family": "trn2", "compute.lnc": 2, "processesPerReplica": 4},
    {"compute.family": "trn2", "compute.lnc": 1, "processesPerReplica": 8},
    {"compute.family": "trn3", "compute.lnc": 2, "processesPerReplica": 4, "serving.runtime": "vllm"},
    {"compute.family": "trn3", "compute.lnc": 1, "compute.inf": 16, "processesPerReplica": 128},
    {"compute.family": "trn1", "compute.inf": 16, "processesPerReplica": 1},  # a group of 32
    {"compute.family": "inf2", "compute.inf": 2, "processesPerReplica": 1, "serving.runtime": "vllm"},
]


@pytest.mark.parametrize("overrides", NEURONX_VALID, ids=str)
def test_neuronx_specs_without_errors(overrides):
    assert error_lines(make_spec(**overrides)) == []


@pytest.mark.parametrize("value", [True, False])
def test_static_weights_on_a_neuronx_family_is_a_warning_not_a_silent_drop(value):
    spec = make_spec(**{"compute.family": "inf2", "compile.staticWeights": value, "model.weights": 10**10, "compile.buckets": DROP})
    assert error_lines(spec) == []  # not the inf1 memory check either: the option does nothing here
    assert (
        f"warning: spec.compile.staticWeights: {str(value).lower()} has no effect on inf2: static weights are a "
        "neuron-cc (inf1) option, and neuronx-cc has no --static-weights; remove it or leave it at auto"
    ) in findings_of(spec)


ONE_VERDICT = [
    *[
        ({"compute.memory": q}, f"spec.compute.memory: '{q}' is not a Kubernetes quantity")
        for q in ("1.2.3", "1iM", "-1Gi", "1kk", "1 Gi", "Gi", "")
    ],
    ({"compute.cpu": "1e"}, "spec.compute.cpu: '1e' is not a Kubernetes quantity"),
    *[
        (
            {"compute.hugepages": h},
            f"spec.compute.hugepages: '{h}' is not a whole number of 2 MiB hugepages; valid values are a positive multiple of 2Mi",
        )
        for h in ("3Mi", "1.5Mi", "0", "-2Mi", "1", "lots", "2Mi ")
    ],
    (
        {"serving.port": 65535, "processesPerReplica": 2},
        "spec.serving.port: the pod listens on ports 65535 to 65536 (2 ports: the processes, and the batching front "
        "end if any), past 65535; valid values are at most 65534",
    ),
    (
        {"serving.port": 65534, "processesPerReplica": 2, "serving.batching": {"maxBatchSize": 4}},
        "spec.serving.port: the pod listens on ports 65534 to 65536 (3 ports",
    ),
    (
        {"serving.env": [{"name": "A=B", "value": "x"}]},
        "spec.serving.env: 'A=B' is not a valid environment variable name; valid names are letters, digits and '_', "
        "not starting with a digit",
    ),
    ({"serving.env": [{"name": "1X", "value": "x"}]}, "spec.serving.env: '1X' is not a valid environment variable name"),
    (
        {"compile.extraArgs": ["--x\nLD_PRELOAD=/evil.so"]},
        "spec.compile.extraArgs: 1 compiler arguments contain a line break or NUL, which cannot reach the process intact; "
        "valid values are single lines",
    ),
    ({"serving.args": ["a\x00b", "c\rd"]}, "spec.serving.args: 2 arguments contain a line break or NUL"),
    ({"serving.env": [{"name": "X", "value": "a\nB=c"}]}, "spec.serving.env: 1 environment values contain a line break or NUL"),
    (
        {"serving.image": "example.com/serve:1 "},
        "spec.serving.image: 'example.com/serve:1 ' is not a valid image reference: it contains white space",
    ),
    ({"compile.image": "a b"}, "spec.compile.image: 'a b' is not a valid image reference: it contains white space"),
    ({"rollout.maxSurge": -1}, "spec.rollout.maxSurge: '-1' is not valid; valid values are a whole number or a percentage"),
    (
        {"rollout.maxUnavailable": "150%"},
        "spec.rollout.maxUnavailable: '150%' is not valid; valid values are a whole number or a percentage up to 100%",
    ),
    (
        {"rollout.maxSurge": 0, "rollout.maxUnavailable": "0%"},
        "spec.rollout: maxSurge and maxUnavailable cannot both be 0: no replica could ever be replaced; "
        "valid values make at least one of them positive",
    ),
    ({"replicas": 2**31}, "spec.replicas: 2147483648 is too large; valid values are at most 2147483647"),
]


@pytest.mark.parametrize("overrides,expected", ONE_VERDICT, ids=lambda v: str(v)[:60])
def test_what_a_child_could_not_hold_is_refused_on_the_model(overrides, expected):
    """What the API server would refuse in a child is refused on the model (one verdict)."""
    lines = error_lines(make_spec(**overrides))
    assert any(line.startswith(expected) for line in lines), lines


def test_secrets_reach_the_serving_process_by_reference_only():
    """valueFrom and envFrom are accepted, and checked with the messages the API server gives."""
    from inferentia_operator.core.planner import plan as make_plan
    from inferentia_operator.core.pod.model import Model
    from inferentia_operator.core.serving.deployment import serving_deployment

    env = [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}]
    spec, found = parse_spec(make_spec(**{"serving.env": env, "serving.envFrom": [{"configMapRef": {"name": "tuning"}, "prefix": "APP_"}]}))
    assert not errors(found)
    container = serving_deployment(Model("m", "ns", "u", spec, make_plan(spec)))["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}} in container["env"]
    assert container["envFrom"] == [{"configMapRef": {"name": "tuning"}, "prefix": "APP_"}]


@pytest.mark.parametrize(
    "env,message",
    [
        (
            {"name": "A", "value": "x", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            "environment variable 'A' needs one value",
        ),
        ({"name": "B", "valueFrom": {}}, "environment variable 'B' needs one value"),
        ({"name": "C", "valueFrom": {"fieldRef": {"fieldPath": "spec.containers"}}}, "valid fieldRef.fieldPath values are metadata.name"),
        (
            {"name": "D", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "a/b"}}},
            "environment variable 'D' names a Secret or ConfigMap key",
        ),
    ],
)
def test_bad_env_sources_are_refused_naming_the_variable(env, message):
    _, found = parse_spec(make_spec(**{"serving.env": [env]}))
    assert any(message in f.message and f.path == "spec.serving.env" for f in errors(found)), found


def test_instance_types_are_filtered_by_cpu_and_memory_after_system_reservations():
    """An inf2.xlarge has 4 vCPUs in all, of which the kubelet's reservations leave 3920m:
    a replica asking for 4 CPUs is planned onto the larger types only."""
    from inferentia_operator.core.planner import plan as make_plan

    spec, found = parse_spec(make_spec(**{"compute.family": "inf2", "compute.cpu": "4"}))
    assert not errors(found)
    assert make_plan(spec).instance_types == ["inf2.8xlarge", "inf2.24xlarge", "inf2.48xlarge"]
    spec, found = parse_spec(make_spec(**{"compute.family": "inf2", "compute.cpu": "3920m", "compute.memory": "15391Mi"}))
    assert make_plan(spec).instance_types[0] == "inf2.xlarge"


def test_a_replica_no_instance_type_can_hold_is_refused_with_the_valid_values():
    found = errors(parse_spec(make_spec(**{"compute.family": "inf2", "compute.cpu": "4", "compute.instanceTypes": ["inf2.xlarge"]}))[1])
    [finding] = found
    assert finding.path == "spec.compute"
    assert finding.message.startswith("a replica asks for 4 CPU and 2Gi of memory, more than any inf2 instance type with 1 chip")
    assert "inf2.xlarge (3920m CPU, 15391Mi)" in finding.message and "inf2.48xlarge (191450m CPU" in finding.message
    assert not errors(
        parse_spec(make_spec(**{"compute.family": "trn1", "compute.inf": 16, "compute.instanceTypes": ["trn1n.32xlarge"]}))[1]
    )


@pytest.mark.parametrize(
    "overrides,line",
    [
        ({"model": None}, "spec.model: null is not valid; a mapping of fields is needed"),
        ({"compute.family": None}, "spec.compute.family: null is not valid; valid values are inf1, inf2, trn1, trn2, trn3"),
        ({"serving.runtime": None}, "spec.serving.runtime: null is not valid; valid values are custom, vllm"),
        ({"serving.image": 5}, "spec.serving.image: 5 is not valid; a string is needed"),
    ],
)
def test_messages_speak_yaml_not_python(overrides, line):
    """null, true and a mapping, as the user wrote them; never None, True or NoneType."""
    lines = error_lines(make_spec(**overrides))
    assert line in lines
    assert not any(word in " ".join(lines) for word in ("None", "True", "NoneType", "dict", "ModelSource"))


# Device memory (inf2, trn1, trn2, trn3): weights at the precision's bytes, the KV cache where
# the shape is known, and 96 MiB a physical core of runtime reserve, against a process's cores.
BIG = {"model.weights": 20_000_000_000, "model.precision": "bf16", "compile.buckets": DROP}
LLAMA_8B = {
    "model.weights": 8_030_000_000, "model.precision": "bf16", "model.architecture": "transformer",
    "model.layers": 32, "model.kvHeads": 8, "model.headDim": 128, "compute.family": "inf2", "compute.inf": 1,
    "processesPerReplica": 1, "serving.runtime": "vllm", "serving.batching": {"maxBatchSize": 8},
}  # fmt: skip


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (
            {**BIG, "compute.family": "inf2"},
            "spec.compute.inf: 20000000000 bf16 weights and the Neuron runtime's reserve need 38 GiB of device memory a "
            "process, and a process has 32 GiB on its 2 NeuronCores; valid values are at least 2 chips for 1 process "
            "(the largest inf2.48xlarge instance has 12)",
        ),
        (
            {**BIG, "compute.family": "inf2", "compute.inf": DROP, "compute.cores": 1},
            "spec.compute.cores: 20000000000 bf16 weights and the Neuron runtime's reserve need 38 GiB of device memory a "
            "process, and a process has 16 GiB on its 1 NeuronCore; valid values are at least 3 NeuronCores for 1 process "
            "(the largest inf2.48xlarge instance has 24)",
        ),
        (
            # Four processes on trn2's 4 logical cores: 24 GiB each; 40 GB needs two cores a process, so 2 chips.
            {**BIG, "compute.family": "trn2", "processesPerReplica": 4},
            "spec.compute.inf: 20000000000 bf16 weights and the Neuron runtime's reserve need 38 GiB of device memory a "
            "process, and a process has 24 GiB on its 1 NeuronCore; valid values are at least 2 chips for 4 processes "
            "(the largest trn2.48xlarge instance has 16)",
        ),
        (
            # No instance holds it: the valid values name more chips than the largest has.
            {**BIG, "model.weights": 10**13, "compute.family": "trn3"},
            "spec.compute.inf: 10000000000000 bf16 weights and the Neuron runtime's reserve need 18628 GiB of device memory "
            "a process, and a process has 144 GiB on its 4 NeuronCores; valid values are at least 131 chips for 1 process "
            "(the largest trn3.48xlarge instance has 16)",
        ),
        (
            # The weights fit one chip (15 GiB of 32), a 32768-token KV cache for 8 sequences (32 GiB) does not.
            {**LLAMA_8B, "compile.buckets": [[32768]]},
            "spec.compute.inf: 8030000000 bf16 weights, a KV cache of 32 GiB (32 layers, 8 KV heads of dimension 128, "
            "32768 tokens, 8 sequences) and the Neuron runtime's reserve need 48 GiB of device memory a process, and a "
            "process has 32 GiB on its 2 NeuronCores; valid values are at least 2 chips for 1 process (the largest "
            "inf2.48xlarge instance has 12)",
        ),
    ],
)
def test_a_model_that_cannot_fit_its_device_memory_is_refused_with_the_smallest_request_that_fits(overrides, expected):
    assert error_lines(make_spec(**overrides)) == [expected]


@pytest.mark.parametrize(
    "overrides",
    [
        {**BIG, "compute.family": "inf2", "compute.inf": 2},
        {**BIG, "compute.family": "trn3", "compute.lnc": 1, "compute.inf": DROP, "compute.cores": 3},
        {**LLAMA_8B, "compile.buckets": [[4096]]},
        # inf1 keeps its own rule: static weights, which auto turns off when they do not fit.
        {**BIG, "model.weights": 5_000_000_000},
    ],
    ids=str,
)
def test_models_that_fit_their_device_memory_are_accepted(overrides):
    assert error_lines(make_spec(**overrides)) == []


def test_vllm_without_the_models_shape_warns_that_only_the_weights_were_checked():
    spec = make_spec(**{**LLAMA_8B, "model.layers": DROP, "compile.buckets": [[4096]]})
    assert error_lines(spec) == []
    assert (
        "warning: spec.model: only the weights were checked against the device memory: vLLM also holds a KV cache; "
        "set layers to check that it fits too"
    ) in findings_of(spec)


def test_an_lnc_above_a_chips_cores_is_refused_by_name_not_by_a_crash():
    """inf2 shows 2 cores a chip: at lnc 4 a chip holds no whole core, so nothing may divide by
    the cores a chip shows before LNC_VALUE has passed."""
    lines = error_lines(make_spec(**{"compute.inf": DROP, "compute.family": "inf2", "compute.cores": 1, "compute.lnc": 4,
                                     "compute.instanceTypes": ["inf2.xlarge"], "compute.cpu": "2"}))  # fmt: skip
    assert "spec.compute.lnc: 4 is not supported on inf2; valid values are 1" in lines


def test_every_dra_rule_a_spec_breaks_is_reported():
    lines = error_lines(make_spec(**{"compute.inf": DROP, "compute.cores": 1, "compute.allocation": "dra"}))
    assert any(line.startswith("spec.compute.allocation: dra does not run on inf1") for line in lines), lines
    assert any(line.startswith("spec.compute.cores: 1 NeuronCores cannot be claimed with allocation dra") for line in lines), lines


def test_vllm_on_nxd_inference_compiles_ahead_with_the_operators_program_without_a_warning():
    """compile.image on inf2 and trn1 runs the operator's NxD Inference program, in AWS's own vLLM image."""
    spec = make_spec(**{**LLAMA_8B, "compile.buckets": [[4096]], "compile.image": "public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:x",
                        "model.uri": "s3://models/llama/"})  # fmt: skip
    assert not [f for f in findings_of(spec) if "compile" in f], findings_of(spec)


@pytest.mark.parametrize("family", ["inf2", "trn1"])
def test_vllm_on_nxd_inference_compiled_ahead_must_state_its_shape(family):
    """The compiled model's sequence length and sequences are the server's: the program cannot guess vLLM's defaults."""
    spec = make_spec(**{**LLAMA_8B, "compute.family": family, "compile.buckets": DROP, "serving.batching": DROP,
                        "compile.image": "public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:x", "model.uri": "s3://models/llama/"})  # fmt: skip
    assert (
        f"warning: spec.compile.buckets: vLLM on NxD Inference ({family}) is compiled ahead for one sequence length and "
        "number of sequences, and the spec leaves compile.buckets (the largest is --max-model-len) or "
        "serving.batching.maxBatchSize (--max-num-seqs) unset, so the compile Job fails; set both"
    ) in findings_of(spec)


# -- AWS's images, by what their tags carry (core/neuron_images.py) ---------------------------

VLLM_REPO = "public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:"
NEURONX_REPO = "public.ecr.aws/neuron/pytorch-inference-neuronx:"


def test_a_replica_across_nodes_is_refused_on_an_image_without_vllms_v0_worker():
    """vllm-neuron (AWS's vLLM images from 0.11.0) serves one node: the message names the images that can."""
    from corpus import _TWO_TRN1_NODES

    image = VLLM_REPO + "0.16.0-neuronx-py312-sdk2.31.0-ubuntu24.04"
    [line] = [x for x in error_lines(make_spec(**{**_TWO_TRN1_NODES, "serving.image": image})) if "serving.image" in x]
    assert line.startswith(f"spec.serving.image: {image} cannot serve a replica across nodes: its vLLM has no V0 Neuron worker")
    assert VLLM_REPO + "0.9.1-neuronx-py311-sdk2.26.1-ubuntu22.04" in line
    v0 = make_spec(**{**_TWO_TRN1_NODES, "serving.image": VLLM_REPO + "0.9.1-neuronx-py311-sdk2.26.1-ubuntu22.04"})
    assert not [x for x in error_lines(v0) if "serving.image" in x]
    # An image of another name is the user's to know.
    assert not [x for x in error_lines(make_spec(**{**_TWO_TRN1_NODES, "serving.image": "example.com/vllm:1"})) if "serving.image" in x]


def test_a_torch_neuronx_compile_image_older_than_neuron_2_21_is_warned_of():
    """The compile Job has no device, and torch_neuronx.trace traces on the CPU only from Neuron 2.21 (cpu_backend)."""
    old = NEURONX_REPO + "2.1.2-neuronx-py310-sdk2.20.2-ubuntu20.04"
    spec = make_spec(**{"compute.family": "inf2", "compile.image": old, "compile.buckets": [[8]], "serving.image": old})
    assert any(f.startswith(f"warning: spec.compile.image: {old} is of Neuron 2.20.2") and "cpu_backend" in f for f in findings_of(spec))
    for fine in (NEURONX_REPO + "2.9.0-neuronx-py312-sdk2.31.1-ubuntu24.04", NEURONX_REPO + "1.13.1-neuronx-py310-sdk2.20.2-ubuntu20.04"):
        spec = make_spec(**{"compute.family": "inf2", "compile.image": fine, "compile.buckets": [[8]], "serving.image": fine})
        assert not [f for f in findings_of(spec) if "spec.compile.image" in f], fine  # torch 1.13 traces anywhere


def test_compile_and_serving_images_of_other_compiler_versions_are_warned_of():
    """The plugin's compile cache key hashes torch-neuronx, neuronx-cc and NKI: another set misses every graph."""
    spec = make_spec(**{
        "compute.family": "trn2", "compute.inf": 1, "serving.runtime": "vllm", "compile.buckets": [[2048]],
        "serving.batching": {"maxBatchSize": 4}, "model.uri": "s3://models/llama/",
        "compile.image": VLLM_REPO + "0.21.0.1.0.0-neuronx-py313-sdk2.31.0-ubuntu24.04",
        "serving.image": VLLM_REPO + "0.24.0.1.1.0-neuronx-py313-sdk2.32.0-ubuntu24.04",
    })  # fmt: skip
    [line] = [f for f in findings_of(spec) if "other Neuron versions" in f]
    assert "neuronx-cc 2.26.6360.0 against 2.27.5334.0" in line and line.startswith("warning: spec.compile.image:")


def test_vllm_on_trn2_in_an_nxd_inference_image_is_warned_of():
    """vLLM on trn2 and trn3 runs on the vLLM Neuron plugin, which AWS's NxD Inference images lack."""
    nxdi = VLLM_REPO + "0.16.0-neuronx-py312-sdk2.31.0-ubuntu24.04"
    spec = make_spec(**{"compute.family": "trn2", "compute.inf": 1, "serving.runtime": "vllm", "serving.image": nxdi})
    [line] = [f for f in findings_of(spec) if "spec.serving.image" in f]
    assert line.startswith(f"warning: spec.serving.image: {nxdi} carries vLLM 0.16.0 on NxD Inference") and "plugin" in line
    plugin = VLLM_REPO + "0.24.0.1.1.0-neuronx-py313-sdk2.32.0-ubuntu24.04"
    spec = make_spec(**{"compute.family": "inf2", "serving.runtime": "vllm", "serving.image": plugin})
    assert any(f.startswith(f"warning: spec.serving.image: {plugin} carries vLLM for trn2, trn3, not inf2") for f in findings_of(spec))


# -- Bigger than a node: a replica across nodes holds its model in every node's device memory --

LLAMA_405B = {
    "model.weights": 405_000_000_000, "model.precision": "bf16", "model.architecture": "transformer",
    "model.layers": 126, "model.kvHeads": 8, "model.headDim": 128, "compile.buckets": [[4096]],
    "serving.runtime": "vllm", "serving.batching": {"maxBatchSize": 8}, "compute.family": "trn1", "compute.inf": 16,
}  # fmt: skip


def test_a_model_bigger_than_a_node_is_accepted_across_the_nodes_it_needs():
    """810 GB of bf16 weights: two trn1.32xlarge hold 1,024 GiB between them, one holds 512."""
    assert error_lines(make_spec(**{**LLAMA_405B, "compute.nodes": 2})) == []
    one = findings_of(make_spec(**LLAMA_405B))
    assert any(f.startswith("spec.compute.inf: 405000000000 bf16 weights") for f in one), one
    assert (
        "warning: spec.compute.nodes: the model fits no trn1 node, and fits across 2 trn1.32xlarge nodes: set nodes 2 with "
        "inf 16 and the vllm runtime (docs/multi-node.md)"
    ) in one


def test_a_model_too_big_for_its_nodes_is_refused_naming_the_fewest_that_hold_it():
    weights = {**LLAMA_405B, "model.weights": 1_000_000_000_000, "compute.nodes": 2}  # 2 TB of bf16 weights
    [line] = error_lines(make_spec(**weights))
    assert line == (
        "spec.compute.nodes: 1000000000000 bf16 weights and the Neuron runtime's reserve need 1869 GiB of device memory across "
        "the replica's 64 NeuronCores, and 2 nodes hold 1024 GiB; valid values are at least 4 nodes"
    )
    # With the KV cache (no CEL twin): 4,096 tokens of 24 sequences no longer fit two nodes, and fit three.
    kv = {**LLAMA_405B, "compute.nodes": 2, "serving.batching": {"maxBatchSize": 24}}
    [line] = error_lines(make_spec(**kv))
    assert line.startswith("spec.compute.nodes: 405000000000 bf16 weights, a KV cache of") and line.endswith("at least 3 nodes")
    # 128 sequences: each core already holds one KV head, so more nodes add as much cache as memory.
    [line] = error_lines(make_spec(**{**kv, "serving.batching": {"maxBatchSize": 128}}))
    assert line.endswith("no number of nodes up to 16 holds it; valid values are fewer sequences (serving.batching.maxBatchSize) "
                         "or a shorter sequence length (compile.buckets)")  # fmt: skip


def test_a_digest_pinned_vllm_image_is_not_judged_by_a_tag_it_does_not_have():
    from corpus import _TWO_TRN1_NODES

    image = VLLM_REPO + "0.9.1-neuronx-py311-sdk2.26.1-ubuntu22.04@sha256:" + "0" * 64
    assert not [x for x in error_lines(make_spec(**{**_TWO_TRN1_NODES, "serving.image": image})) if "serving.image" in x]


def test_serving_flags_that_change_a_compiled_nxd_inference_model_are_warned_of():
    """vllm-neuron loads a compiled model as it is: a flag that changes what its loader builds serves another model."""
    base = {**LLAMA_8B, "compile.buckets": [[4096]], "compile.image": VLLM_REPO + "0.16.0-neuronx-py312-sdk2.31.0-ubuntu24.04",
            "serving.image": VLLM_REPO + "0.16.0-neuronx-py312-sdk2.31.0-ubuntu24.04", "model.uri": "s3://models/llama/"}  # fmt: skip
    assert not [f for f in findings_of(make_spec(**{**base, "serving.args": ["--served-model-name", "llama"]})) if "serving" in f]
    [line] = [
        f for f in findings_of(make_spec(**{**base, "serving.args": ["--enable-prefix-caching", "--max-num-seqs=4"]})) if "serving" in f
    ]
    assert line.startswith("warning: spec.serving.args: --enable-prefix-caching, --max-num-seqs change the model vLLM on NxD Inference")
    # vLLM's FlexibleArgumentParser takes underscores as dashes: --max_num_seqs is --max-num-seqs.
    [line] = [f for f in findings_of(make_spec(**{**base, "serving.args": ["--max_num_seqs", "4", "--block_size=64"]})) if "serving" in f]
    assert line.startswith("warning: spec.serving.args: --block-size, --max-num-seqs change the model vLLM on NxD Inference")
    env = [{"name": "DISABLE_NEURON_CUSTOM_SCHEDULER", "value": "1"}]
    [line] = [f for f in findings_of(make_spec(**{**base, "serving.env": env})) if "serving" in f]
    assert line.startswith("warning: spec.serving.env: DISABLE_NEURON_CUSTOM_SCHEDULER change the model")


@pytest.mark.parametrize(
    ("family", "inf", "itype"),
    [("trn2", 1, "trn2.3xlarge"), ("trn2", 16, "trn2u.48xlarge"), ("trn2", 4, "trn2.48xlarge"), ("trn3", 4, "trn3e.24xlarge")],
)
def test_every_instance_type_aws_documents_is_accepted(family, inf, itype):
    """trn2.3xlarge, the UltraServer's trn2u.48xlarge and trn3's Gen2 server trn3e.24xlarge were refused as unknown."""
    spec = make_spec(**{"compute.family": family, "compute.inf": inf, "compute.instanceTypes": [itype]})
    assert error_lines(spec) == []


def test_an_instance_type_too_small_for_the_request_is_refused_by_its_chips():
    lines = error_lines(make_spec(**{"compute.family": "trn2", "compute.inf": 4, "compute.instanceTypes": ["trn2.3xlarge"]}))
    assert lines == [
        "spec.compute.instanceTypes: none of the listed instance types has 4 chips; trn2 types with at least 4 chips: "
        "trn2.48xlarge, trn2u.48xlarge"
    ]


def test_every_module_of_the_rules_package_is_in_MODULES():
    """A module of core/rules/ left out of ``rules.MODULES`` would have its CEL missing from the
    CRD and its checks never run, silently. Every module is a rule module (identity too: the
    name's and namespace's rules); there is no helper module to except, so a new one would
    have to be named here, with why."""
    in_package = {info.name for info in pkgutil.iter_modules(rules.__path__)}
    listed = [module.__name__.rpartition(".")[2] for module in rules.MODULES]
    assert len(listed) == len(set(listed)), "a module listed twice in rules.MODULES"
    assert set(listed) == in_package
    for module in rules.MODULES:
        assert isinstance(module.RULES, tuple | list) and isinstance(module.CHECKS, tuple | list), module.__name__


# Python's "$" also matches before a string's last line break, RE2's (CEL's matches(), and the
# API server's checks of the children) only at its end: each pattern is checked whole, so that
# validate refuses what kubectl apply would.
TRAILING_BREAK = [
    ({"serving.env": [{"name": "X\n", "value": "x"}]}, "spec.serving.env: 'X\n' is not a valid environment variable name"),
    ({"compute.memory": "4Gi\n"}, "spec.compute.memory"),
    ({"rollout.maxSurge": "25%\n"}, "spec.rollout.maxSurge"),
    ({"compute.hugepages": "2Mi\n"}, "spec.compute.hugepages"),
]


@pytest.mark.parametrize("overrides,expected", TRAILING_BREAK, ids=lambda v: str(v)[:40])
def test_a_value_with_a_trailing_line_break_is_refused_as_the_api_server_refuses_it(overrides, expected):
    lines = error_lines(make_spec(**overrides))
    assert any(line.startswith(expected) for line in lines), lines


def test_a_namespace_with_a_trailing_line_break_is_refused():
    from inferentia_operator.core.rules.identity import check_name, check_namespace

    assert check_namespace("team\n") and check_name("model\n")
