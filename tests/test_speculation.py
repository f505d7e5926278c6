"""EAGLE3 speculative decoding with the vLLM Neuron plugin (spec.serving.speculation): the flags
the serving processes and the compile step get, the rules, and the KV cache sized with the draft.

The flags are held to the plugin's own example commands:
- the Llama 3.1 8B EAGLE3 tutorial,
  https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/tutorials/tutorial-eagle3-speculative-decoding-llama-3-1.html:
  ``--speculative-config '{"method": "eagle3", "model": "RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3",
  "num_speculative_tokens": 3}'`` beside ``--tensor-parallel-size 8 --max-num-seqs 2 --max-model-len 2048``;
- the features guide, "Speculative decoding (EAGLE3)",
  https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/guides/features-guide.html:
  "Mutually exclusive with async scheduling. Setting --speculative-config disables async
  scheduling automatically", and async scheduling is turned off with ``--no-async-scheduling``.

The KV figures are worked by hand (docs/api.md, "The KV cache on trn2 and trn3", and
"Speculative decoding"): the draft's weights join the target's in each core's bytes_used, and its
one decoder layer joins the target's layers in every block, since the target and the draft share
one KV cache whose block tables span "all layers (target + draft)" (the speculative decoding design
page, "KV Cache Sharing",
https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/design/speculation/speculative_decoding_design.html).
Llama-3.1-8B (8.03e9 bf16 weights, 32 layers, 8 KV heads of 128) on two trn2 chips at LNC 2, 8
ways, with a draft of 1e9 parameters:

    total  = int(25769803776 * 0.9) = 23192823398, cap = int(23192823398 * 0.30) = 6957847019
    weights a core: (16060000000 + 2000000000) / 8 = 2257500000, leaving 20935323398: the cap binds
    a block: 32 tokens * 2 * (32 + 1) layers * 1 KV head * 128 * 2 bytes = 540672
    blocks = 6957847019 // 540672 = 12868        (13271 without the draft: 524288 a block)
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from inferentia_operator.core import sizing
from inferentia_operator.core.api import InferentiaModelSpec
from inferentia_operator.core.catalogue import FAMILIES
from inferentia_operator.core.compile.job import compile_job
from inferentia_operator.core.cores import device_memory_per_process, kv_cache_bytes
from inferentia_operator.core.model import check_model
from inferentia_operator.core.planner import plan
from inferentia_operator.core.pod.artefact import compile_inputs
from inferentia_operator.core.pod.model import Model, plan_document
from inferentia_operator.core.serving.deployment import serving_deployment
from specs import DROP, make_spec

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "manifests" / "samples" / "trn2-eagle3.yaml"
DRAFT = "RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3"
TARGET = "meta-llama/Llama-3.1-8B-Instruct"
# The tutorial's model details: "tensor-parallel-size 8, max-num-seqs 2, max-model-len 2048,
# num_speculative_tokens 3", on a trn2.48xlarge (two chips at LNC 2 are 8 logical cores).
EAGLE3_TRN2 = {
    "model.uri": TARGET, "model.architecture": "transformer", "model.precision": "bf16",
    "model.weights": 8_030_000_000, "model.layers": 32, "model.kvHeads": 8, "model.headDim": 128,
    "compute.family": "trn2", "compute.inf": 2, "compute.memory": "64Gi", "processesPerReplica": 1,
    "compile.buckets": [[2048]], "compile.image": "example.com/vllm-neuronx:2.32", "compile.outputUri": "s3://models/compiled/",
    "serving.runtime": "vllm", "serving.batching": {"maxBatchSize": 2}, "serving.port": 8000,
    # Dotted, so that each spec gets its own speculation object (make_spec sets a dict value as it is).
    "serving.speculation.draft.uri": DRAFT, "serving.speculation.draft.weights": 1_000_000_000,
    "serving.speculation.numSpeculativeTokens": 3,
}  # fmt: skip
# The tutorial's EAGLE3 server (Step 2), as its page gives it.
TUTORIAL_COMMAND = """vllm serve meta-llama/Llama-3.1-8B-Instruct \\
    --tensor-parallel-size 8 \\
    --max-num-seqs 2 \\
    --max-model-len 2048 \\
    --no-enable-prefix-caching \\
    --speculative-config '{
        "method": "eagle3",
        "model": "RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3",
        "num_speculative_tokens": 3
      }' \\
    --port 8000"""


def without_speculation(overrides: dict) -> dict:
    return {k: v for k, v in overrides.items() if not k.startswith("serving.speculation")}


def spec_of(**overrides) -> InferentiaModelSpec:
    return InferentiaModelSpec.model_validate(make_spec(**overrides))


def model_of(**overrides) -> Model:
    spec = spec_of(**overrides)
    return Model("llama", "team", "uid-1", spec, plan(spec))


def serving_flags(m: Model) -> list[str]:
    [container] = serving_deployment(m)["spec"]["template"]["spec"]["containers"]
    return container["args"]


def compile_engine_args(m: Model) -> dict:
    compile_step = compile_job(m)["spec"]["template"]["spec"]["initContainers"][-1]
    return json.loads({e["name"]: e.get("value") for e in compile_step["env"]}["INFERENTIA_VLLM_ENGINE_ARGS"])


def flag_values(args: list[str]) -> dict[str, str | bool]:
    """``--name value`` and bare ``--name`` flags, as a table (the last of a name, as vLLM takes it)."""
    found: dict[str, str | bool] = {}
    for i, arg in enumerate(args):
        if not arg.startswith("--"):
            continue
        value = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else True
        found[arg] = value
    return found


def problems(**overrides) -> tuple[list[str], list[str]]:
    """(errors, warnings) of validate, each as ``path: message``."""
    # Two chips a pod need the Neuron scheduler extension's scheduler, which validate is told of here.
    checked = check_model("llama", "team", make_spec(**overrides), scheduler_name="my-scheduler")
    said = [(f.severity, f"{f.path}: {f.message}") for f in checked.findings]
    return [t for s, t in said if s == "error"], [t for s, t in said if s == "warning"]


def test_the_serving_flags_are_the_tutorials_speculative_config_with_async_scheduling_off():
    m = model_of(**EAGLE3_TRN2)
    ours = flag_values(serving_flags(m))
    theirs = flag_values(shlex.split(TUTORIAL_COMMAND)[2:])
    assert json.loads(str(ours["--speculative-config"])) == json.loads(str(theirs["--speculative-config"]))
    # The tutorial's --no-enable-prefix-caching is not compared: this test holds the flags that
    # spec.serving.speculation and the batching set, and the operator leaves prefix caching to
    # serving.args (the tutorial's page gives no reason tying it to speculation).
    for name in ("--tensor-parallel-size", "--max-num-seqs", "--max-model-len"):
        assert ours[name] == theirs[name], name
    # The features guide: speculation and async scheduling are mutually exclusive; said, not left to the plugin's warning.
    assert ours["--no-async-scheduling"] is True and "--async-scheduling" not in ours


def test_the_compile_step_compiles_the_engine_that_is_served():
    """The plugin warms up (compiles) the draft's graphs and the target's verification graphs with
    speculation on: the compile Job's engine must have the same speculative_config, or the served
    engine misses the cache. The compile key has it: another draft is another compile."""
    m = model_of(**EAGLE3_TRN2)
    engine = compile_engine_args(m)
    assert engine["speculative_config"] == {"method": "eagle3", "model": DRAFT, "num_speculative_tokens": 3}
    assert engine["async_scheduling"] is False
    assert json.loads(str(flag_values(serving_flags(m))["--speculative-config"])) == engine["speculative_config"]
    assert compile_inputs(m)["engineArgs"] == engine
    other = model_of(**{**EAGLE3_TRN2, "serving.speculation.numSpeculativeTokens": 4})
    assert compile_inputs(other) != compile_inputs(m)


def test_without_speculation_nothing_of_it_is_rendered():
    m = model_of(**{**without_speculation(EAGLE3_TRN2), "serving.speculation": DROP})
    assert "speculative_config" not in compile_engine_args(m) and "async_scheduling" not in compile_engine_args(m)
    assert not any(a.startswith(("--speculative", "--no-async")) for a in serving_flags(m))


@pytest.mark.parametrize(
    "overrides,with_draft,without",
    [
        # The module's figure: the cap binds, and the draft's layer makes each block larger.
        ({}, 12868, 13271),
        # Llama-3.1-70B (70.6e9 weights, 80 layers) over the same 8 cores is bound by its weights:
        # 23192823398 - (141200000000 + 2000000000) / 8 = 5292823398, a block of 81 layers is 1327104
        # bytes: 3988 blocks (4228 without the draft: 5542823398 // 1310720).
        ({"model.weights": 70_600_000_000, "model.layers": 80}, 3988, 4228),
    ],
)
def test_the_kv_blocks_leave_room_for_the_drafts_weights_and_layer(overrides, with_draft, without):
    spec = {**EAGLE3_TRN2, **overrides}
    assert plan_document(plan(spec_of(**spec)))["kvCache"] == {"blocks": with_draft, "blockSize": 32}
    no_draft = without_speculation(spec)
    assert plan_document(plan(spec_of(**no_draft)))["kvCache"] == {"blocks": without, "blockSize": 32}
    m = model_of(**spec)
    assert flag_values(serving_flags(m))["--num-gpu-blocks-override"] == str(with_draft)
    assert compile_engine_args(m)["num_gpu_blocks_override"] == with_draft


def test_the_plans_device_memory_counts_the_drafts_weights_and_layer_on_the_same_cores():
    """plan's DEVICE-MEMORY (deviceMemoryPerProcess.neededBytes): the draft's 1e9 bf16 weights are 2e9 bytes
    more, and its layer in the KV cache 2 * 8 heads * 128 * 2 bytes a token, 2048 tokens of 2 sequences, 16777216."""
    trn2 = FAMILIES["trn2"]
    with_draft = device_memory_per_process(spec_of(**EAGLE3_TRN2), trn2, 8)
    without = device_memory_per_process(spec_of(**without_speculation(EAGLE3_TRN2)), trn2, 8)
    assert with_draft["neededBytes"] is not None and without["neededBytes"] is not None
    assert with_draft["neededBytes"] - without["neededBytes"] == 2_000_000_000 + 16_777_216


def test_without_the_drafts_weights_the_plan_gives_no_block_count_and_says_why():
    """The count that fits cannot be known without the draft's weights: the plugin sizes its cache
    itself, as it does for a model of unknown shape, and validate says what to set."""
    spec = {**EAGLE3_TRN2, "serving.speculation.draft.weights": DROP}
    assert plan(spec_of(**spec)).kv_cache is None
    errors, warnings = problems(**spec)
    assert errors == []
    assert warnings == [
        "spec.serving.speculation.draft.weights: not set, so the KV cache blocks are left to the vLLM Neuron plugin: the "
        "draft's weights share each core's memory with the target's; set the draft's parameters to have the plan size the cache"
    ]


@pytest.mark.parametrize(
    "overrides,refused",
    [
        (
            {"serving.runtime": "custom", "serving.args": ["serve"]},
            "spec.serving.speculation: EAGLE3 speculative decoding runs on the vLLM Neuron plugin, and serving.runtime is "
            "custom on trn2; valid specs set serving.runtime: vllm and compute.family trn2 or trn3",
        ),
        (
            {"compute.family": "inf2", "compute.inf": 2},
            "spec.serving.speculation: EAGLE3 speculative decoding runs on the vLLM Neuron plugin, and serving.runtime is "
            "vllm on inf2; valid specs set serving.runtime: vllm and compute.family trn2 or trn3",
        ),
        (
            {"serving.args": ["--speculative-config", '{"method": "eagle3"}']},
            "spec.serving.args: --speculative-config sets vLLM's speculative config a second time, beside "
            "spec.serving.speculation, and the compile step would not compile it; valid specs set it in "
            "spec.serving.speculation only",
        ),
        (
            {"serving.args": ["--speculative_config.num_speculative_tokens=5"]},
            "spec.serving.args: --speculative_config.num_speculative_tokens=5 sets vLLM's speculative config a second "
            "time, beside spec.serving.speculation, and the compile step would not compile it; valid specs set it in "
            "spec.serving.speculation only",
        ),
        (
            {"serving.args": ["--async-scheduling"]},
            "spec.serving.args: --async-scheduling turns on async scheduling, which the vLLM Neuron plugin runs only without "
            "spec.serving.speculation (it turns it off); valid specs drop --async-scheduling or spec.serving.speculation",
        ),
        (
            {"serving.args": ["--async_scheduling"]},
            "spec.serving.args: --async_scheduling turns on async scheduling, which the vLLM Neuron plugin runs only without "
            "spec.serving.speculation (it turns it off); valid specs drop --async_scheduling or spec.serving.speculation",
        ),
        (
            {"serving.speculation.draft.uri": "s3://models/eagle3/"},
            "spec.serving.speculation.draft.uri: s3://models/eagle3/ is not a model vLLM reads itself, and the draft is "
            "not fetched; valid values are a Hugging Face model id (org/name) or an absolute path in the serving image",
        ),
        (
            {"serving.speculation.draft.uri": "/"},
            "spec.serving.speculation.draft.uri: / is not a model vLLM reads itself, and the draft is not fetched; valid "
            "values are a Hugging Face model id (org/name) or an absolute path in the serving image",
        ),
    ],
)
def test_what_the_plugin_does_not_take_with_eagle3_is_refused_naming_both(overrides, refused):
    errors, _ = problems(**{**EAGLE3_TRN2, **overrides})
    assert refused in errors, errors


@pytest.mark.parametrize("uri", [f"{DRAFT}\n", "org/draft\n"])
def test_a_draft_id_with_a_trailing_newline_is_refused_as_the_api_server_refuses_it(uri):
    """CEL's matches() is RE2, whose $ is the end of the text; Python's re.match lets $ match before a
    last newline. validate must refuse what the API server refuses (tests/corpus.py holds the case)."""
    errors, _ = problems(**{**EAGLE3_TRN2, "serving.speculation.draft.uri": uri})
    assert any(e.startswith("spec.serving.speculation.draft.uri:") for e in errors), errors


def test_the_kv_cache_bytes_count_the_drafts_layer_as_the_plugins_blocks_do():
    """kv_cache_bytes (memory_needed, the fit rules) and plugin_block_bytes both hold kv_layers: the
    target's 32 layers and the draft's one. 2 KV bytes * 33 layers * 8 heads * 128 * 2 (bf16), 2048 tokens, 2 sequences."""
    trn2 = FAMILIES["trn2"]
    assert kv_cache_bytes(spec_of(**EAGLE3_TRN2), trn2, 8) == 2 * 33 * 8 * 128 * 2 * 2048 * 2
    assert kv_cache_bytes(spec_of(**without_speculation(EAGLE3_TRN2)), trn2, 8) == 2 * 32 * 8 * 128 * 2 * 2048 * 2


def test_a_kv_cache_that_does_not_fit_names_the_drafts_weights_it_counted():
    """KV_FIT's need holds the draft's weights (memory_needed): its words name them too."""
    errors, _ = problems(**{**EAGLE3_TRN2, "serving.batching": {"maxBatchSize": 1024}})
    [kv] = [e for e in errors if "a KV cache of" in e]
    assert kv.startswith("spec.compute.inf: 8030000000 bf16 weights and an EAGLE3 draft of 1000000000 weights, a KV cache of"), kv
    errors, _ = problems(**{**without_speculation(EAGLE3_TRN2), "serving.batching": {"maxBatchSize": 1024}})
    [kv] = [e for e in errors if "a KV cache of" in e]
    assert kv.startswith("spec.compute.inf: 8030000000 bf16 weights, a KV cache of"), kv


def test_speculating_past_max_model_len_is_a_warning_since_the_plugin_starts_and_decodes_without_it():
    """The design page: "Speculation is automatically skipped when a sequence's position reaches
    max_model_len - num_speculative_tokens": the server starts, and never speculates."""
    errors, warnings = problems(**{**EAGLE3_TRN2, "serving.speculation.numSpeculativeTokens": 2048})
    assert errors == []
    assert warnings == [
        "spec.serving.speculation.numSpeculativeTokens: 2048 leaves no position to speculate at: the plugin skips "
        "speculation from max_model_len - numSpeculativeTokens on, and max_model_len is 2048; valid values are 1 to 2047"
    ]


@pytest.mark.parametrize("tokens", [0, -1, "3", 1.5])
def test_num_speculative_tokens_is_a_count_of_at_least_one(tokens):
    """vLLM: "Expected num_speculative_tokens to be greater than zero" (vllm/config/speculative.py)."""
    errors, _ = problems(**{**EAGLE3_TRN2, "serving.speculation.numSpeculativeTokens": tokens})
    assert any(e.startswith("spec.serving.speculation.numSpeculativeTokens:") for e in errors), errors


def test_async_scheduling_turned_off_again_or_other_flags_are_taken():
    errors, warnings = problems(**{**EAGLE3_TRN2, "serving.args": ["--no-async-scheduling", "--max-num-batched-tokens", "2048"]})
    assert errors == [] and warnings == []


def test_a_hand_written_speculative_config_is_a_warning_where_the_plan_sizes_the_cache():
    """serving.args' own --speculative-config still reaches vLLM, as before the field; but the plan's
    block count leaves no room for a draft it does not know of, and the compile step compiles none."""
    config = json.dumps({"method": "eagle3", "model": DRAFT, "num_speculative_tokens": 3})
    spec = {**without_speculation(EAGLE3_TRN2), "serving.args": ["--speculative-config", config]}
    errors, warnings = problems(**spec)
    assert errors == []
    assert warnings == [
        "spec.serving.args: --speculative-config sets a speculative config the plan does not know of: the KV cache "
        "blocks it gives the plugin leave no room for a draft's weights and layer, and the compile step compiles no "
        "draft; valid specs set spec.serving.speculation instead"
    ]
    # The user's own block count is theirs to size.
    assert problems(**{**spec, "serving.args": ["--speculative-config", config, "--num-gpu-blocks-override", "6000"]}) == ([], [])


def test_a_hub_target_is_served_offline_and_the_compile_engine_names_the_hub_draft():
    """What this checks: the serving pods read a Hub target offline (HF_HUB_OFFLINE=1), and the
    compile Job's engine names the Hub draft, so the compile step, which downloads every Hub id the
    engine names, fetches it. That the compile step keeps it in the artefact is
    tests/test_programs.py's test_the_plugin_compile_step_keeps_an_eagle3_draft_from_the_hub_beside_its_target."""
    m = model_of(**EAGLE3_TRN2)
    [container] = serving_deployment(m)["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env.get("HF_HUB_OFFLINE") == "1"
    assert compile_engine_args(m)["speculative_config"]["model"] == DRAFT


def test_a_hub_draft_is_sized_where_it_is_written():
    """Kept in the artefact beside a Hub target's snapshot, the draft takes room in its volume; read by
    vLLM itself (a target in S3), it is downloaded into HOME, in the serving pods and the compile Job,
    and the start-up budget waits for it at 100 MiB/s."""
    kept = spec_of(**EAGLE3_TRN2)
    assert sizing.artefact_bytes(kept) == sizing.with_room(16_060_000_000 + 2_000_000_000)
    assert sizing.home_bytes(kept) == sizing.HOME_BYTES
    big = {**EAGLE3_TRN2, "model.uri": "s3://models/llama-3.1-8b/", "serving.speculation.draft.weights": 10_000_000_000}
    downloaded = spec_of(**big)
    assert sizing.artefact_bytes(downloaded) == sizing.with_room(16_060_000_000)
    assert sizing.home_bytes(downloaded) == sizing.compile_home_bytes(downloaded) == sizing.with_room(20_000_000_000)
    no_draft = spec_of(**without_speculation(big))
    assert sizing.startup_seconds(downloaded) - sizing.startup_seconds(no_draft) == -(-20_000_000_000 // (100 * 2**20))
    # A draft in the image is nobody's download.
    in_image = spec_of(**{**big, "serving.speculation.draft.uri": "/opt/drafts/llama-eagle3"})
    assert sizing.home_bytes(in_image) == sizing.home_bytes(no_draft)


def test_the_sample_is_the_tutorials_pair_and_validates_without_a_warning():
    doc = yaml.safe_load(SAMPLE.read_text())
    checked = check_model(doc["metadata"]["name"], doc["metadata"]["namespace"], doc["spec"], scheduler_name="my-scheduler")
    assert [f"{f.severity} {f.path}: {f.message}" for f in checked.findings] == []
    assert checked.model is not None
    engine = compile_engine_args(checked.model)
    assert engine["model"] == TARGET and engine["speculative_config"]["model"] == DRAFT
    assert (engine["tensor_parallel_size"], engine["max_num_seqs"], engine["max_model_len"]) == (8, 2, 2048)
