"""How big a model's pods must be, from the model itself (spec.model.weights and precision):
the disk of each volume the pods write, the host memory and CPU a replica needs, and how long
it may take to start. Pure: the planner puts the result in the plan, the builders apply it,
and :mod:`.rules.sizing` warns when a spec overrides one with less.

What each estimate rests on:
- A compiled artefact holds the weights once per bucket: torch-neuron(x) tracing inlines the
  weights into each compiled graph (``inline_weights_to_neff=True`` by default,
  https://awsdocs-neuron.readthedocs-hosted.com/en/latest/frameworks/torch/torch-neuronx/api-reference-guide/inference/api-torch-neuronx-trace.html).
  vLLM's artefacts are counted as one copy of the weights, the size of a sharded checkpoint.
- A model vLLM downloads from the Hugging Face Hub lands in HF_HOME (under HOME) at its
  stored dtype, the precision's bytes a weight. So does an EAGLE3 draft named by a Hub id
  (serving.speculation.draft.weights, at the target's precision), unless the compile Job keeps it
  in the artefact beside the target's snapshot, whose volume then holds it. An uncompiled model fetched from a store is
  counted at four bytes a weight: a module saved at fp32, which the compiler casts.
- Host memory: each serving process holds its weights in host memory while it loads them
  onto its cores. A compile in the pod needs what a compile Job gets: twice the weights, at
  least 8 GiB. AWS publishes no host-memory or compile-time figure for neuron-cc or
  neuronx-cc (its compiler FAQ only recommends "a high-performance compute server",
  https://awsdocs-neuron.readthedocs-hosted.com/en/latest/compiler/neuronx-cc/faq.html), so
  these two are this operator's rules of thumb, which compile.memory and compute.memory override.
- Start-up: 30 minutes to load, plus the download at 100 MiB/s (no AWS figure either: an
  S3 or Hub download on one connection, well below an instance's network), plus the compile's
  own budget (compile.timeoutSeconds) when the pod compiles at start.

Every disk size gets a quarter and one GiB of room, in whole GiB. Without spec.model.weights
nothing can be sized from the model: the pods keep the fixed sizes (HOME 20 GiB, each
artefact volume 50 GiB) and nothing is warned.
"""

from __future__ import annotations

from .api import InferentiaModelSpec, Sizes
from .catalogue import GIB, Family
from .cores import draft_weights_bytes, weights_bytes
from .drift import quantity

HOME_BYTES = 20 * GIB  # the floor of HOME, and its size for a model of unknown size
ARTEFACT_BYTES = 50 * GIB  # an artefact or model volume for a model of unknown size
LOAD_SECONDS = 1800  # loading a large model onto its cores: minutes
DOWNLOAD_BYTES_PER_SECOND = 100 * 2**20
COMPILE_MEMORY_FLOOR = 8 * GIB
FETCHED_SCHEMES = ("s3://", "https://")
FETCHED_BYTES_PER_WEIGHT = 4  # an uncompiled module, perhaps saved at fp32


def gib(size: int) -> int:
    """Whole GiB, rounded up."""
    return -(-size // GIB)


def with_room(size: int) -> int:
    """A quarter and one GiB more, in whole GiB."""
    return (gib(size * 5 // 4) + 1) * GIB


def downloads_from_hub(spec: InferentiaModelSpec) -> bool:
    """vLLM reads spec.model.uri itself: a Hugging Face id (not a store, not a path), downloaded from the Hub."""
    uri = spec.model.uri
    return spec.serving.runtime == "vllm" and not uri.startswith(FETCHED_SCHEMES) and not uri.startswith(("/", "file://"))


def keeps_hub_snapshot(spec: InferentiaModelSpec) -> bool:
    """A vLLM model named by a Hugging Face id, compiled ahead: its compile Job downloads it once
    and keeps it in the artefact, and the serving pods read it from there, offline
    (programs/hub_snapshot.py)."""
    return downloads_from_hub(spec) and spec.compile.image is not None


def replica_downloads_from_hub(spec: InferentiaModelSpec) -> bool:
    """Each serving pod downloads the Hub model into its HOME: unless the artefact keeps it."""
    return downloads_from_hub(spec) and not keeps_hub_snapshot(spec)


def draft_from_hub(spec: InferentiaModelSpec) -> bool:
    """An EAGLE3 draft named by a Hugging Face id, which vLLM downloads (not a path in the image)."""
    speculation = spec.serving.speculation
    return speculation is not None and not speculation.draft.uri.startswith(("/", *FETCHED_SCHEMES))


def draft_download_bytes(spec: InferentiaModelSpec, kept: bool) -> int:
    """A Hub draft's weights where they are written: in the artefact beside a kept Hub snapshot
    (``kept``), else in HOME by whoever starts vLLM; 0 for a draft of unknown size or none."""
    if not draft_from_hub(spec) or kept != keeps_hub_snapshot(spec):
        return 0
    return draft_weights_bytes(spec) or 0


def compiles_in_pod(spec: InferentiaModelSpec) -> bool:
    """No compile Job: vLLM, or the operator's model server, compiles at start in every process.
    (A custom server's own start-up is its own: nothing is known of it.)"""
    return spec.compile.image is None and (spec.serving.runtime == "vllm" or spec.serves_with_program)


def compile_cpu(spec: InferentiaModelSpec, fam: Family) -> str:
    """The compile Job's CPU: compile.cpu, else 4 for neuronx-cc and 2 for neuron-cc."""
    return spec.compile.cpu or ("4" if fam.neuronx else "2")


def compile_memory_bytes(spec: InferentiaModelSpec, fam: Family) -> int:
    """What one compile needs: twice the weights, at least 8 GiB; else 16 GiB for neuronx-cc and 8 for neuron-cc."""
    weights = weights_bytes(spec)
    if weights is None:
        return 16 * GIB if fam.neuronx else 8 * GIB
    return max(COMPILE_MEMORY_FLOOR, gib(2 * weights) * GIB)


def compile_memory(spec: InferentiaModelSpec, fam: Family) -> str:
    """The compile Job's memory: compile.memory, else :func:`compile_memory_bytes`."""
    return spec.compile.memory or f"{gib(compile_memory_bytes(spec, fam))}Gi"


def replica_memory_bytes(spec: InferentiaModelSpec, fam: Family, groups: int) -> int | None:
    """Host memory one pod of a replica needs: each process's compile, or each process's copy of
    the weights. A replica across nodes has one pod a node, which shards and loads only its own
    ranks' weights (NxD Inference's start_rank_id and local_ranks_size): the node's share of the
    weights, once. (Twice the whole weights, as a compile of the whole model takes, would exceed
    the host memory of any node whose device memory the model outgrows: a trn1.32xlarge has 512
    GiB of each.)"""
    weights = weights_bytes(spec)
    if weights is None:
        return None
    if spec.compute.nodes > 1:
        return -(-weights // spec.compute.nodes)
    return groups * (compile_memory_bytes(spec, fam) if compiles_in_pod(spec) else weights)


def _buckets(spec: InferentiaModelSpec) -> int:
    return max(1, len(spec.compile.buckets or []))


def artefact_bytes(spec: InferentiaModelSpec) -> int:
    """The compiled volume: the weights once per bucket (traced graphs), once for vLLM."""
    weights = weights_bytes(spec)
    if weights is None:
        return ARTEFACT_BYTES
    copies = 1 if spec.serving.runtime == "vllm" else _buckets(spec)
    # A Hub draft kept in the artefact beside the target's snapshot (programs/vllm_compile.py).
    return with_room(copies * weights + draft_download_bytes(spec, kept=True))


def model_bytes(spec: InferentiaModelSpec) -> int:
    """The volume an uncompiled model is fetched into."""
    return ARTEFACT_BYTES if spec.model.weights is None else with_room(spec.model.weights * FETCHED_BYTES_PER_WEIGHT)


def home_bytes(spec: InferentiaModelSpec) -> int:
    """HOME of a serving pod: the Hub download, and the graphs a compile at start writes under its caches."""
    weights = weights_bytes(spec)
    if weights is None:
        return HOME_BYTES
    written = (weights if replica_downloads_from_hub(spec) else 0) + (weights * _buckets(spec) if compiles_in_pod(spec) else 0)
    written += draft_download_bytes(spec, kept=False)  # a Hub draft vLLM downloads at start
    return max(HOME_BYTES, with_room(written)) if written else HOME_BYTES


def compile_home_bytes(spec: InferentiaModelSpec) -> int:
    """HOME of the compile Job: the Hub download when the compile reads the model from the Hub."""
    weights = weights_bytes(spec)
    draft = draft_download_bytes(spec, kept=False)  # a Hub draft the compile's engine downloads itself
    if weights is None or not (downloads_from_hub(spec) or draft):
        return HOME_BYTES
    return max(HOME_BYTES, with_room((weights if downloads_from_hub(spec) else 0) + draft))


def startup_seconds(spec: InferentiaModelSpec) -> int:
    """Loading, the download, and a compile at start."""
    weights = weights_bytes(spec) or 0
    downloaded = (weights if replica_downloads_from_hub(spec) else 0) + draft_download_bytes(spec, kept=False)
    compile_budget = spec.compile.timeout_seconds if compiles_in_pod(spec) else 0
    return LOAD_SECONDS + -(-downloaded // DOWNLOAD_BYTES_PER_SECOND) + compile_budget


def size(spec: InferentiaModelSpec, fam: Family, groups: int) -> Sizes:
    """The sizes the plan shows and the builders apply; spec overrides win (a too-small one is warned of)."""
    in_pod = compiles_in_pod(spec)
    compiled = spec.compile.image is not None
    return Sizes(
        home_bytes=int(quantity(spec.serving.home_size) or 0) if spec.serving.home_size else home_bytes(spec),
        artefact_bytes=artefact_bytes(spec) if compiled else None,
        model_bytes=model_bytes(spec) if spec.model.uri.startswith(FETCHED_SCHEMES) else None,
        compile_home_bytes=compile_home_bytes(spec) if compiled else None,
        compiles_in_pod=in_pod,
        memory_bytes=replica_memory_bytes(spec, fam, groups),
        compile_cpu=compile_cpu(spec, fam) if compiled else None,
        compile_memory=compile_memory(spec, fam) if compiled else None,
        startup_seconds=spec.serving.startup_seconds or startup_seconds(spec),
    )
