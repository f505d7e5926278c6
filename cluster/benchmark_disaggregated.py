"""Prefill and decode pools against aggregated serving on the same chips, for real on loopback.

    make benchmark-disaggregated     # --pools 2x2:1x2; python cluster/benchmark_disaggregated.py: the sample's pools

Both arms are rendered by the operator from one sample, manifests/samples/trn2-disaggregated.yaml
(Llama 3.1 8B on Trainium2, a prefill pool of one replica and a decode pool of two, one chip
each, unless --pools gives others): (a) the same spec without spec.disaggregation and as many
replicas as the pools have chips (of --aggregated-inf chips each, else the sample's), each an
aggregated vLLM server; (b) the pools and the operator's proxy (pd_proxy). Every
server is the vLLM Neuron plugin's stand-in (cluster/node/standins), started as a local process
with the engine flags its Deployment renders and the planned environment, less what only a pod
has (its paths, its IP, the compile Job's cache): the model is a local checkpoint of the
sample's shape, the pod's IP is 127.0.0.1, each replica's chips are its own four logical cores each.

The timing model is the stand-in's (vllm_disagg, docs/development.md, "vLLM's disaggregated
prefill and decode"): a prefill of p prompt tokens takes TOKEN_SECONDS x p / 10, a decode step
with s running sequences TOKEN_SECONDS x (1 + (s - 1) / 8), on one chip (TP 4), and a server
tensor parallel over t cores takes 4/t of these (scaled_token_seconds); each DP rank runs one iteration at a
time, a prefill (one request's, first come first served, ahead of the next decode step) or a
decode step of every running sequence, never both, as the plugin's NeuronScheduler does; a
request arriving at a decode server, its KV read, runs one decode step's iteration alone. So in
an aggregated server a long prompt stalls the running answers for its prefill; in a decode
server an arrival holds them for one step. The aggregated stand-in runs that same engine
(NEURON_STANDIN_SCHEDULER=neuron).

The load is one seeded open-loop Poisson sequence, sent to both arms alike: half long prompts
with short answers, half short prompts with long answers, every request streamed. Time to first
token and each token's time are measured by the client: TTFT from the request's send to its
first token, TPOT per request as (last token - first token) / (tokens - 1), as vLLM's
vllm:request_time_per_output_token_seconds is, ITL each gap between two tokens of an answer.
Throughput is the tokens and answers over the seconds from the first send to the last answer. The aggregated arm's client spreads requests
round-robin over the replicas (a Service spreads at random, which can only do worse); the
disaggregated arm sends every request to the proxy, which takes turns over each pool's servers.

Goals (the verdict lines): the disaggregated arm's TPOT p99 at most 0.5x the aggregated arm's,
with its TTFT p99 at most 1.2x.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import http.client
import json
import math
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

import images
from inferentia_operator.core import neuron_images
from inferentia_operator.core.api import InferentiaModelSpec
from inferentia_operator.core.decide import rendered
from inferentia_operator.core.planner import plan
from inferentia_operator.core.pod.model import Model
from ports import free_port

ROOT = Path(__file__).resolve().parent.parent
STANDINS = ROOT / "cluster" / "node" / "standins"
sys.path.insert(0, str(STANDINS))
import vllm_disagg  # noqa: E402  (the stand-in's timing defaults, from STANDINS)

SAMPLE = ROOT / "manifests" / "samples" / "trn2-disaggregated.yaml"
UID = "0c6a1d2e-0000-4000-8000-00000000d15a"
CORES_PER_CHIP = 4  # trn2 at lnc 2, as the sample's NEURON_LOGICAL_NC_CONFIG plans it
SAFETY = 120.0  # seconds: a request, or a server's start, that takes longer has failed

# The mix: (prompt tokens, answer tokens), half each.
LONG_PROMPT = (400, 8)
LONG_ANSWER = (20, 100)
TOKEN_SECONDS = 0.02  # one decode step of one sequence; a 400-token prefill is 0.8 s
GOAL_TPOT, GOAL_TTFT = 0.5, 1.2

# What only a pod has, left out of the planned environment: paths of its image and volumes, the
# compile Job's cache (the stand-in compiles at start in its place), the Secret's token.
POD_ONLY = {
    "HOME", "HF_HOME", "XDG_CACHE_HOME", "TMPDIR", "INFERENTIA_PLAN_FILE", "INFERENTIA_COMPILED_MODEL_DIR",
    "VLLM_CACHE_ROOT", "HF_HUB_CACHE", "VLLM_NEURON_DISABLE_WARMUP_COMPILE", "HF_TOKEN",
    "VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT",
}  # fmt: skip


# -- the load ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    at: float  # seconds after the start
    prompt: int
    max_tokens: int


def workload(seed: int, rate: float, seconds: float) -> list[Request]:
    """Poisson arrivals at ``rate`` a second for ``seconds``, each a long prompt with a short
    answer or a short prompt with a long answer, at even odds."""
    rng, at, out = random.Random(seed), 0.0, []
    while True:
        at += rng.expovariate(rate)
        if at >= seconds:
            return out
        prompt, answer = LONG_PROMPT if rng.random() < 0.5 else LONG_ANSWER
        out.append(Request(at, prompt, answer))


@dataclass
class Outcome:
    sent: float = 0.0
    tokens: list[float] = field(default_factory=list)  # each token's arrival, monotonic
    error: str | None = None

    @property
    def ttft(self) -> float:
        return self.tokens[0] - self.sent

    @property
    def tpot(self) -> float | None:
        return (self.tokens[-1] - self.tokens[0]) / (len(self.tokens) - 1) if len(self.tokens) > 1 else None


def stream(port: int, request: Request, outcome: Outcome) -> None:
    """One streamed completion; its tokens' times, or why it failed."""
    body = {"model": "m", "prompt": " ".join(["w"] * request.prompt), "max_tokens": request.max_tokens, "stream": True}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=SAFETY)
    try:
        outcome.sent = time.monotonic()
        conn.request("POST", "/v1/completions", body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        answer = conn.getresponse()
        if answer.status != 200:
            outcome.error = f"{answer.status}: {answer.read(512).decode(errors='replace')}"
            return
        done = False
        for line in iter(answer.readline, b""):
            if line.strip() == b"data: [DONE]":
                done = True
            elif line.startswith(b"data: "):
                outcome.tokens.append(time.monotonic())
        if not done or len(outcome.tokens) != request.max_tokens:
            outcome.error = f"cut: {len(outcome.tokens)} of {request.max_tokens} tokens"
    except (OSError, http.client.HTTPException) as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()


def send(load: list[Request], ports: list[int]) -> tuple[list[Outcome], float]:
    """The load, open loop: each request at its time whatever the others are doing, the n-th to
    ``ports[n % len(ports)]``. The outcomes, and the seconds from the first send to the last answer."""
    outcomes = [Outcome() for _ in load]
    threads = []
    start = time.monotonic()
    for n, request in enumerate(load):
        time.sleep(max(0.0, start + request.at - time.monotonic()))
        thread = threading.Thread(target=stream, args=(ports[n % len(ports)], request, outcomes[n]), daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join(SAFETY)
    for thread, outcome in zip(threads, outcomes, strict=True):
        if thread.is_alive():
            outcome.error = outcome.error or "no answer within the safety timeout"
    return outcomes, time.monotonic() - start


# -- the figures ------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile: the smallest value with at least q of them at or below it."""
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)] if ordered else math.nan


@dataclass
class Figures:
    arm: str
    chips: int
    requests: int
    answered: int
    failed: int
    ttft: tuple[float, float]  # p50, p99, seconds
    tpot: tuple[float, float]
    itl_p99: float  # the gaps between consecutive tokens, all requests'
    tokens_per_second: float
    answers_per_second: float
    errors: list[str]
    notes: list[str] = field(default_factory=list)


def figures(arm: str, chips: int, outcomes: list[Outcome], seconds: float) -> Figures:
    good = [o for o in outcomes if o.error is None]
    ttfts = [o.ttft for o in good]
    tpots = [t for o in good if (t := o.tpot) is not None]
    gaps = [b - a for o in good for a, b in zip(o.tokens, o.tokens[1:], strict=False)]
    return Figures(
        arm, chips, len(outcomes), len(good), len(outcomes) - len(good),
        (percentile(ttfts, 0.5), percentile(ttfts, 0.99)), (percentile(tpots, 0.5), percentile(tpots, 0.99)),
        percentile(gaps, 0.99),
        sum(len(o.tokens) for o in good) / seconds, len(good) / seconds, [o.error for o in outcomes if o.error][:3],
    )  # fmt: skip


def table(rows: list[Figures]) -> str:
    ms = lambda s: f"{s * 1000:.0f}"  # noqa: E731
    lines = [
        "| arm | chips | requests | answered | failed | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | TPOT p99 ms | ITL p99 ms | output tokens/s | answers/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for f in rows:
        lines.append(f"| {f.arm} | {f.chips} | {f.requests} | {f.answered} | {f.failed} | {ms(f.ttft[0])} | {ms(f.ttft[1])} | "
                     f"{ms(f.tpot[0])} | {ms(f.tpot[1])} | {ms(f.itl_p99)} | {f.tokens_per_second:.1f} | {f.answers_per_second:.2f} |")  # fmt: skip
    return "\n".join(lines)


def verdicts(aggregated: Figures, disaggregated: Figures) -> list[str]:
    tpot = disaggregated.tpot[1] / aggregated.tpot[1]
    ttft = disaggregated.ttft[1] / aggregated.ttft[1]
    said = lambda ok: "met" if ok else "NOT met"  # noqa: E731
    return [
        f"TPOT p99, disaggregated / aggregated: {tpot:.2f}x (goal at most {GOAL_TPOT}x): {said(tpot <= GOAL_TPOT)}",
        f"TTFT p99, disaggregated / aggregated: {ttft:.2f}x (goal at most {GOAL_TTFT}x): {said(ttft <= GOAL_TTFT)}",
    ]


# -- the arms, as the operator renders them ------------------------------------------------------


Split = tuple[tuple[int, int | None], tuple[int, int | None]]  # (replicas, inf or None) of prefill, then decode


def sample(split: Split | None = None) -> tuple[str, dict]:
    """The sample's name and spec; ``split``: each pool's replicas, and its chips (inf) where
    given, instead of the sample's own."""
    doc = yaml.safe_load(SAMPLE.read_text())
    if split is not None:
        for role, (replicas, inf) in zip(("prefill", "decode"), split, strict=True):
            pool = doc["spec"]["disaggregation"].setdefault(role, {})
            pool["replicas"] = replicas
            if inf is not None:
                pool["inf"] = inf
                # The one artefact compile.image makes has spec.compute's shape, which a pool of
                # other chips cannot use: the operator refuses the pair, and such a pool compiles at
                # start (docs/api.md, "Prefill and decode pools"), as every stand-in server here does.
                doc["spec"]["compile"].pop("image", None)
    return doc["metadata"]["name"], doc["spec"]


def pools_split(text: str) -> Split:
    """--pools P:D, each pool's replicas (1 to 8), each optionally xI, its replica's chips (1, 2
    or 4: a trn2 tensor-parallel group of 4, 8 or 16 logical cores), e.g. 1x2:1."""
    pools = []
    for part in text.split(":") if text.count(":") == 1 else ():
        replicas, x, inf = part.partition("x")
        if not (replicas.isdigit() and 1 <= int(replicas) <= 8 and (not x or inf in ("1", "2", "4"))):
            break
        pools.append((int(replicas), int(inf) if x else None))
    if len(pools) != 2:
        raise argparse.ArgumentTypeError(
            f"{text!r}: valid values are P:D, prefill and decode replicas of 1 to 8 each, either one optionally xI, "
            "its replica's chips (1, 2 or 4), e.g. 2:1 or 1x2:1"
        )
    return pools[0], pools[1]


def model_of(name: str, spec: dict) -> Model:
    parsed = InferentiaModelSpec.model_validate(spec)
    return Model(name, "default", UID, parsed, plan(parsed))


def deployments(model: Model) -> dict[str, dict]:
    return {c["metadata"]["name"]: c for c in rendered(model) if c["kind"] == "Deployment"}


def pool_chips(model: Model, spec: dict) -> int:
    pools = model.plan.disaggregation
    assert pools is not None
    return pools.prefill.chips * spec["disaggregation"]["prefill"].get("replicas", 1) + pools.decode.chips * spec["disaggregation"][
        "decode"
    ].get("replicas", 1)


def aggregated_spec(spec: dict, chips: int, inf: int | None = None) -> dict:
    """The sample without its pools, with as many replicas as they have chips in all: of
    ``inf`` chips each, else of the sample's."""
    out = copy.deepcopy(spec)
    del out["disaggregation"]
    if inf is not None:
        out["compute"]["inf"] = inf
    per_replica = out["compute"]["inf"]
    if chips % per_replica:
        raise SystemExit(f"{chips} chips are no whole number of {per_replica}-chip replicas")
    out["replicas"] = chips // per_replica
    return out


def checkpoint(where: Path, spec: dict) -> Path:
    """A local checkpoint of the sample model's shape (its layers, KV heads, head dimension and
    weights), so each KV transfer moves the bytes that model's would."""
    where.mkdir(parents=True, exist_ok=True)
    model = spec["model"]
    heads = 32
    config = {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16",
        "num_hidden_layers": model["layers"], "num_key_value_heads": model["kvHeads"], "num_attention_heads": heads,
        "hidden_size": heads * model["headDim"], "_standin_parameters": model["weights"],
    }  # fmt: skip
    (where / "config.json").write_text(json.dumps(config))
    (where / "model.safetensors").write_bytes(b"")
    return where


class Processes:
    """The arm's processes, stopped on exit."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, argv: list[str], env: dict[str, str], port: int, health: str, log: Path) -> None:
        with log.open("w") as out:
            proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        deadline = time.monotonic() + SAFETY
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"{argv[:4]} exited {proc.returncode}: {log.read_text()[-2000:]}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", health)
                if conn.getresponse().status == 200:
                    conn.close()
                    return
                conn.close()
            except OSError:
                pass
            time.sleep(0.1)
        raise SystemExit(f"port {port} never answered {health}")

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        for proc in self.procs:
            proc.wait(SAFETY)


def server_argv(deployment: dict, model: Path, port: int) -> list[str]:
    """The Deployment's engine flags (after ``/bin/sh -c '<exec ...>' vllm``), the model a local
    folder and the port a free one."""
    flags = list(deployment["spec"]["template"]["spec"]["containers"][0]["args"][4:])
    flags[flags.index("--model") + 1] = str(model)
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--port", str(port), *flags]


def tensor_parallel(deployment: dict) -> int:
    """The server's rendered --tensor-parallel-size."""
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return int(args[args.index("--tensor-parallel-size") + 1])


def scaled_token_seconds(token_seconds: float, deployment: dict) -> float:
    """The server's times: the reference chip's (``token_seconds``, tensor parallel over its 4
    cores) over the server's share of them. Tensor parallelism gives each rank 1/TP of every weight
    matrix and of its work ("each rank holds 1/TP_SIZE of each weight matrix", the plugin's
    tensor-parallelism design page,
    https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/design/parallelism/tensor_parallelism.html),
    so a prefill's compute and a decode step's reads of weights and KV divide among the ranks,
    which is how the Neuron Hardware Entitlement skill floors each operator's time on the tensor
    engine and on HBM for a parallelism config
    (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/tools/neuron-agentic-development/developer_guides/neuron-hardware-entitlement.html).
    The collectives TP adds ("relatively high communication volume and ... a synchronization
    point in forward pass", NxD Inference's parallelism page) are not counted, so this is the
    most a wider group can gain."""
    return token_seconds * CORES_PER_CHIP / tensor_parallel(deployment)


@dataclass(frozen=True)
class Timing:
    """The stand-in's timing knobs: one decode step of one sequence on the reference chip, and the
    prompt tokens a prefill computes in that time (vllm_disagg.prefill_seconds)."""

    token_seconds: float = TOKEN_SECONDS
    prompt_tokens_per_step: float = vllm_disagg.PROMPT_TOKENS_PER_STEP


def server_env(deployment: dict, work: Path, image: str, chip: int, chips: int, timing: Timing) -> dict[str, str]:
    """The server's environment on ``chips`` chips from ``chip``, with ``timing`` (the reference
    chip's, scaled to the server's share of cores: scaled_token_seconds)."""
    planned = {e["name"]: e["value"] for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"] if "value" in e}
    site = work / "site"
    if not site.exists():
        images.write_distributions(site, neuron_images.CATALOGUE[image].distributions)
    first, last = chip * CORES_PER_CHIP, (chip + chips) * CORES_PER_CHIP - 1
    home = work / f"chip{chip}"
    home.mkdir(exist_ok=True)
    return {
        **{k: v for k, v in planned.items() if k not in POD_ONLY},
        "PATH": "/usr/bin:/bin", "PYTHONPATH": f"{site}:{STANDINS}", "HOME": str(home), "TMPDIR": str(home),
        "VLLM_CACHE_ROOT": str(home / "cache"), "NEURON_STANDIN_DEV_DIR": str(work / "dev"),
        "NEURON_STANDIN_PLATFORM": "trn2", "NEURON_STANDIN_CORES_PER_DEVICE": str(CORES_PER_CHIP),
        "NEURON_STANDIN_LOCK_DIR": str(work / "locks"), "NEURON_RT_VISIBLE_CORES": f"{first}-{last}",
        "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port()),
        "NEURON_STANDIN_TOKEN_SECONDS": str(scaled_token_seconds(timing.token_seconds, deployment)), "NEURON_STANDIN_SCHEDULER": "neuron",
        "NEURON_STANDIN_PROMPT_TOKENS_PER_STEP": str(timing.prompt_tokens_per_step),
    }  # fmt: skip


def devices(work: Path, chips: int) -> None:
    (work / "dev").mkdir(parents=True, exist_ok=True)
    for chip in range(chips):
        (work / "dev" / f"neuron{chip}").touch()


def run_aggregated(work: Path, spec: dict, chips: int, load: list[Request], timing: Timing, inf: int | None = None) -> Figures:
    model = model_of("llama-8b", aggregated_spec(spec, chips, inf))
    (deployment,) = deployments(model).values()
    replicas, per = deployment["spec"]["replicas"], model.spec.compute.inf
    devices(work, chips)
    weights = checkpoint(work / "model", spec)
    procs, ports = Processes(), []
    try:
        for replica in range(replicas):
            port = free_port()
            env = server_env(deployment, work, spec["serving"]["image"], replica * per, per, timing)
            procs.start(server_argv(deployment, weights, port), env, port, "/health", work / f"aggregated-{replica}.log")
            ports.append(port)
        outcomes, seconds = send(load, ports)
    finally:
        procs.stop()
    return figures(f"aggregated, {replicas} replicas (TP {tensor_parallel(deployment)})", chips, outcomes, seconds)


def run_disaggregated(work: Path, name: str, spec: dict, chips: int, load: list[Request], timing: Timing) -> Figures:
    model = model_of(name, spec)
    rendered_ = deployments(model)
    devices(work, chips)
    weights = checkpoint(work / "model", spec)
    procs, ports, chip = Processes(), {"prefill": [], "decode": []}, 0
    pools = model.plan.disaggregation
    assert pools is not None
    try:
        for pool, per in (("prefill", pools.prefill.chips), ("decode", pools.decode.chips)):
            deployment = rendered_[f"{name}-{pool}"]
            for replica in range(deployment["spec"]["replicas"]):
                port = free_port()
                env = server_env(deployment, work, spec["serving"]["image"], chip, per, timing)
                procs.start(server_argv(deployment, weights, port), env, port, "/health", work / f"{pool}-{replica}.log")
                ports[pool].append(port)
                chip += per
        proxy = proxy_argv(rendered_[name], name, ports)
        listen = int(proxy[proxy.index("--port") + 1])
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT / "operator")}
        procs.start([sys.executable, *proxy], env, listen, "/healthcheck", work / "proxy.log")
        outcomes, seconds = send(load, [listen])
        moved = [kv_moved(port) for port in ports["decode"]]
    finally:
        procs.stop()
    tp = {pool: tensor_parallel(rendered_[f"{name}-{pool}"]) for pool in ports}
    pool_replicas = f"{len(ports['prefill'])} prefill (TP {tp['prefill']}) + {len(ports['decode'])} decode (TP {tp['decode']})"
    found = figures(f"disaggregated, {pool_replicas}", chips, outcomes, seconds)
    transfers = sum(m[0] for m in moved)
    if transfers:
        found.notes.append(f"KV read by the decode servers: {transfers:g} transfers, {sum(m[1] for m in moved) / transfers / 2**20:.1f} MiB "
                           f"and {sum(m[2] for m in moved) / transfers * 1000:.0f} ms each on average (vllm:nixl_*, loopback TCP)")  # fmt: skip
    return found


def kv_moved(port: int) -> tuple[float, float, float]:
    """A decode server's KV transfers: their count, bytes and seconds (its NIXL histograms)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=SAFETY)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()

    def total(name: str) -> float:
        return sum(float(v) for v in re.findall(rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", text, re.M))

    return total("vllm:nixl_bytes_transferred_count"), total("vllm:nixl_bytes_transferred_sum"), total("vllm:nixl_xfer_time_seconds_sum")


def proxy_argv(deployment: dict, name: str, ports: dict[str, list[int]]) -> list[str]:
    """The proxy's rendered command line, each pool's Service (one host) swapped for its servers'
    loopback ports, which the proxy takes turns over as the Service would spread its pods."""
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    args = list(container["args"])
    assert args[args.index("--prefiller-host") + 1] == f"{name}-prefill" and args[args.index("--decoder-host") + 1] == f"{name}-decode"
    out = container["command"][1:]  # -m inferentia_operator.programs.pd_proxy
    skip = {"--prefiller-host", "--prefiller-port", "--decoder-host", "--decoder-port", "--host", "--port"}
    i = 0
    while i < len(args):
        if args[i] in skip:
            i += 2
            continue
        out.append(args[i])
        i += 1
    out += ["--host", "127.0.0.1", "--port", str(free_port())]
    for role, pool in (("prefiller", "prefill"), ("decoder", "decode")):
        out += [f"--{role}-hosts", *["127.0.0.1"] * len(ports[pool]), f"--{role}-ports", *map(str, ports[pool])]
    return out


# -- the run ----------------------------------------------------------------------------------


def commit() -> str:
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    return (done.stdout.strip() or "unknown") + (" (with local changes)" if dirty.stdout.strip() else "")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rate", type=float, default=1.2, help="requests a second")
    p.add_argument("--seconds", type=float, default=60.0, help="seconds of arrivals")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--token-seconds", type=float, default=TOKEN_SECONDS, help="one decode step of one sequence")
    p.add_argument("--aggregated-inf", type=int, choices=(1, 2, 4), default=None,
                   help="chips of each aggregated replica (default: the sample's spec.compute.inf)")  # fmt: skip
    p.add_argument(
        "--prompt-tokens-per-step", type=float, default=None,
        help=f"prompt tokens a prefill computes in a decode step's time (default: the stand-in's {vllm_disagg.PROMPT_TOKENS_PER_STEP})",
    )  # fmt: skip
    p.add_argument(
        "--pools", default=None, metavar="P:D", help="prefill and decode replicas, each optionally xI chips (default: the sample's)"
    )
    args = p.parse_args(argv)
    if not (0 < args.rate <= 20 and 0 < args.seconds <= 600 and 0 < args.token_seconds <= 1):
        p.error("--rate in (0, 20], --seconds in (0, 600], --token-seconds in (0, 1]")
    if args.prompt_tokens_per_step is not None and not 0 < args.prompt_tokens_per_step <= 1000:
        p.error("--prompt-tokens-per-step in (0, 1000]")
    timing = Timing(args.token_seconds, args.prompt_tokens_per_step or vllm_disagg.PROMPT_TOKENS_PER_STEP)
    try:
        split = pools_split(args.pools) if args.pools is not None else None
    except argparse.ArgumentTypeError as exc:
        p.error(f"--pools {exc}")
    name, spec = sample(split)
    chips = pool_chips(model_of(name, spec), spec)
    load = workload(args.seed, args.rate, args.seconds)
    shown = {k: v for k, v in vars(args).items() if v is not None}
    command = "python cluster/benchmark_disaggregated.py " + " ".join(
        f"--{k.replace('_', '-')} {v:g}" if isinstance(v, float) else f"--{k.replace('_', '-')} {v}" for k, v in shown.items()
    )
    now = datetime.datetime.now(datetime.UTC)
    print(f"{now:%Y-%m-%d %H:%M} UTC, {command}, commit {commit()}", flush=True)
    print(f"{SAMPLE.relative_to(ROOT)}: {chips} chips; {len(load)} requests, half {LONG_PROMPT[0]}-token prompts with "
          f"{LONG_PROMPT[1]}-token answers, half {LONG_ANSWER[0]}-token prompts with {LONG_ANSWER[1]}-token answers", flush=True)  # fmt: skip
    print(f"timing, on one chip (TP {CORES_PER_CHIP}): a prefill of p tokens {args.token_seconds:g} x p / {timing.prompt_tokens_per_step:g} s; a decode step of s "
          f"sequences {args.token_seconds:g} x (1 + (s - 1) / 8) s; a server of TP t takes {CORES_PER_CHIP}/t of these; one iteration "
          "at a time per engine", flush=True)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-disagg-") as tmp:
        aggregated = run_aggregated(Path(tmp) / "aggregated", spec, chips, load, timing, args.aggregated_inf)
        disaggregated = run_disaggregated(Path(tmp) / "disaggregated", name, spec, chips, load, timing)
    print()
    print(table([aggregated, disaggregated]))
    print()
    for line in verdicts(aggregated, disaggregated):
        print(line)
    for f in (aggregated, disaggregated):
        for note in f.notes:
            print(note)
        for error in f.errors:
            print(f"{f.arm}: a failure: {error}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
