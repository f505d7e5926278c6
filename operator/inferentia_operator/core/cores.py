"""The arithmetic of cores, groups and memory that the rules and the planner share."""

from __future__ import annotations

from dataclasses import dataclass

from .api import InferentiaModelSpec, KvCache, Pool
from .catalogue import FAMILIES, Family, bucket_budget_per_core


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


def kv_bytes_per_token(spec: InferentiaModelSpec, family: Family, group: int) -> int | None:
    """A group's KV cache for one token: keys and values of every layer. Tensor parallel over the
    group (neuronx families), each core holds its share of the KV heads, and at least one: heads
    are replicated when the group has more cores than heads. None when the shape is unknown."""
    m = spec.model
    if m.layers is None or m.kv_heads is None or m.head_dim is None:
        return None
    heads = -(-m.kv_heads // group) * group if family.neuronx else m.kv_heads
    return 2 * m.layers * heads * m.head_dim * bytes_per_weight(m.precision)


def kv_cache_bytes(spec: InferentiaModelSpec, family: Family, group: int) -> int | None:
    """A group's KV cache: every token of every sequence (kv_bytes_per_token), of every layer the
    cache holds (kv_layers: an EAGLE3 draft's too, as plugin_block_bytes counts them)."""
    seqs, per_token, layers = sequences(spec), kv_bytes_per_token(spec, family, group), kv_layers(spec)
    if seqs is None or per_token is None or layers is None or spec.model.layers is None:
        return None
    tokens, batch = seqs
    return per_token // spec.model.layers * layers * tokens * batch


def memory_needed(spec: InferentiaModelSpec, family: Family, group: int, with_kv: bool = True) -> int | None:
    """Device memory one group needs (weights, the KV cache where known, the runtime's reserve). With
    the KV cache, an EAGLE3 draft's weights too, where known (they are on the same cores): that count
    is validate's and the operator's; the weights alone are the CRD's CEL rule, which reads spec.model."""
    weights = weights_bytes(spec)
    if weights is None:
        return None
    kv = kv_cache_bytes(spec, family, group) if with_kv else None
    draft = (draft_weights_bytes(spec) or 0) if with_kv else 0
    return weights + draft + (kv or 0) + runtime_reserve_bytes(lnc_of(spec, family), group)


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


# The vLLM Neuron plugin's KV cache (vLLM on trn2 and trn3). The plugin budgets device memory for
# it per logical NeuronCore, each rank of the tensor-parallel group, by default as
#     total_budget = int(total_hbm * gpu_memory_utilization)
#     available = max(min(total_budget - bytes_used, int(total_budget * cap_fraction)), 0)
# with bytes_used the rank's "model parameter + buffer sizes", cap_fraction
# VLLM_NEURON_KV_GMU_BUDGET_CAP_FRACTION (0.30: "a safety-first value derived from worst-case
# compile behavior"), and a budget under VLLM_NEURON_MIN_KV_BUDGET_GIB (1.0) raising
# "RuntimeError: Computed KV cache budget is below minimum threshold" ("determine_available_memory
# design", https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/design/vllm/determine_available_memory_design.html).
# total_hbm is one logical core's HBM, "hbm_stack_bytes / logical_cores_per_hbm_stack", 1 at LNC 2
# and 2 at LNC 1 (the same page for Neuron 2.33,
# https://awsdocs-neuron.readthedocs-hosted.com/en/v2.33.0/vllm-neuron/docs/design/vllm/determine_available_memory_design.html):
# the catalogue's memory per logical core. The CPU compile takes "the static HBM size for the target
# platform" so as to "produce the same KV block count that the execution phase will use".
# vLLM makes that budget available // (page size x layers) blocks, or num_gpu_blocks_override
# blocks whatever the memory (vllm-project/vllm vllm/v1/core/kv_cache_utils.py, get_num_blocks and
# may_override_num_blocks). A page is block_size tokens of the rank's KV heads, keys and values: the
# "KV cache integration" page's 16384 blocks of 16 tokens of 4 bf16 heads of 128 are 536870912 bytes
# a layer (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/design/vllm/vllm-integration-kv-cache.html).
# Block 0 is vLLM's null block, never given to a request ("Block KV batching and padding",
# https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/design/vllm/padding-batching-block-kv.html),
# so N blocks keep N - 1 for sequences and prefixes. On Neuron the cache is compiled into every
# graph: "If the KV allocation is too large, the total tensor footprint exceeds this limit and the
# compiler rejects the program (NCC_EVRF009)" (the determine_available_memory page); the cap is the
# plugin's guard against it. So the blocks that fit are the plugin's own budget over a block's bytes:
# what it would size itself, set explicitly, as its features guide asks ("On Neuron, block count is
# set explicitly via num_gpu_blocks_override, and block_size must be specified", Prefix caching,
# https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/guides/features-guide.html),
# so that the compile Job and the serving pods compile and load the same cache. block_size defaults
# to 32 (the configuration reference, KV cache options,
# https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/guides/reference-configuration.html),
# gpu_memory_utilization to 0.9 (the features guide, "KV cache budget too low"; vLLM's newest
# releases default to 0.92, a larger budget, which this count stays within).
# The cap is the plugin's heuristic ("a safety-first value"), not the compiler's limit: a count
# above the budget may fail the compile or the allocation, and may also work.
# Assumed where the documentation is silent (and said in docs/api.md): a rank's bytes_used is its
# even share of spec.model.weights at the precision's bytes; every layer is full attention of
# spec.model.kvHeads heads (sliding-window or mixed layers, gpt-oss's for one, page otherwise);
# the cache is in the model's precision, fp32 at 4 bytes and all else at 2 (--kv-cache-dtype fp8
# halves a block, and the count stays the model precision's); the budget is the utilization and
# cap policy, not Neuron 2.33's "headroom" policy, which is not modelled.
PLUGIN_BLOCK_SIZE = 32
PLUGIN_GPU_MEMORY_UTILIZATION = 0.9
PLUGIN_KV_CAP_FRACTION = 0.30
PLUGIN_MIN_KV_BUDGET_GIB = 1.0
KV_CAP_ENV = "VLLM_NEURON_KV_GMU_BUDGET_CAP_FRACTION"
MIN_KV_BUDGET_ENV = "VLLM_NEURON_MIN_KV_BUDGET_GIB"


def pool_cores(spec: InferentiaModelSpec, family: Family, pool: Pool | None) -> tuple[int, int]:
    """A pool's replica (spec.disaggregation; None: one of the model's own shape): its chips
    (InferentiaModelSpec.pool_chips) and their logical NeuronCores."""
    chips = spec.pool_chips(pool)
    return chips, chips * family.cores_per_chip(lnc_of(spec, family))


def pool_tensor_parallel(spec: InferentiaModelSpec, family: Family, pool: Pool) -> int:
    """A pool's vLLM --tensor-parallel-size: its own, else its replica's logical cores over its
    dataParallelSize (the rules hold that to a divisor of the cores)."""
    return pool.tensor_parallel_size or pool_cores(spec, family, pool)[1] // pool.data_parallel_size


def on_vllm_plugin(spec: InferentiaModelSpec, family: Family) -> bool:
    """The vLLM preset on a family where vLLM runs on the vLLM Neuron plugin (trn2, trn3)."""
    return spec.serving.runtime == "vllm" and family.vllm == "vllm-neuron-plugin"


# The families of on_vllm_plugin, by name: what the rules' messages and CEL list.
PLUGIN_FAMILIES = [f.name for f in FAMILIES.values() if f.vllm == "vllm-neuron-plugin"]


def flag_name(arg: str) -> str:
    """A command-line flag's name as vLLM's argument parser reads it: what comes before ``=``, with
    underscores as dashes up to the first ``.`` (``--block_size`` is ``--block-size``). vLLM's
    FlexibleArgumentParser, "ArgumentParser that allows both underscore and dash in names", converts
    them so in parse_args (vllm-project/vllm, vllm/utils/argparse_utils.py)."""
    name = arg.split("=", 1)[0]
    if not name.startswith("--"):
        return name
    head, dot, tail = name[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + tail


def serving_flag(spec: InferentiaModelSpec, flag: str) -> str | None:
    """What serving.args gives a vLLM flag (``--flag value`` or ``--flag=value``, dashes or
    underscores): the last, as vLLM's argument parser takes a flag given twice."""
    args, found = spec.serving.args or [], None
    for i, arg in enumerate(args):
        if not arg.startswith("--") or flag_name(arg) != flag:
            continue
        if "=" in arg:
            found = arg.partition("=")[2]
        elif i + 1 < len(args):
            found = args[i + 1]
    return found


def serving_env(spec: InferentiaModelSpec, name: str) -> str | None:
    """A variable's value in serving.env (the last of a name, as Kubernetes takes it); None when it
    comes from valueFrom, which the operator cannot read."""
    return next((e.value for e in reversed(spec.serving.env or []) if e.name == name), None)


def _positive_int(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() and int(text) > 0 else None


def serving_count(spec: InferentiaModelSpec, flag: str) -> int | None:
    """What serving.args gives a vLLM flag, where it is a count (above 0)."""
    return _positive_int(serving_flag(spec, flag))


def _fraction(text: str | None, default: float, most: float = 1.0) -> float:
    """A fraction the user set (above 0, at most ``most``), else the default, which the plan then
    assumes for a value it cannot take as the budget's."""
    try:
        value = float(text) if text is not None else default
    except ValueError:
        return default
    return value if 0 < value <= most else default


def user_block_size(spec: InferentiaModelSpec) -> int | None:
    """serving.args' --block-size, where it is a count."""
    return serving_count(spec, "--block-size")


def plugin_block_size(spec: InferentiaModelSpec) -> int:
    """The KV cache's tokens a block: serving.args' --block-size, else the plugin's default."""
    return user_block_size(spec) or PLUGIN_BLOCK_SIZE


def user_kv_blocks(spec: InferentiaModelSpec) -> int | None:
    """serving.args' --num-gpu-blocks-override, where it is a count."""
    return serving_count(spec, "--num-gpu-blocks-override")


def user_gpu_memory_utilization(spec: InferentiaModelSpec) -> float | None:
    """serving.args' --gpu-memory-utilization, where it is a fraction (above 0, at most 1)."""
    text = serving_flag(spec, "--gpu-memory-utilization")
    value = _fraction(text, -1.0)
    return None if value < 0 else value


# EAGLE3 speculative decoding (spec.serving.speculation) on the plugin: the draft's weights are on
# every rank beside the target's ("Applies the same TP group sharding as the target model"), and its
# layers share the target's KV cache: "vLLM allocates block tables spanning all layers (target +
# draft)", the draft being "a single decoder layer" (the speculative decoding design page,
# https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/design/speculation/speculative_decoding_design.html),
# so a block holds DRAFT_LAYERS more layers, and vLLM's budget // (page size x layers) counts them.
# vLLM loads the draft at the target's dtype (SpeculativeConfig's draft_model_config,
# dtype=self.target_model_config.dtype, vllm-project/vllm vllm/config/speculative.py): its weights
# at the model's precision's bytes. Assumed where the documentation is silent (docs/api.md says so):
# the plugin's bytes_used ("model parameter + buffer sizes") counts the draft's parameters once
# loaded, and the draft's layer has the target's KV heads and head dimension, as the EAGLE3 drafts
# of the plugin's tutorials do.
DRAFT_LAYERS = 1


def draft_weights_bytes(spec: InferentiaModelSpec) -> int | None:
    """The EAGLE3 draft's weights at the target's precision: 0 without speculation, None where unknown."""
    speculation = spec.serving.speculation
    if speculation is None:
        return 0
    weights = speculation.draft.weights
    return None if weights is None else weights * bytes_per_weight(spec.model.precision)


def kv_layers(spec: InferentiaModelSpec) -> int | None:
    """The layers whose keys and values one KV cache block holds: the target's, and the draft's with speculation."""
    layers = spec.model.layers
    if layers is None:
        return None
    return layers + (DRAFT_LAYERS if spec.serving.speculation is not None else 0)


@dataclass(frozen=True)
class PluginKvBudget:
    """The plugin's KV cache budget on each logical core of a group (bytes), and what makes it."""

    core_bytes: int  # the core's device memory
    utilization: float  # gpu_memory_utilization
    total: int  # int(core_bytes * utilization)
    weights: int  # the core's share of the weights
    cap_fraction: float
    available: int  # the budget: max(min(total - weights, int(total * cap_fraction)), 0)
    minimum: int  # below it the plugin does not start (VLLM_NEURON_MIN_KV_BUDGET_GIB)


def plugin_kv_budget(spec: InferentiaModelSpec, family: Family, group: int) -> PluginKvBudget | None:
    """The plugin's KV cache budget a core, with the user's gpu_memory_utilization (serving.args)
    and cap fraction and minimum (serving.env) where set, the EAGLE3 draft's weights beside the
    target's; None off the plugin or without the weights (the draft's too, with speculation)."""
    weights, draft = weights_bytes(spec), draft_weights_bytes(spec)
    if not on_vllm_plugin(spec, family) or weights is None or draft is None:
        return None
    weights += draft  # both models' weights are on every rank before the cache is sized
    core = family.memory_per_core_bytes(lnc_of(spec, family))
    utilization = user_gpu_memory_utilization(spec) or PLUGIN_GPU_MEMORY_UTILIZATION
    cap = _fraction(serving_env(spec, KV_CAP_ENV), PLUGIN_KV_CAP_FRACTION)
    minimum = _min_kv_budget_gib(serving_env(spec, MIN_KV_BUDGET_ENV))
    total = int(core * utilization)
    share = -(-weights // group)
    available = max(min(total - share, int(total * cap)), 0)
    return PluginKvBudget(core, utilization, total, share, cap, available, int(minimum * 2**30))


def _min_kv_budget_gib(text: str | None) -> float:
    """VLLM_NEURON_MIN_KV_BUDGET_GIB as the plugin reads it: GiB, 0 turning its guard off (so not
    the default); the default where unset or not a number."""
    try:
        value = float(text) if text is not None else PLUGIN_MIN_KV_BUDGET_GIB
    except ValueError:
        return PLUGIN_MIN_KV_BUDGET_GIB
    return value if 0 <= value <= 2**20 else PLUGIN_MIN_KV_BUDGET_GIB


def plugin_block_bytes(spec: InferentiaModelSpec, family: Family, group: int) -> int | None:
    """One block's bytes on each core of the group: block_size tokens of every layer (the draft's too,
    with speculation: kv_layers), of the core's share of the KV heads (kv_bytes_per_token replicates
    heads up to a multiple of the group)."""
    per_token, layers = kv_bytes_per_token(spec, family, group), kv_layers(spec)
    if per_token is None or layers is None or spec.model.layers is None:
        return None
    return plugin_block_size(spec) * (per_token // spec.model.layers * layers) // group


def plugin_kv_blocks(spec: InferentiaModelSpec, family: Family, group: int) -> int | None:
    """The most KV cache blocks the plugin's budget holds on the group's cores (the null block among
    them), or None where the model's shape or weights are unknown, or off the plugin."""
    budget, block = plugin_kv_budget(spec, family, group), plugin_block_bytes(spec, family, group)
    return None if budget is None or block is None else budget.available // block


def kv_cache(spec: InferentiaModelSpec, family: Family, group: int) -> KvCache | None:
    """What the plan gives the plugin: serving.args' block count where set (the compile step must
    build the cache the server loads), else the most that fit; None where neither is known."""
    if not on_vllm_plugin(spec, family):
        return None
    blocks = user_kv_blocks(spec) or plugin_kv_blocks(spec, family, group)
    return KvCache(blocks=blocks, block_size=plugin_block_size(spec)) if blocks else None
