"""Prefill and decode pools (spec.disaggregation): what the vLLM Neuron plugin serves that way, and
what of this operator's spec the pools do not combine with yet.

The plugin's disaggregated inference is Trn2's and Trn3's ("DI is supported on Trn2 and Trn3",
https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/tutorials/tutorial-di-1p1d-xpyd.html,
Prerequisites), so the pools need the vLLM runtime on those families. Each pool replica is one
vLLM server over all its cores: the tutorial gives its TP4 prefill exactly four NeuronCores
("exposes exactly four host-level NeuronCores to the TP4 prefill process") and its DP4 x TP8
decode 32, so tensorParallelSize times dataParallelSize is the replica's cores.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from inferentia_operator.core.api import DecodeAutoscaling, InferentiaModelSpec, Pool, PrefillAutoscaling
from inferentia_operator.core.catalogue import EFA_DEVICES, FAMILIES, Family
from inferentia_operator.core.cel import (
    CEL_DIVISORS,
    CEL_FAMILY,
    CEL_LNC,
    CEL_LNC_VALUES,
    CEL_MAX,
    CEL_PHYSICAL_CORES,
    CEL_TYPES,
    CEL_TYPES_TEXT,
    CrossFieldRule,
    literal,
)
from inferentia_operator.core.cores import PLUGIN_FAMILIES, divisors, lnc_of, on_vllm_plugin, pool_cores, pool_tensor_parallel
from inferentia_operator.core.findings import Finding, format_list

_POOLS = "has(self.disaggregation)"

DISAGGREGATION_RUNTIME = CrossFieldRule(
    "spec.disaggregation",
    "spec",
    f"needs the vLLM Neuron plugin, which serves prefill and decode pools: valid specs set spec.serving.runtime vllm "
    f"and spec.compute.family {' or '.join(PLUGIN_FAMILIES)}; the runtime is %s and the family %s",
    f"!{_POOLS} || (has(self.serving.runtime) && self.serving.runtime == 'vllm' && has(self.compute.family)"
    f" && self.compute.family in {literal(PLUGIN_FAMILIES)})",
    (
        "has(self.serving.runtime) ? self.serving.runtime : 'custom'",
        "has(self.compute.family) ? self.compute.family : 'inf1'",
    ),
)


def _refused(
    path: str, cel_absent: str, is_set: Callable[[InferentiaModelSpec], bool], why: str
) -> tuple[CrossFieldRule, Callable[[InferentiaModelSpec], bool]]:
    """A field the pools cannot be combined with today, refused rather than silently ignored: the
    rule, with ``cel_absent`` its CEL, and ``is_set``, the same test in Python."""
    rule = CrossFieldRule(
        path, "spec", f"cannot be combined with spec.disaggregation: {why}; valid specs leave it out", f"!{_POOLS} || {cel_absent}", ()
    )
    return rule, is_set


REFUSED = (
    _refused(
        "spec.autoscaling",
        "!has(self.autoscaling)",
        lambda s: s.autoscaling is not None,
        "the model's spec.replicas scales the proxy, and each pool scales on its own signal; valid specs set "
        "spec.disaggregation.prefill.autoscaling (its prompt queue) and spec.disaggregation.decode.autoscaling (its running "
        "sequences and KV-cache use) instead",
    ),
    _refused(
        "spec.routing.inferencePool",
        "!has(self.routing) || !has(self.routing.inferencePool)",
        lambda s: s.routing is not None and s.routing.inference_pool is not None,
        "the endpoint picker would route past the proxy to servers of one role",
    ),
    _refused(
        "spec.processesPerReplica",
        "!has(self.processesPerReplica) || self.processesPerReplica == 1",
        lambda s: s.processes_per_replica != 1,
        "each pool replica is one vLLM server over its cores (dataParallelSize runs more engines in it)",
    ),
    _refused(
        "spec.compute.cores",
        "!has(self.compute.cores)",
        lambda s: s.compute.cores is not None,
        "a pool replica takes whole chips (its inf)",
    ),
    _refused(
        "spec.compute.nodes",
        "!has(self.compute.nodes) || self.compute.nodes == 1",
        lambda s: s.compute.nodes != 1,
        "a pool replica is one pod on one node",
    ),
)
# With allocation dra, a pool's pods would claim from ResourceClaimTemplates of the pool's own
# shape, which the device-claims part does not write (it writes the model's one). The operator
# applies its --allocation default to the spec before the rules run, so the Python rule refuses
# that too; the CEL twin sees only what the spec says.
DRA_ALLOCATION = CrossFieldRule(
    "spec.compute.allocation",
    "spec",
    "is %s, and spec.disaggregation's pools take their devices from the Neuron device plugin only (no claim templates are "
    "written for them yet); valid values with spec.disaggregation are devicePlugin",
    f"!{_POOLS} || !has(self.compute.allocation) || self.compute.allocation != 'dra'",
    ("self.compute.allocation",),
)
# NIXL's side channel, where a decode server asks a prefill server for a request's blocks:
# VLLM_NIXL_SIDE_CHANNEL_PORT's default, 5557 (the DI design page, Environment Variables), which
# serving/pools.py gives each pool's servers. It listens on that port plus the engine's
# data-parallel index; with dataParallelSize held to 1, on 5557 alone.
SIDE_CHANNEL_PORT = 5557
SIDE_CHANNEL = CrossFieldRule(
    "spec.serving.port",
    "spec",
    f"is %d, the port NIXL's side channel listens on in each pool's servers (VLLM_NIXL_SIDE_CHANNEL_PORT {SIDE_CHANNEL_PORT}); "
    f"valid values with spec.disaggregation are any other port",
    f"!{_POOLS} || !has(self.serving.port) || self.serving.port != {SIDE_CHANNEL_PORT}",
    ("self.serving.port",),
)

# Each pool's servers get the pool's own --tensor-parallel-size, --data-parallel-size and
# --kv-transfer-config; serving.args come after them and would win in both pools. vLLM's
# FlexibleArgumentParser reads underscores as dashes; -tp and -dp are its short forms.
POOL_FLAGS = (
    "--tensor-parallel-size", "--tensor_parallel_size", "--data-parallel-size", "--data_parallel_size",
    "--kv-transfer-config", "--kv_transfer_config",
)  # fmt: skip
SHORT_POOL_FLAGS = ("-tp", "-dp")


def is_pool_flag(arg: str) -> bool:
    return arg.startswith(POOL_FLAGS) or arg in SHORT_POOL_FLAGS or arg.startswith(tuple(f"{f}=" for f in SHORT_POOL_FLAGS))


_CEL_POOL_FLAG = " || ".join(
    [f"a.startsWith({literal(f)})" for f in POOL_FLAGS]
    + [f"a == {literal(f)} || a.startsWith({literal(f + '=')})" for f in SHORT_POOL_FLAGS]
)
POOL_FLAG_IN_ARGS = CrossFieldRule(
    "spec.serving.args",
    "spec",
    "%s sets what spec.disaggregation sets for each pool (its tensorParallelSize, dataParallelSize and NIXL "
    "--kv-transfer-config), and would override both pools' own; valid specs set the pools' parallelism in "
    "spec.disaggregation and leave these flags out of spec.serving.args",
    f"!{_POOLS} || !has(self.serving.args) || !self.serving.args.exists(a, {_CEL_POOL_FLAG})",
    (f"self.serving.args.filter(a, {_CEL_POOL_FLAG})[0]",),
)


def _empty_pool_rule(role: str) -> CrossFieldRule:
    p = f"self.disaggregation.{role}"
    return CrossFieldRule(
        f"spec.disaggregation.{role}.replicas",
        "spec",
        "is 0 while the proxy serves (spec.replicas %d): every request would go to a pool with no server; valid values "
        "are 1 or more, or spec.replicas 0 as well",
        f"!{_POOLS} || !has({p}) || !has({p}.replicas) || {p}.replicas != 0 || has({p}.autoscaling)"
        " || (has(self.replicas) && self.replicas == 0)",
        ("has(self.replicas) ? self.replicas : 1",),
    )


EMPTY_POOL_RULES = {role: _empty_pool_rule(role) for role in ("prefill", "decode")}


def _check_runtime(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    if spec.disaggregation is None:
        return []
    found = []
    if not on_vllm_plugin(spec, fam):
        found.append(DISAGGREGATION_RUNTIME.finding(spec.serving.runtime, fam.name))
    found += [rule.finding() for rule, is_set in REFUSED if is_set(spec)]
    if spec.compute.allocation == "dra":
        found.append(DRA_ALLOCATION.finding("dra"))
    if spec.serving.port == SIDE_CHANNEL_PORT:
        found.append(SIDE_CHANNEL.finding(spec.serving.port))
    if flag := next((a for a in spec.serving.args or [] if is_pool_flag(a)), None):
        found.append(POOL_FLAG_IN_ARGS.finding(flag))
    d = spec.disaggregation
    if spec.replicas != 0:
        found += [
            EMPTY_POOL_RULES[r].finding(spec.replicas)
            for r, pool in (("prefill", d.prefill), ("decode", d.decode))
            if pool.replicas == 0 and pool.autoscaling is None
        ]
    return found


# The same in CEL (self = spec), for the pool at ``p`` (self.disaggregation.prefill or .decode).
_PLUGIN = f"{CEL_FAMILY} in {literal(PLUGIN_FAMILIES)}"
_COMPUTE_CHIPS = "(has(self.compute.inf) ? self.compute.inf : 1)"


def _cel_chips(p: str) -> str:
    return f"(has({p}.inf) ? {p}.inf : {_COMPUTE_CHIPS})"


def _cel_cores(p: str) -> str:
    return f"({_cel_chips(p)} * ({CEL_PHYSICAL_CORES}[{CEL_FAMILY}] / {CEL_LNC}))"


def _cel_dp(p: str) -> str:
    return f"(has({p}.dataParallelSize) ? {p}.dataParallelSize : 1)"


def _pool_rules(role: str) -> tuple[CrossFieldRule, CrossFieldRule, CrossFieldRule]:
    """A pool's chips fit the family; its dataParallelSize divides its cores; tensorParallelSize
    times dataParallelSize is its cores. Each only where the one before holds."""
    p, path = f"self.disaggregation.{role}", f"spec.disaggregation.{role}"
    guard = f"!{_POOLS} || !has({p}) || !({_PLUGIN}) || !({CEL_LNC} in {CEL_LNC_VALUES}[{CEL_FAMILY}])"
    fits = f"{_cel_chips(p)} <= {CEL_MAX}[{CEL_FAMILY}]"
    chips = CrossFieldRule(
        f"{path}.inf",
        "spec",
        "is %d, more chips than any %s instance has; valid values are 1 to %d",
        f"{guard} || {fits}",
        (_cel_chips(p), CEL_FAMILY, f"{CEL_MAX}[{CEL_FAMILY}]"),
    )
    cores, dp, tp = _cel_cores(p), _cel_dp(p), f"{p}.tensorParallelSize"
    divides = CrossFieldRule(
        f"{path}.dataParallelSize",
        "spec",
        "is %d, which does not divide the replica's %d NeuronCores (%d chips); valid values are %s",
        f"{guard} || !({fits}) || has({tp}) || {cores} % {dp} == 0",
        (dp, cores, _cel_chips(p), f"{CEL_DIVISORS}[{cores}]"),
    )
    covers = CrossFieldRule(
        f"{path}.tensorParallelSize",
        "spec",
        "is %d, and %d x dataParallelSize %d is %d, not the replica's %d NeuronCores (%d chips): one vLLM server takes them all; "
        "valid values multiply with dataParallelSize to %d",
        f"{guard} || !({fits}) || !has({tp}) || {tp} * {dp} == {cores}",
        (tp, tp, dp, f"{tp} * {dp}", cores, _cel_chips(p), cores),
    )
    return chips, divides, covers


POOL_RULES = {role: _pool_rules(role) for role in ("prefill", "decode")}


def _data_parallel_rule(role: str) -> CrossFieldRule:
    """dataParallelSize above 1 runs that many engines in the replica's server, each holding all
    the weights over its own tensorParallelSize cores (AWS's data-parallelism design page:
    "replicates the entire model across multiple independent groups"), and vLLM gives each engine
    --num-gpu-blocks-override. The memory check and the plan take the replica as one engine over
    all its cores, so they cannot judge that: refused until they plan each engine."""
    p = f"self.disaggregation.{role}"
    return CrossFieldRule(
        f"spec.disaggregation.{role}.dataParallelSize",
        "spec",
        "is %d: each data-parallel engine would hold all the weights over its own cores and its own KV cache blocks, "
        "which the memory check does not plan yet; valid values are 1 (one engine over the replica's cores; scale with replicas)",
        f"!{_POOLS} || !has({p}) || {_cel_dp(p)} == 1",
        (_cel_dp(p),),
    )


DATA_PARALLEL_RULES = {role: _data_parallel_rule(role) for role in ("prefill", "decode")}


def _cel_pool(role: str, field: str, otherwise: str) -> str:
    """A pool's field, or ``otherwise`` where the pool or the field is left out."""
    p = f"self.disaggregation.{role}"
    return f"(has({p}) && has({p}.{field}) ? {p}.{field} : {otherwise})"


def _cel_pool_tp(role: str) -> str:
    """A pool's tensor-parallel size: its own, else its replica's cores over its dataParallelSize."""
    chips = _cel_pool(role, "inf", _COMPUTE_CHIPS)
    cores = f"({chips} * ({CEL_PHYSICAL_CORES}[{CEL_FAMILY}] / {CEL_LNC}))"
    return _cel_pool(role, "tensorParallelSize", f"({cores} / {_cel_pool(role, 'dataParallelSize', '1')})")


def _cel_pool_holds(role: str) -> str:
    """The pool's own rules hold (POOL_RULES): its chips fit, its parallelism fills its cores."""
    chips = _cel_pool(role, "inf", _COMPUTE_CHIPS)
    cores = f"({chips} * ({CEL_PHYSICAL_CORES}[{CEL_FAMILY}] / {CEL_LNC}))"
    dp = _cel_pool(role, "dataParallelSize", "1")
    p = f"self.disaggregation.{role}"
    fills = f"((has({p}) && has({p}.tensorParallelSize)) ? {p}.tensorParallelSize * {dp} == {cores} : {cores} % {dp} == 0)"
    return f"({chips} <= {CEL_MAX}[{CEL_FAMILY}] && {fills})"


# vLLM's NixlConnector, where a decode worker meets a prefill's (add_remote_agent, and
# _validate_remote_agent_handshake from vLLM 0.11; vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py):
# "tp_ratio = divide(self._tp_size[self.engine_id], self._tp_size[engine_id])" (the decode's over the
# prefill's; vllm.distributed.utils.divide asserts that it divides) and "assert tp_ratio > 0,
# 'Decode TP cannot be smaller than prefill TP'". The plugin transfers KV with that connector (its
# DI design page: "Neuron DI uses the upstream NixlConnector"), whose own pair is a TP4 prefill and a
# TP8 decode. So a decode pool's TP is the prefill's or a multiple of it, or every request fails at
# its KV read.
TP_PAIR = CrossFieldRule(
    "spec.disaggregation.decode.tensorParallelSize",
    "spec",
    "is %d, and the prefill pool's is %d: vLLM's NixlConnector reads a prefill's KV only into a decode of the same "
    'tensor-parallel size or a multiple of it ("Decode TP cannot be smaller than prefill TP"); valid values are multiples of %d',
    f"!{_POOLS} || !({_PLUGIN}) || !({CEL_LNC} in {CEL_LNC_VALUES}[{CEL_FAMILY}]) || !{_cel_pool_holds('prefill')} "
    f"|| !{_cel_pool_holds('decode')} || {_cel_pool_tp('decode')} % {_cel_pool_tp('prefill')} == 0",
    (_cel_pool_tp("decode"), _cel_pool_tp("prefill"), _cel_pool_tp("prefill")),
)


def _check_tp_pair(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    pools = _pools(spec, fam)
    if not pools or any(_check_pool(spec, fam, role, pool) for role, pool in pools):
        return []
    prefill, decode = (pool_tensor_parallel(spec, fam, pool) for _, pool in pools)
    return [TP_PAIR.finding(decode, prefill, prefill)] if decode % prefill else []


def _check_pool(spec: InferentiaModelSpec, fam: Family, role: str, pool: Pool) -> list[Finding]:
    chips_rule, divides_rule, covers_rule = POOL_RULES[role]
    chips, cores = pool_cores(spec, fam, pool)
    if chips > fam.max_chips:
        return [chips_rule.finding(chips, fam.name, fam.max_chips)]
    dp, tp = pool.data_parallel_size, pool.tensor_parallel_size
    if tp is None and cores % dp:
        return [divides_rule.finding(dp, cores, chips, format_list(divisors(cores)))]
    if tp is not None and tp * dp != cores:
        return [covers_rule.finding(tp, tp, dp, tp * dp, cores, chips, cores)]
    return []


def _pools(spec: InferentiaModelSpec, fam: Family) -> tuple[tuple[Literal["prefill", "decode"], Pool], ...]:
    """The pools whose rules can be judged: on the plugin's families, at an LNC the family has."""
    d = spec.disaggregation
    if d is None or fam.name not in PLUGIN_FAMILIES or lnc_of(spec, fam) not in fam.lnc_values:
        return ()
    return (("prefill", d.prefill), ("decode", d.decode))


def _check_pools(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    return [finding for role, pool in _pools(spec, fam) for finding in _check_pool(spec, fam, role, pool)]


def _check_data_parallel(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    d = spec.disaggregation
    if d is None:
        return []
    pools = (("prefill", d.prefill), ("decode", d.decode))
    return [DATA_PARALLEL_RULES[role].finding(pool.data_parallel_size) for role, pool in pools if pool.data_parallel_size != 1]


def pool_spec_findings(spec: InferentiaModelSpec, fam: Family, check: Callable[[InferentiaModelSpec], list[Finding]]) -> list[Finding]:
    """A pool on chips of its own is a replica of another size: every rule (``check``, the
    package's check_spec, which calls this) runs on it again, its weights and KV cache against its
    chips, its host against its CPU and memory, and what it breaks is named under the pool. Only
    where the pool's own rules hold. No CEL twin: the CRD's rules read spec.compute; the operator
    and validate refuse such a spec (Validated=False)."""
    found = []
    for role, pool in _pools(spec, fam):
        if pool.inf is None or pool.inf == spec.compute.inf or _check_pool(spec, fam, role, pool):
            continue  # the model's own shape (its findings are the model's), or a pool already refused
        found += [
            Finding(f"spec.disaggregation.{role}.inf", f"is {pool.inf}, and on {pool.inf} chips {f.path}: {f.message}")
            for f in check(spec.pool_spec(role))
            if f.severity == "error"
        ]
    return found


# The compile Job makes one artefact, of spec.compute's shape (its tensor parallelism is part of
# the compile key): both pools load it only where they have that shape. Compiling each pool's own
# shape ahead is not done yet; without compile.image each pool compiles at start.
def _cel_same_shape(role: str) -> str:
    p = f"self.disaggregation.{role}"
    return (
        f"(!has({p}) || ((!has({p}.inf) || {p}.inf == self.compute.inf) && {_cel_dp(p)} == 1"
        f" && (!has({p}.tensorParallelSize) || {p}.tensorParallelSize == {_cel_cores(p)})))"
    )


COMPILE_AHEAD = CrossFieldRule(
    "spec.compile.image",
    "spec",
    "compiles one artefact, of spec.compute's shape (%d chips, tensor parallel over their %d NeuronCores), and the %s would need "
    "another; valid specs give both pools that shape (no inf, tensorParallelSize or dataParallelSize of their own), or leave "
    "compile.image out, so that each pool compiles at start",
    f"!{_POOLS} || !has(self.compile.image) || !has(self.compute.inf) || !({_PLUGIN})"
    f" || ({_cel_same_shape('prefill')} && {_cel_same_shape('decode')})",
    (
        "self.compute.inf",
        f"self.compute.inf * ({CEL_PHYSICAL_CORES}[{CEL_FAMILY}] / {CEL_LNC})",
        f"{_cel_same_shape('prefill')} ? 'decode pool' : ({_cel_same_shape('decode')} ? 'prefill pool' : 'prefill and decode pools')",
    ),
)


def _same_shape(spec: InferentiaModelSpec, pool: Pool, cores: int) -> bool:
    return (
        (pool.inf is None or pool.inf == spec.compute.inf) and pool.data_parallel_size == 1 and pool.tensor_parallel_size in (None, cores)
    )


def _check_compile_ahead(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    d = spec.disaggregation
    if d is None or spec.compile.image is None or fam.name not in PLUGIN_FAMILIES or spec.compute.inf is None:
        return []
    _, cores = pool_cores(spec, fam, None)
    odd = [role for role, pool in (("prefill", d.prefill), ("decode", d.decode)) if not _same_shape(spec, pool, cores)]
    if not odd:
        return []
    which = f"{odd[0]} pool" if len(odd) == 1 else "prefill and decode pools"
    return [COMPILE_AHEAD.finding(spec.compute.inf, cores, which)]


# A pool's autoscaling (core/autoscaling.py: a ScaledObject on the pool's Deployment).
_TARGETS = {"prefill": ("targetWaiting", "requests waiting"), "decode": ("targetRunning", "sequences running")}


def _pool_autoscaling_rules(role: str) -> tuple[CrossFieldRule, CrossFieldRule, CrossFieldRule]:
    """A pool's range starts at 1 and is a range; its target per replica is named or follows from
    serving.batching."""
    p, path = f"self.disaggregation.{role}.autoscaling", f"spec.disaggregation.{role}.autoscaling"
    guard = f"!{_POOLS} || !has(self.disaggregation.{role}) || !has({p})"
    target, what = _TARGETS[role]
    zero = CrossFieldRule(
        f"{path}.minReplicas",
        "spec",
        "is 0: a pool does not scale to zero, since the proxy would send every request to a pool with no server while one "
        "starts; valid values are 1 to maxReplicas (%d)",
        f"{guard} || !has({p}.minReplicas) || {p}.minReplicas >= 1",
        (f"{p}.maxReplicas",),
    )
    span = CrossFieldRule(
        f"{path}.minReplicas",
        "spec",
        "%d is larger than maxReplicas %d; valid values are 1 to maxReplicas",
        f"{guard} || !has({p}.minReplicas) || {p}.minReplicas <= {p}.maxReplicas",
        (f"{p}.minReplicas", f"{p}.maxReplicas"),
    )
    named = CrossFieldRule(
        f"{path}.{target}",
        "spec",
        f"is required without spec.serving.batching, whose maxBatchSize (vLLM's --max-num-seqs) it defaults to: the {what} "
        "one replica should carry; valid specs set it (1 or more), or set spec.serving.batching.maxBatchSize",
        f"{guard} || has({p}.{target}) || has(self.serving.batching)",
        (),
    )
    return zero, span, named


POOL_AUTOSCALING_RULES = {role: _pool_autoscaling_rules(role) for role in ("prefill", "decode")}


def _check_pool_autoscaling(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    d = spec.disaggregation
    if d is None:
        return []
    found = []
    for role, pool in (("prefill", d.prefill), ("decode", d.decode)):
        a = pool.autoscaling
        if a is None:
            continue
        zero, span, named = POOL_AUTOSCALING_RULES[role]
        if a.min_replicas == 0:
            found.append(zero.finding(a.max_replicas))
        elif a.min_replicas > a.max_replicas:
            found.append(span.finding(a.min_replicas, a.max_replicas))
        target = a.target_waiting if isinstance(a, PrefillAutoscaling) else a.target_running if isinstance(a, DecodeAutoscaling) else None
        if target is None and spec.serving.batching is None:
            found.append(named.finding())
    return found


# spec.disaggregation.efa: a pool's pods request their share of their instance's EFA devices,
# and the pool is held to the instance types whose EFA count the catalogue has
# (planner.plan_pool_efa, catalogue.efa_share). Each such type of the plugin's families is one of
# its largest (tests/test_disaggregation.py holds this), so every pool the family fits fits it:
# whether the pools may use one is whether spec.compute's types name one.
EFA_TYPES = [t for name in PLUGIN_FAMILIES for t in FAMILIES[name].instance_chips if t in EFA_DEVICES]
_CEL_TYPES_CONSIDERED = f"(has(self.compute.instanceTypes) ? self.compute.instanceTypes : {CEL_TYPES}[{CEL_FAMILY}])"
_NO_EFA_COUNT = "no %s instance type the pools may use (%s) has an EFA device count the operator knows"
EFA_REQUIRED = CrossFieldRule(
    "spec.disaggregation.efa",
    "spec",
    f"is required, and {_NO_EFA_COUNT}, so it cannot say how many vpc.amazonaws.com/efa devices each pod requests; valid "
    f"values: auto or off, with which the pods request none; required needs one of {format_list(EFA_TYPES)} among "
    "the pools' instance types",
    f"!{_POOLS} || !has(self.disaggregation.efa) || self.disaggregation.efa != 'required' || !({_PLUGIN})"
    f" || {_CEL_TYPES_CONSIDERED}.exists(t, t in {literal(EFA_TYPES)})",
    (CEL_FAMILY, f"has(self.compute.instanceTypes) ? 'spec.compute.instanceTypes' : {CEL_TYPES_TEXT}[{CEL_FAMILY}]"),
)


def _check_efa(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    """required with no instance type of a known EFA count is refused; auto, warned of (no CEL:
    the CRD's rules refuse, never warn)."""
    d = spec.disaggregation
    if d is None or d.efa == "off" or fam.name not in PLUGIN_FAMILIES:
        return []
    listed = spec.compute.instance_types
    if any(t in EFA_TYPES for t in listed or fam.instance_chips):
        return []
    considered = "spec.compute.instanceTypes" if listed else format_list(list(fam.instance_chips))
    if d.efa == "required":
        return [EFA_REQUIRED.finding(fam.name, considered)]
    return [
        Finding(
            "spec.disaggregation.efa",
            f"is auto, and {_NO_EFA_COUNT % (fam.name, considered)}: the pools' pods request no EFA device, and "
            "their servers move the KV cache over EFA only if they get EFA devices another way; off says that is meant",
            severity="warning",
        )
    ]


RULES: list[CrossFieldRule] = [
    DISAGGREGATION_RUNTIME,
    *(rule for rule, _ in REFUSED),
    DRA_ALLOCATION,
    SIDE_CHANNEL,
    POOL_FLAG_IN_ARGS,
    *EMPTY_POOL_RULES.values(),
    *(r for rules in POOL_RULES.values() for r in rules),
    *DATA_PARALLEL_RULES.values(),
    TP_PAIR,
    COMPILE_AHEAD,
    *(r for rules in POOL_AUTOSCALING_RULES.values() for r in rules),
    EFA_REQUIRED,
]
CHECKS = (_check_runtime, _check_pools, _check_data_parallel, _check_tp_pair, _check_compile_ahead, _check_pool_autoscaling, _check_efa)
