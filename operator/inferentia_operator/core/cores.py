"""The arithmetic of cores, groups and memory that the rules and the planner share."""

from __future__ import annotations

from .api import InferentiaModelSpec
from .catalogue import Family, bucket_budget_per_core


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def round_half_up_div(numerator: int, denominator: int) -> int:
    """round(numerator / denominator) with halves rounded up, in integers (as the CEL rule computes it)."""
    return (2 * numerator + denominator) // (2 * denominator)


def bytes_per_weight(precision: str) -> int:
    return 4 if precision == "fp32" else 2


def lnc_of(spec: InferentiaModelSpec, family: Family) -> int:
    """The spec's logical NeuronCore configuration, or the family's default."""
    return spec.compute.lnc if spec.compute.lnc is not None else family.default_lnc


def core_request_counts(family: Family, lnc: int) -> list[int]:
    """The NeuronCore counts a ``cores`` request may have on the family at this LNC.

    The device plugin hands out single cores as aws.amazon.com/neuroncore, and the Neuron
    scheduler extension places a request of more than one on directly connected cores:
    contiguous on the ring of inf1 and inf2 devices (any count up to an instance's), and
    on trn1's torus only in the device shapes its containers may use, so one chip's cores
    or 1, 4, 8 or 16 whole chips' (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/containers/tutorials/k8s-neuron-scheduler.html).
    Only at LNC 1: how the plugin counts cores under a logical NeuronCore configuration is
    not documented, so trn2 core requests need lnc: 1."""
    if lnc != 1:
        return []
    per = family.cores_per_chip(lnc)
    if family.allowed_chip_counts:
        return sorted(set(range(1, per + 1)) | {per * k for k in family.allowed_chip_counts})
    return list(range(1, per * family.max_chips + 1))


def replica_cores(spec: InferentiaModelSpec, family: Family) -> int:
    """The replica's NeuronCores, in logical cores: its cores request, or its chips' cores."""
    if spec.compute.cores is not None:
        return spec.compute.cores
    return family.cores_per_chip(lnc_of(spec, family)) * (spec.compute.inf or 0)


def chips_needed(spec: InferentiaModelSpec, family: Family) -> int:
    """The chips an instance needs for one replica: its inf, or as many as its cores fill."""
    if spec.compute.cores is not None:
        return -(-spec.compute.cores // family.cores_per_chip(lnc_of(spec, family)))
    return spec.compute.inf or 0


def request_ok(spec: InferentiaModelSpec, family: Family) -> bool:
    """Exactly one of inf and cores, of a size the family can place, at an LNC it supports."""
    compute, lnc = spec.compute, lnc_of(spec, family)
    if not compute.one_request or lnc not in family.lnc_values:
        return False
    if compute.cores is not None:
        return compute.cores in core_request_counts(family, lnc)
    return compute.inf is not None and compute.inf <= family.max_chips


def group_size_of(spec: InferentiaModelSpec, family: Family) -> int | None:
    """The cores of one group, or None when the spec has no valid group size to check against."""
    cores = replica_cores(spec, family)
    if not request_ok(spec, family) or cores % spec.processes_per_replica:
        return None
    return cores // spec.processes_per_replica


def max_buckets_per_group(family: Family, lnc: int, group_size: int, weights: int) -> int:
    """The bucketing note's round(10^9 / weights) bucketed models per NeuronCore (scaled for non-inf1 cores)."""
    return group_size * round_half_up_div(bucket_budget_per_core(family, lnc), weights)


def tensor_parallel_processes(family: Family, cores: int) -> list[int]:
    """The processesPerReplica values whose groups the family's runtime can run tensor parallel."""
    return [d for d in divisors(cores) if family.tensor_parallel_ok(cores // d)]


# Device memory a process's cores must hold. The runtime takes "a micro-code overhead of
# 96MB per physical Neuron Core" before any model loads (the Neuron Device Memory page,
# https://awsdocs-neuron.readthedocs-hosted.com/en/latest/neuron-runtime/explore/device-memory.html);
# scratchpad, DMA rings and collectives take more, by model, so the check is a floor: a
# model it refuses cannot load, and one it passes may still need more.
RUNTIME_RESERVE_PER_PHYSICAL_CORE = 96 * 2**20


def runtime_reserve_bytes(lnc: int, group: int) -> int:
    return group * lnc * RUNTIME_RESERVE_PER_PHYSICAL_CORE


def group_memory_bytes(family: Family, lnc: int, group: int) -> int:
    """The device memory of a group's cores: its share of its chips' memory."""
    return group * family.memory_per_core_bytes(lnc)


def weights_bytes(spec: InferentiaModelSpec) -> int | None:
    weights = spec.model.weights
    return None if weights is None else weights * bytes_per_weight(spec.model.precision)


def sequences(spec: InferentiaModelSpec) -> tuple[int, int] | None:
    """(tokens per sequence, sequences at once) of a transformer that holds a KV cache: the
    vLLM preset (--max-model-len from the largest bucket, --max-num-seqs from maxBatchSize),
    or a transformer compiled for buckets (their largest last dimension, at the compiled
    batch size). None when either is unknown."""
    buckets = spec.compile.buckets or []
    tokens = max((b[-1] for b in buckets if b), default=None)
    if spec.serving.runtime == "vllm":
        batch = spec.serving.batching.max_batch_size if spec.serving.batching else None
    elif spec.model.architecture == "transformer":
        batch = spec.compile.batch_size
    else:
        return None
    return None if tokens is None or batch is None else (tokens, batch)


def kv_cache_bytes(spec: InferentiaModelSpec, family: Family, group: int) -> int | None:
    """A group's KV cache: keys and values of every layer for every token of every sequence.
    Tensor parallel over the group (neuronx families), each core holds its share of the KV
    heads, and at least one: heads are replicated when the group has more cores than heads."""
    m, seqs = spec.model, sequences(spec)
    if seqs is None or m.layers is None or m.kv_heads is None or m.head_dim is None:
        return None
    heads = -(-m.kv_heads // group) * group if family.neuronx else m.kv_heads
    tokens, batch = seqs
    return 2 * m.layers * heads * m.head_dim * tokens * batch * bytes_per_weight(m.precision)


def memory_needed(spec: InferentiaModelSpec, family: Family, group: int, with_kv: bool = True) -> int | None:
    """Device memory one group needs (weights, the KV cache where known, the runtime's reserve)."""
    weights = weights_bytes(spec)
    if weights is None:
        return None
    kv = kv_cache_bytes(spec, family, group) if with_kv else None
    return weights + (kv or 0) + runtime_reserve_bytes(lnc_of(spec, family), group)


def smallest_fitting_group(spec: InferentiaModelSpec, family: Family, with_kv: bool, most: int | None = None) -> int:
    """The fewest cores a group needs for the model to fit (possibly more than any instance has).
    ``most``: where the search with the KV cache stops, the family's largest instance unless given
    (a replica across nodes searches its nodes' cores)."""
    lnc = lnc_of(spec, family)
    weights = weights_bytes(spec) or 0
    per_core = family.memory_per_core_bytes(lnc) - lnc * RUNTIME_RESERVE_PER_PHYSICAL_CORE
    group = max(1, -(-weights // per_core))  # the weights alone: what the CEL rule computes
    if with_kv:
        # Past the family's largest instance nothing fits; the KV cache of replicated heads
        # grows with the group, so the search must stop somewhere.
        most = most or family.cores_per_chip(lnc) * family.max_chips
        while group <= most and (memory_needed(spec, family, group) or 0) > group_memory_bytes(family, lnc, group):
            group += 1
    return group


def device_memory_per_process(spec: InferentiaModelSpec, family: Family, group: int) -> dict[str, int | None]:
    """What one process's cores hold, and what its model needs there: the weights, the KV
    cache and the runtime's reserve, as the device-memory rule counts them (inf2, trn1,
    trn2, trn3; None where unknown). A replica across nodes is one model over every node's
    cores, one process a node: each holds its node's share of what the whole model needs."""
    lnc, nodes = lnc_of(spec, family), spec.compute.nodes
    world = group * nodes

    def share(size: int | None) -> int | None:
        return None if size is None else -(-size // nodes)

    out: dict[str, int | None] = {"availableBytes": group_memory_bytes(family, lnc, group)}
    if family.neuronx:
        out |= {
            "weightsBytes": share(weights_bytes(spec)),
            "kvCacheBytes": share(kv_cache_bytes(spec, family, world)),
            "runtimeReserveBytes": share(runtime_reserve_bytes(lnc, world)),
            "neededBytes": share(memory_needed(spec, family, world)),
        }
    return out
