"""Buckets and device memory: the shapes, how many buckets the weights allow, and whether the weights (and the KV cache) fit a process's cores."""

from __future__ import annotations

from typing import Any

from inferentia_operator.core.api import MAX_NODES, InferentiaModelSpec
from inferentia_operator.core.catalogue import GIB, MULTI_NODE_FAMILIES, Family, bucket_budget_per_core
from inferentia_operator.core.cel import (
    CEL_BUCKET_LIMIT,
    CEL_BUDGET,
    CEL_DIVIDES,
    CEL_FAMILY,
    CEL_FITS,
    CEL_GROUP,
    CEL_LARGEST,
    CEL_LNC,
    CEL_MAX,
    CEL_MAX_CORES,
    CEL_PHYSICAL_CORES,
    CEL_PROCESSES,
    CEL_WEIGHTS,
    FAMILY_LIST,
    NEURON_CC_FAMILIES,
    CrossFieldRule,
    literal,
)
from inferentia_operator.core.cores import (
    RUNTIME_RESERVE_PER_PHYSICAL_CORE,
    bytes_per_weight,
    group_memory_bytes,
    group_size_of,
    kv_cache,
    kv_cache_bytes,
    lnc_of,
    max_buckets_per_group,
    memory_needed,
    plugin_block_bytes,
    plugin_block_size,
    plugin_kv_blocks,
    plugin_kv_budget,
    sequences,
    serving_count,
    smallest_fitting_group,
    user_kv_blocks,
)
from inferentia_operator.core.findings import Finding, and_list

# Rule 6: bucket shapes.
BUCKET_DIMENSIONS = CrossFieldRule(
    "spec.compile.buckets",
    "spec.compile",
    "buckets have different numbers of dimensions %s; every bucket needs as many as the first (%d)",
    "!has(self.buckets) || size(self.buckets) == 0 || self.buckets.all(b, size(b) == size(self.buckets[0]))",
    ("self.buckets.map(b, size(b))", "size(self.buckets[0])"),
)
BUCKET_DUPLICATE = CrossFieldRule(
    "spec.compile.buckets",
    "spec.compile",
    "bucket %s appears more than once; every bucket must be different",
    "!has(self.buckets) || self.buckets.all(a, self.buckets.exists_one(b, b == a))",
    ("self.buckets.filter(a, !self.buckets.exists_one(b, b == a))[0]",),
)


def _check_bucket_shapes(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    buckets = [list(b) for b in spec.compile.buckets or []]
    found = []
    if any(len(b) != len(buckets[0]) for b in buckets):
        found.append(BUCKET_DIMENSIONS.finding(str([len(b) for b in buckets]), len(buckets[0])))
    duplicates = [b for b in buckets if buckets.count(b) > 1]
    if duplicates:
        found.append(BUCKET_DUPLICATE.finding(str(duplicates[0])))
    return found


# Rule 5: how many buckets the weights allow (the bucketing application note,
# https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/appnotes/torch-neuron/bucketing-app-note.html).
# Each bucket there is a traced model with its own copy of the weights. vLLM's buckets are
# sequence lengths of one model whose weights are loaded once: the bound is not theirs.
BUCKET_BOUND = CrossFieldRule(
    "spec.compile.buckets",
    "spec",
    "%d buckets do not fit: a group of %d NeuronCores holds at most %d bucketed models of %d weights (round(%d / weights) per NeuronCore)",
    f"!has({CEL_WEIGHTS}) || !has(self.compile.buckets) || size(self.compile.buckets) == 0"
    f" || (has(self.serving.runtime) && self.serving.runtime == 'vllm') || !({CEL_FITS} && {CEL_DIVIDES})"
    f" || size(self.compile.buckets) <= {CEL_BUCKET_LIMIT}",
    ("size(self.compile.buckets)", CEL_GROUP, CEL_BUCKET_LIMIT, CEL_WEIGHTS, CEL_BUDGET),
)


# Device memory: the weights (at the precision's bytes) and the runtime's reserve must fit
# the cores of each process (cores.memory_needed says what is counted and why). Checked
# where the group size is valid; the valid values name the smallest request that fits, at
# the same processesPerReplica. On inf2, trn1, trn2 and trn3: a group there is one model
# sharded tensor parallel, and the runtime's reserve is the Neuron 2.x runtime's. inf1
# (neuron-cc, in maintenance) keeps its own memory rule, the static-weights one below, and
# its plans stay what they were (a golden test holds them).
_BPW = "(self.model.precision == 'fp32' ? 4 : 2)"
_W = f"({CEL_WEIGHTS} * {_BPW})"
_CORE_MEMORY = (
    f"{literal({f.name: {lnc: f.memory_per_core_bytes(lnc) for lnc in f.lnc_values} for f in FAMILY_LIST})}[{CEL_FAMILY}][{CEL_LNC}]"
)
_RESERVE = f"({CEL_GROUP} * {CEL_LNC} * {RUNTIME_RESERVE_PER_PHYSICAL_CORE})"
_HAS = f"({CEL_GROUP} * {_CORE_MEMORY})"
_NET_PER_CORE = f"({_CORE_MEMORY} - {CEL_LNC} * {RUNTIME_RESERVE_PER_PHYSICAL_CORE})"
_MIN_GROUP = f"(({_W} + {_NET_PER_CORE} - 1) / {_NET_PER_CORE})"
_PER_CHIP = f"({CEL_PHYSICAL_CORES}[{CEL_FAMILY}] / {CEL_LNC})"
_NEED_GIB = f"(({_W} + {_RESERVE} + {GIB} - 1) / {GIB})"
_CORES_WORD = f"({CEL_GROUP} == 1 ? 'NeuronCore' : 'NeuronCores')"
_PROCESSES_WORD = f"({CEL_PROCESSES} == 1 ? 'process' : 'processes')"
_NODES = "self.compute.nodes"
# Checked for one node here; a replica across nodes is checked over all of them (NODES_MEMORY).
_CHECKED = f"!has({CEL_WEIGHTS}) || {CEL_FAMILY} in {literal(NEURON_CC_FAMILIES)} || !({CEL_FITS} && {CEL_DIVIDES})"
_MEMORY_FITS = f"{_CHECKED} || {_NODES} > 1 || {_W} + {_RESERVE} <= {_HAS}"
MEMORY_NEEDS = (
    "%d %s weights and the Neuron runtime's reserve need %d GiB of device memory a process, and a process has %d GiB on its %d %s; "
)
# The valid values, for a request of whole chips (inf) and of NeuronCores (cores).
AT_LEAST = {
    "inf": "valid values are at least %d chips for %d %s (the largest %s instance has %d)",
    "cores": "valid values are at least %d NeuronCores for %d %s (the largest %s instance has %d)",
}


def _weights_fit(request: str, least: str, most: str) -> CrossFieldRule:
    """The weights rule for one kind of request; ``least`` and ``most``: CEL for the
    smallest request that fits and the family's largest."""
    return CrossFieldRule(
        f"spec.compute.{request}",
        "spec",
        MEMORY_NEEDS + AT_LEAST[request],
        f"{'' if request == 'inf' else '!'}has(self.compute.cores) || {_MEMORY_FITS}",
        (CEL_WEIGHTS, "self.model.precision", _NEED_GIB, f"({_HAS} / {GIB})", CEL_GROUP, _CORES_WORD,
         least, CEL_PROCESSES, _PROCESSES_WORD, f"{CEL_LARGEST}[{CEL_FAMILY}]", f"{most}[{CEL_FAMILY}]"),
    )  # fmt: skip


WEIGHTS_FIT = {
    "inf": _weights_fit("inf", f"(({_MIN_GROUP} * {CEL_PROCESSES} + {_PER_CHIP} - 1) / {_PER_CHIP})", CEL_MAX),
    "cores": _weights_fit("cores", f"({_MIN_GROUP} * {CEL_PROCESSES})", CEL_MAX_CORES),
}

# A replica across nodes is one tensor-parallel model over every node's cores (rules/nodes.py):
# its weights are sharded over all of them, and every core keeps the runtime's reserve, so the
# device memory it has is every node's. The valid values name the fewest nodes that hold it.
NODES_MEMORY_NEEDS = (
    "%d %s weights and the Neuron runtime's reserve need %d GiB of device memory across the replica's %d NeuronCores, "
    "and %d nodes hold %d GiB; "
)
NODES_AT_LEAST = "valid values are at least %d nodes"
NODES_MEMORY = CrossFieldRule(
    "spec.compute.nodes",
    "spec",
    NODES_MEMORY_NEEDS + NODES_AT_LEAST,
    f"{_CHECKED} || {_NODES} == 1 || {_W} + {_RESERVE} * {_NODES} <= {_HAS} * {_NODES}",
    (CEL_WEIGHTS, "self.model.precision", f"(({_W} + {_RESERVE} * {_NODES} + {GIB} - 1) / {GIB})", f"({CEL_GROUP} * {_NODES})",
     _NODES, f"({_HAS} * {_NODES} / {GIB})", f"(({_MIN_GROUP} + {CEL_GROUP} - 1) / {CEL_GROUP})"),
)  # fmt: skip
# With the KV cache: no CEL twin, as KV_FIT.
NODES_KV_FIT = (
    "%d %s weights, a KV cache of %d GiB (%d layers, %d KV heads of dimension %d, %d tokens, %d sequences) and the "
    "Neuron runtime's reserve need %d GiB of device memory across the replica's %d NeuronCores, and %d nodes hold %d GiB; " + NODES_AT_LEAST
)


# With the KV cache: no CEL twin, since the sequence length is the largest bucket's last
# dimension, a maximum over a list of lists that the API server's cost estimator cannot
# bound. The operator reports it in status, and validate prints it.
# The second %s names an EAGLE3 draft's weights where memory_needed counts them (DRAFT_WEIGHTS), else is empty.
KV_NEEDS = (
    "%d %s weights%s, a KV cache of %d GiB (%d layers, %d KV heads of dimension %d, %d tokens, %d sequences) and the "
    "Neuron runtime's reserve need %d GiB of device memory a process, and a process has %d GiB on its %d %s; "
)
KV_FIT = {request: KV_NEEDS + valid for request, valid in AT_LEAST.items()}
DRAFT_WEIGHTS = " and an EAGLE3 draft of %d weights"
KV_UNKNOWN = "only the weights were checked against the device memory: vLLM also holds a KV cache; set %s to check that it fits too"


def _check_nodes_memory_fit(spec: InferentiaModelSpec, fam: Family, lnc: int, group: int) -> list[Finding]:
    """A replica across nodes: the weights, then the KV cache where known, against every node's device memory."""
    m, nodes = spec.model, spec.compute.nodes
    world = group * nodes
    has = group_memory_bytes(fam, lnc, world)

    def fewest(with_kv: bool) -> int:
        return -(-smallest_fitting_group(spec, fam, with_kv, most=group * MAX_NODES) // group)

    weights_only = memory_needed(spec, fam, world, with_kv=False) or 0
    if weights_only > has:
        return [NODES_MEMORY.finding(m.weights, m.precision, -(-weights_only // GIB), world, nodes, has // GIB, fewest(False))]
    kv = kv_cache_bytes(spec, fam, world)
    need = weights_only + (kv or 0)
    if kv is None or need <= has:
        return []
    seqs = sequences(spec)
    assert seqs is not None and m.layers and m.kv_heads and m.head_dim
    least = fewest(True)
    text = NODES_KV_FIT % (
        m.weights, m.precision, -(-kv // GIB), m.layers, m.kv_heads, m.head_dim, *seqs, -(-need // GIB), world, nodes,
        has // GIB, least,
    )  # fmt: skip
    if least > MAX_NODES:
        # The KV heads are replicated once there are more cores than heads, so more nodes add as
        # much cache as memory: only fewer tokens or sequences fit.
        text = text.removesuffix(NODES_AT_LEAST % least) + (
            f"no number of nodes up to {MAX_NODES} holds it; valid values are fewer sequences (serving.batching.maxBatchSize) "
            "or a shorter sequence length (compile.buckets)"
        )
    return [Finding("spec.compute.nodes", text)]


def _check_memory_fit(spec: InferentiaModelSpec, fam: Family, lnc: int, group: int) -> list[Finding]:
    """The weights, then the KV cache where it is known, against a process's device memory."""
    if spec.compute.nodes > 1:
        return _check_nodes_memory_fit(spec, fam, lnc, group)
    found = _check_one_node_memory_fit(spec, fam, lnc, group)
    node_cores = fam.cores_per_chip(lnc) * fam.max_chips
    if found and fam.name in MULTI_NODE_FAMILIES and spec.processes_per_replica == 1:
        with_kv = kv_cache_bytes(spec, fam, group) is not None  # the KV cache too, where it is known
        needed = smallest_fitting_group(spec, fam, with_kv, most=node_cores * MAX_NODES)
        if needed > node_cores and needed <= node_cores * MAX_NODES:
            nodes = -(-needed // node_cores)
            found.append(
                Finding(
                    "spec.compute.nodes",
                    f"the model fits no {fam.name} node, and fits across {nodes} {fam.largest_instance[0]} nodes: set nodes "
                    f"{nodes} with inf {fam.max_chips} and the vllm runtime (docs/multi-node.md)",
                    "warning",
                )
            )
    return found


def _check_one_node_memory_fit(spec: InferentiaModelSpec, fam: Family, lnc: int, group: int) -> list[Finding]:
    has = group_memory_bytes(fam, lnc, group)
    weights_only = memory_needed(spec, fam, group, with_kv=False) or 0
    p, m = spec.processes_per_replica, spec.model
    request = "cores" if spec.compute.cores is not None else "inf"
    core_word, process_word = ("NeuronCore" if group == 1 else "NeuronCores"), ("process" if p == 1 else "processes")
    most = fam.cores_per_chip(1) * fam.max_chips if request == "cores" else fam.max_chips

    def valid(with_kv: bool) -> tuple[Any, ...]:
        """The AT_LEAST arguments: the smallest request that fits, the processes, the family's largest."""
        group_needed = smallest_fitting_group(spec, fam, with_kv)
        least = group_needed * p if request == "cores" else -(-group_needed * p // fam.cores_per_chip(lnc))
        return least, p, process_word, fam.largest_instance[0], most

    if weights_only > has:
        need_gib = -(-weights_only // GIB)
        return [WEIGHTS_FIT[request].finding(m.weights, m.precision, need_gib, has // GIB, group, core_word, *valid(False))]
    kv = kv_cache_bytes(spec, fam, group)
    if kv is None:
        # Only vLLM is sure to be generative: an encoder (BERT) compiled for buckets holds no cache.
        if spec.serving.runtime != "vllm":
            return []
        missing = [n for n, v in (("layers", m.layers), ("kvHeads", m.kv_heads), ("headDim", m.head_dim)) if v is None]
        if spec.compile.buckets is None:
            missing.append("compile.buckets (the sequence length)")
        if spec.serving.batching is None:
            missing.append("serving.batching.maxBatchSize (the sequences at once)")
        return [Finding("spec.model", KV_UNKNOWN % and_list(missing), "warning")] if missing else []
    need = memory_needed(spec, fam, group) or 0  # the weights (an EAGLE3 draft's too), the cache, the reserve
    if need <= has:
        return []
    seqs = sequences(spec)
    assert seqs is not None and m.layers and m.kv_heads and m.head_dim
    # need (memory_needed) holds an EAGLE3 draft's weights where they are known: named beside the target's.
    speculation = spec.serving.speculation
    drafted = DRAFT_WEIGHTS % speculation.draft.weights if speculation is not None and speculation.draft.weights else ""
    text = KV_FIT[request] % (
        m.weights, m.precision, drafted, -(-kv // GIB), m.layers, m.kv_heads, m.head_dim, *seqs,
        -(-need // GIB), has // GIB, group, core_word, *valid(True),
    )  # fmt: skip
    return [Finding(f"spec.compute.{request}", text)]


# Rule 5, static weights. No CEL twin: the field is true, false or "auto", which a
# structural schema can only hold as x-kubernetes-preserve-unknown-fields, and CEL
# cannot see such a field (the API server refuses the CRD). The operator reports
# it in status instead.
STATIC_WEIGHTS_TOO_LARGE = (
    "true needs %s for %d %s weights, but a group of %d NeuronCores has a %s share of device memory; "
    "use auto or false, or fewer processesPerReplica"
)


def _check_weights(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    weights, lnc, group = spec.model.weights, lnc_of(spec, fam), group_size_of(spec, fam)
    if group is None:
        return []  # no group size to check against
    found = []
    if weights is None:
        if spec.compile.static_weights is True and not fam.neuronx:
            found.append(
                Finding(
                    "spec.compile.staticWeights",
                    "true cannot be checked against the group's memory without spec.model.weights; "
                    "the compile fails if the weights do not fit",
                    "warning",
                )
            )
        return found
    buckets = spec.compile.buckets or []
    bound = max_buckets_per_group(fam, lnc, group, weights)
    if buckets and len(buckets) > bound and spec.serving.runtime != "vllm":
        found.append(BUCKET_BOUND.finding(len(buckets), group, bound, weights, bucket_budget_per_core(fam, lnc)))
    if fam.neuronx:
        found += _check_memory_fit(spec, fam, lnc, group)
    need = weights * bytes_per_weight(spec.model.precision)
    share = group * fam.memory_per_core_bytes(lnc)
    if spec.compile.static_weights is True and need > share and not fam.neuronx:
        found.append(
            Finding(
                "spec.compile.staticWeights",
                STATIC_WEIGHTS_TOO_LARGE % (gib(need), weights, spec.model.precision, group, gib(share)),
            )
        )
    return found


def gib(size: int) -> str:
    """Bytes as people read them: 8 GiB, 1.5 GiB."""
    return f"{size / 2**30:.3g} GiB"


def _percent(fraction: float) -> str:
    return f"{fraction * 100:g}%"


# The vLLM Neuron plugin's KV cache (trn2, trn3; cores.plugin_kv_budget for its budget and the
# sources). Warnings: the budget is the plugin's documented default, and what a rank really holds
# (its buffers, the runtime's own figure of its memory) is known only on the device.
PLUGIN_BUDGET = "the least of %s of its %s less its %s share of the weights, and %s of that %s"
PLUGIN_BELOW_MINIMUM = (
    "the vLLM Neuron plugin keeps %s of each NeuronCore's device memory for the KV cache (%s), less than the %s it needs "
    'to start (VLLM_NEURON_MIN_KV_BUDGET_GIB): it stops with "Computed KV cache budget is below minimum threshold"; '
    "valid values are more %s, a higher serving.args --gpu-memory-utilization (the compile Job is given it too), or a "
    "lower VLLM_NEURON_MIN_KV_BUDGET_GIB in serving.env (0 turns the check off)"
)
PLUGIN_BLOCKS_PAST_BUDGET = (
    "--num-gpu-blocks-override %d is more KV cache blocks than the vLLM Neuron plugin's budget holds: %s keeps %s for "
    "the KV cache (%s), and a block of %d tokens takes %s there; the plugin compiles the cache into its graphs, and a "
    "larger one may fail the compile (NCC_EVRF009) or the cache's allocation at start; valid values are at most %d"
)


def _check_kv_cache(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    """What the vLLM Neuron plugin keeps for its KV cache: enough to start, and room for the blocks
    serving.args asks for. Only where the weights fit the group (else _check_weights says so)."""
    group = group_size_of(spec, fam)
    if group is None:
        return []
    # A count the user gives is checked against max_model_len whatever the operator knows of the memory.
    found = _check_one_request_fits(spec, fam, group)
    budget = plugin_kv_budget(spec, fam, group)
    if budget is None:
        return found
    if (memory_needed(spec, fam, group, with_kv=False) or 0) > group_memory_bytes(fam, lnc_of(spec, fam), group):
        return found
    u = _percent(budget.utilization)
    made = PLUGIN_BUDGET % (u, gib(budget.core_bytes), gib(budget.weights), _percent(budget.cap_fraction), u)
    if budget.minimum > 0 and budget.available < budget.minimum:
        request = "cores" if spec.compute.cores is not None else "inf"
        more = "NeuronCores" if request == "cores" else "chips"
        return [
            *found,
            Finding(f"spec.compute.{request}", PLUGIN_BELOW_MINIMUM % (gib(budget.available), made, gib(budget.minimum), more), "warning"),
        ]
    given, fit, block = user_kv_blocks(spec), plugin_kv_blocks(spec, fam, group), plugin_block_bytes(spec, fam, group)
    if given is None or fit is None or block is None or given <= fit:
        return found
    cores = f"each of the group's {group} NeuronCores" if group > 1 else "the group's NeuronCore"
    tokens = plugin_block_size(spec)
    text = PLUGIN_BLOCKS_PAST_BUDGET % (given, cores, gib(budget.available), made, tokens, f"{block / 2**20:.3g} MiB", fit)
    return [*found, Finding("spec.serving.args", text, "warning")]


# vLLM refuses to start when the KV cache cannot hold one request of max_model_len: "Checks whether
# `available_memory` is enough for the KV cache to hold at least one request with the model's
# max_model_len", raising "To serve at least one request with the models's max seq len ..."; it
# plans against the usable blocks, less "the null block BlockPool permanently holds back"
# (vllm-project/vllm, vllm/v1/core/kv_cache_utils.py, check_enough_kv_cache_memory).
PLUGIN_BLOCKS_UNDER_ONE_REQUEST = (
    "%s gives the vLLM Neuron plugin %d KV cache blocks of %d tokens, which leave %d tokens for requests (block 0 is "
    "vLLM's null block), fewer than one "
    "request of max_model_len %d needs (%d blocks): vLLM refuses to start (check_enough_kv_cache_memory); valid values "
    "are %s"
)


def _check_one_request_fits(spec: InferentiaModelSpec, fam: Family, group: int) -> list[Finding]:
    """The plan's blocks (the user's count, else the most that fit) less the null block hold one
    request of max_model_len (serving.args' --max-model-len, else the largest bucket's last dimension)."""
    cache = kv_cache(spec, fam, group)
    user_len = serving_count(spec, "--max-model-len")
    longest = user_len or max((b[-1] for b in spec.compile.buckets or [] if b), default=None)
    if cache is None or longest is None:
        return []
    needed = -(-longest // cache.block_size)
    if cache.blocks - 1 >= needed:
        return []
    given = user_kv_blocks(spec)
    what = f"--num-gpu-blocks-override {given}" if given else "the plan (the most blocks the plugin's budget holds)"
    field = "spec.serving.args" if given or user_len else "spec.compile.buckets"
    usable = (cache.blocks - 1) * cache.block_size
    length = "--max-model-len" if user_len else "a largest bucket (its last dimension is max_model_len)"
    valid = (
        f"at least {needed + 1} blocks, or {length} of at most {usable}" if given else f"{length} of at most {usable}, or more NeuronCores"
    )
    text = PLUGIN_BLOCKS_UNDER_ONE_REQUEST % (what, cache.blocks, cache.block_size, usable, longest, needed, valid)
    return [Finding(field, text, "warning")]


RULES: list[CrossFieldRule] = [
    BUCKET_DIMENSIONS,
    BUCKET_DUPLICATE,
    BUCKET_BOUND,
    *WEIGHTS_FIT.values(),
    NODES_MEMORY,
]
CHECKS = (_check_bucket_shapes, _check_weights, _check_kv_cache)
