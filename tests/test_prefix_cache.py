"""The vLLM Neuron plugin's KV cache blocks (trn2, trn3): the count that fits a group, as the
plugin budgets its device memory (cores.plugin_kv_blocks), in the plan (Plan.kvCache), in the
serving pods' flags and the compile step's engine arguments alike, and the warnings of the rules.

The figures are worked by hand from the plugin's documented budget (docs/api.md, "The KV
cache on trn2 and trn3"), per logical core, for Llama-3.1-8B (8.03e9 bf16 weights, 32 layers, 8
KV heads of dimension 128) on trn2 at LNC 2 (24 GiB = 25769803776 bytes a logical core):

    total  = int(25769803776 * 0.9)  = 23192823398        (gpu_memory_utilization 0.9)
    cap    = int(23192823398 * 0.30) = 6957847019         (the plugin's cap fraction)
    weights a core, 4 ways: 16060000000 / 4 = 4015000000
    budget = min(23192823398 - 4015000000, 6957847019) = 6957847019
    one block of 32 tokens, all layers, 2 KV heads a core: 2 * 32 * 2 * 128 * 2 * 32 = 1048576
    blocks = 6957847019 // 1048576 = 6635
"""

import json

import pytest

from inferentia_operator.core.api import InferentiaModelSpec
from inferentia_operator.core.catalogue import FAMILIES
from inferentia_operator.core.compile.job import compile_job
from inferentia_operator.core.cores import plugin_kv_blocks
from inferentia_operator.core.model import check_model
from inferentia_operator.core.planner import plan
from inferentia_operator.core.pod.artefact import compile_inputs
from inferentia_operator.core.pod.model import Model, plan_document
from inferentia_operator.core.serving.deployment import serving_deployment
from specs import DROP, make_spec

LLAMA_8B_TRN2 = {
    "model.uri": "s3://models/llama-3.1-8b/", "model.architecture": "transformer", "model.precision": "bf16",
    "model.weights": 8_030_000_000, "model.layers": 32, "model.kvHeads": 8, "model.headDim": 128,
    "compute.family": "trn2", "compute.inf": 1, "processesPerReplica": 1,
    "compile.buckets": [[4096]], "compile.image": "example.com/vllm-neuronx:2.32",
    "serving.runtime": "vllm", "serving.batching": {"maxBatchSize": 8}, "serving.port": 8000,
}  # fmt: skip
# Llama-3.1-70B: 70.6e9 weights, 80 layers, 8 KV heads of dimension 128.
LLAMA_70B_TRN2 = {**LLAMA_8B_TRN2, "model.weights": 70_600_000_000, "model.layers": 80, "compute.inf": 2}


def spec_of(**overrides) -> InferentiaModelSpec:
    return InferentiaModelSpec.model_validate(make_spec(**overrides))


def blocks(**overrides) -> int | None:
    spec = spec_of(**overrides)
    fam = FAMILIES[spec.compute.family]
    return plugin_kv_blocks(spec, fam, plan(spec).group_size)


def model_of(**overrides) -> Model:
    spec = spec_of(**overrides)
    return Model("llama", "team", "uid-1", spec, plan(spec))


def warnings(**overrides) -> list[str]:
    checked = check_model("llama", "team", make_spec(**overrides))
    assert not checked.errors, checked.errors
    return [f"{f.path}: {f.message}" for f in checked.findings if f.severity == "warning"]


@pytest.mark.parametrize(
    "overrides,expected",
    [
        # The module's worked figure: one chip, 4 logical cores, the cap bounds the budget.
        (LLAMA_8B_TRN2, 6635),
        # Two chips, 8 ways: the same cap a core, 1 KV head a core, so a block takes half: 6957847019 // 524288.
        ({**LLAMA_8B_TRN2, "compute.inf": 2}, 13271),
        # LNC 1: 8 logical cores of 12 GiB. total = int(12884901888 * 0.9) = 11596411699, cap =
        # int(11596411699 * 0.3) = 3478923509, 1 KV head a core: 3478923509 // 524288.
        ({**LLAMA_8B_TRN2, "compute.lnc": 1}, 6635),
        # The weights bound it: 141.2e9 bytes over 8 cores leave 23192823398 - 17650000000 = 5542823398,
        # under the cap; a block of 80 layers with 1 KV head a core is 2 * 80 * 1 * 128 * 2 * 32 = 1310720.
        (LLAMA_70B_TRN2, 4228),
        # The user's block size (serving.args): a block of 64 tokens takes twice the memory.
        ({**LLAMA_8B_TRN2, "serving.args": ["--block-size", "64"]}, 3317),
        # The user's gpu_memory_utilization: total = int(25769803776 * 0.8) = 20615843020, cap 6184752906.
        ({**LLAMA_8B_TRN2, "serving.args": ["--gpu-memory-utilization=0.8"]}, 5898),
        # The user's cap (serving.env): min(19177823398, int(23192823398 * 0.5) = 11596411699) // 1048576.
        ({**LLAMA_8B_TRN2, "serving.env": [{"name": "VLLM_NEURON_KV_GMU_BUDGET_CAP_FRACTION", "value": "0.5"}]}, 11059),
        # 4 KV heads over 8 cores: replicated, one a core, as cores.kv_cache_bytes counts them.
        ({**LLAMA_8B_TRN2, "compute.inf": 2, "model.kvHeads": 4}, 13271),
    ],
)
def test_the_blocks_that_fit_are_the_plugins_budget_over_a_blocks_bytes(overrides, expected):
    assert blocks(**overrides) == expected


@pytest.mark.parametrize(
    "overrides",
    [
        {"model.layers": DROP},
        {"model.kvHeads": DROP},
        {"model.headDim": DROP},
        {"model.weights": DROP},
        # vLLM on NxD Inference sizes its own blocks (pod.vllm.vllm_engine_args); the custom runtime has no vLLM.
        {"compute.family": "inf2", "compute.inf": 2},
        {"serving.runtime": "custom", "serving.args": ["serve"]},
    ],
)
def test_no_figure_where_the_shape_or_the_weights_are_unknown_or_the_plugin_does_not_serve(overrides):
    assert blocks(**{**LLAMA_8B_TRN2, **overrides}) is None
    spec = spec_of(**{**LLAMA_8B_TRN2, **overrides})
    assert plan(spec).kv_cache is None and "kvCache" not in plan_document(plan(spec))


def test_the_plan_shows_the_blocks_and_their_size():
    assert plan_document(plan(spec_of(**LLAMA_8B_TRN2)))["kvCache"] == {"blocks": 6635, "blockSize": 32}
    on_trn3 = plan_document(plan(spec_of(**{**LLAMA_8B_TRN2, "compute.family": "trn3"})))["kvCache"]
    # trn3 at LNC 2: 144 GiB over 4 logical cores, 36 GiB = 38654705664 bytes a core; total =
    # int(38654705664 * 0.9) = 34789235097, cap = int(34789235097 * 0.3) = 10436770529; // 1048576.
    assert on_trn3 == {"blocks": 9953, "blockSize": 32}


def serving_flags(m: Model) -> list[str]:
    [container] = serving_deployment(m)["spec"]["template"]["spec"]["containers"]
    return container["args"]


def compile_engine_args(m: Model) -> dict:
    compile_step = compile_job(m)["spec"]["template"]["spec"]["initContainers"][-1]
    return json.loads({e["name"]: e["value"] for e in compile_step["env"]}["INFERENTIA_VLLM_ENGINE_ARGS"])


def flag(args: list[str], name: str) -> str:
    return args[len(args) - 1 - args[::-1].index(name) + 1]  # the last, as vLLM takes it


def test_the_serving_flags_and_the_compile_step_give_the_plugin_the_same_blocks():
    """On Neuron the KV cache is in every compiled graph: the serving Deployment's flags and the
    compile Job's engine arguments must both carry it."""
    m = model_of(**LLAMA_8B_TRN2)
    args = serving_flags(m)
    assert (flag(args, "--block-size"), flag(args, "--num-gpu-blocks-override")) == ("32", "6635")
    engine = compile_engine_args(m)
    assert (engine["block_size"], engine["num_gpu_blocks_override"]) == (32, 6635)
    assert "gpu_memory_utilization" not in engine and "--gpu-memory-utilization" not in args
    # The compile key has them: another block count is another compile.
    assert compile_inputs(m)["engineArgs"] == engine


@pytest.mark.parametrize(
    "given",
    [
        ["--gpu-memory-utilization", "0.8"],
        ["--gpu-memory-utilization=0.8"],
        ["--gpu_memory_utilization", "0.8"],
        ["--gpu_memory_utilization=0.8"],
    ],
)
def test_a_users_gpu_memory_utilization_sizes_the_plan_and_reaches_the_compile_step(given):
    """The plugin's CPU compile sizes the cache (and checks its minimum) from gpu_memory_utilization:
    the user's, not the plugin's default, or compile and serve disagree."""
    m = model_of(**{**LLAMA_8B_TRN2, "serving.args": given})
    # int(int(25769803776 * 0.8) * 0.3) // 1048576 = 6184752906 // 1048576 = 5898
    assert compile_engine_args(m)["gpu_memory_utilization"] == 0.8
    assert compile_engine_args(m)["num_gpu_blocks_override"] == 5898
    assert flag(serving_flags(m), "--num-gpu-blocks-override") == "5898"


@pytest.mark.parametrize("given", [["--block_size", "64"], ["--block-size=64"], ["--block_size=64"]])
def test_a_users_block_size_with_underscores_is_read_and_reaches_the_compile_step(given):
    """vLLM's FlexibleArgumentParser takes --block_size as --block-size."""
    m = model_of(**{**LLAMA_8B_TRN2, "serving.args": given})
    assert plan_document(m.plan)["kvCache"] == {"blocks": 3317, "blockSize": 64}
    assert (compile_engine_args(m)["block_size"], compile_engine_args(m)["num_gpu_blocks_override"]) == (64, 3317)
    # Without the model's shape there is no count, and the user's block size still reaches the compile.
    unsized = model_of(**{**LLAMA_8B_TRN2, "serving.args": given, "model.layers": DROP})
    assert unsized.plan.kv_cache is None
    assert compile_engine_args(unsized)["block_size"] == 64


def test_a_users_block_count_that_fits_is_given_to_both_and_warns_of_nothing():
    user = {**LLAMA_8B_TRN2, "serving.args": ["--num-gpu-blocks-override", "4000"]}
    m = model_of(**user)
    assert plan_document(m.plan)["kvCache"] == {"blocks": 4000, "blockSize": 32}
    compile_step = compile_job(m)["spec"]["template"]["spec"]["initContainers"][-1]
    engine = json.loads({e["name"]: e["value"] for e in compile_step["env"]}["INFERENTIA_VLLM_ENGINE_ARGS"])
    assert engine["num_gpu_blocks_override"] == 4000
    [container] = serving_deployment(m)["spec"]["template"]["spec"]["containers"]
    assert container["args"][-2:] == ["--num-gpu-blocks-override", "4000"]  # serving.args last, as ever
    assert not [w for w in warnings(**user) if "--num-gpu-blocks-override" in w]
    # Without the model's shape the operator cannot size the cache, and still gives both the user's count.
    unsized = model_of(**{**user, "model.layers": DROP})
    assert plan_document(unsized.plan)["kvCache"] == {"blocks": 4000, "blockSize": 32}


@pytest.mark.parametrize("given", [["--num-gpu-blocks-override", "9000"], ["--num-gpu-blocks-override=9000"]])
def test_a_users_block_count_past_the_plugins_budget_is_a_warning_naming_the_largest_that_fits(given):
    found = warnings(**{**LLAMA_8B_TRN2, "serving.args": given})
    assert (
        "spec.serving.args: --num-gpu-blocks-override 9000 is more KV cache blocks than the vLLM Neuron plugin's budget "
        "holds: each of the group's 4 NeuronCores keeps 6.48 GiB for the KV cache (the least of 90% of its 24 GiB less its "
        "3.74 GiB share of the weights, and 30% of that 90%), and a block of 32 tokens takes 1 MiB there; the plugin compiles "
        "the cache into its graphs, and a larger one may fail the compile (NCC_EVRF009) or the cache's allocation at start; "
        "valid values are at most 6635" in found
    ), found
    # The plan gives the plugin what the user asked for all the same: the warning says what may follow.
    assert plan_document(model_of(**{**LLAMA_8B_TRN2, "serving.args": given}).plan)["kvCache"]["blocks"] == 9000


def test_weights_that_leave_the_plugin_less_than_its_minimum_kv_budget_are_a_warning():
    """45e9 bf16 weights over one trn2 chip fit its 96 GiB with the runtime's reserve, but leave each
    core 23192823398 - 22500000000 = 692823398 bytes of the plugin's budget, under its 1 GiB minimum."""
    heavy = {**LLAMA_8B_TRN2, "model.weights": 45_000_000_000, "model.layers": DROP}
    found = warnings(**heavy)
    assert (
        "spec.compute.inf: the vLLM Neuron plugin keeps 0.645 GiB of each NeuronCore's device memory for the KV cache (the "
        "least of 90% of its 24 GiB less its 21 GiB share of the weights, and 30% of that 90%), less than the 1 GiB it needs to start "
        '(VLLM_NEURON_MIN_KV_BUDGET_GIB): it stops with "Computed KV cache budget is below minimum threshold"; valid values '
        "are more chips, a higher serving.args --gpu-memory-utilization (the compile Job is given it too), or a lower "
        "VLLM_NEURON_MIN_KV_BUDGET_GIB in serving.env (0 turns the check off)" in found
    ), found
    assert not [w for w in warnings(**LLAMA_8B_TRN2) if "minimum" in w]


@pytest.mark.parametrize(("count", "warned"), [(100, True), (128, True), (129, False)])
def test_a_users_block_count_under_one_max_length_request_is_a_warning(count, warned):
    """max_model_len 4096 in blocks of 32 is 128 blocks; block 0 is vLLM's null block, so 129 are the
    fewest with which vLLM starts (check_enough_kv_cache_memory)."""
    found = warnings(**{**LLAMA_8B_TRN2, "serving.args": ["--num-gpu-blocks-override", str(count)]})
    expected = (
        f"spec.serving.args: --num-gpu-blocks-override {count} gives the vLLM Neuron plugin {count} KV cache blocks of 32 "
        f"tokens, which leave {(count - 1) * 32} tokens for requests (block 0 is vLLM's null block), fewer than one request "
        "of max_model_len 4096 needs (128 blocks): vLLM refuses to start (check_enough_kv_cache_memory); valid values are "
        f"at least 129 blocks, or a largest bucket (its last dimension is max_model_len) of at most {(count - 1) * 32}"
    )
    assert (expected in found) is warned, found
    # Without the model's shape the user's count is checked all the same.
    unsized = warnings(**{**LLAMA_8B_TRN2, "serving.args": ["--num-gpu-blocks-override", str(count)], "model.layers": DROP})
    assert (expected in unsized) is warned, unsized


def test_the_plans_own_count_under_one_max_length_request_is_a_warning_on_the_buckets():
    """43e9 bf16 weights leave each core int(25769803776 * 0.9) - 21500000000 = 1692823398 bytes, 1614
    blocks of 1 MiB; 1613 * 32 = 51616 tokens, and a bucket of 65536 needs 2048 blocks."""
    heavy = {**LLAMA_8B_TRN2, "model.weights": 43_000_000_000, "serving.batching": {"maxBatchSize": 1}}
    found = warnings(**{**heavy, "compile.buckets": [[65536]]})
    assert (
        "spec.compile.buckets: the plan (the most blocks the plugin's budget holds) gives the vLLM Neuron plugin 1614 KV "
        "cache blocks of 32 tokens, which leave 51616 tokens for requests (block 0 is vLLM's null block), fewer than one "
        "request of max_model_len 65536 needs (2048 blocks): vLLM refuses to start (check_enough_kv_cache_memory); valid "
        "values are a largest bucket (its last dimension is max_model_len) of at most 51616, or more NeuronCores" in found
    ), found
    assert not [w for w in warnings(**heavy) if "null block" in w]
    # serving.args' --max-model-len is vLLM's, over the buckets'.
    given = warnings(**{**heavy, "serving.args": ["--max_model_len=65536"]})
    assert [w for w in given if w.startswith("spec.serving.args: the plan") and "of at most 51616, or more" in w], given


def test_a_minimum_kv_budget_of_zero_turns_the_plugins_guard_off():
    """VLLM_NEURON_MIN_KV_BUDGET_GIB=0 is the guard off, not unset."""
    heavy = {**LLAMA_8B_TRN2, "model.weights": 45_000_000_000, "model.layers": DROP}
    off = [{"name": "VLLM_NEURON_MIN_KV_BUDGET_GIB", "value": "0"}]
    assert not [w for w in warnings(**{**heavy, "serving.env": off}) if "minimum threshold" in w]
    assert [w for w in warnings(**heavy) if "minimum threshold" in w]
