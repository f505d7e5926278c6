"""Stand-in for vLLM's disaggregated prefill and decode on the vLLM Neuron plugin: a server given
``--kv-transfer-config`` is a prefill server (``kv_producer``) or a decode server (``kv_consumer``),
and the decode server pulls each request's KV cache from the prefill server that made it.

Sources (read for this stand-in):

- AWS, "Tutorial: Configure disaggregated inference with 1P1D and xPyD"
  (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/tutorials/tutorial-di-1p1d-xpyd.html;
  aws-neuron/aws-neuron-sdk a3247f5b, vllm-neuron/docs/tutorials/tutorial-di-1p1d-xpyd.md): the
  servers' command lines, ``VLLM_NIXL_SIDE_CHANNEL_HOST``/``_PORT``, the request flow in read mode.
- AWS, "Disaggregated Inference — Design Document"
  (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/design/vllm/disaggregated-inference.html;
  the same commit, vllm-neuron/docs/design/vllm/disaggregated-inference.md): the connectors the
  plugin uses (``NixlConnector``, ``NeuronNixlConnector``), the side channel's defaults
  (127.0.0.1, 5557), the prefill's discarded token, the decode's ``WAITING_FOR_REMOTE_KVS``.
- vLLM ``vllm/config/kv_transfer.py`` (KVTransferConfig's fields, its Literal kv_role and
  kv_load_failure_policy, default "fail", and its __post_init__ checks), parsed from the flag by
  ``parse_dataclass`` in ``vllm/engine/arg_utils.py`` (``TypeAdapter(cls).validate_json(val)``,
  a ValidationError raised as ``argparse.ArgumentTypeError(repr(e))``).
- vLLM's NixlConnector (``vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py``,
  ``request_finished``): the prefill's ``kv_transfer_params`` (do_remote_prefill,
  do_remote_decode, remote_block_ids, remote_engine_id, remote_request_id, remote_host,
  remote_port, tp_size); a request without a usable set is computed locally; blocks unread after
  ``VLLM_NIXL_ABORT_REQUEST_TIMEOUT`` (480 s) are released by the prefill.

What is not Neuron here is everything: the "KV cache" is bytes of the model's KV shape, made by
the prefill and read over loopback TCP by the decode through the side channel, which stands for
both NIXL's handshake and its RDMA READ.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import queue
import signal
import socket
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from typing import Any

from standin_serving import Histogram, JsonHandler, Ranks, model_label, rank_groups, scheduler_gauges
from vllm_neuron_metrics import PluginMetrics

# -- KVTransferConfig ------------------------------------------------------------------------

KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
FAILURE_POLICIES = ("recompute", "fail")
# The connectors the plugin's DI design page names: "Neuron DI uses the upstream NixlConnector for
# standard TP topologies. NeuronNixlConnector extends it" (DCP, sliding-window models).
PLUGIN_CONNECTORS = ("NixlConnector", "NeuronNixlConnector")
# KVTransferConfig's fields and their JSON types (vllm/config/kv_transfer.py).
FIELDS: dict[str, tuple[type, ...]] = {
    "kv_connector": (str, type(None)),
    "engine_id": (str, type(None)),
    "kv_buffer_device": (str,),
    "kv_buffer_size": (int, float),
    "kv_role": (str, type(None)),
    "kv_rank": (int, type(None)),
    "kv_parallel_size": (int,),
    "kv_ip": (str,),
    "kv_port": (int,),
    "kv_connector_extra_config": (dict,),
    "kv_connector_module_path": (str, type(None)),
    "enable_permute_local_kv": (bool,),
    "kv_load_failure_policy": (str,),
}
_TYPE_WORDS = {str: "a valid string", int: "a valid integer", float: "a valid number", dict: "a valid dictionary",
               bool: "a valid boolean"}  # fmt: skip


def _pydantic_error(loc: str | None, message: str, kind: str, value: Any) -> str:
    """One error as pydantic v2's ValidationError prints it (its repr, which vLLM passes to argparse)."""
    where = f"{loc}\n" if loc else ""
    return f"1 validation error for KVTransferConfig\n{where}  {message} [type={kind}, input_value={value!r}, input_type={type(value).__name__}]"


@dataclass
class KVTransferConfig:
    kv_connector: str | None = None
    engine_id: str | None = None
    kv_buffer_device: str = "cuda"
    kv_buffer_size: float = 1e9
    kv_role: str | None = None
    kv_rank: int | None = None
    kv_parallel_size: int = 1
    kv_ip: str = "127.0.0.1"
    kv_port: int = 14579
    kv_connector_extra_config: dict = field(default_factory=dict)
    kv_connector_module_path: str | None = None
    enable_permute_local_kv: bool = False
    kv_load_failure_policy: str = "fail"

    @property
    def is_kv_producer(self) -> bool:
        return self.kv_connector is not None and self.kv_role in ("kv_producer", "kv_both")

    @property
    def is_kv_consumer(self) -> bool:
        return self.kv_connector is not None and self.kv_role in ("kv_consumer", "kv_both")


def parse_kv_transfer_config(text: str) -> KVTransferConfig:
    """``--kv-transfer-config`` as vLLM's parser reads it, or argparse.ArgumentTypeError with the
    ValidationError's text. Stricter than vLLM in one way: a key KVTransferConfig does not have is
    refused ("Unexpected keyword argument"), where a pydantic dataclass may ignore it."""
    try:
        found = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(_pydantic_error(None, f"Invalid JSON: {exc.msg}", "json_invalid", text)) from None
    if not isinstance(found, dict):
        raise argparse.ArgumentTypeError(
            _pydantic_error(None, "Input should be a dictionary or an instance of KVTransferConfig", "dataclass_type", found)
        )
    for key, value in found.items():
        if key not in FIELDS:
            raise argparse.ArgumentTypeError(_pydantic_error(key, "Unexpected keyword argument", "unexpected_keyword_argument", value))
        if key == "kv_role" and value is not None and value not in KV_ROLES:
            raise argparse.ArgumentTypeError(
                _pydantic_error(key, "Input should be 'kv_producer', 'kv_consumer' or 'kv_both'", "literal_error", value)
            )
        if key == "kv_load_failure_policy" and value not in FAILURE_POLICIES:
            raise argparse.ArgumentTypeError(_pydantic_error(key, "Input should be 'recompute' or 'fail'", "literal_error", value))
        allowed = FIELDS[key]
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            word = _TYPE_WORDS[next(t for t in allowed if t is not type(None))]
            raise argparse.ArgumentTypeError(_pydantic_error(key, f"Input should be {word}", "type_error", value))
    config = KVTransferConfig(**found)
    if config.kv_connector is not None and config.kv_role is None:
        # __post_init__'s check, which pydantic reports as a "Value error".
        raise argparse.ArgumentTypeError(
            _pydantic_error(
                None,
                f"Value error, Please specify kv_disagg_role when kv_connector is set, supported roles are {KV_ROLES}",
                "value_error",
                found,
            )
        )
    if config.engine_id is None:
        config.engine_id = str(uuid.uuid4())
    return config


def add_flags(parser: argparse.ArgumentParser) -> None:
    """vLLM's flags that the tutorial's prefill and decode commands use besides the stand-in's
    others, with vLLM's types (vllm/engine/arg_utils.py): --kv-transfer-config (KVTransferConfig,
    above), --data-parallel-size, --enable-expert-parallel, --max-num-batched-tokens,
    --[no-]disable-hybrid-kv-cache-manager, --hf-overrides (JSON), --optimization-level (0 to 3)
    and --max-logprobs. Each is taken and changes nothing the stand-in models, except
    --kv-transfer-config, and --data-parallel-size (``-dp``, as vLLM's parser has it) on the
    plugin: DP ranks, each a TP group of the visible cores (neuron_standin.runtime_checks, standin_serving.Ranks)."""
    parser.add_argument("--kv-transfer-config", type=parse_kv_transfer_config, default=None)
    parser.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    parser.add_argument("--enable-expert-parallel", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    parser.add_argument("--disable-hybrid-kv-cache-manager", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--hf-overrides", type=json.loads, default=None)
    parser.add_argument("--optimization-level", type=int, choices=(0, 1, 2, 3), default=None)
    parser.add_argument("--max-logprobs", type=int, default=20)


class ConnectorRefused(Exception):
    """What vLLM's engine raises at start for a KV connector it cannot build."""


def check_connector(config: KVTransferConfig, plugin: bool) -> None:
    """The engine builds the connector at start (KVConnectorFactory.create_connector, "Unsupported
    connector type: <name>" for a name it has not registered). Stricter: on the plugin only the two
    NIXL connectors of its DI design page are taken, and off the plugin (vllm-neuron on NxD
    Inference, V0) none: the DI pages are the plugin's, for Trn2 and Trn3."""
    if config.kv_connector is None:
        return
    if not plugin:
        raise ConnectorRefused(
            f"Unsupported connector type: {config.kv_connector} (disaggregated inference is the vLLM Neuron plugin's, on Trn2 and Trn3)"
        )
    if config.kv_connector not in PLUGIN_CONNECTORS:
        raise ConnectorRefused(
            f"Unsupported connector type: {config.kv_connector} (the vLLM Neuron plugin transfers KV with {' or '.join(PLUGIN_CONNECTORS)})"
        )
    if config.kv_buffer_device not in ("cuda", "cpu"):
        # NixlConnector's own check of the buffer device against the platform's supported ones.
        raise ConnectorRefused(f"neuron with {config.kv_buffer_device} kv_buffer is not supported.")


# -- the timing model -------------------------------------------------------------------------

# The share of a decode step that one more sequence of the batch adds (its KV's read), the
# weights' read being the step's fixed part; and how many prompt tokens a prefill processes in
# the time of one decode step, unless NEURON_STANDIN_PROMPT_TOKENS_PER_STEP (the stand-in's own
# knob, for make benchmark-disaggregated's --prompt-tokens-per-step) says otherwise.
SEQUENCE_SHARE = 1 / 8
PROMPT_TOKENS_PER_STEP = 10


def token_seconds() -> float:
    return float(os.environ.get("NEURON_STANDIN_TOKEN_SECONDS", "0"))


def prompt_tokens_per_step() -> float:
    return float(os.environ.get("NEURON_STANDIN_PROMPT_TOKENS_PER_STEP") or PROMPT_TOKENS_PER_STEP)


def prefill_seconds(prompt_tokens: int) -> float:
    """A prefill's time: ``NEURON_STANDIN_CALL_SECONDS + NEURON_STANDIN_TOKEN_SECONDS * p / 10``
    for a prompt of p tokens.

    Prefill is the forward pass over the whole prompt at once, bound by compute, so its time grows
    with the prompt's tokens ("prefill and decode have different compute profiles"; the plugin's
    tutorials: "a compute-bound prefill over the prompt with memory-bandwidth-bound token
    generation, which loads the model weights from HBM once per token", EPD tutorial,
    https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/tutorials/tutorial-epd-1e-1pd-xeypd.html).
    One decode step's time (NEURON_STANDIN_TOKEN_SECONDS, the stand-in's existing per-token knob)
    processes 10 prompt tokens in the prefill (NEURON_STANDIN_PROMPT_TOKENS_PER_STEP another number):
    the ratio is the stand-in's, not a measurement.
    NEURON_STANDIN_CALL_SECONDS, the stand-in's per-call time, is paid once per request."""
    return float(os.environ.get("NEURON_STANDIN_CALL_SECONDS", "0")) + token_seconds() * prompt_tokens / prompt_tokens_per_step()


def step_seconds(sequences: int) -> float:
    """One decode step's time with ``s`` sequences in the batch:
    ``NEURON_STANDIN_TOKEN_SECONDS * (1 + (s - 1) / 8)``.

    A decode step is bound by memory bandwidth: it reads the weights once for the whole batch (the
    fixed part, one NEURON_STANDIN_TOKEN_SECONDS) and each sequence's KV cache (the part that grows
    with the batch; 1/8 of the weights' read a sequence, the stand-in's figure). Source for the
    shape: the DI design page ("decode ... optimized for memory-bandwidth-bound generation") and the
    EPD tutorial above ("loads the model weights from HBM once per token")."""
    return token_seconds() * (1 + max(sequences - 1, 0) * SEQUENCE_SHARE)


# -- the engine's iterations, as the plugin's NeuronScheduler runs them ----------------------------


@dataclass(eq=False)
class Sequence:
    """One request in the engine: the prompt tokens it still has to compute here (0 once its KV is
    read from a prefill server), the tokens it still has to make, and each token's time;
    ``kv_read`` while a request whose KV was read has its first iteration to run."""

    prompt: int
    left: int
    kv_read: bool = False
    made: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)


class NeuronScheduler:
    """One DP rank's engine loop, one iteration at a time, as the vLLM Neuron plugin's
    NeuronScheduler schedules it (aws-neuron/aws-neuron-sdk a3247f5b,
    vllm-neuron/docs/design/vllm/neuron-scheduler.md;
    https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/design/vllm/neuron-scheduler.html):

    - "Neuron requires prefill and decode operations to run in separate batches": an iteration is
      one request's prefill or one decode step of every running sequence, never both;
    - "The scheduler currently processes only one prefill request per iteration ... Prefill
      requests are processed sequentially (FIFO order) ... Decode requests are hidden during each
      prefill iteration";
    - "Prefill Priority: When decode frees capacity and prefills are waiting, the scheduler
      transitions to ACTIVE_PREFILL in the next iteration", and a request is admitted only while
      the running requests are fewer than max_num_seqs ("at_capacity");
    - a prompt longer than max_num_batched_tokens is prefilled in several iterations, and
      ACTIVE_PREFILL lasts until all of them are done, the decodes hidden throughout: the
      stand-in runs it as one iteration of the same total time;
    - a decode server's request, its KV read from a prefill server, runs one iteration alone, in
      the time of a decode step of one sequence (on the decode graph), the running decodes waiting, and
      then joins them. The sources disagree here, and this is the stand-in's choice between them.
      vLLM, once a request's remote KV is loaded, sets its num_computed_tokens to num_tokens - 1
      ("on a full prompt hit, we need to re-compute the last token in order to be able to sample
      the next token", Scheduler._update_waiting_for_remote_kv, vllm/v1/core/sched/scheduler.py),
      and this page classifies a request with num_computed_tokens < num_prompt_tokens as a
      prefill (_is_prefill_request), which runs alone. The plugin's DI design page
      (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/design/vllm/disaggregated-inference.html)
      says "decode instances run exclusively decode batches", its decode server's data flow
      runs "model.forward() [compiled decode NEFF]" once the KV is read, and a decode-only server
      may skip compiling the prefill NEFFs (VLLM_NEURON_SKIP_PREFILL_WARMUP). So: alone, as the
      scheduler page has it, for one token on the decode graph, as the DI page has it.

    So in an aggregated server a long prompt stalls every running answer for its prefill's time,
    which is the interference disaggregation removes ("Removing prefill interruptions to decode
    from continuous batching to reduce inter token latency (ITL)", NxD Inference's
    disaggregated-inference guide,
    https://awsdocs-neuron.readthedocs-hosted.com/en/latest/libraries/nxd-inference/developer_guides/disaggregated-inference.html).
    An iteration lasts prefill_seconds or step_seconds (the timing model above). ``graphs``
    counts each iteration's graph and its padding (the plugin's vllm_neuron: metrics)."""

    def __init__(self, max_num_seqs: int | None, graphs: PluginMetrics) -> None:
        self.capacity = max_num_seqs or 256  # without --max-num-seqs, the bound run() sizes the blocks for
        self.graphs = graphs
        self.lock = threading.Condition()
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.loading = 0  # requests reading their KV from a prefill server, in WAITING_FOR_REMOTE_KVS
        threading.Thread(target=self._loop, daemon=True).start()

    def gauges(self) -> tuple[int, int]:
        """(running, waiting) as vLLM's scheduler reports them: ``make_stats`` gives
        ``num_running_reqs=len(self.running)`` and ``num_waiting_reqs=len(self.waiting)``
        (vllm/v1/core/sched/scheduler.py), and PrometheusStatLogger sets vllm:num_requests_waiting
        to the waiting plus the skipped waiting, where a request loading its KV asynchronously is
        held (vllm/v1/metrics/loggers.py; "'deferred' = deferred by transient constraints (LoRA
        budget, KV transfer, blocked status)"). The plugin's NeuronScheduler admits one request a
        prefill iteration and drains the rest back to waiting ("Step 5: Restore Queues ... Drain
        holdback_queue back to waiting", its design page above): so a prompt behind the prefill in
        progress is waiting, not running, and so is a request whose KV is being read (the DI design
        page's ``WAITING_FOR_REMOTE_KVS``)."""
        with self.lock:
            return len(self.running), len(self.waiting) + self.loading

    @contextlib.contextmanager
    def loading_kv(self) -> Iterator[None]:
        """A request waiting for its KV read (WAITING_FOR_REMOTE_KVS), counted as waiting."""
        with self.lock:
            self.loading += 1
        try:
            yield
        finally:
            with self.lock:
                self.loading -= 1

    def generate(self, prompt: int, max_tokens: int, kv_read: bool = False) -> Iterator[float]:
        """The monotonic time each of the request's tokens is made, for a request with ``prompt``
        tokens to compute here, or ``kv_read`` from a prefill server; a request given up (its
        client gone, the generator closed) leaves the engine."""
        sequence = Sequence(prompt, max_tokens, kv_read)
        with self.lock:
            self.waiting.append(sequence)
            self.lock.notify()
        try:
            for _ in range(max_tokens):
                yield sequence.made.get()
        finally:
            with self.lock:
                if sequence in self.waiting:
                    self.waiting.remove(sequence)
                if sequence in self.running:
                    self.running.remove(sequence)

    def _next(self) -> tuple[Sequence | None, list[Sequence]]:
        """The next iteration's work, waiting for some: a prefill (or a request's first iteration
        after its KV read), else the decodes."""
        with self.lock:
            while True:
                while self.waiting and len(self.running) < self.capacity:
                    admitted = self.waiting.popleft()
                    self.running.append(admitted)
                    if admitted.prompt or admitted.kv_read:
                        return admitted, []
                if self.running:
                    return None, list(self.running)
                self.lock.wait()

    def _loop(self) -> None:
        while True:
            prefill, decodes = self._next()
            if prefill is not None:
                if prefill.kv_read:  # its last prompt token, alone, on the decode graph (above)
                    time.sleep(step_seconds(1))
                    self.graphs.decode(1)
                else:
                    time.sleep(prefill_seconds(prefill.prompt))
                    self.graphs.prefill(prefill.prompt)
                prefill.prompt, prefill.kv_read = 0, False
                self._made([prefill])
            else:
                time.sleep(step_seconds(len(decodes)))
                self.graphs.decode(len(decodes))
                self._made(decodes)

    def _made(self, sequences: list[Sequence]) -> None:
        now = time.monotonic()
        with self.lock:
            for sequence in sequences:
                sequence.made.put(now)
                sequence.left -= 1
                if sequence.left <= 0 and sequence in self.running:
                    self.running.remove(sequence)
            self.lock.notify()


# -- metrics, as vLLM names them -----------------------------------------------------------------
# vLLM's V1 PrometheusStatLogger (vllm/v1/metrics/loggers.py) and its docs/usage/metrics.md, for the
# plugin's vLLM 0.21 and later: vllm:time_to_first_token_seconds, vllm:inter_token_latency_seconds
# (vllm:time_per_output_token_seconds, "Deprecated in 0.11 - Renamed as vllm:inter_token_latency_seconds",
# "in 0.12, only enable if show_hidden_metrics=True"), vllm:request_time_per_output_token_seconds (one observation
# per request), vllm:e2e_request_latency_seconds, vllm:kv_cache_usage_perc (vllm:gpu_cache_usage_perc
# before 0.10), vllm:prompt_tokens_total, vllm:generation_tokens_total, vllm:request_success_total.
# NIXL's, on the side that reads (NixlPromMetrics, vllm/distributed/kv_transfer/kv_connector/v1/nixl/stats.py):
# vllm:nixl_bytes_transferred and vllm:nixl_xfer_time_seconds (histograms, one observation per
# transfer), vllm:nixl_num_failed_transfers and vllm:nixl_num_kv_expired_reqs (counters). The
# plugin's own vllm_neuron: metrics are vllm_neuron_metrics.PluginMetrics's.

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
                160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
               1920.0, 7680.0)  # fmt: skip
BYTES_BUCKETS = tuple(float(2**k) for k in range(11, 35, 2))  # 2 KiB to 16 GiB, as NixlPromMetrics's span
XFER_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class Metrics:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
        self.tpot = Histogram(
            "vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.", ITL_BUCKETS
        )
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", E2E_BUCKETS)
        self.nixl_bytes = Histogram("vllm:nixl_bytes_transferred", "Bytes transferred per NIXL KV Cache transfer.", BYTES_BUCKETS)
        self.nixl_time = Histogram("vllm:nixl_xfer_time_seconds", "Transfer duration for NIXL KV Cache transfers.", XFER_BUCKETS)
        self.counters: dict[str, float] = {
            "vllm:prompt_tokens_total": 0, "vllm:generation_tokens_total": 0, "vllm:nixl_num_failed_transfers_total": 0,
            "vllm:nixl_num_kv_expired_reqs_total": 0,
        }  # fmt: skip
        self.success: dict[str, int] = {}

    def add(self, name: str, value: float = 1) -> None:
        with self.lock:
            self.counters[name] += value

    def finished(self, reason: str) -> None:
        with self.lock:
            self.success[reason] = self.success.get(reason, 0) + 1

    def observe(self, histogram: Histogram, value: float) -> None:
        with self.lock:
            histogram.observe(value)

    def text(self, model: str, running: int, waiting: int, kv_usage: float) -> str:
        label = model_label(model)
        with self.lock:
            out = [
                *scheduler_gauges(label, running, waiting),
                "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
                "# TYPE vllm:kv_cache_usage_perc gauge", f"vllm:kv_cache_usage_perc{{{label}}} {kv_usage}",
            ]  # fmt: skip
            for name, value in self.counters.items():
                out += [f"# TYPE {name.removesuffix('_total')} counter", f"{name}{{{label}}} {value}"]
            out += ["# TYPE vllm:request_success counter"]
            out += [f'vllm:request_success_total{{finished_reason="{r}",{label}}} {n}' for r, n in sorted(self.success.items())]
            text = "\n".join(out) + "\n"
            for h in (self.ttft, self.itl, self.tpot, self.e2e, self.nixl_bytes, self.nixl_time):
                text += h.text(label)
        return text


# -- the KV cache and its transfer ----------------------------------------------------------------


def prompt_tokens(prompt: Any) -> int:
    """The prompt's tokens: a list of token ids as it is; a string one token a whitespace-separated
    word (the stand-in has no tokenizer)."""
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return len(prompt)
    if isinstance(prompt, str):
        return max(len(prompt.split()), 1)
    raise ValueError("prompt must be a string or a list of token ids")


class KvError(Exception):
    """A KV transfer that failed, with what NIXL's side reported."""


@dataclass
class Held:
    tokens: int
    blocks: list[int]
    expires: float
    rank: int  # the DP rank whose blocks they are


class BlockPool:
    """The engine's KV blocks: a request holds ceil(tokens / block_size) of them while it runs, and
    a prefill's stay held for the decode to read, until it has, or VLLM_NIXL_ABORT_REQUEST_TIMEOUT."""

    def __init__(self, total: int, block_size: int) -> None:
        self.total, self.block_size = max(total, 1), block_size
        self.lock = threading.Lock()
        self.free = list(range(self.total))

    def take(self, tokens: int) -> list[int]:
        need = max(math.ceil(tokens / self.block_size), 1)
        with self.lock:
            if need > len(self.free):
                raise KvError(f"no KV cache blocks free: {need} needed, {len(self.free)} of {self.total} free")
            taken, self.free = self.free[:need], self.free[need:]
        return taken

    def give(self, blocks: list[int]) -> None:
        with self.lock:
            self.free.extend(blocks)

    def usage(self) -> float:
        with self.lock:
            return (self.total - len(self.free)) / self.total


PATTERN = bytes(range(256)) * 256  # 64 KiB
MAX_HEADER = 64 * 1024


def _read_line(sock: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(1)
        if not chunk:
            raise KvError("the side channel closed before its header")
        data += chunk
        if len(data) > MAX_HEADER:
            raise KvError("the side channel's header is too long")
    return data


class SideChannel:
    """The prefill's NIXL side channel at VLLM_NIXL_SIDE_CHANNEL_HOST:VLLM_NIXL_SIDE_CHANNEL_PORT,
    standing for NIXL's handshake and its RDMA READ: a decode sends one JSON line naming the engine
    and the request, and reads a JSON line and the request's KV bytes."""

    def __init__(self, engine: Engine, host: str, port: int) -> None:
        self.engine = engine
        self.server = socket.create_server((host, port), reuse_port=False)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(30)
            try:
                ask = json.loads(_read_line(conn))
                held = self.engine.take_held(ask.get("engine_id"), ask.get("request_id"), ask.get("block_ids"))
            except (KvError, ValueError, AttributeError, OSError) as exc:
                try:
                    conn.sendall(json.dumps({"error": str(exc)}).encode() + b"\n")
                except OSError:
                    pass
                return
            size = held.tokens * self.engine.token_bytes
            header = {"bytes": size, "token_bytes": self.engine.token_bytes}
            try:
                conn.sendall(json.dumps(header).encode() + b"\n")
                sent = 0
                while sent < size:
                    piece = PATTERN[: min(len(PATTERN), size - sent)]
                    conn.sendall(piece)
                    sent += len(piece)
                _read_line(conn)  # the decode's notification that it has read them ("Notify P to free blocks")
            except (OSError, KvError):
                pass
            finally:
                self.engine.pools[held.rank].give(held.blocks)
            try:
                conn.sendall(b"freed\n")  # so that the decode goes on only once the blocks are free here
            except OSError:
                pass


def pull(params: dict, token_bytes: int, tokens: int, tp: int) -> int:
    """The decode's read, on its ``tp`` ranks, of a request's KV from the prefill named in
    ``params``; returns the bytes read, or raises KvError."""
    remote_tp = params.get("tp_size")
    if isinstance(remote_tp, int) and remote_tp > 0 and tp % remote_tp:
        # vLLM's NixlConnector meeting the prefill's agent (add_remote_agent;
        # _validate_remote_agent_handshake from 0.11): "tp_ratio = divide(self._tp_size[self.engine_id],
        # self._tp_size[engine_id])", the decode's TP over the prefill's, where vllm.distributed.utils's
        # divide asserts "{} is not divisible by {}"; then "assert tp_ratio > 0, 'Decode TP cannot be
        # smaller than prefill TP'". So a decode reads only from a prefill whose TP divides its own.
        raise KvError(f"AssertionError: {tp} is not divisible by {remote_tp}")
    host, port = params["remote_host"], int(params["remote_port"])
    try:
        sock = socket.create_connection((host, port), timeout=30)
    except OSError as exc:
        raise KvError(f"NIXL handshake with {host}:{port} failed: {exc}") from None
    with sock:
        ask = {"engine_id": params["remote_engine_id"], "request_id": params.get("remote_request_id"),
               "block_ids": params["remote_block_ids"]}  # fmt: skip
        try:
            sock.sendall(json.dumps(ask).encode() + b"\n")
            header = json.loads(_read_line(sock))
            if "error" in header:
                raise KvError(header["error"])
            if header["token_bytes"] != token_bytes:
                raise KvError(
                    f"the prefill's KV is {header['token_bytes']} bytes a token, this engine's {token_bytes}: another model's cache"
                )
            want, got = int(header["bytes"]), 0
            while got < want:
                chunk = sock.recv(min(1 << 20, want - got))
                if not chunk:
                    raise KvError(f"the prefill at {host}:{port} closed the transfer at {got} of {want} bytes")
                got += len(chunk)
            sock.sendall(b"read\n")
            _read_line(sock)
        except OSError as exc:
            raise KvError(f"NIXL transfer from {host}:{port} failed: {exc}") from None
    if got != tokens * token_bytes:
        raise KvError(f"read {got} bytes of KV for {tokens} prompt tokens, {tokens * token_bytes} expected")
    return got


class Engine:
    """One server's engine: its role, its blocks, its held prefills, its metrics."""

    def __init__(
        self, config: KVTransferConfig, token_bytes: int, block_size: int, blocks: int, tp: int, dp: int, graphs: PluginMetrics
    ) -> None:
        self.config = config
        self.engine_id = config.engine_id  # parse_kv_transfer_config gives one where the flag does not
        self.token_bytes = token_bytes
        # Each DP rank its own KV cache of ``blocks`` (a replica of the model on its own TP group).
        self.pools = [BlockPool(blocks, block_size) for _ in range(dp)]
        self.tp = tp
        self.metrics = Metrics()
        self.graphs = graphs  # the plugin's vllm_neuron: metrics, the start's and each graph's
        self.lock = threading.Lock()
        self.held: dict[str, Held] = {}
        self.timeout = float(os.environ.get("VLLM_NIXL_ABORT_REQUEST_TIMEOUT", "480"))
        # vLLM's envs: VLLM_NIXL_SIDE_CHANNEL_HOST, VLLM_NIXL_SIDE_CHANNEL_PORT (the DI design page's defaults).
        self.side_host = os.environ.get("VLLM_NIXL_SIDE_CHANNEL_HOST", "127.0.0.1")
        self.side_port = int(os.environ.get("VLLM_NIXL_SIDE_CHANNEL_PORT", "5557"))

    def listen(self) -> SideChannel | None:
        """The prefill's side channel, which the decodes read its KV through; None for any other
        server (the stand-in's decode reads and is never read from)."""
        return SideChannel(self, self.side_host, self.side_port) if self.config.is_kv_producer else None

    def expire(self) -> None:
        now = time.monotonic()
        with self.lock:
            gone = [r for r, h in self.held.items() if h.expires < now]
            for request in gone:
                held = self.held.pop(request)
                self.pools[held.rank].give(held.blocks)
                self.metrics.add("vllm:nixl_num_kv_expired_reqs_total")
                print(
                    f"WARNING Releasing expired KV blocks for request {request} which were retrieved by 0 decode worker(s) "
                    f"within {self.timeout:g} seconds.",
                    file=sys.stderr,
                    flush=True,
                )

    def hold(self, request: str, tokens: int, blocks: list[int], rank: int) -> None:
        self.expire()
        with self.lock:
            self.held[request] = Held(tokens, blocks, time.monotonic() + self.timeout, rank)

    def usage(self) -> float:
        """The KV cache's use over the server's DP ranks."""
        return sum(pool.usage() for pool in self.pools) / len(self.pools)

    def take_held(self, engine_id: Any, request: Any, block_ids: Any) -> Held:
        self.expire()
        if engine_id != self.engine_id:
            raise KvError(f"Remote NIXL agent engine ID mismatch. Expected {engine_id}, received {self.engine_id}.")
        with self.lock:
            held = self.held.get(request) if isinstance(request, str) else None
            if held is None or held.blocks != block_ids:
                raise KvError(f"no KV blocks {block_ids} held for request {request}: released, already read, or never made")
            del self.held[request]
        return held


# -- the server ----------------------------------------------------------------------------------

MAX_BODY = 4 * 1024 * 1024


class DisaggServer(ThreadingHTTPServer):
    """vLLM's OpenAI server as a prefill or decode server: /health, /metrics, /v1/completions
    (stream or not), /standin. Its Handler reads the model, the engine and the scheduler from it.
    On SIGTERM, as vLLM's server (uvicorn) does: stop listening, finish the requests in hand
    (server_close joins the threads, which are not daemons), exit 0; as neuron_standin.serve."""

    daemon_threads = False

    def __init__(self, port: int, model: str, found: dict, engine: Engine, max_num_seqs: int | None, max_model_len: int | None) -> None:
        self.model, self.found, self.engine, self.max_model_len = model, found, engine, max_model_len
        self.sequences = Ranks(max_num_seqs, rank_groups(found))
        self.schedulers = [NeuronScheduler(max_num_seqs, engine.graphs) for _ in self.sequences.groups]
        self.started = time.time()
        self.ids = itertools.count()
        super().__init__(("0.0.0.0", port), Handler)

    def gauges(self) -> tuple[int, int]:
        """vllm:num_requests_running and vllm:num_requests_waiting: the schedulers' queues, summed
        over the DP ranks: each rank has its own scheduler, and vLLM writes one sample a DP engine
        (its ``engine`` label, create_metric_per_engine in vllm/v1/metrics/loggers.py), where the
        stand-in writes their sum, which is what the operator's queries take. The requests the
        server holds back past --max-num-seqs before they reach a scheduler
        (``sequences.waiting``) are waiting too: vLLM has no such hold, and queues them in its
        scheduler's waiting queue."""
        counts = [scheduler.gauges() for scheduler in self.schedulers]
        return sum(r for r, _ in counts), sum(w for _, w in counts) + self.sequences.waiting


@dataclass
class Completion:
    """One request as the server runs it."""

    id: str
    model: str  # the name its answer carries
    tokens: int  # the prompt's
    max_tokens: int
    arrived: float
    rank: int  # the DP rank it runs on
    scheduler: NeuronScheduler  # that rank's
    kv_params: dict | None = None  # a prefill's, for the decode
    compute: int = 0  # the prompt tokens this engine computes: all of them, or none once its KV is read
    kv_read: bool = False  # its KV read from a prefill server


class Handler(JsonHandler):
    protocol_version = "HTTP/1.1"
    timeout = 60
    server: DisaggServer

    def _error(self, code: int, message: str, kind: str) -> None:
        # vLLM's ErrorResponse (vllm/entrypoints/openai/protocol.py).
        self._json(code, {"error": {"message": message, "type": kind, "param": None, "code": code}})

    def do_GET(self) -> None:
        server, engine = self.server, self.server.engine
        if self.path == "/health":
            self._json(200, {})
        elif self.path == "/metrics":
            engine.expire()
            running, waiting = server.gauges()
            self._metrics(
                engine.metrics.text(server.model, running, waiting, engine.usage()) + engine.graphs.text(model_label(server.model))
            )
        elif self.path == "/standin":
            self._json(200, {**server.found, "kvRole": engine.config.kv_role, "engineId": engine.engine_id, "pid": os.getpid(),
                             "uptime": time.time() - server.started})  # fmt: skip
        else:
            self._error(404, "Not Found", "NotFoundError")

    def do_POST(self) -> None:
        admitted = self._admit()
        if admitted is None:
            return
        body, tokens, max_tokens = admitted
        with self.server.sequences.rank() as (rank, _):
            request = f"cmpl-{self.headers.get('X-Request-Id') or uuid.uuid4().hex}-{next(self.server.ids)}"
            completion = Completion(request, body.get("model") or self.server.model, tokens, max_tokens, time.monotonic(), rank,
                                    self.server.schedulers[rank])  # fmt: skip
            self._complete(body, completion)

    def _admit(self) -> tuple[dict, int, int] | None:
        """The request's body, prompt tokens and max_tokens; None once it has been refused."""
        length = self.headers.get("Content-Length") or ""
        if not length.isdigit() or int(length) > MAX_BODY:
            self._error(413 if length.isdigit() else 411, "request body refused", "BadRequestError")
            return None
        try:
            body = json.loads(self.rfile.read(int(length)) or b"{}")
        except ValueError:
            self._error(400, "body is not JSON", "BadRequestError")
            return None
        if self.path != "/v1/completions" or not isinstance(body, dict):
            self._error(404, "Not Found", "NotFoundError")
            return None
        try:
            tokens = prompt_tokens(body.get("prompt", ""))
        except ValueError as exc:
            self._error(400, str(exc), "BadRequestError")
            return None
        max_tokens = body.get("max_tokens", 16)
        if not isinstance(max_tokens, int) or max_tokens < 1:
            self._error(400, f"max_tokens must be at least 1, got {max_tokens}.", "BadRequestError")
            return None
        most = self.server.max_model_len
        if most and tokens + max_tokens > most:
            self._error(
                400,
                f"This model's maximum context length is {most} tokens. However, you requested "
                f"{tokens + max_tokens} tokens ({tokens} in the messages, {max_tokens} in the completion).",
                "BadRequestError",
            )
            return None
        return body, tokens, max_tokens

    def _complete(self, body: dict, completion: Completion) -> None:
        engine = self.server.engine
        params = body.get("kv_transfer_params") if isinstance(body.get("kv_transfer_params"), dict) else None
        try:
            blocks = engine.pools[completion.rank].take(completion.tokens + completion.max_tokens)
        except KvError as exc:
            self._error(503, str(exc), "ServiceUnavailableError")
            return
        keep = False
        try:
            if not self._receive_kv(completion, params):
                return
            engine.metrics.add("vllm:prompt_tokens_total", completion.tokens)
            if engine.config.is_kv_producer and params is not None and params.get("do_remote_decode"):
                completion.max_tokens = 1  # the proxy's max_tokens=1; the token sampled is discarded by the design
                completion.kv_params = self._offer_kv(completion, blocks)
                keep = True
            if body.get("stream"):
                self._streamed(completion)
            else:
                self._whole(completion)
        finally:
            if not keep:
                engine.pools[completion.rank].give(blocks)

    def _receive_kv(self, completion: Completion, params: dict | None) -> bool:
        """The prompt's KV: read from the prefill its params name (WAITING_FOR_REMOTE_KVS, before
        the request runs), else to be computed here (``completion.compute``, which the engine's
        prefill iteration runs). False once the request has failed, answered."""
        engine = self.server.engine
        asked = engine.config.is_kv_consumer and params is not None and params.get("do_remote_prefill")
        keys = ("remote_engine_id", "remote_host", "remote_port", "remote_block_ids")
        if not asked or params is None or not all(params.get(k) is not None for k in keys):
            if asked:
                # NixlConnector.update_state_after_alloc: "Got invalid KVTransferParams".
                print(f"WARNING Got invalid KVTransferParams: {params}. This request will not utilize KVTransfer",
                      file=sys.stderr, flush=True)  # fmt: skip
            completion.compute = completion.tokens
            return True
        began = time.monotonic()
        try:
            with completion.scheduler.loading_kv():
                moved = pull(params, engine.token_bytes, completion.tokens, engine.tp)
        except KvError as exc:
            engine.metrics.add("vllm:nixl_num_failed_transfers_total")
            print(f"ERROR KV transfer for request {completion.id} failed: {exc}", file=sys.stderr, flush=True)
            if engine.config.kv_load_failure_policy == "fail":
                engine.metrics.finished("error")
                # The request finishes with FinishReason.ERROR, which the OpenAI server answers as
                # an internal error (kv_load_failure_policy "fail", vLLM's default).
                self._error(500, "Internal server error", "InternalServerError")
                return False
            completion.compute = completion.tokens  # "recompute": the blocks are computed here
            return True
        completion.kv_read = True
        engine.metrics.observe(engine.metrics.nixl_bytes, moved)
        engine.metrics.observe(engine.metrics.nixl_time, time.monotonic() - began)
        print(f"INFO KV transfer for request {completion.id}: {moved} bytes from {params['remote_host']}:{params['remote_port']}",
              flush=True)  # fmt: skip
        return True

    def _offer_kv(self, completion: Completion, blocks: list[int]) -> dict:
        """A prefill's blocks, held for the decode to read, and the kv_transfer_params naming them."""
        engine = self.server.engine
        engine.hold(completion.id, completion.tokens, blocks, completion.rank)
        return {
            "do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": blocks,
            "remote_engine_id": engine.engine_id, "remote_request_id": completion.id, "remote_host": engine.side_host,
            "remote_port": engine.side_port, "tp_size": engine.tp,
        }  # fmt: skip

    def _decode(self, completion: Completion) -> Iterator[str]:
        """The completion's tokens as its DP rank's engine makes them (NeuronScheduler), the first
        with the rank's cores; its metrics once the last is out."""
        metrics = self.server.engine.metrics
        first = last = 0.0
        for i, now in enumerate(completion.scheduler.generate(completion.compute, completion.max_tokens, completion.kv_read)):
            if i == 0:
                first = now
                metrics.observe(metrics.ttft, now - completion.arrived)
            else:
                metrics.observe(metrics.itl, now - last)
            last = now
            yield (f" [cores {self.server.sequences.groups[completion.rank]}]" if i == 0 else "") + f" tok{i}"
        metrics.add("vllm:generation_tokens_total", completion.max_tokens)
        if completion.max_tokens > 1:
            metrics.observe(metrics.tpot, (last - first) / (completion.max_tokens - 1))
        metrics.observe(metrics.e2e, time.monotonic() - completion.arrived)
        metrics.finished("length")

    def _streamed(self, completion: Completion) -> None:
        """Server-sent events, a chunk a token, the prefill's kv_transfer_params on the last."""
        created = int(time.time())
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        last = completion.max_tokens - 1
        for i, text in enumerate(self._decode(completion)):
            chunk = {"id": completion.id, "object": "text_completion", "created": created, "model": completion.model,
                     "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "length" if i == last else None}]}  # fmt: skip
            if i == last and completion.kv_params is not None:
                chunk["kv_transfer_params"] = completion.kv_params
            self._chunk(f"data: {json.dumps(chunk)}\n\n".encode())
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")

    def _whole(self, completion: Completion) -> None:
        created = int(time.time())
        text = "".join(self._decode(completion))
        tokens, max_tokens = completion.tokens, completion.max_tokens
        self._json(200, {
            "id": completion.id, "object": "text_completion", "created": created, "model": completion.model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "length", "stop_reason": None}],
            "usage": {"prompt_tokens": tokens, "completion_tokens": max_tokens, "total_tokens": tokens + max_tokens},
            "kv_transfer_params": completion.kv_params,
        })  # fmt: skip

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


def serve(port: int, model: str, found: dict, engine: Engine, max_num_seqs: int | None, max_model_len: int | None,
          side: SideChannel | None) -> None:  # fmt: skip
    server = DisaggServer(port, model, found, engine, max_num_seqs, max_model_len)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    listening = f", side channel {engine.side_host}:{engine.side_port}" if side is not None else ""
    print(f"serving {model} on :{port} as {engine.config.kv_role or 'an aggregated server'} (engine {engine.engine_id}{listening})"
          f" with NeuronCores {found['cores']}", flush=True)  # fmt: skip
    engine.graphs.ready()
    print("INFO:     Application startup complete.", flush=True)
    server.serve_forever()
    server.server_close()


def run(args: argparse.Namespace, model: str, found: dict, token_bytes: int, block_size: int, graphs: PluginMetrics) -> int:
    """Serve ``args.kv_transfer_config``'s role, after vllm_main's checks and warm-up: ``found`` is
    what they found (the plugin's KV cache among it, its budget and a block's bytes, target and
    draft, as neuron_standin.plugin_kv_cache sizes them), ``token_bytes`` one token's KV cache
    (neuron_standin.kv_token_bytes), ``block_size`` the tokens a block holds, ``graphs`` the plugin's
    vllm_neuron: metrics, the start's figures in them (vllm_main)."""
    # Without a connector (NEURON_STANDIN_SCHEDULER=neuron, neuron_standin.vllm_main): an
    # aggregated server, computing every prompt itself, on the same engine and timing.
    config: KVTransferConfig = args.kv_transfer_config or KVTransferConfig(engine_id=str(uuid.uuid4()))
    tp = args.tensor_parallel_size or 1
    blocks = args.num_gpu_blocks_override
    kv = found.get("kvCache") or {}
    if blocks is None and kv.get("kvBudgetBytes") and kv.get("kvBlockBytes"):
        blocks = kv["kvBudgetBytes"] // kv["kvBlockBytes"]
    if blocks is None:
        blocks = (args.max_num_seqs or 256) * -(-(args.max_model_len or 2048) // block_size)
    engine = Engine(config, token_bytes, block_size, blocks, tp, len(rank_groups(found)), graphs)
    # vLLM opens the NIXL side channel only through its NIXL connector, so an aggregated server
    # (no --kv-transfer-config) opens none and leaves VLLM_NIXL_SIDE_CHANNEL_PORT free.
    side = None
    if args.kv_transfer_config is not None:
        try:
            side = engine.listen()
        except OSError as exc:
            print(f"RuntimeError: the NIXL side channel cannot listen on {engine.side_host}:{engine.side_port}: {exc}",
                  file=sys.stderr, flush=True)  # fmt: skip
            return 1
    serve(args.port, model, found, engine, args.max_num_seqs, args.max_model_len, side)
    return 0
