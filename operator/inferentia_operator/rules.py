"""Validation: the rules every InferentiaModel spec must satisfy.

Each finding names the field path, the value given and what would be valid.
Every cross-field rule that CEL can express is written twice, side by side: once
in Python (used by the CLI and the operator) and once as a CEL rule that the CRD
carries, so ``kubectl apply`` refuses the same input with the same message.
An end-to-end test applies invalid objects to a real API server and compares the
two messages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from .api import InferentiaModelSpec
from .catalogue import FAMILIES, Family, bucket_budget_per_core


@dataclass(frozen=True)
class Finding:
    """One problem with a spec. Errors block planning; warnings do not."""

    path: str
    message: str
    severity: Literal["error", "warning"] = "error"

    def __str__(self) -> str:
        prefix = "warning: " if self.severity == "warning" else ""
        return f"{prefix}{self.path}: {self.message}"


def errors(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == "error"]


# ---------------------------------------------------------------------------
# Shared arithmetic (the planner uses the same functions).


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def round_half_up_div(numerator: int, denominator: int) -> int:
    """round(numerator / denominator) with halves rounded up, in integers (as the CEL rule computes it)."""
    return (2 * numerator + denominator) // (2 * denominator)


def bytes_per_weight(precision: str) -> int:
    return 4 if precision == "fp32" else 2


def max_buckets_per_group(family: Family, group_size: int, weights: int) -> int:
    """Seed 003: round(10^9 / weights) bucketed models per NeuronCore (scaled for non-inf1 cores)."""
    return group_size * round_half_up_div(bucket_budget_per_core(family), weights)


def _format_list(values: list[Any]) -> str:
    return ", ".join(str(v) for v in values)


def _or_list(values: list[Any]) -> str:
    words = [str(v) for v in values]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


# ---------------------------------------------------------------------------
# Parsing: pydantic errors, translated into findings with field paths.

_UNION_TAGS = {"int", "str", "bool", "float", "list", "dict", "none"}


def _path(loc: tuple[Any, ...], root: str) -> str:
    path = root
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in _UNION_TAGS or any(c in str(part) for c in "[]()-"):
            continue  # pydantic names the union member it tried; users never wrote it
        else:
            path += f".{part}"
    return path


def _describe_error(error: dict[str, Any]) -> str:
    kind, value, ctx = error["type"], error.get("input"), error.get("ctx") or {}
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return "is not a field of this object; check its spelling (kubectl explain inferentiamodel.spec lists the fields)"
    if kind in {"int_type", "int_from_float", "int_parsing"}:
        return f"{value!r} is not a whole number; valid values are whole numbers"
    if kind == "bool_type":
        return f"{value!r} is not valid; valid values are true, false"
    if kind == "greater_than_equal":
        return f"{value!r} is too small; valid values are at least {ctx['ge']}"
    if kind == "less_than_equal":
        return f"{value!r} is too large; valid values are at most {ctx['le']}"
    if kind == "literal_error":
        expected = ctx.get("expected", "").replace("'", "").replace(" or ", ", ")
        return f"{value!r} is not valid; valid values are {expected}"
    if kind in {"too_short", "string_too_short"}:
        return "must not be empty"
    if kind in {"too_long", "string_too_long"}:
        limit = ctx.get("max_length")
        return f"is too long; at most {limit} {'items' if kind == 'too_long' else 'characters'}"
    if kind == "string_pattern_mismatch":
        return f"{value!r} does not match the pattern {ctx.get('pattern')}"
    if kind == "value_error":
        return f"{value!r} is not valid: {ctx.get('error')}"
    return f"{value!r} is not valid: {error['msg']}"


def parse_spec(raw: Any, root: str = "spec") -> tuple[InferentiaModelSpec | None, list[Finding]]:
    """Parses and checks a spec: (the spec or None, every finding)."""
    if not isinstance(raw, dict):
        return None, [Finding(root, f"must be a mapping of fields, got {type(raw).__name__}")]
    try:
        spec = InferentiaModelSpec.model_validate(raw)
    except ValidationError as exc:
        seen: dict[str, Finding] = {}
        for error in exc.errors():
            path = _path(error["loc"], root)
            # A union reports one error per member; the first says enough.
            seen.setdefault(path, Finding(path, _describe_error(error)))
        return None, list(seen.values())
    return spec, check_spec(spec)


# ---------------------------------------------------------------------------
# Cross-field rules, each with its CEL twin.


@dataclass(frozen=True)
class CelRule:
    """An x-kubernetes-validations entry placed on the schema node at ``node``."""

    node: str  # "spec", "spec.compute" or "spec.compile"
    rule: str
    message_expression: str
    field_path: str  # relative to node, as CEL's fieldPath
    reason: str = "FieldValueInvalid"

    def as_schema(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "messageExpression": self.message_expression,
            "fieldPath": self.field_path,
            "reason": self.reason,
        }


def _cel_map(mapping: dict[Any, Any]) -> str:
    def lit(v: Any) -> str:
        if isinstance(v, str):
            return "'" + v + "'"
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(lit(x) for x in v) + "]"
        return str(v)

    return "{" + ", ".join(f"{lit(k)}: {lit(v)}" for k, v in mapping.items()) + "}"


_FAM = list(FAMILIES.values())
CEL_CORES = _cel_map({f.name: f.cores_per_chip for f in _FAM})
CEL_MAX = _cel_map({f.name: f.max_chips for f in _FAM})
CEL_LARGEST = _cel_map({f.name: f.largest_instance[0] for f in _FAM})
CEL_TYPES = _cel_map({f.name: list(f.instance_chips) for f in _FAM})
CEL_TYPE_CHIPS = _cel_map({t: c for f in _FAM for t, c in f.instance_chips.items()})
CEL_MEM_PER_CORE = _cel_map({f.name: f.memory_per_core_bytes for f in _FAM})
CEL_BUCKET_BUDGET = _cel_map({f.name: bucket_budget_per_core(f) for f in _FAM})
# The list of valid processesPerReplica for every core count a valid inf can give.
CEL_DIVISORS = _cel_map(
    {
        cores: _format_list(divisors(cores))
        for cores in sorted({f.cores_per_chip * inf for f in _FAM for inf in range(1, f.max_chips + 1)})
    }
)

# CEL fragments over the spec (self = spec).
_fam = "self.compute.family"
_inf = "self.compute.inf"
_p = "self.processesPerReplica"
_cores = f"({CEL_CORES}[{_fam}] * {_inf})"
_fits_family = f"{_inf} <= {CEL_MAX}[{_fam}]"
_divides = f"{_cores} % {_p} == 0"
_group = f"({_cores} / {_p})"
_w = "self.model.weights"
_bytes = "(self.model.precision == 'fp32' ? 4 : 2)"
_planned = f"{_fits_family} && {_divides}"  # the rules below need a group size

CEL_RULES: list[CelRule] = []


def _rule(node: str, field_path: str, rule: str, message_expression: str) -> None:
    CEL_RULES.append(CelRule(node, rule, message_expression, field_path))


# Rule 2: inf fits the family's largest instance type.
def _check_fits_family(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    name, most = fam.largest_instance
    if spec.compute.inf <= most:
        return []
    return [
        Finding(
            "spec.compute.inf",
            f"{spec.compute.inf} chips do not fit any {fam.name} instance: the largest, {name}, has {most}; "
            f"valid values are 1 to {most}",
        )
    ]


_rule(
    "spec.compute",
    ".inf",
    f"self.inf <= {CEL_MAX}[self.family]",
    f"string(self.inf) + ' chips do not fit any ' + self.family + ' instance: the largest, ' + {CEL_LARGEST}[self.family]"
    f" + ', has ' + string({CEL_MAX}[self.family]) + '; valid values are 1 to ' + string({CEL_MAX}[self.family])",
)


# Rule 7: platforms that restrict the device count of one container (trn1).
def _check_allowed_chip_counts(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    allowed = fam.allowed_chip_counts
    if allowed is None or spec.compute.inf in allowed:
        return []
    return [
        Finding(
            "spec.compute.inf",
            f"{fam.name} containers may use only {_or_list(list(allowed))} chips, got {spec.compute.inf}; "
            f"valid values are {_format_list(list(allowed))}",
        )
    ]


for _f in _FAM:
    if _f.allowed_chip_counts:
        _allowed = list(_f.allowed_chip_counts)
        _rule(
            "spec.compute",
            ".inf",
            f"self.family != '{_f.name}' || self.inf in {_allowed}",
            f"'{_f.name} containers may use only {_or_list(_allowed)} chips, got ' + string(self.inf)"
            f" + '; valid values are {_format_list(_allowed)}'",
        )


# instanceTypes: every entry belongs to the family, and one of them holds a replica.
def _check_instance_types(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    listed = spec.compute.instance_types
    if listed is None:
        return []
    unknown = [t for t in listed if t not in fam.instance_chips]
    if unknown:
        return [
            Finding(
                "spec.compute.instanceTypes",
                f"'{unknown[0]}' is not an {fam.name} instance type; valid values are {_format_list(list(fam.instance_chips))}",
            )
        ]
    inf = spec.compute.inf
    if inf > fam.max_chips or any(fam.instance_chips[t] >= inf for t in listed):
        return []
    large_enough = [t for t, chips in fam.instance_chips.items() if chips >= inf]
    return [
        Finding(
            "spec.compute.instanceTypes",
            f"none of the listed instance types has {inf} chips; {fam.name} types with at least {inf} chips: "
            f"{_format_list(large_enough)}",
        )
    ]


_rule(
    "spec.compute",
    ".instanceTypes",
    f"!has(self.instanceTypes) || self.instanceTypes.all(t, t in {CEL_TYPES}[self.family])",
    f"\"'\" + self.instanceTypes.filter(t, !(t in {CEL_TYPES}[self.family]))[0] + \"' is not an \" + self.family"
    f" + ' instance type; valid values are ' + {CEL_TYPES}[self.family].join(', ')",
)
_rule(
    "spec.compute",
    ".instanceTypes",
    f"!has(self.instanceTypes) || !self.instanceTypes.all(t, t in {CEL_TYPES}[self.family])"
    f" || self.inf > {CEL_MAX}[self.family] || self.instanceTypes.exists(t, {CEL_TYPE_CHIPS}[t] >= self.inf)",
    f"'none of the listed instance types has ' + string(self.inf) + ' chips; ' + self.family"
    f" + ' types with at least ' + string(self.inf) + ' chips: '"
    f" + {CEL_TYPES}[self.family].filter(t, {CEL_TYPE_CHIPS}[t] >= self.inf).join(', ')",
)


# Rule 3: the processes share the replica's NeuronCores evenly.
def _check_divisibility(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    inf, p = spec.compute.inf, spec.processes_per_replica
    cores = fam.cores_per_chip * inf
    if inf > fam.max_chips or cores % p == 0:
        return []  # an oversized inf is reported by rule 2
    return [
        Finding(
            "spec.processesPerReplica",
            f"cannot evenly distribute {inf} {fam.name} chip{'' if inf == 1 else 's'} ({cores} NeuronCores) over {p} processes; "
            f"valid values are {_format_list(divisors(cores))}",
        )
    ]


_rule(
    "spec",
    ".processesPerReplica",
    f"!({_fits_family}) || {_divides}",
    f"'cannot evenly distribute ' + string({_inf}) + ' ' + {_fam} + ({_inf} == 1 ? ' chip (' : ' chips (')"
    f" + string({_cores}) + ' NeuronCores) over ' + string({_p}) + ' processes; valid values are '"
    f" + {CEL_DIVISORS}[{_cores}]",
)


# Rule 4: CNN batch limits (seed 000).
FP16_CNN_MAX_BATCH = 5


def _check_cnn_batch(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    model, b = spec.model, spec.compile.batch_size
    if model.architecture != "cnn" or b <= 1:
        return []
    if model.precision == "fp32":
        return [
            Finding(
                "spec.compile.batchSize",
                f"a CNN in fp32 compiles only at batch size 1, got {b}; valid values are 1 "
                f"(or use precision fp16 for batch sizes up to {FP16_CNN_MAX_BATCH})",
            )
        ]
    if model.precision == "fp16" and b > FP16_CNN_MAX_BATCH:
        return [
            Finding(
                "spec.compile.batchSize",
                f"an fp16 CNN above batch size {FP16_CNN_MAX_BATCH} may not compile (the compiler supports FP16 "
                f"ResNet-50 up to batch {FP16_CNN_MAX_BATCH}), got {b}",
                "warning",
            )
        ]
    return []


_rule(
    "spec",
    ".compile.batchSize",
    "!(self.model.architecture == 'cnn' && self.model.precision == 'fp32' && self.compile.batchSize > 1)",
    f"'a CNN in fp32 compiles only at batch size 1, got ' + string(self.compile.batchSize)"
    f" + '; valid values are 1 (or use precision fp16 for batch sizes up to {FP16_CNN_MAX_BATCH})'",
)


# Rule 6: bucket shapes.
def _bucket_text(bucket: list[int]) -> str:
    return "[" + _format_list(bucket) + "]"


def _check_bucket_shapes(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    buckets = spec.compile.buckets or []
    found = []
    if any(len(b) != len(buckets[0]) for b in buckets):
        found.append(
            Finding(
                "spec.compile.buckets",
                f"buckets have different numbers of dimensions ({_format_list([len(b) for b in buckets])}); "
                f"every bucket needs as many as the first ({len(buckets[0])})",
            )
        )
    duplicates = [b for b in buckets if buckets.count(b) > 1]
    if duplicates:
        found.append(
            Finding(
                "spec.compile.buckets",
                f"bucket {_bucket_text(duplicates[0])} appears more than once; every bucket must be different",
            )
        )
    return found


_rule(
    "spec.compile",
    ".buckets",
    "!has(self.buckets) || size(self.buckets) == 0 || self.buckets.all(b, size(b) == size(self.buckets[0]))",
    "'buckets have different numbers of dimensions (' + self.buckets.map(b, string(size(b))).join(', ')"
    " + '); every bucket needs as many as the first (' + string(size(self.buckets[0])) + ')'",
)
_rule(
    "spec.compile",
    ".buckets",
    "!has(self.buckets) || self.buckets.all(a, self.buckets.exists_one(b, b == a))",
    "'bucket [' + self.buckets.filter(a, !self.buckets.exists_one(b, b == a))[0].map(d, string(d)).join(', ')"
    " + '] appears more than once; every bucket must be different'",
)


# Rule 5: what the weights allow (seeds 001 and 003).
def _check_weights(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    inf, p, weights = spec.compute.inf, spec.processes_per_replica, spec.model.weights
    cores = fam.cores_per_chip * inf
    if inf > fam.max_chips or cores % p:
        return []  # no group size to check against
    group = cores // p
    found = []
    if weights is None:
        if spec.compile.static_weights is True:
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
    bound = max_buckets_per_group(fam, group, weights)
    if buckets and len(buckets) > bound:
        found.append(
            Finding(
                "spec.compile.buckets",
                f"{len(buckets)} buckets do not fit: a group of {group} NeuronCores holds at most {bound} bucketed "
                f"models of {weights} weights (round({bucket_budget_per_core(fam)} / weights) per NeuronCore)",
            )
        )
    need = weights * bytes_per_weight(spec.model.precision)
    share = group * fam.memory_per_core_bytes
    if spec.compile.static_weights is True and need > share:
        found.append(
            Finding(
                "spec.compile.staticWeights",
                f"true needs {need} bytes for {weights} {spec.model.precision} weights, but a group of {group} "
                f"NeuronCores has a {share}-byte share of device memory; use auto or false, or fewer processesPerReplica",
            )
        )
    return found


_rule(
    "spec",
    ".compile.buckets",
    f"!has({_w}) || !has(self.compile.buckets) || size(self.compile.buckets) == 0 || !({_planned})"
    f" || size(self.compile.buckets) <= {_group} * ((2 * {CEL_BUCKET_BUDGET}[{_fam}] + {_w}) / (2 * {_w}))",
    f"string(size(self.compile.buckets)) + ' buckets do not fit: a group of ' + string({_group})"
    f" + ' NeuronCores holds at most ' + string({_group} * ((2 * {CEL_BUCKET_BUDGET}[{_fam}] + {_w}) / (2 * {_w})))"
    f" + ' bucketed models of ' + string({_w}) + ' weights (round(' + string({CEL_BUCKET_BUDGET}[{_fam}])"
    f" + ' / weights) per NeuronCore)'",
)
_rule(
    "spec",
    ".compile.staticWeights",
    f"!has({_w}) || !has(self.compile.staticWeights) || self.compile.staticWeights != true || !({_planned})"
    f" || {_w} * {_bytes} <= {_group} * {CEL_MEM_PER_CORE}[{_fam}]",
    f"'true needs ' + string({_w} * {_bytes}) + ' bytes for ' + string({_w}) + ' ' + self.model.precision"
    f" + ' weights, but a group of ' + string({_group}) + ' NeuronCores has a '"
    f" + string({_group} * {CEL_MEM_PER_CORE}[{_fam}])"
    f" + '-byte share of device memory; use auto or false, or fewer processesPerReplica'",
)
# staticWeights is true, false or "auto"; the schema cannot say "boolean or string", so CEL does.
CEL_RULES.append(
    CelRule(
        "spec.compile",
        "!has(self.staticWeights) || type(self.staticWeights) == bool || self.staticWeights == 'auto'",
        "'is not valid; valid values are auto, true, false'",
        ".staticWeights",
    )
)


# Warnings only: allowed, but probably not what the user wants.
def _check_advice(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    inf, p = spec.compute.inf, spec.processes_per_replica
    cores = fam.cores_per_chip * inf
    if inf > fam.max_chips or cores % p:
        return []
    group = cores // p
    found = []
    if group < fam.cores_per_chip and fam.cores_per_chip % group or group > fam.cores_per_chip and group % fam.cores_per_chip:
        found.append(
            Finding(
                "spec.processesPerReplica",
                f"groups of {group} NeuronCores straddle chip boundaries ({fam.cores_per_chip} cores per chip); "
                f"values giving whole-chip or in-chip groups: "
                f"{_format_list([d for d in divisors(cores) if (cores // d) % fam.cores_per_chip == 0 or fam.cores_per_chip % (cores // d) == 0])}",
                "warning",
            )
        )
    threads = spec.serving.threads_per_process
    if threads is not None and threads <= group:
        found.append(
            Finding(
                "spec.serving.threadsPerProcess",
                f"{threads} threads cannot keep a group of {group} NeuronCores busy; use more than {group}",
                "warning",
            )
        )
    batching = spec.serving.batching
    if batching and batching.max_batch_size > spec.compile.batch_size and not spec.compile.dynamic_batch_size:
        found.append(
            Finding(
                "spec.serving.batching.maxBatchSize",
                f"{batching.max_batch_size} is larger than the compiled batch size {spec.compile.batch_size}; "
                "set spec.compile.dynamicBatchSize: true so the model accepts larger batches",
                "warning",
            )
        )
    if spec.compile.optimize_for == "throughput" and group > 1:
        found.append(
            Finding(
                "spec.processesPerReplica",
                f"throughput is usually best with one NeuronCore per group (processesPerReplica: {cores}); "
                f"{p} gives groups of {group}",
                "warning",
            )
        )
    if spec.compile.optimize_for == "latency" and group == 1 and cores > 1:
        found.append(
            Finding(
                "spec.processesPerReplica",
                f"latency usually improves with larger groups (NeuronCore pipeline); {p} gives groups of 1 core",
                "warning",
            )
        )
    return found


_CHECKS = (
    _check_fits_family,
    _check_allowed_chip_counts,
    _check_instance_types,
    _check_divisibility,
    _check_cnn_batch,
    _check_bucket_shapes,
    _check_weights,
    _check_advice,
)


def check_spec(spec: InferentiaModelSpec) -> list[Finding]:
    """Every cross-field finding for a spec that parsed."""
    fam = FAMILIES[spec.compute.family]
    return [finding for check in _CHECKS for finding in check(spec, fam)]
