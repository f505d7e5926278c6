"""The stand-ins refuse what the real programs refuse (docs/development.md, "Stand-ins and the
interfaces they keep"): an undocumented flag, a V0 interface on a V1 image, a path chosen by an
environment variable the real package never reads. Each runs as the real node's pods run it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import images
from inferentia_operator.core import neuron_images

ROOT = Path(__file__).resolve().parent.parent
STANDINS = ROOT / "cluster" / "node" / "standins"
PROGRAMS = ROOT / "operator" / "inferentia_operator" / "programs"
VLLM_REPO = "public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:"
V0 = VLLM_REPO + "0.9.1-neuronx-py311-sdk2.26.1-ubuntu22.04"
NXDI = VLLM_REPO + "0.16.0-neuronx-py312-sdk2.31.0-ubuntu24.04"
PLUGIN = VLLM_REPO + "0.24.0.1.1.0-neuronx-py313-sdk2.32.0-ubuntu24.04"


def site(where: Path, image: str | None) -> str:
    """PYTHONPATH for an image: its packages' dist-info (as the stand-in images carry them), then the stand-ins."""
    if image is None:
        return str(STANDINS)
    images.write_distributions(where, neuron_images.CATALOGUE[image].distributions)
    return f"{where}:{STANDINS}"


def run(tmp_path: Path, image: str | None, *argv: str, **env: str) -> subprocess.CompletedProcess:
    environment = {"PATH": "/usr/bin:/bin", "PYTHONPATH": site(tmp_path / "site", image), "HOME": str(tmp_path), **env}
    return subprocess.run([sys.executable, *argv], env=environment, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("image", [V0, NXDI, PLUGIN])
def test_vllms_server_refuses_an_undocumented_flag_as_its_argument_parser_does(tmp_path, image):
    done = run(tmp_path, image, "-m", "vllm.entrypoints.openai.api_server", "--model", "m", "--no-such-flag", "1")
    assert done.returncode == 2 and "unrecognized arguments: --no-such-flag 1" in done.stderr, done.stderr


@pytest.mark.parametrize(("image", "flag"), [(NXDI, "--override-neuron-config"), (PLUGIN, "--override-neuron-config"),
                                             (V0, "--additional-config")])  # fmt: skip
def test_each_vllm_release_takes_its_own_neuron_override_flag_only(tmp_path, image, flag):
    """--override-neuron-config is V0's (vLLM up to 0.10.1.1); --additional-config replaced it."""
    done = run(tmp_path, image, "-m", "vllm.entrypoints.openai.api_server", "--model", "m", flag, "{}")
    assert done.returncode == 2 and f"unrecognized arguments: {flag}" in done.stderr, done.stderr


def test_an_image_without_vllm_has_no_vllm_to_import(tmp_path):
    done = run(tmp_path, None, "-m", "vllm.entrypoints.openai.api_server", "--model", "m")
    assert done.returncode == 1 and "No module named 'vllm'" in done.stderr, done.stderr


def test_the_multi_node_worker_is_refused_on_a_v1_image(tmp_path):
    """vllm-neuron has no --override-neuron-config and no V0 driver_worker: the operator's worker
    program stops at its arguments, as it would on AWS's 0.11.0 and later images."""
    (tmp_path / "vllm_worker.py").write_text((PROGRAMS / "vllm_worker.py").read_text())
    argv = (str(tmp_path / "vllm_worker.py"), "--model", "m", "--override-neuron-config", "{}")
    done = run(tmp_path, NXDI, *argv, NEURON_RANK_ID="1")
    assert done.returncode == 2 and "unrecognized arguments: --override-neuron-config" in done.stderr, done.stderr


def test_the_serving_path_is_the_installed_packages_not_vllm_neuron_framework(tmp_path):
    """VLLM_NEURON_FRAMEWORK is read by vLLM's V0 worker only; on the plugin's image it chooses nothing."""
    probe = "import neuron_standin as s; print(s.vllm_serving(), s.plugin_mode())"
    framework = {"VLLM_NEURON_FRAMEWORK": "neuronx-distributed-inference"}
    assert run(tmp_path / "a", PLUGIN, "-c", probe, **framework).stdout.split() == ["vllm-neuron-plugin", "True"]
    assert run(tmp_path / "b", NXDI, "-c", probe).stdout.split() == ["vllm-neuron", "False"]
    assert run(tmp_path / "c", V0, "-c", probe).stdout.split() == ["vllm-v0", "False"]


def test_vllm_reads_no_object_store_without_the_run_ai_streamer(tmp_path):
    done = run(tmp_path, NXDI, "-m", "vllm.entrypoints.openai.api_server", "--model", "s3://models/llama/")
    assert done.returncode == 1 and "'load_format' must be 'runai_streamer'" in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("prog", "flags", "refused"),
    [
        ("neuronx-cc", ["--target", "inf2", "--no-such-flag"], "--no-such-flag"),
        ("neuronx-cc", ["--target", "inf2", "--neuroncore-pipeline-cores", "2"], "--neuroncore-pipeline-cores"),  # neuron-cc's
        ("neuron-cc", ["--no-such-flag"], "--no-such-flag"),
        ("neuron-cc", ["--target", "inf2"], "--target"),  # neuronx-cc's
    ],
)
def test_the_compilers_refuse_an_undocumented_flag(tmp_path, prog, flags, refused):
    script = f"import sys, neuron_standin; sys.exit(neuron_standin.compiler(['compile', *{flags!r}], {prog!r}))"
    done = run(tmp_path, None, "-c", script)
    assert done.returncode == 1 and f"unrecognized arguments: {refused}" in done.stderr, done.stderr


def test_vllm_neuron_asserts_a_block_size_with_prefix_caching_on(tmp_path):
    """vLLM turns prefix caching on by default; vllm-neuron's platform then needs --block-size."""
    done = run(tmp_path, NXDI, "-m", "vllm.entrypoints.openai.api_server", "--model", "m", "--max-num-seqs", "4")
    assert done.returncode == 1 and "When prefix caching is enabled, block_size must be set" in done.stderr, done.stderr


def test_vllms_v0_worker_asserts_its_own_block_count(tmp_path):
    """vLLM's V0 Neuron worker keeps max_num_seqs + 1 blocks and asserts it (vllm/worker/neuron_worker.py)."""
    argv = ("-m", "vllm.entrypoints.openai.api_server", "--model", "m", "--max-num-seqs", "4", "--num-gpu-blocks-override", "4")
    done = run(tmp_path, V0, *argv)
    assert done.returncode == 1 and "num_gpu_blocks == max_num_seqs + 1" in done.stderr, done.stderr


def test_a_model_larger_than_its_cores_device_memory_fails_to_allocate_as_the_runtime_does(tmp_path):
    """405e9 bf16 parameters over one trn1.32xlarge's 32 NeuronCores are 25 GB a core, where a
    core has 16 GiB: the runtime fails to allocate (vllm#12443's nrt_tensor_allocate "Allocation
    Failure"). Over two nodes' 64 cores, or for an 8B model, each core's share fits."""
    dev = tmp_path / "dev"
    dev.mkdir()
    for chip in range(16):
        (dev / f"neuron{chip}").touch()
    trn1 = {"NEURON_STANDIN_DEV_DIR": str(dev), "NEURON_STANDIN_PLATFORM": "trn1", "NEURON_STANDIN_CORES_PER_DEVICE": "2",
            "NEURON_STANDIN_LOCK_DIR": str(tmp_path / "locks"), "NEURON_RT_VISIBLE_CORES": "0-31"}  # fmt: skip
    big = "meta-llama/Llama-3.1-405B-Instruct"
    argv = ("-m", "vllm.entrypoints.openai.api_server", "--model", big, "--tensor-parallel-size", "32")
    no_token = run(tmp_path, V0, *argv, **trn1)  # a gated model: the Hub refuses it without a token, as vLLM reports
    assert no_token.returncode == 1 and "GatedRepoError: 401 Client Error. Cannot access gated repo" in no_token.stderr, no_token.stderr
    trn1["HF_TOKEN"] = "standin-token"
    done = run(tmp_path, V0, *argv, **trn1)
    assert done.returncode == 1 and 'nrt_tensor_allocate status=4 message="Allocation Failure"' in done.stderr, done.stderr
    assert "TDRV:dmem_alloc_internal" in done.stderr
    for model, cores in ((big, 64), ("meta-llama/Llama-3.1-8B-Instruct", 32)):
        probe = f"import neuron_standin as s; s.check_device_memory({model!r}, {cores}, 'bfloat16'); print('fits')"
        fits = run(tmp_path, V0, "-c", probe, **trn1)
        assert fits.stdout.strip() == "fits", fits.stderr


def test_offline_the_hub_client_serves_only_a_cached_snapshot_with_the_librarys_words(tmp_path):
    """huggingface_hub with HF_HUB_OFFLINE=1 (or local_files_only=True) downloads nothing: the
    snapshot the cache's ref names is returned if its folder exists, else LocalEntryNotFoundError
    (huggingface_hub/_snapshot_download.py). Online, the snapshot's files are links into blobs/."""
    code = (
        "import os, sys, json\n"
        "from huggingface_hub import snapshot_download\n"
        "try:\n"
        "    print(json.dumps({'path': snapshot_download(sys.argv[1], **json.loads(sys.argv[2]))}))\n"
        "except Exception as e:\n"
        "    print(json.dumps({'error': type(e).__name__, 'message': str(e)}))\n"
    )
    cache = tmp_path / "hub"
    ask = lambda repo, kwargs="{}", **env: json.loads(run(tmp_path, None, "-c", code, repo, kwargs, HF_HUB_CACHE=str(cache), **env).stdout)  # noqa: E731
    missing = ask("gpt2", HF_HUB_OFFLINE="1")
    assert missing["error"] == "LocalEntryNotFoundError" and missing["message"].endswith("set 'HF_HUB_OFFLINE=0' as environment variable.")
    local_only = ask("gpt2", '{"local_files_only": true}')
    assert local_only["error"] == "LocalEntryNotFoundError" and local_only["message"].endswith("pass 'local_files_only=False' as input.")
    online = Path(ask("gpt2")["path"])
    assert (online / "config.json").is_symlink() and (online / "config.json").resolve().parent.name == "blobs"
    assert (online.parent.parent / "refs" / "main").read_text() == online.name
    assert Path(ask("gpt2", HF_HUB_OFFLINE="1")["path"]) == online
    # allow_patterns and ignore_patterns filter what is fetched, as the library's filter_repo_objects does.
    some = Path(ask("openai-community/gpt2", '{"allow_patterns": ["*.json"], "ignore_patterns": ["tok*"]}')["path"])
    assert sorted(p.name for p in some.iterdir()) == ["config.json"]
    listed = run(tmp_path, None, "-c", "import huggingface_hub as h; print(h.list_repo_files('gpt2'))", HF_HUB_OFFLINE="1")
    assert "OfflineModeIsEnabled" in listed.stderr  # listing asks the Hub: refused offline
    # A cached ref that names no snapshot folder is as good as no cache.
    (online.parent.parent / "refs" / "main").write_text("0" * 40)
    assert ask("gpt2", HF_HUB_OFFLINE="yes")["error"] == "LocalEntryNotFoundError"


@pytest.mark.parametrize("image", [NXDI, PLUGIN])
def test_vllm_offline_serves_a_hub_id_only_from_the_hub_cache(tmp_path, image):
    """vLLM reads a Hub id through the Hub client: offline with nothing cached it fails with the
    client's reason; the plugin (which loads the checkpoint's weights itself) also fails on a
    cache that holds the configuration but no weights, as vLLM's loader does."""
    argv = ("-m", "vllm.entrypoints.openai.api_server", "--model", "gpt2", "--max-model-len", "128", "--block-size", "32")
    empty = run(tmp_path, image, *argv, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path / "empty"))
    assert empty.returncode == 1 and "LocalEntryNotFoundError: Cannot find an appropriate cached snapshot folder" in empty.stderr, (
        empty.stderr
    )
    cache = tmp_path / "hub"
    fetched = run(tmp_path, None, "-c", "import huggingface_hub as h; print(h.snapshot_download('gpt2'))", HF_HUB_CACHE=str(cache))
    snapshot = Path(fetched.stdout.strip())
    (snapshot / "model.safetensors").unlink()
    config_only = run(tmp_path, image, *argv, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache))
    if image == PLUGIN:
        assert config_only.returncode == 1 and "RuntimeError: Cannot find any model weights with `gpt2`" in config_only.stderr
    else:  # NxD Inference without a compiled model loads the checkpoint's weights too
        assert config_only.returncode == 1 and "Cannot find any model weights" in config_only.stderr, config_only.stderr


# -- the vLLM Neuron plugin's KV cache (trn2): what it refuses at start and in its CPU compile ----


def llama_8b_checkpoint(where: Path) -> Path:
    """A local checkpoint that stands for Llama-3.1-8B: its config.json's shape (32 layers, 8 KV
    heads, 32 attention heads of a 4096 hidden size: head dimension 128), its parameters, and a
    weights file for vLLM's loader to find."""
    where.mkdir(parents=True)
    config = {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16", "num_hidden_layers": 32,
        "num_key_value_heads": 8, "num_attention_heads": 32, "hidden_size": 4096, "_standin_parameters": 8_030_000_000,
    }  # fmt: skip
    (where / "config.json").write_text(json.dumps(config))
    (where / "model.safetensors").write_bytes(b"")
    return where


def trn2_chip(tmp_path: Path) -> dict[str, str]:
    """One Trainium2 chip as the device plugin stand-in mounts it: 4 logical cores of 24 GiB at LNC 2."""
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "neuron0").touch()
    return {
        "NEURON_STANDIN_DEV_DIR": str(dev), "NEURON_STANDIN_PLATFORM": "trn2", "NEURON_STANDIN_CORES_PER_DEVICE": "4",
        "NEURON_STANDIN_LOCK_DIR": str(tmp_path / "locks"), "NEURON_RT_VISIBLE_CORES": "0-3", "NEURON_LOGICAL_NC_CONFIG": "2",
        "VLLM_CACHE_ROOT": str(tmp_path / "cache"), "VLLM_NEURON_DISABLE_WARMUP_COMPILE": "1",
    }  # fmt: skip


@pytest.mark.parametrize(
    "flags,refused",
    [
        # 8.03e9 bf16 weights over 4 cores are 4015000000 bytes a core; a block of 32 tokens of 2 KV heads
        # of 128, 32 layers, is 1048576 bytes: (25769803776 - 4015000000) // 1048576 = 20746 blocks fit a core.
        (("--num-gpu-blocks-override", "20747"), 'nrt_tensor_allocate status=4 message="Allocation Failure" (initialize_kv_cache'),
        # int(25769803776 * 0.19) - 4015000000 = 881262717 bytes: under the plugin's 1 GiB minimum budget.
        (("--gpu-memory-utilization", "0.19"), "RuntimeError: Computed KV cache budget is below minimum threshold"),
        # What fits starts: the server goes on to warm up, and misses the empty cache.
        (("--num-gpu-blocks-override", "20746"), "VLLM_NEURON_DISABLE_WARMUP_COMPILE: local compile cache miss"),
        (("--num-gpu-blocks-override", "6635", "--gpu-memory-utilization", "0.2"), "local compile cache miss"),
    ],
)
def test_the_plugin_refuses_a_kv_cache_its_cores_cannot_hold_or_a_budget_under_its_minimum(tmp_path, flags, refused):
    checkpoint = llama_8b_checkpoint(tmp_path / "llama")
    argv = ("-m", "vllm.entrypoints.openai.api_server", "--model", str(checkpoint), "--tensor-parallel-size", "4",
            "--max-model-len", "256", "--block-size", "32", *flags)  # fmt: skip
    done = run(tmp_path, PLUGIN, *argv, **trn2_chip(tmp_path))
    assert done.returncode == 1 and refused in done.stderr, done.stderr
    if "cache miss" in refused:
        assert "Allocation Failure" not in done.stderr and "minimum threshold" not in done.stderr


def test_the_plugins_cpu_compile_refuses_a_kv_cache_too_large_and_keys_its_graphs_by_the_cache(tmp_path):
    """The compile Job's engine: the graph of a cache that does not fit is rejected as neuronx-cc
    rejects it (NCC_EVRF009); the graphs compiled for one block count are not those of another,
    since the cache is an input of every graph."""
    checkpoint = llama_8b_checkpoint(tmp_path / "llama")
    env = {**trn2_chip(tmp_path), "VLLM_NEURON_CPU_COMPILE": "1", "NEURON_PLATFORM_TARGET_OVERRIDE": "trn2"}
    engine = {"model": str(checkpoint), "tensor_parallel_size": 4, "max_model_len": 256, "block_size": 32}

    def compile_with(blocks: int) -> subprocess.CompletedProcess:
        return run(tmp_path, PLUGIN, "-c", f"from vllm import LLM; LLM(**{ {**engine, 'num_gpu_blocks_override': blocks}!r})", **env)

    too_large = compile_with(20747)
    assert too_large.returncode == 1 and "RuntimeError: NCC_EVRF009" in too_large.stderr, too_large.stderr
    assert not (tmp_path / "cache" / "neuron" / "compile_cache").exists()
    assert compile_with(6635).returncode == 0
    probe = (
        "import neuron_standin as s\n"
        f"print(s.plugin_warm_up({ {**engine, 'num_gpu_blocks_override': 6635}!r}, 'trn2', may_compile=False)[1])\n"
        f"s.plugin_warm_up({ {**engine, 'num_gpu_blocks_override': 6000}!r}, 'trn2', may_compile=False)\n"
    )
    served = run(tmp_path, PLUGIN, "-c", probe, **env)
    assert served.stdout.split() == ["False"] and "local compile cache miss" in served.stderr, served.stderr


def test_the_plugins_graphs_are_the_same_for_its_default_block_size_unset_or_given(tmp_path):
    """block_size unset is the plugin's 32: a compile without it serves an engine given --block-size 32."""
    env = {**trn2_chip(tmp_path), "VLLM_NEURON_CPU_COMPILE": "1", "NEURON_PLATFORM_TARGET_OVERRIDE": "trn2"}
    probe = (
        "import neuron_standin as s\n"
        "e = {'model': 'm', 'tensor_parallel_size': 4, 'num_gpu_blocks_override': 100}\n"
        "print(sorted(s.plugin_graphs(e, 'trn2')) == sorted(s.plugin_graphs({**e, 'block_size': 32}, 'trn2')))\n"
        "print(sorted(s.plugin_graphs(e, 'trn2')) == sorted(s.plugin_graphs({**e, 'block_size': 64}, 'trn2')))\n"
    )
    done = run(tmp_path, PLUGIN, "-c", probe, **env)
    assert done.stdout.split() == ["True", "False"], done.stderr


def test_the_compile_and_the_server_take_one_core_memory_at_the_logical_nc_config(tmp_path):
    """The plugin's CPU compile and the device give a logical core the same HBM: a Trainium2 chip's
    96 GiB over 8 physical cores at NEURON_LOGICAL_NC_CONFIG, whatever the device plugin counts."""
    probe = "import neuron_standin as s\nprint(s.core_memory_bytes(), s.core_memory_bytes('trn2'))\n"
    chip = trn2_chip(tmp_path)
    at_2 = run(tmp_path, PLUGIN, "-c", probe, **{**chip, "NEURON_STANDIN_CORES_PER_DEVICE": "8"})
    assert at_2.stdout.split() == [str(24 << 30)] * 2, at_2.stderr
    at_1 = run(tmp_path, PLUGIN, "-c", probe, **{**chip, "NEURON_LOGICAL_NC_CONFIG": "1"})
    assert at_1.stdout.split() == [str(12 << 30)] * 2, at_1.stderr


def test_the_plugins_server_takes_flags_with_underscores_as_vllm_does(tmp_path):
    """vLLM's FlexibleArgumentParser reads --block_size as --block-size; a cache that fits starts and
    goes on to miss the empty compile cache."""
    checkpoint = llama_8b_checkpoint(tmp_path / "llama")
    argv = ("-m", "vllm.entrypoints.openai.api_server", "--model", str(checkpoint), "--tensor_parallel_size", "4",
            "--max_model_len=256", "--block_size", "32", "--num_gpu_blocks_override", "6635")  # fmt: skip
    done = run(tmp_path, PLUGIN, *argv, **trn2_chip(tmp_path))
    assert done.returncode == 1 and "local compile cache miss" in done.stderr, done.stderr
    assert "unrecognized arguments" not in done.stderr


# -- EAGLE3 speculative decoding on the vLLM Neuron plugin (trn2) ------------------------------
# vLLM parses --speculative-config as JSON and checks num_speculative_tokens in SpeculativeConfig
# (vllm/config/speculative.py); the plugin's docs name "eagle3" (2.31) and "dflash" (2.33), and it turns async
# scheduling off with it (the features guide, "Speculative decoding (EAGLE3)",
# https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/guides/features-guide.html).


def eagle3_draft(where: Path, parameters: int = 1_000_000_000) -> Path:
    """A local EAGLE3 draft checkpoint: one decoder layer ("a single decoder layer", the speculative
    decoding design page) of the target's attention shape, its parameters, and a weights file."""
    where.mkdir(parents=True)
    config = {
        "model_type": "llama", "architectures": ["LlamaForCausalLMEagle3"], "torch_dtype": "bfloat16", "num_hidden_layers": 1,
        "num_key_value_heads": 8, "num_attention_heads": 32, "hidden_size": 4096, "_standin_parameters": parameters,
    }  # fmt: skip
    (where / "config.json").write_text(json.dumps(config))
    (where / "model.safetensors").write_bytes(b"")
    return where


def speculative(draft: Path, **fields: object) -> str:
    return json.dumps({"method": "eagle3", "model": str(draft), "num_speculative_tokens": 3, **fields})


@pytest.mark.parametrize(
    "config,code,refused",
    [
        ("{method: eagle3}", 2, "argument --speculative-config: invalid loads value"),
        (None, 1, "Expected num_speculative_tokens to be greater than zero (0)."),
        ("no-tokens", 1, "num_speculative_tokens must be provided with speculative model unless the draft model config"),
        ("ngram", 1, "the vLLM Neuron plugin documents the speculative methods eagle3, dflash only, not 'ngram'"),
        # A method that takes no draft (vLLM's ngram): its method is refused, not a missing model.
        ("ngram-no-model", 1, "the vLLM Neuron plugin documents the speculative methods eagle3, dflash only, not 'ngram'"),
        # No method: vLLM infers one from the draft's name, here none it knows, so draft_model.
        ("no-method", 1, "the vLLM Neuron plugin documents the speculative methods eagle3, dflash only, not 'draft_model'"),
    ],
)
def test_the_plugins_server_refuses_a_speculative_config_vllm_or_the_plugin_refuses(tmp_path, config, code, refused):
    draft = eagle3_draft(tmp_path / "draft")
    given = {
        None: speculative(draft, num_speculative_tokens=0),
        "no-tokens": json.dumps({"method": "eagle3", "model": str(draft)}),
        "ngram": speculative(draft, method="ngram"),
        "ngram-no-model": json.dumps({"method": "ngram", "num_speculative_tokens": 3}),
        "no-method": json.dumps({"model": str(draft), "num_speculative_tokens": 3}),
    }.get(config, config)
    checkpoint = llama_8b_checkpoint(tmp_path / "llama")
    argv = ("-m", "vllm.entrypoints.openai.api_server", "--model", str(checkpoint), "--tensor-parallel-size", "4",
            "--max-model-len", "256", "--block-size", "32", "--speculative-config", str(given))  # fmt: skip
    done = run(tmp_path, PLUGIN, *argv, **trn2_chip(tmp_path))
    assert done.returncode == code and refused in done.stderr, done.stderr


@pytest.mark.parametrize("form", ["inferred-eagle3", "n_predict", "dflash", "dotted"])
def test_the_plugins_server_takes_the_speculative_configs_vllm_and_the_plugin_take(tmp_path, form):
    """vLLM infers the method from the draft's name and takes num_speculative_tokens from its config's
    n_predict (vllm/config/speculative.py); the 2.33 docs add {"method": "dflash", ...}; and vLLM reads
    --speculative-config.<key> as one key of the object. Each gets past the config to the warm-up."""
    draft = eagle3_draft(tmp_path / "llama-eagle3-draft")
    if form == "n_predict":
        config = json.loads((draft / "config.json").read_text())
        (draft / "config.json").write_text(json.dumps({**config, "n_predict": 3}))
    flags = {
        "inferred-eagle3": ["--speculative-config", json.dumps({"model": str(draft), "num_speculative_tokens": 3})],
        "n_predict": ["--speculative-config", json.dumps({"method": "eagle3", "model": str(draft)})],
        "dflash": ["--speculative-config", speculative(draft, method="dflash")],
        "dotted": ["--speculative-config.method", "eagle3", f"--speculative_config.model={draft}",
                   "--speculative-config.num_speculative_tokens", "3"],
    }[form]  # fmt: skip
    checkpoint = llama_8b_checkpoint(tmp_path / "llama")
    argv = ("-m", "vllm.entrypoints.openai.api_server", "--model", str(checkpoint), "--tensor-parallel-size", "4",
            "--max-model-len", "256", "--block-size", "32", "--num-gpu-blocks-override", "19655", *flags)  # fmt: skip
    done = run(tmp_path, PLUGIN, *argv, **trn2_chip(tmp_path))
    assert done.returncode == 1 and "VLLM_NEURON_DISABLE_WARMUP_COMPILE: local compile cache miss" in done.stderr, done.stderr


@pytest.mark.parametrize(
    "blocks,refused",
    [
        # The draft's 1e9 bf16 parameters join the target's, 4 ways: (16060000000 + 2000000000) / 4 = 4515000000
        # bytes a core, and its layer joins every block: 32 * 2 * 33 * 2 * 128 * 2 = 1081344 bytes, so
        # (25769803776 - 4515000000) // 1081344 = 19655 blocks fit, 1091 fewer than without the draft.
        ("19656", 'nrt_tensor_allocate status=4 message="Allocation Failure" (initialize_kv_cache'),
        ("19655", "VLLM_NEURON_DISABLE_WARMUP_COMPILE: local compile cache miss"),
    ],
)
def test_the_plugins_server_counts_the_drafts_weights_and_layer_in_its_kv_cache(tmp_path, blocks, refused):
    checkpoint, draft = llama_8b_checkpoint(tmp_path / "llama"), eagle3_draft(tmp_path / "draft")
    argv = ("-m", "vllm.entrypoints.openai.api_server", "--model", str(checkpoint), "--tensor-parallel-size", "4",
            "--max-model-len", "256", "--block-size", "32", "--num-gpu-blocks-override", blocks,
            "--speculative_config", speculative(draft))  # fmt: skip
    done = run(tmp_path, PLUGIN, *argv, **trn2_chip(tmp_path))
    assert done.returncode == 1 and refused in done.stderr, done.stderr


def test_the_plugin_turns_async_scheduling_off_with_speculation_and_says_so(tmp_path):
    """ "Setting --speculative-config disables async scheduling automatically with a startup warning"
    (the features guide): the server goes on, to its warm-up, which misses the empty cache."""
    checkpoint, draft = llama_8b_checkpoint(tmp_path / "llama"), eagle3_draft(tmp_path / "draft")
    argv = ("-m", "vllm.entrypoints.openai.api_server", "--model", str(checkpoint), "--tensor-parallel-size", "4",
            "--max-model-len", "256", "--block-size", "32", "--async-scheduling", "--speculative-config", speculative(draft))  # fmt: skip
    done = run(tmp_path, PLUGIN, *argv, **trn2_chip(tmp_path))
    assert done.returncode == 1 and "local compile cache miss" in done.stderr, done.stderr
    assert "WARNING" in done.stderr and "async scheduling is disabled with speculative decoding" in done.stderr


def test_the_plugins_graphs_with_a_draft_are_not_those_without_and_the_compile_makes_them(tmp_path):
    """With speculation the plugin warms up the draft's graphs and the target's verification graphs
    (the design page, "Warmup with Speculation Enabled"): a cache compiled without the draft serves no
    engine with it, and the CPU compile given the same speculative_config fills what that engine reads."""
    checkpoint, draft = llama_8b_checkpoint(tmp_path / "llama"), eagle3_draft(tmp_path / "draft")
    env = {**trn2_chip(tmp_path), "VLLM_NEURON_CPU_COMPILE": "1", "NEURON_PLATFORM_TARGET_OVERRIDE": "trn2"}
    config = json.loads(speculative(draft))
    engine = {"model": str(checkpoint), "tensor_parallel_size": 4, "max_model_len": 256, "block_size": 32, "num_gpu_blocks_override": 6000}
    compiled = run(
        tmp_path,
        PLUGIN,
        "-c",
        f"from vllm import LLM; LLM(**{ {**engine, 'speculative_config': config, 'async_scheduling': False}!r})",
        **env,
    )
    assert compiled.returncode == 0, compiled.stderr
    probe = (
        "import neuron_standin as s\n"
        f"print(s.plugin_warm_up({ {**engine, 'speculative_config': config}!r}, 'trn2', may_compile=False)[1])\n"
        f"s.plugin_warm_up({engine!r}, 'trn2', may_compile=False)\n"
    )
    served = run(tmp_path, PLUGIN, "-c", probe, **env)
    assert served.stdout.split() == ["False"] and "local compile cache miss" in served.stderr, served.stderr
