"""Stand-ins for the Neuron side of a serving pod, for the local cluster's real node.

Command lines of one module (installed as /usr/local/bin/{neuron-cc,neuronx-cc,neuron-serve}
and as vLLM's ``python3 -m vllm.entrypoints.openai.api_server``):

- ``neuron-cc`` / ``neuronx-cc compile``: records its flags, refuses what the real compiler
  refuses for that target, and writes an artefact (JSON) carrying flags, target, LNC and
  tensor-parallel degree.
- ``neuron-serve`` and the vLLM entry point: an HTTP server with vLLM's OpenAI-compatible
  ``/v1/completions`` and ``/health``. At start it checks what the Neuron runtime and vLLM
  would check, and exits non-zero with the kind of message they give when a check fails.
  What serves vLLM is what the image's installed packages say (standin_versions): vLLM's V0
  Neuron worker or vllm-neuron run on NxD Inference: the loader loads the compiled model in
  ``NEURON_COMPILED_ARTIFACTS`` with the NxD Inference stand-in (refusing one compiled for
  another engine, nxdi_neuron_config), and compiles at start when that fails, as vLLM's does.
  vllm-neuron 0.21 and later is the vLLM Neuron plugin, which registers itself: its compile cache under ``$VLLM_CACHE_ROOT/neuron/compile_cache/<hash>/`` is used
  at warm-up, and a miss compiles the graph, or, with ``VLLM_NEURON_DISABLE_WARMUP_COMPILE=1``,
  raises RuntimeError;
- across nodes (``ENABLE_NEURON_MULTI_NODE=true``, ``--override-neuron-config`` with its
  layout): rank 0's vLLM server starts the root communicator at ``NEURON_RT_ROOT_COMM_ID`` and
  answers nothing until every node's ranks have joined; each completion is then a step of every
  node, and a node lost kills it (neuron_collectives; the other nodes run the operator's worker
  program on ``vllm.engine``'s ``AsyncEngineArgs`` and ``AsyncLLMEngine``);
- ``vllm.LLM``: vLLM's offline engine (``LLM(model=..., tensor_parallel_size=...,
  max_model_len=..., max_num_seqs=...)``); as the plugin, with ``VLLM_NEURON_CPU_COMPILE=1``,
  it only compiles, for ``NEURON_PLATFORM_TARGET_OVERRIDE``, into the same cache.

Nothing here is Neuron: it only enforces the contract a real node puts on a pod.
"""

from __future__ import annotations

import argparse
import fcntl
import glob
import hashlib
import json
import os
import re
import signal
import socket
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import NoReturn

import vllm_disagg
import vllm_neuron_metrics
from neuron_collectives import CollectiveError, RootCommunicator, fatal, multi_node_config

# Sequences is neuron_standin's too, as it was before standin_serving held it (tests/test_programs.py uses it).
from standin_serving import JsonHandler, Ranks, Sequences, model_label, rank_groups, scheduler_gauges  # noqa: F401
from standin_versions import VLLM_NEURON_NXDI, VLLM_NEURON_PLUGIN, VLLM_V0, compiler_versions, installed, vllm_serving

ARTEFACT = "model.neff.json"


def fail(component: str, message: str) -> NoReturn:
    # The Neuron runtime logs as "<time> ERROR  NRT:<function>  <message>".
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} ERROR  {component}  {message}", file=sys.stderr, flush=True)
    sys.exit(1)


def expand(cores: str) -> list[int]:
    out: list[int] = []
    for part in cores.split(","):
        part = part.strip()
        if not re.fullmatch(r"\d+(-\d+)?", part):
            fail("NRT:nrt_init", f"NEURON_RT_VISIBLE_CORES={cores!r} is not a valid core list")
        first, _, last = part.partition("-")
        out += range(int(first), int(last or first) + 1)
    return out


# -- the compiler ------------------------------------------------------------------------------

# trn3: the compiler's release notes name it a target (Neuron 2.31: "the default for trn2 and
# trn3 targets", https://awsdocs-neuron.readthedocs-hosted.com/en/latest/release-notes/components/compiler.html).
# The CLI reference lists "inf2, trn1, trn1n, trn2".
NEURONX_TARGETS = {"inf2", "trn1", "trn1n", "trn2", "trn3"}
LNC_TARGETS = {"trn2", "trn3"}  # "LNC applies only to Trn2 and Trn3 instances"
# Each compiler's documented flags (compiler_parser): neuron-cc's CLI reference
# (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/compiler/neuron-cc/command-line-reference.html)
# and neuronx-cc's
# (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/compiler/neuronx-cc/api-reference-guide/neuron-compiler-cli-reference-guide.html).
# A flag of the other compiler (--target for neuron-cc, --neuroncore-pipeline-cores for
# neuronx-cc) is unknown to it, like any other.


class CompilerRefused(Exception):
    """What the compiler prints when it refuses its arguments (exit status 1)."""


def compiler_parser(prog: str) -> argparse.ArgumentParser:
    """The compiler's documented flags, and no others: an undocumented one is refused, as the
    real compilers' argument parsers refuse it. neuronx-cc: "neuronx-cc compile <model_files>
    --framework --target [--model-type] [--auto-cast] [--auto-cast-type] [--distribution-strategy]
    [--logical-nc-config, or -lnc] [--optlevel, or -O] [--enable-mixed-precision-accumulation]
    [--enable-saturate-infinity] [--enable-fast-context-switch] [--enable-fast-loading-neuron-binaries]
    [--logfile] [--output]" (the CLI reference above); ``--lnc`` as NCC_EARG001's page and NxD
    Inference's own compile flags spell it
    (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/compiler/error-codes/EARG001.html).
    neuron-cc: "neuron-cc compile <file names> --framework --io-config [--neuroncore-pipeline-cores]
    [--enable-saturate-infinity] [--enable-fast-loading-neuron-binaries] [--enable-fast-context-switch]
    [--fp32-cast] [--fast-math] [--output]" and its CLI reference's other options (--static-weights,
    --dynamic-batch-size) and the batching tech note's CNN flags (--batching_en,
    --rematerialization_en, --spill_dis, --sb_size, --enable-replication)."""
    p = argparse.ArgumentParser(prog=prog, add_help=False)
    p.add_argument("model", nargs="*")
    p.add_argument("--framework")
    p.add_argument("--output", default=ARTEFACT)
    p.add_argument("--verbose")
    for flag in ("--enable-saturate-infinity", "--enable-fast-context-switch", "--enable-fast-loading-neuron-binaries"):
        p.add_argument(flag, action="store_true")
    if prog == "neuronx-cc":
        p.add_argument("--target")
        p.add_argument("--lnc", "--logical-nc-config", "-lnc", dest="lnc", type=int)
        p.add_argument("--model-type")
        p.add_argument("--auto-cast")
        p.add_argument("--auto-cast-type")
        p.add_argument("--distribution-strategy")
        p.add_argument("--optlevel", "-O", type=int, choices=(1, 2, 3))
        p.add_argument("--enable-mixed-precision-accumulation", action="store_true")
        p.add_argument("--logfile")
    else:
        p.add_argument("--io-config")
        p.add_argument("--neuroncore-pipeline-cores", "--num-neuroncores", dest="neuroncore_pipeline_cores", type=int)
        p.add_argument("--fp32-cast")
        p.add_argument("--fast-math")
        p.add_argument("--static-weights", action="store_true")
        p.add_argument("--dynamic-batch-size", action="store_true")
        for flag in ("--batching_en", "--rematerialization_en", "--spill_dis"):
            p.add_argument(flag, action="store_true")
        p.add_argument("--sb_size", type=int)
        p.add_argument("--enable-replication")
    return p


def check_compiler_args(prog: str, argv: list[str]) -> dict:
    """What the compiler would be asked to build, or CompilerRefused with its message."""
    p = compiler_parser(prog)
    args, unknown = p.parse_known_args(argv)
    if unknown:
        code = "ERROR [NCC_EARG000] " if prog == "neuronx-cc" else f"{prog}: error: "
        raise CompilerRefused(f"{code}unrecognized arguments: {' '.join(unknown)}")
    target = getattr(args, "target", None) or ("inf1" if prog == "neuron-cc" else "trn1")
    if prog == "neuronx-cc":
        if target not in NEURONX_TARGETS:
            raise CompilerRefused(f"ERROR [NCC_EARG000] --target {target} is not supported by neuronx-cc")
        if args.lnc not in (None, 1, 2) or (args.lnc == 2 and target not in LNC_TARGETS):
            # LNC=2 exists only on Trainium2 and Trainium3 (compiler error NCC_EARG001).
            raise CompilerRefused(f"ERROR [NCC_EARG001] --lnc {args.lnc} is not supported for target {target}")
    else:
        if args.neuroncore_pipeline_cores is not None and not 1 <= args.neuroncore_pipeline_cores <= 64:
            raise CompilerRefused(f"neuron-cc: error: --neuroncore-pipeline-cores {args.neuroncore_pipeline_cores} is out of range 1-64")
    lnc = getattr(args, "lnc", None)
    return {
        "compiler": prog,
        "target": target,
        "lnc": lnc or (2 if target in LNC_TARGETS else 1),
        "pipelineCores": getattr(args, "neuroncore_pipeline_cores", None) or 1,
        "flags": argv,
        "model": args.model[0] if args.model else None,
        "output": args.output,
    }


def compiler(argv: list[str], prog: str) -> int:
    if prog == "neuronx-cc":
        if not argv or argv[0] != "compile":
            print("usage: neuronx-cc compile [options] <model>", file=sys.stderr)
            return 2
        argv = argv[1:]
    try:
        artefact = check_compiler_args(prog, argv)
    except CompilerRefused as exc:
        print(exc, file=sys.stderr)
        return 1
    output = artefact.pop("output")
    Path(output).write_text(json.dumps(artefact, indent=2))
    print(f"{prog}: compiled {artefact['model']} for {artefact['target']} -> {output}")
    return 0


# -- the vLLM Neuron plugin's compile cache ----------------------------------------------------
# https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/design/compilation/compilation_cache.html
# and .../compilation/cpu_compilation.html: the environment variables, the cache's layout
# ($VLLM_CACHE_ROOT/neuron/compile_cache/<hash>/, default ~/.cache/vllm) and what a miss does.

NXD_INFERENCE = "neuronx-distributed-inference"
PLUGIN_TARGETS = {"trn2", "trn3"}  # "the vLLM Neuron plugin for Trn2 and Trn3"
# The plugin's KV cache defaults, as the operator assumes them (core/cores.py, where they are cited):
# block_size 32 (the plugin's configuration reference, KV cache options) and gpu_memory_utilization
# 0.9 (the plugin's features guide, "KV cache budget too low").
PLUGIN_BLOCK_SIZE = 32
PLUGIN_GPU_MEMORY_UTILIZATION = 0.9
GRAPH = "graph.neff.json"


def plugin_mode() -> bool:
    """vLLM on the vLLM Neuron plugin (Trn2, Trn3): the installed vllm-neuron decides (standin_versions)."""
    return vllm_serving() == VLLM_NEURON_PLUGIN


def plugin_cache() -> Path:
    root = os.environ.get("VLLM_CACHE_ROOT") or str(Path(os.environ.get("HOME", "/root")) / ".cache" / "vllm")
    return Path(root) / "neuron" / "compile_cache"


def plugin_graphs(engine: dict, target: str) -> dict[str, dict]:
    """The graphs the plugin's warm-up compiles for an engine, by cache key. The real key hashes the
    FX graph, the input shapes, "torch_neuronx version, neuronxcc version, NKI version", the
    compiler arguments and the target into 32 hex digits (the Compilation Cache page above), so an
    image with other compiler versions than the compile Job's misses every graph; here the model's
    name stands for its graph, and there is one prefill graph at the sequence length and one
    decode graph at the sequences."""
    lnc = int(os.environ.get("NEURON_LOGICAL_NC_CONFIG", "2"))
    # The KV cache is an input of every graph: "each NEFF is compiled with KV tensors sized by the
    # allocated token count" (the plugin's determine_available_memory design page, below), so its
    # blocks and their tokens are in the key (blocks None where the plugin sizes them itself, which
    # its CPU compile and its served engine do alike; block_size unset is the plugin's 32, the same graph).
    common = {
        "model": engine["model"], "tensorParallelSize": engine.get("tensor_parallel_size") or 1, "target": target, "lnc": lnc,
        "compilerArgs": os.environ.get("NEURON_CC_FLAGS", ""), "versions": compiler_versions(),
        "kvCacheBlocks": engine.get("num_gpu_blocks_override"), "blockSize": engine.get("block_size") or PLUGIN_BLOCK_SIZE,
    }  # fmt: skip
    if engine.get("speculative_config") is not None:
        # With speculation the warm-up compiles the draft's graphs and the target's verification graphs,
        # which process 1 + num_speculative_tokens tokens a sequence (the speculative decoding design page).
        common["speculativeConfig"] = engine["speculative_config"]
    tokens, sequences = graph_sizes(engine)
    graphs = {
        "prefill": {**common, "phase": "prefill", "tokens": tokens},
        "decode": {**common, "phase": "decode", "sequences": sequences},
    }
    return {hashlib.md5(json.dumps(g, sort_keys=True).encode()).hexdigest(): g for g in graphs.values()}


def graph_sizes(engine: dict) -> tuple[int, int]:
    """The stand-in's prefill graph's tokens (the model's length) and decode graph's sequences
    (--max-num-seqs), vLLM's defaults where unset."""
    return engine.get("max_model_len") or 2048, engine.get("max_num_seqs") or 256


def plugin_warm_up(
    engine: dict, target: str, may_compile: bool, timed: vllm_neuron_metrics.PluginMetrics | None = None
) -> tuple[list[str], bool]:
    """The plugin's warm-up: each graph from the cache, or compiled into it, its time in ``timed``
    (vllm_neuron:compilation_time_seconds, "Includes compile cache hits"). Returns the keys and
    whether any graph was compiled; raises RuntimeError on a miss that may not compile."""
    if target not in PLUGIN_TARGETS:
        raise RuntimeError(f"the vLLM Neuron plugin supports Trn2 and Trn3, not {target}")
    cache, graphs = plugin_cache(), plugin_graphs(engine, target)
    compiled = False
    for key, graph in graphs.items():
        began = time.monotonic()
        compiled = _warm_up_graph(cache / key, key, graph, cache, may_compile) or compiled
        if timed is not None:
            bucket = (
                vllm_neuron_metrics.prefill_bucket(graph["tokens"]) if graph["phase"] == "prefill"
                else vllm_neuron_metrics.decode_bucket(graph["sequences"])
            )  # fmt: skip
            timed.compiled(bucket, time.monotonic() - began)
    return sorted(graphs), compiled


def _warm_up_graph(entry: Path, key: str, graph: dict, cache: Path, may_compile: bool) -> bool:
    """One graph of the warm-up: from the cache (False), or compiled into it (True)."""
    if (entry / GRAPH).is_file():
        return False
    if not may_compile:
        # The plugin's own words (a miss "raises RuntimeError", the Compilation Cache page),
        # then which graph, where, and for which compiler versions.
        raise RuntimeError(
            f"VLLM_NEURON_DISABLE_WARMUP_COMPILE: local compile cache miss for key {key}. All graphs must be pre-compiled "
            f"when warmup compilation is disabled. (the {graph['phase']} graph, in {cache}, for {graph['versions']})"
        )
    entry.mkdir(parents=True, exist_ok=True)
    (entry / GRAPH).write_text(json.dumps({**graph, "compiler": "neuronx-cc"}, indent=2))
    return True


# -- Speculative decoding on the plugin (EAGLE3; DFlash from Neuron 2.33) ------------------------
# vLLM takes --speculative-config as a JSON object (or its keys as --speculative-config.<key>, vLLM's
# dotted JSON flags: "--json-arg.key1 value1" is "--json-arg '{"key1": "value1"}'", the engine
# arguments page, https://docs.vllm.ai/en/v0.13.0/configuration/engine_args/) and builds
# SpeculativeConfig (vllm/config/speculative.py): without "method" it infers one from the draft
# ("eagle-" in its name is eagle, "eagle3" eagle3, "dflash" dflash, else draft_model); without
# num_speculative_tokens it takes the draft config's n_predict ("It will default to the number in
# the draft model config if present, otherwise, it is required"), else "num_speculative_tokens must be
# provided with speculative model unless the draft model config contains an n_predict parameter.";
# "Expected num_speculative_tokens to be greater than zero (N).". The draft is loaded at the target's
# dtype (draft_model_config's dtype=self.target_model_config.dtype).
# The plugin's methods, as the docs of each release give them: the EAGLE3 design page's method row,
# "Must be "eagle3". Currently the only supported speculation method on Neuron"
# (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/design/speculation/speculative_decoding_design.html,
# from a release whose speculation index lists EAGLE3 only); the 2.33 docs' speculation index adds
# "Speculative decoding (DFlash)", {"method": "dflash", "model": ..., "num_speculative_tokens": 9}
# (https://awsdocs-neuron.readthedocs-hosted.com/en/v2.33.0/vllm-neuron/docs/design/speculation/index.html and
# https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/design/speculation/dflash_speculative_decoding_design.html).
# The plugin's version does not name the SDK release, so the stand-in takes both; a method neither
# documents is refused in the stand-in's words (the plugin's own message is not documented). The
# draft's KV layers join the target's in one cache ("all layers (target + draft)"), and the warm-up
# compiles the draft's graphs and the target's verification graphs
# (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/design/speculation/speculative_decoding_design.html);
# "Setting --speculative-config disables async scheduling automatically with a startup warning"
# (the features guide).
PLUGIN_SPECULATIVE_METHODS = ("eagle3", "dflash")
SPECULATIVE_CONFIG_FLAG = "--speculative-config"


def inferred_method(draft: str) -> str:
    """vLLM's method for a draft named without one (SpeculativeConfig.__post_init__)."""
    name = draft.lower()
    return next((m for key, m in (("eagle-", "eagle"), ("eagle3", "eagle3"), ("dflash", "dflash")) if key in name), "draft_model")


def check_speculative_config(config: object) -> str:
    """The draft's checkpoint folder, for a speculative config vLLM and the plugin accept; fails with their reason."""
    if not isinstance(config, dict):
        fail("vllm", f"ValueError: --speculative-config must be a JSON object, got {config!r}")
    # vLLM looks at a given method before it asks for a model: ngram, suffix and mtp take none
    # (SpeculativeConfig.__post_init__, "if self.model is None and self.num_speculative_tokens is
    # not None"), so a method the plugin does not document is refused as such, model or not.
    if config.get("method") and config["method"] not in PLUGIN_SPECULATIVE_METHODS:
        refuse_method(config["method"])
    if not isinstance(config.get("model"), str) or not config["model"]:
        fail("vllm", "ValueError: num_speculative_tokens was provided but without speculative model.")
    folder = local_checkpoint(str(config["model"]), weights=True)
    draft_config = Path(folder) / "config.json"
    n_predict = json.loads(draft_config.read_text()).get("n_predict") if draft_config.is_file() else None
    tokens = config.get("num_speculative_tokens", n_predict)
    if tokens is None:
        fail("vllm", "ValueError: num_speculative_tokens must be provided with speculative model unless the draft model "
                     "config contains an n_predict parameter.")  # fmt: skip
    if not isinstance(tokens, int) or isinstance(tokens, bool):
        fail("vllm", f"ValueError: num_speculative_tokens: Input should be a valid integer, got {tokens!r}")
    if tokens <= 0:
        fail("vllm", f"ValueError: Expected num_speculative_tokens to be greater than zero ({tokens}).")
    method = config.get("method") or inferred_method(str(config["model"]))
    if method not in PLUGIN_SPECULATIVE_METHODS:
        refuse_method(method)
    return folder


def refuse_method(method: object) -> NoReturn:
    fail("vllm", f"ValueError: the vLLM Neuron plugin documents the speculative methods {', '.join(PLUGIN_SPECULATIVE_METHODS)} "
                 f"only, not {method!r}")  # fmt: skip


def dotted_json_flags(argv: list[str]) -> list[str]:
    """--speculative-config.<key> <value> (or =<value>) folded into one --speculative-config object,
    as vLLM's FlexibleArgumentParser folds dotted JSON flags (flexible_flag has made the name dashed).
    A value is read as JSON where it is JSON (3, true), else as the string it is: the stand-in's
    reading, since the engine arguments page shows string values only."""
    folded: dict[str, object] = {}
    rest, i = [], 0
    while i < len(argv):
        name, eq, value = argv[i].partition("=")
        if not name.startswith(SPECULATIVE_CONFIG_FLAG + "."):
            rest.append(argv[i])
            i += 1
            continue
        if not eq:
            i += 1
            value = argv[i] if i < len(argv) else ""
        try:
            folded[name.removeprefix(SPECULATIVE_CONFIG_FLAG + ".")] = json.loads(value)
        except ValueError:
            folded[name.removeprefix(SPECULATIVE_CONFIG_FLAG + ".")] = value
        i += 1
    return [*rest, SPECULATIVE_CONFIG_FLAG, json.dumps(folded)] if folded else rest


def with_draft(engine: dict) -> dict:
    """The engine with its speculative config's draft checkpoint (draft_checkpoint), which is loaded
    beside the target before the warm-up compiles its graphs; as it is without a speculative config."""
    if engine.get("speculative_config") is None:
        return engine
    return {**engine, "draft_checkpoint": check_speculative_config(engine["speculative_config"])}


def speculation_off_async(async_scheduling: bool | None, config: object) -> bool | None:
    """Async scheduling as the plugin runs it: off with a speculative config, with its startup warning."""
    if config is None:
        return async_scheduling
    if async_scheduling:
        print("WARNING  vllm-neuron  async scheduling is disabled with speculative decoding (--speculative-config): "
              "the two are mutually exclusive on Neuron", file=sys.stderr, flush=True)  # fmt: skip
    return False


def llm(**engine) -> dict:
    """vLLM's offline engine, as far as compiling goes: on the plugin with VLLM_NEURON_CPU_COMPILE=1,
    the graphs are compiled for NEURON_PLATFORM_TARGET_OVERRIDE and never run."""
    if not plugin_mode():
        raise RuntimeError("the offline engine stand-in runs only as the vLLM Neuron plugin")
    if os.environ.get("VLLM_NEURON_CPU_COMPILE") != "1":
        raise RuntimeError("no Neuron device: set VLLM_NEURON_CPU_COMPILE=1 to compile on the CPU")
    if os.environ.get("VLLM_NEURON_CPU_MODE") == "1":
        raise RuntimeError("VLLM_NEURON_CPU_COMPILE and VLLM_NEURON_CPU_MODE cannot be enabled together")
    target = os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE")
    if not target:
        raise RuntimeError("NEURON_PLATFORM_TARGET_OVERRIDE is required with VLLM_NEURON_CPU_COMPILE=1")
    if target not in PLUGIN_TARGETS:
        raise RuntimeError(f"the vLLM Neuron plugin supports Trn2 and Trn3, not {target}")
    checkpoint = local_checkpoint(str(engine["model"]), weights=True)  # the engine loads the weights before it warms up
    speculation_off_async(engine.get("async_scheduling"), engine.get("speculative_config"))
    engine = with_draft(engine)
    # CPU compile: "the static HBM size for the target platform", a logical core's, as on the device.
    memory = core_memory_bytes(target)
    assert memory is not None  # a plugin target
    try:
        plugin_kv_cache(checkpoint, engine, memory, compiling=True)
    except KvCacheError as exc:
        raise RuntimeError(str(exc)) from None
    keys, _ = plugin_warm_up(engine, target, may_compile=True)
    return {"cacheKeys": keys, "target": target}


# -- the runtime and server ---------------------------------------------------------------------

# Where the device-plugin stand-in mounts the node's core locks (--lock-dir): one file per
# NeuronCore, locked by the live process that holds the core.
# NEURON_STANDIN_LOCK_DIR: where tests outside a pod keep them.
LOCK_DIR = Path(os.environ.get("NEURON_STANDIN_LOCK_DIR", "/run/neuron-standin"))
_held: list[int] = []  # the lock files' descriptors: the locks last as long as the process


def hold_cores(cores: list[int]) -> list[int]:
    """Take ``cores`` for this process, as the Neuron runtime does: a NeuronCore a live process
    holds cannot be taken by another, which fails with "NeuronCore(s) not available" (AWS's
    torch-neuronx troubleshooting guide, "NeuronCore(s) not available - Requested:1
    Available:0", whose cause is another process holding the cores). The kernel drops the
    locks when the process dies, as the driver frees a dead process's cores. Without the
    lock directory (outside a pod the device plugin granted), nothing is recorded. Returns
    the cores another process holds (none taken then), or [] once all are this process's."""
    if not LOCK_DIR.is_dir():
        return []
    taken, busy = [], []
    for core in cores:
        fd = os.open(LOCK_DIR / f"core-{core}.lock", os.O_RDWR | os.O_CREAT, 0o666)
        try:
            os.fchmod(fd, 0o666)  # another pod's user must be able to open it too
        except PermissionError:
            pass  # created by another user, who made it so
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            busy.append(core)
            os.close(fd)
            continue
        taken.append(fd)
    if busy:
        for fd in taken:
            os.close(fd)
        return busy
    _held.extend(taken)
    return []


def held_message(requested: str, cores: list[int], busy: list[int]) -> str:
    return (
        f"Logical Neuron Core(s) not available - Requested:{requested} Available:{len(cores) - len(busy)} "
        f"(cores {','.join(map(str, busy))} are held by another process)"
    )


def runtime_checks(tp: int | None, local_ranks: int | None = None, dp: int = 1) -> dict:
    """What the Neuron runtime and vLLM check when a server starts; returns what it found.
    ``local_ranks``: across nodes, the ranks of this node (--override-neuron-config's
    local_ranks_size), one a visible NeuronCore. ``dp``: the plugin's --data-parallel-size, DP
    ranks each a TP group of ``tp`` consecutive visible cores (the plugin's data-parallelism design
    page, https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/design/parallelism/data_parallelism.html:
    "--tensor-parallel-size 8 --data-parallel-size 4 on 32 Neuron cores", TP group 0 ranks 0-7,
    group 1 ranks 8-15, ...), so the visible cores must be dp x tp."""
    # NEURON_STANDIN_DEV_DIR: where the tests outside a pod keep stand-in device files.
    dev = os.environ.get("NEURON_STANDIN_DEV_DIR", "/dev")
    devices = sorted(glob.glob(f"{dev}/neuron[0-9]*"), key=lambda d: int(d.removeprefix(f"{dev}/neuron")))
    if not devices:
        fail("NRT:nrt_init", "No neuron device available")
    per_device = int(os.environ.get("NEURON_STANDIN_CORES_PER_DEVICE", "2"))
    mounted = [int(d.removeprefix(f"{dev}/neuron")) * per_device + k for d in devices for k in range(per_device)]
    visible = os.environ.get("NEURON_RT_VISIBLE_CORES")
    cores = expand(visible) if visible else mounted
    absent = [c for c in cores if c not in mounted]
    if absent:
        fail(
            "NRT:nrt_allocate_neuron_cores",
            f"Logical Neuron Core(s) not available - Requested: {visible} Available: {','.join(map(str, mounted))} "
            f"(devices mounted: {' '.join(devices)})",
        )
    for var in ("HOME", "HF_HOME"):
        where = os.environ.get(var)
        if not where:
            continue
        try:
            Path(where).mkdir(parents=True, exist_ok=True)
            probe = Path(where) / ".standin-write-check"
            probe.write_text("ok")
            probe.unlink()
        except OSError as exc:
            fail("vllm", f"cannot write the cache in {var}={where}: {exc}")
    if "HOME" not in os.environ or not os.access(os.environ["HOME"], os.W_OK):
        fail("vllm", f"HOME={os.environ.get('HOME')!r} is not writable: downloads and caches fail ([Errno 13] Permission denied)")
    artefact = None
    compiled = os.environ.get("NEURON_COMPILED_ARTIFACTS")
    if compiled:
        artefact = nxd_inference_load(compiled)
        lnc = int(os.environ.get("NEURON_LOGICAL_NC_CONFIG", "1"))
        if artefact and artefact["logical_nc_config"] != lnc:
            fail("NRT:nrt_load", f"NEFF compiled for LNC={artefact['logical_nc_config']} cannot load with NEURON_LOGICAL_NC_CONFIG={lnc}")
        if artefact and artefact["tp_degree"] != len(cores):
            fail(
                "NRT:nrt_init",
                f"the compiled model is tensor parallel over {artefact['tp_degree']} NeuronCores, {len(cores)} visible ({visible})",
            )
    if local_ranks is not None and local_ranks != len(cores):
        fail(
            "NRT:nrt_init", f"local_ranks_size {local_ranks} needs {local_ranks} NeuronCores on this node, {len(cores)} visible ({visible})"
        )
    if dp > 1 and (tp or 1) * dp != len(cores):
        # Neither vLLM nor the plugin documents the words it fails with when the visible cores are
        # not dp x tp (the design page says only that DP4 x TP8 runs "on 32 Neuron cores"); this
        # message is the stand-in's, naming both sizes.
        fail(
            "NRT:nrt_init",
            f"tensor parallel size {tp or 1} x data parallel size {dp} needs {(tp or 1) * dp} NeuronCores, "
            f"{len(cores)} visible ({visible})",
        )
    if dp == 1 and tp is not None and tp != len(cores):
        fail("NRT:nrt_init", f"tensor parallel size {tp} needs {tp} NeuronCores, {len(cores)} visible ({visible})")
    busy = hold_cores(cores)
    if busy:
        fail("NRT:nrt_allocate_neuron_cores", held_message(visible or ",".join(map(str, cores)), cores, busy))
    found = {"cores": cores, "devices": devices, "artefact": artefact, "loaded": "compiled" if artefact else "compiled-at-load"}
    if dp > 1:
        size = tp or 1
        found["dataParallel"] = {"size": dp, "groups": [cores[r * size : (r + 1) * size] for r in range(dp)]}
    return found


# Device memory a chip has, by the platform the device plugin stand-in names (the Neuron
# architecture pages: Inferentia 8 GiB, Inferentia2 and Trainium 32 GiB, Trainium2 96 GiB,
# Trainium3 144 GiB), shared by its cores as the device plugin counts them.
CHIP_MEMORY_GIB = {"inf1": 8, "inf2": 32, "trn1": 32, "trn2": 96, "trn3": 144}
GIB = 1 << 30


def model_parameters(model: str) -> int | None:
    """The parameters the model stands for: a local checkpoint's config.json (the stand-in Hub's
    _standin_parameters), else what a Hub id's name says."""
    from huggingface_hub import standin_parameters

    config = Path(model) / "config.json"
    if config.is_file():
        found = json.loads(config.read_text()).get("_standin_parameters")
        return found if isinstance(found, int) else standin_parameters(str(json.loads(config.read_text()).get("_standin_repo", "")))
    return standin_parameters(model)


def core_memory_bytes(platform: str | None = None) -> int | None:
    """A NeuronCore's device memory: its chip's, by the platform (the device plugin stand-in's
    unless given), over its cores. On Trainium2 and Trainium3 a logical core's, the chip's 8
    physical cores over NEURON_LOGICAL_NC_CONFIG (2 unless set, the runtime's default there): "the
    static HBM size" the plugin's CPU compile takes and the device's are one figure, as the plugin's
    determine_available_memory design page has them ("hbm_stack_bytes / logical_cores_per_hbm_stack").
    Elsewhere the cores the device plugin stand-in counts a device. None off a known platform."""
    platform = platform or os.environ.get("NEURON_STANDIN_PLATFORM")
    if platform not in CHIP_MEMORY_GIB:
        return None
    if platform in LNC_TARGETS:
        lnc = int(os.environ.get("NEURON_LOGICAL_NC_CONFIG") or "2")
        return CHIP_MEMORY_GIB[platform] * GIB // (8 // lnc)
    return CHIP_MEMORY_GIB[platform] * GIB // int(os.environ.get("NEURON_STANDIN_CORES_PER_DEVICE", "2"))


def check_device_memory(model: str, world_cores: int, dtype: str) -> None:
    """Each rank holds its share of the weights on its NeuronCore: a share larger than a core's
    device memory fails as the runtime fails to allocate it (TDRV:dmem_alloc_internal "Failed to
    alloc DEVICE memory", and vLLM's nrt_tensor_allocate status=4 "Allocation Failure", vllm#12443)."""
    parameters, core_memory = model_parameters(model), core_memory_bytes()
    if core_memory is None or not parameters or world_cores < 1:
        return
    share = parameters * (4 if dtype == "float32" else 2) // world_cores
    if share > core_memory:
        print(f"ERROR  TDRV:dmem_alloc_internal  Failed to alloc DEVICE memory: {share}", file=sys.stderr, flush=True)
        fail("vllm", 'RuntimeError: nrt_tensor_allocate status=4 message="Allocation Failure" '
                     f"({share / GIB:.1f} GiB of weights a NeuronCore over {world_cores} cores, {core_memory / GIB:.0f} GiB each)")  # fmt: skip


class KvCacheError(Exception):
    """What the vLLM Neuron plugin refuses of its KV cache, with its words."""


def kv_shape(checkpoint: str) -> tuple[int, int, int] | None:
    """(layers, KV heads, head dimension) from the checkpoint's config.json, as vLLM reads them
    (num_hidden_layers, num_key_value_heads, head_dim or hidden_size / num_attention_heads)."""
    config = Path(checkpoint) / "config.json"
    found = json.loads(config.read_text()) if config.is_file() else {}
    layers, heads = found.get("num_hidden_layers"), found.get("num_key_value_heads")
    head_dim = found.get("head_dim") or (
        found["hidden_size"] // found["num_attention_heads"] if found.get("hidden_size") and found.get("num_attention_heads") else None
    )
    return (layers, heads, head_dim) if layers and heads and head_dim else None


# A weight's or a KV element's bytes: vLLM's "auto" dtype is always a half type here (checkpoint_dtype).
HALF_BYTES = 2


def kv_token_bytes(checkpoint: str) -> int:
    """One token's KV cache over the whole model: layers x 2 (K and V) x KV heads x head dimension
    x dtype bytes (0 when the checkpoint does not say its shape)."""
    shape = kv_shape(checkpoint)
    if shape is None:
        return 0
    layers, heads, head_dim = shape
    return layers * 2 * heads * head_dim * HALF_BYTES


def kv_block_bytes(checkpoint: str, engine: dict) -> int | None:
    """One KV cache block on a core of the TP group: block_size tokens x 2 (K and V) x the layers of
    the target and of its draft, if any ("all layers (target + draft)", the speculative decoding
    design page) x the core's share of the KV heads x head dimension x dtype bytes. None when the
    checkpoint does not say its shape."""
    shape = kv_shape(checkpoint)
    if shape is None:
        return None
    layers, heads, head_dim = shape
    draft = engine.get("draft_checkpoint")
    layers += (kv_shape(draft) or (1, 0, 0))[0] if draft else 0
    tp = engine.get("tensor_parallel_size") or 1
    return (engine.get("block_size") or PLUGIN_BLOCK_SIZE) * 2 * layers * -(-heads // tp) * head_dim * HALF_BYTES


def loaded_parameters(checkpoint: str, engine: dict) -> int:
    """The parameters the cores hold: the target's and, beside them, its draft's, at the target's
    dtype (vLLM's draft_model_config); 0 for a checkpoint that does not say."""
    draft = engine.get("draft_checkpoint")
    return (model_parameters(checkpoint) or 0) + ((model_parameters(draft) or 0) if draft else 0)


def plugin_kv_cache(checkpoint: str, engine: dict, core_memory: int, compiling: bool) -> dict | None:
    """The vLLM Neuron plugin's KV cache on each logical core of the group, before warm-up; raises
    KvCacheError with the plugin's reason where it would not start. Its budget ("determine_available_memory
    design", https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/design/vllm/determine_available_memory_design.html):
    total_budget = int(total_hbm * gpu_memory_utilization) (0.9 unless --gpu-memory-utilization),
    available = max(min(total_budget - bytes_used, int(total_budget * VLLM_NEURON_KV_GMU_BUDGET_CAP_FRACTION)), 0)
    (cap 0.30), and under VLLM_NEURON_MIN_KV_BUDGET_GIB (1.0) "RuntimeError: Computed KV cache
    budget is below minimum threshold", in the CPU compile and on the device alike. bytes_used is
    the rank's share of the parameters the checkpoint stands for. vLLM then allocates
    --num-gpu-blocks-override blocks whatever the budget (vllm/v1/core/kv_cache_utils.py,
    may_override_num_blocks): a cache that does not fit the core beside its weights fails, when
    compiling as the compiler rejects the graph ("the total tensor footprint exceeds this limit and
    the compiler rejects the program (NCC_EVRF009)", the same page), when serving as the runtime
    fails to allocate it (initialize_kv_cache "physically allocate[s] the KV cache tensors on Neuron
    devices", https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/design/vllm/vllm-integration-kv-cache.html).
    Looser than the compiler, whose limit counts the graph's other tensors too: here only the
    weights and the cache are counted against the core. Returns the budget, the blocks and a block's
    bytes (kv_block_bytes), or None when the checkpoint says nothing of its size."""
    tp = engine.get("tensor_parallel_size") or 1
    if not model_parameters(checkpoint):
        return None
    share = loaded_parameters(checkpoint, engine) * HALF_BYTES // tp
    total = int(core_memory * (engine.get("gpu_memory_utilization") or PLUGIN_GPU_MEMORY_UTILIZATION))
    cap = float(os.environ.get("VLLM_NEURON_KV_GMU_BUDGET_CAP_FRACTION", "0.30"))
    available = max(min(total - share, int(total * cap)), 0)
    minimum = float(os.environ.get("VLLM_NEURON_MIN_KV_BUDGET_GIB", "1.0"))
    if available < minimum * GIB:
        raise KvCacheError(
            f"Computed KV cache budget is below minimum threshold: {available / GIB:.3f} GiB < {minimum} GiB "
            f"(VLLM_NEURON_MIN_KV_BUDGET_GIB) on a NeuronCore of {core_memory / GIB:.0f} GiB with {share / GIB:.2f} GiB of weights"
        )
    blocks, block = engine.get("num_gpu_blocks_override"), kv_block_bytes(checkpoint, engine)
    if blocks is None or block is None:
        return {"kvBudgetBytes": available, "kvCacheBlocks": blocks, "kvBlockBytes": block}
    if share + blocks * block > core_memory:
        need = (share + blocks * block) / GIB
        if compiling:
            raise KvCacheError(
                f"NCC_EVRF009: the tensors of the graph need {need:.1f} GiB, more than the {core_memory / GIB:.0f} GiB of a "
                f"NeuronCore ({blocks} KV cache blocks of {block} bytes and {share / GIB:.2f} GiB of weights)"
            )
        raise KvCacheError(
            f'nrt_tensor_allocate status=4 message="Allocation Failure" (initialize_kv_cache: {blocks} KV cache blocks of '
            f"{block} bytes and {share / GIB:.2f} GiB of weights need {need:.1f} GiB, a NeuronCore has {core_memory / GIB:.0f} GiB)"
        )
    return {"kvBudgetBytes": available, "kvCacheBlocks": blocks, "kvBlockBytes": block}


def nxd_inference_load(compiled: str) -> dict | None:
    """vLLM's NxD Inference loader with NEURON_COMPILED_ARTIFACTS: the compiled model's class from
    its saved config, loaded from there; None when that fails, after the loader's own warning,
    and vLLM then compiles at start (vllm-neuron's neuronx_distributed_model_loader; the vLLM
    User Guide for NxD Inference, "Loading pre-compiled models")."""
    from neuronx_distributed_inference.models.config import CONFIG_FILE
    from neuronx_distributed_inference.utils.constants import MODEL_TYPES

    try:
        model_type = json.loads((Path(compiled) / CONFIG_FILE).read_text()).get("model_type")
        app = MODEL_TYPES[model_type]["causal-lm"](compiled)
        app.load(compiled)
    except (FileNotFoundError, ValueError, KeyError) as exc:
        print(f"WARNING Exception: {exc}", file=sys.stderr, flush=True)
        print(f"WARNING Unable to find precompiled artifacts from {compiled}. Recompiling...", file=sys.stderr, flush=True)
        return None
    return {**(app.traced_model or {}), "logical_nc_config": app.neuron_config.logical_nc_config, "neuron_config": vars(app.neuron_config)}


def serve(
    port: int, model: str, found: dict, max_num_seqs: int | None = None, group: RootCommunicator | None = None,
    graphs: vllm_neuron_metrics.PluginMetrics | None = None,
) -> None:  # fmt: skip
    """A server of the model: vLLM's OpenAI endpoints on the plugin with ``graphs`` (its
    vllm_neuron: metrics) or on NxD Inference, or the plain model server (neuron-serve)."""
    started = time.time()
    sequences = Ranks(max_num_seqs, rank_groups(found))

    class Handler(JsonHandler):
        def do_GET(self):
            if self.path in ("/health", "/healthz", "/readyz"):
                self._json(200, {"status": "ok"})
            elif self.path == "/metrics":
                label = model_label(model)
                plugin = graphs.text(label) if graphs is not None else ""
                self._metrics("\n".join(scheduler_gauges(label, sequences.running, sequences.waiting)) + "\n" + plugin)
            elif self.path == "/standin":
                described = {"group": group.describe()} if group else {}
                self._json(200, {**found, **described, "pid": os.getpid(), "uptime": time.time() - started})
            else:
                self._json(404, {"error": "not found"})

        def do_POST(self):
            with sequences.rank() as (rank, _):
                self._post(sequences.groups[rank])

        def _post(self, cores: list[int]):
            # A model's time per call, for the autoscaling tests (nothing the operator runs sets it).
            time.sleep(float(os.environ.get("NEURON_STANDIN_CALL_SECONDS", "0")))
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                self._json(400, {"error": "body is not JSON"})
                return
            # And per generated token, for the routing benchmark: a completion's time grows with
            # its max_tokens, as a decode does (nothing the operator runs sets it either).
            per_token = float(os.environ.get("NEURON_STANDIN_TOKEN_SECONDS", "0"))
            if per_token and isinstance(body, dict) and isinstance(body.get("max_tokens"), int):
                time.sleep(per_token * max(0, min(body["max_tokens"], 4096)))
            if self.path == "/v1/completions" and isinstance(body, dict):
                prompt = body.get("prompt", "")
                if graphs is not None:
                    # This server answers at once, no iterations: a prefill of the prompt's words, then
                    # a decode step for each token asked (vLLM's default 16), at the batch running now.
                    graphs.prefill(len(prompt) if isinstance(prompt, list) else len(str(prompt).split()))
                    asked = body.get("max_tokens")
                    for _ in range(min(asked, 4096) if isinstance(asked, int) and asked > 0 else 16):
                        graphs.decode(max(sequences.running, 1))
                ran = f"[cores {cores}]"
                if group is not None:
                    try:
                        nodes = group.step()
                    except CollectiveError as exc:
                        # A rank lost fails the collectives, and vLLM's engine with them.
                        self._json(500, {"error": f"engine dead: {exc}"})
                        fatal(exc)
                        os._exit(1)
                    ran = " ".join(f"[node {n['node_rank']} {n['host']} cores {n['cores'][0]}-{n['cores'][-1]}]" for n in nodes)
                self._json(
                    200,
                    {
                        "object": "text_completion",
                        "model": model,
                        "choices": [{"index": 0, "text": f" {ran} {prompt}", "finish_reason": "length"}],
                    },
                )
            elif self.path == "/" and isinstance(body, list):
                # The model-process contract the batching front end speaks: a JSON list of
                # inputs, answered by a list of outputs of the same length and order.
                self._json(200, [{"cores": cores, "input": i} for i in body])
            else:
                self._json(404, {"error": "not found"})

    server = ThreadingHTTPServer(("0.0.0.0", port), Handler)
    # On SIGTERM, as vLLM's server (uvicorn) does: stop listening, finish the requests in
    # hand, exit 0 (uvicorn's graceful shutdown).
    server.daemon_threads = False
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    if graphs is not None:
        graphs.ready()
    print(f"serving {model} on :{port} with NeuronCores {found['cores']} ({found['loaded']})", flush=True)
    server.serve_forever()
    server.server_close()


def flexible_flag(arg: str) -> str:
    """A flag as vLLM's FlexibleArgumentParser, "ArgumentParser that allows both underscore and dash
    in names", reads it: underscores as dashes in the name, up to the first ``.`` (vllm/utils)."""
    if not arg.startswith("--"):
        return arg
    name, eq, value = arg.partition("=")
    head, dot, tail = name[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + tail + eq + value


def vllm_parser(serving: str) -> argparse.ArgumentParser:
    """vLLM's server flags that this stand-in implements, as the release's own parser takes them:
    vLLM's OpenAI server parses with ``parse_args`` (FlexibleArgumentParser), so an unknown flag
    exits 2 with "unrecognized arguments" (vllm/entrypoints/openai/api_server.py, vllm/utils).
    --override-neuron-config exists only with the V0 Neuron worker (vllm/engine/arg_utils.py up
    to 0.10.1.1); from 0.10.2 Neuron overrides go through --additional-config. --block-size takes
    vLLM's BlockSize choices."""
    p = argparse.ArgumentParser(prog="api_server.py")
    p.add_argument("--host")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model", default="facebook/opt-125m")
    p.add_argument("--served-model-name", nargs="+")
    p.add_argument("--tensor-parallel-size", "-tp", type=int)
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument("--block-size", type=int, choices=(1, 8, 16, 32, 64, 128))
    p.add_argument("--num-gpu-blocks-override", type=int)
    p.add_argument("--gpu-memory-utilization", type=float, default=None)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    # vLLM parses its config flags' JSON with json.loads ("--speculative-config", a SpeculativeConfig as a JSON object).
    p.add_argument("--speculative-config", type=json.loads, default=None)
    p.add_argument("--load-format", default="auto")
    p.add_argument("--dtype", default="auto")
    if serving == VLLM_V0:
        p.add_argument("--device", default="auto")
        p.add_argument("--override-neuron-config", type=json.loads)
    else:
        p.add_argument("--additional-config", type=json.loads)
        # Disaggregated prefill and decode's flags (vllm_disagg, where each is cited).
        vllm_disagg.add_flags(p)
        # V1's scheduler option (vllm/config/scheduler.py, SchedulerConfig.async_scheduling), which V0 never had.
        p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None)
    return p


def local_checkpoint(model: str, weights: bool) -> str:
    """The model's folder as vLLM reads it: a local directory as it is, else a Hugging Face id
    through the Hub client, which honours HF_HUB_CACHE, HF_TOKEN and HF_HUB_OFFLINE (vLLM reads
    the configuration with transformers' AutoConfig and the weights with
    ``download_weights_from_hf``, both from the Hub's cache). ``weights``: this engine loads the
    checkpoint's weights itself (not a compiled model's sharded ones), and fails as vLLM's
    loader fails when there are none ("Cannot find any model weights with", vllm/model_executor/
    model_loader/default_loader.py)."""
    if model.startswith(("s3://", "gs://")):
        return model  # the Run:ai streamer's, read where it lies
    if Path(model).is_dir():
        folder = Path(model)
    else:
        import huggingface_hub

        try:
            folder = Path(huggingface_hub.snapshot_download(model))
        except (OSError, huggingface_hub.RepositoryNotFoundError, ValueError) as exc:
            fail("vllm", f"{type(exc).__name__}: {exc}")
    if not (folder / "config.json").is_file():
        fail("vllm", f"OSError: {model} does not appear to have a file named config.json. "
                     f"Checkout 'https://huggingface.co/{model}/tree/main' for available files.")  # fmt: skip
    if weights and not any(folder.glob("*.safetensors")) and not any(folder.glob("*.bin")):
        fail("vllm", f"RuntimeError: Cannot find any model weights with `{model}`")
    return str(folder)


def checkpoint_dtype(model: str) -> str:
    """The model's dtype as vLLM's "auto" takes it: its config.json's torch_dtype (a Hub id's is
    not read here: the stand-in downloads nothing)."""
    config = Path(model) / "config.json"
    found = json.loads(config.read_text()) if config.is_file() else {}
    dtype = found.get("dtype") or found.get("torch_dtype")  # transformers 4.56 and later write "dtype"
    # vLLM's "auto" keeps a half type and takes float32 down to the platform's first supported dtype, bfloat16
    # ("Downcast for float32 models", vllm/config/model.py, _resolve_auto_dtype, vLLM 0.11.0).
    return dtype if dtype in ("bfloat16", "float16") else "bfloat16"


def nxdi_neuron_config(args: argparse.Namespace, serving: str, checkpoint: str | None = None) -> dict:
    """The NeuronConfig vLLM's loader builds for NxD Inference from the server's engine arguments,
    which a compiled model must have been compiled with.

    V1, vllm-neuron (vllm_neuron/worker/neuronx_distributed_model_loader.py,
    ``_get_default_neuron_config``, after the platform's ``check_and_update_config``): batch_size
    is max_num_seqs (32 when unset); seq_len and max_context_length max_model_len; prefix caching
    on unless turned off, and without it block_size becomes max_model_len ("Neuron requires
    block_size = max_model_len when blockwise KV cache is disabled"); num_gpu_blocks_override gets
    one more block for the null block; pa_num_blocks is that override, else
    ``ceil(max_model_len // block_size) * max_num_seqs``. V0 (the NxD Inference vLLM guide's
    "Feature Configuration"): the same shape without the paged-attention settings."""
    seqs = args.max_num_seqs or 32
    length = args.max_model_len or 2048
    config = {
        "tp_degree": args.tensor_parallel_size or 1, "ctx_batch_size": 1, "batch_size": seqs, "max_context_length": length,
        "seq_len": length, "enable_bucketing": True, "quantized": False, "padding_side": "right",
    }  # fmt: skip
    # Both loaders pass vLLM's dtype and sample on the device (vLLM 0.9.2's V0 loader,
    # vllm/model_executor/model_loader/neuronx_distributed.py, and vllm-neuron's).
    config |= {
        "torch_dtype": checkpoint_dtype(checkpoint or args.model),
        "on_device_sampling_config": {"dynamic": True, "deterministic": False},
    }
    if serving == VLLM_V0:
        return {**config, "is_continuous_batching": True}
    prefix = args.enable_prefix_caching is not False
    block = (args.block_size or 16) if prefix else length
    blocks = args.num_gpu_blocks_override + 1 if args.num_gpu_blocks_override is not None else (length // block) * seqs
    return {
        **config, "is_continuous_batching": seqs > 1,
        "pa_num_blocks": blocks, "pa_block_size": block, "is_block_kv_layout": prefix, "is_prefix_caching": prefix,
    }  # fmt: skip


def check_compiled_config(compiled: dict, expected: dict) -> None:
    """A compiled model is loaded as it is: "any differing model configurations passed in to the
    vllm API will not trigger re-compilation" (the vLLM user guide for NxD Inference), and the
    model runner takes its KV-cache layout from vLLM's cache settings, not from the compiled
    model, so a compiled model that differs serves wrong or fails at its first request. The
    stand-in refuses it at start, naming the setting."""
    differ = {k: (compiled.get(k), v) for k, v in expected.items() if compiled.get(k) != v}
    if differ:
        said = "; ".join(f"{k} compiled {c!r}, the server's engine {e!r}" for k, (c, e) in sorted(differ.items()))
        fail("vllm", f"the model in NEURON_COMPILED_ARTIFACTS was compiled for another engine: {said}")


def plugin_engine(args: argparse.Namespace) -> dict:
    """The engine the plugin builds from the server's flags, with an EAGLE3 draft loaded beside the target."""
    return with_draft({
        "model": args.model, "tensor_parallel_size": args.tensor_parallel_size, "max_model_len": args.max_model_len,
        "max_num_seqs": args.max_num_seqs, "block_size": args.block_size, "num_gpu_blocks_override": args.num_gpu_blocks_override,
        "speculative_config": args.speculative_config,
    })  # fmt: skip


def plugin_start(args: argparse.Namespace, checkpoint: str, timed: vllm_neuron_metrics.PluginMetrics, load_seconds: float) -> dict | None:
    """The plugin's start before it serves: its engine, its weights' load (``load_seconds``, the
    checkpoint's read), its KV cache, its warm-up, their figures in ``timed``; what it found, or
    None once it has said on stderr why it stops."""
    engine = plugin_engine(args)
    timed.loaded(load_seconds, loaded_parameters(checkpoint, engine) * HALF_BYTES)
    async_scheduling = speculation_off_async(args.async_scheduling, args.speculative_config)
    target = os.environ.get("NEURON_STANDIN_PLATFORM", "")
    memory = core_memory_bytes()
    try:
        # vLLM sizes and allocates the KV cache before it warms up (compiles) the graphs.
        kv = (
            plugin_kv_cache(checkpoint, {**engine, "gpu_memory_utilization": args.gpu_memory_utilization}, memory, False)
            if memory
            else None
        )
        keys, compiled = plugin_warm_up(engine, target, os.environ.get("VLLM_NEURON_DISABLE_WARMUP_COMPILE") != "1", timed)
    except (KvCacheError, RuntimeError) as exc:
        print(f"RuntimeError: {exc}", file=sys.stderr, flush=True)
        return None
    return {
        "kvCache": kv, "asyncScheduling": async_scheduling,
        "runtime": "vllm-neuron-plugin", "target": target, "cacheKeys": keys, "compiledAtStart": compiled,
        "loaded": "compiled-at-load" if compiled else "compile-cache",
    }  # fmt: skip


def vllm_main(argv: list[str]) -> int:
    """vLLM's OpenAI-compatible server, as the image's installed vLLM would run it."""
    began = time.monotonic()
    serving = vllm_serving()
    if serving is None:
        fail("vllm", "this image's vLLM has no Neuron platform (no V0 Neuron worker, no vllm-neuron)")
    args = vllm_parser(serving).parse_args(dotted_json_flags([flexible_flag(a) for a in argv]))
    if serving == VLLM_V0 and os.environ.get("VLLM_NEURON_FRAMEWORK", NXD_INFERENCE) != NXD_INFERENCE:
        # vLLM 0.9's Neuron platform reads VLLM_NEURON_FRAMEWORK; AWS's images carry NxD Inference.
        fail("vllm", f"VLLM_NEURON_FRAMEWORK={os.environ['VLLM_NEURON_FRAMEWORK']}: that framework is not installed in this image")
    if args.model.startswith(("s3://", "gs://")) and installed("runai-model-streamer") is None:
        # vLLM reads object-store models only through the Run:ai streamer (vllm/config: "To load a
        # model from S3, 'load_format' must be 'runai_streamer'"), which AWS's Neuron images do not carry.
        fail("vllm", f"cannot load {args.model}: To load a model from S3, 'load_format' must be 'runai_streamer', "
                     "and runai-model-streamer is not installed")  # fmt: skip
    if serving == VLLM_NEURON_NXDI and args.enable_prefix_caching is not False and args.block_size is None:
        # vLLM turns prefix caching on by default, and vllm-neuron's platform then asserts a block size
        # (vllm_neuron/platform.py, check_and_update_config).
        fail("vllm", "AssertionError: When prefix caching is enabled, block_size must be set")
    if serving == VLLM_V0 and args.num_gpu_blocks_override is not None and args.num_gpu_blocks_override != (args.max_num_seqs or 256) + 1:
        # vLLM's V0 Neuron worker keeps one block a sequence and one more, and asserts it
        # (vllm/worker/neuron_worker.py, initialize_cache, 0.9.2 to 0.10.1.1).
        fail("vllm", "AssertionError: num_gpu_blocks == max_num_seqs + 1 (--num-gpu-blocks-override on vLLM's V0 Neuron worker)")
    plugin = serving == VLLM_NEURON_PLUGIN
    if plugin:
        os.environ.pop("NEURON_COMPILED_ARTIFACTS", None)  # NxD Inference's, which the plugin never reads
    # The plugin loads the checkpoint's weights; NxD Inference loads a compiled model's sharded
    # ones when NEURON_COMPILED_ARTIFACTS names one, and reads only the configuration and tokenizer.
    reading = time.monotonic()
    checkpoint = local_checkpoint(args.model, weights=plugin or not os.environ.get("NEURON_COMPILED_ARTIFACTS"))
    load_seconds = time.monotonic() - reading
    try:
        # Only V0's worker reads the multi-node layout; vllm-neuron's starts a world of one.
        layout = multi_node_config(args.override_neuron_config) if serving == VLLM_V0 else None
    except CollectiveError as exc:
        fatal(exc)
        return 1
    disagg = getattr(args, "kv_transfer_config", None)
    if disagg is not None and disagg.kv_connector is not None:
        try:
            vllm_disagg.check_connector(disagg, plugin)
        except vllm_disagg.ConnectorRefused as exc:
            print(f"ValueError: {exc}", file=sys.stderr, flush=True)
            return 1
    if layout and layout["node_rank"] != 0:
        fatal(CollectiveError(f"NEURON_RANK_ID is {layout['node_rank']}: rank 0 serves the API, the others run the worker"))
        return 1
    # Data parallelism is the plugin's (its data-parallelism design page); V0's parser has no
    # --data-parallel-size here, and vllm-neuron on NxD Inference takes it and runs a world of one
    # (its worker's world_size=1), so off the plugin the flag changes nothing, as before.
    dp = (getattr(args, "data_parallel_size", None) or 1) if plugin else 1
    found = runtime_checks(args.tensor_parallel_size, layout["local_ranks_size"] if layout else None, dp)
    # Each DP rank is a whole replica: a core holds its TP rank's share of the weights, not a DP x TP'th.
    check_device_memory(checkpoint, layout["world_size"] if layout else len(found["cores"]) // dp, checkpoint_dtype(checkpoint))
    if found["artefact"] and not layout:
        check_compiled_config(found["artefact"]["neuron_config"], nxdi_neuron_config(args, serving, checkpoint))
    model = (args.served_model_name or [args.model])[0]
    timed = (
        vllm_neuron_metrics.PluginMetrics(*graph_sizes({"max_model_len": args.max_model_len, "max_num_seqs": args.max_num_seqs}), began)
        if plugin
        else None
    )
    if timed is not None:
        started = plugin_start(args, checkpoint, timed, load_seconds)
        if started is None:
            return 1
        found |= started
        if dp > 1:
            # Each DP rank sizes and allocates its own KV cache on its own TP group, the same cache.
            found["kvCacheRanks"] = [started["kvCache"]] * dp
    else:
        found["runtime"] = NXD_INFERENCE
    found["vllm"] = {"version": installed("vllm"), "serving": serving}
    found["checkpoint"] = checkpoint  # where the model id was read from: a local folder, or the Hub cache's snapshot
    group = None
    if layout:
        group = RootCommunicator(layout, {"host": socket.gethostname(), "cores": found["cores"]})
        try:
            group.gather()
        except CollectiveError as exc:
            fatal(exc)
            return 1
    # NEURON_STANDIN_SCHEDULER=neuron (the stand-in's own knob, for cluster/benchmark_disaggregated.py):
    # the plugin's aggregated server on the same engine iterations and timing as its prefill and
    # decode servers (vllm_disagg.NeuronScheduler), streaming, with vLLM's latency histograms.
    scheduled = plugin and os.environ.get("NEURON_STANDIN_SCHEDULER") == "neuron"
    if (disagg is not None and disagg.kv_connector is not None) or scheduled:
        assert timed is not None
        return vllm_disagg.run(args, model, found, kv_token_bytes(checkpoint), args.block_size or PLUGIN_BLOCK_SIZE, timed)
    serve(args.port, model, found, args.max_num_seqs, group, timed)
    return 0


def server_main(argv: list[str], prog: str) -> int:
    if prog == "vllm":
        return vllm_main(argv)
    # neuron-serve: a plain model server on the Neuron runtime (not an AWS program), for the
    # tests' custom-runtime models; its model and port come from the operator's environment.
    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8080")))
    p.add_argument("--model", default=os.environ.get("INFERENTIA_MODEL_URI", "model"))
    args = p.parse_args(argv)
    found = runtime_checks(None)
    serve(args.port, args.model, found)
    return 0


def main() -> int:
    prog = Path(sys.argv[0]).name
    if prog in ("neuron-cc", "neuronx-cc"):
        return compiler(sys.argv[1:], prog)
    return server_main(sys.argv[1:], "vllm" if "vllm" in sys.argv[0] else "neuron-serve")


if __name__ == "__main__":
    sys.exit(main())
