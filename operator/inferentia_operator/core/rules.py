"""Validation: the cross-field rules every InferentiaModel spec must satisfy.

Each finding names the field path, the value given and what would be valid. Every rule
that CEL can express (all but the two about staticWeights) is written twice, side by
side: once in Python (used by the CLI and the operator) and once as a CEL rule that the
CRD carries (:mod:`cel`), so ``kubectl apply`` refuses the same input with the same
message. An end-to-end test applies invalid objects to a real API server and compares
the two messages. Parsing (pydantic's errors) is in :mod:`parsing`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .api import EnvFromSource, EnvVar, InferentiaModelSpec
from .catalogue import FAMILIES, GIB, HUGEPAGE_BYTES, Family, bucket_budget_per_core, host_fits
from .cel import (
    C_CHIPS,
    C_LNC,
    C_LNC_OK,
    C_ONE_REQUEST,
    CEL_ALLOC_CPU,
    CEL_ALLOC_MEMORY,
    CEL_BUCKET_LIMIT,
    CEL_BUDGET,
    CEL_CORE_COUNTS_TEXT,
    CEL_CORES,
    CEL_DIVIDES,
    CEL_DIVISORS,
    CEL_FAMILY,
    CEL_FITS,
    CEL_GROUP,
    CEL_HOST_TEXT,
    CEL_INF,
    CEL_LARGE_ENOUGH_TEXT,
    CEL_LARGEST,
    CEL_LNC,
    CEL_LNC_TEXT,
    CEL_LNC_VALUES,
    CEL_MAX,
    CEL_MAX_CORES,
    CEL_PHYSICAL_CORES,
    CEL_PROCESSES,
    CEL_TP_PROCESSES_TEXT,
    CEL_TYPE_CHIPS,
    CEL_TYPES,
    CEL_TYPES_TEXT,
    CEL_WEIGHTS,
    FAMILY_LIST,
    HOST_TEXT,
    NEURON_CC_FAMILIES,
    TP_RESTRICTED,
    CrossFieldRule,
    literal,
)
from .cores import (
    RUNTIME_RESERVE_PER_PHYSICAL_CORE,
    bytes_per_weight,
    chips_needed,
    core_request_counts,
    divisors,
    group_memory_bytes,
    group_size_of,
    kv_cache_bytes,
    lnc_of,
    max_buckets_per_group,
    memory_needed,
    replica_cores,
    request_ok,
    sequences,
    smallest_fitting_group,
    tensor_parallel_processes,
)
from .drift import quantity
from .findings import Finding, and_list, format_list, or_list

# The model's name is carried by its children: the Service (a DNS-1035 label) and the
# Job "<name>-compile-<10 hex>" (at most 63 characters).
NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
MAX_NAME_LENGTH = 45
NAME = CrossFieldRule(
    "metadata.name",
    "",
    f"'%s' is not valid; use at most {MAX_NAME_LENGTH} lower-case letters, digits and '-', "
    "starting with a letter and ending with a letter or digit",
    f"size(self.metadata.name) <= {MAX_NAME_LENGTH} && self.metadata.name.matches({json.dumps(NAME_PATTERN)})",
    ("self.metadata.name",),
)


def check_name(name: Any) -> list[Finding]:
    if not isinstance(name, str) or not name:
        return [Finding("metadata.name", "is required")]
    if len(name) > MAX_NAME_LENGTH or not re.match(NAME_PATTERN, name):
        return [NAME.finding(name)]
    return []


# A namespace is a DNS-1123 label: the API server refuses any other, so validate does too.
NAMESPACE_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


def check_namespace(namespace: Any) -> list[Finding]:
    if namespace is None:
        return []
    if not isinstance(namespace, str) or len(namespace) > 63 or not re.match(NAMESPACE_PATTERN, namespace):
        shown = namespace if isinstance(namespace, str) else "a non-string"
        return [
            Finding(
                "metadata.namespace",
                f"'{shown}' is not a valid namespace; valid namespaces are at most 63 lower-case letters, digits and '-', "
                "starting and ending with a letter or digit",
            )
        ]
    return []


# A replica asks for whole chips (inf, aws.amazon.com/neuron) or for NeuronCores (cores,
# aws.amazon.com/neuroncore): exactly one of the two.
ONE_REQUEST = CrossFieldRule(
    "spec.compute",
    "spec.compute",
    "set exactly one of inf (whole Neuron chips) and cores (NeuronCores): %s",
    C_ONE_REQUEST,
    ("has(self.inf) ? 'both are set' : 'neither is set'",),
)


def _fits_largest(field: str, unit: str, most: str, applies: str = "") -> CrossFieldRule:
    """A request of ``field`` (inf or cores) fits the family's largest instance type, which has
    ``most`` (a CEL map by family) of them; ``applies``: a CEL condition under which it is checked."""
    return CrossFieldRule(
        f"spec.compute.{field}",
        "spec.compute",
        f"%d {unit} do not fit any %s instance: the largest, %s, has %d; valid values are 1 to %d",
        f"!has(self.{field}) || {applies}self.{field} <= {most}[self.family]",
        (f"self.{field}", "self.family", f"{CEL_LARGEST}[self.family]", f"{most}[self.family]", f"{most}[self.family]"),
    )


# Rule 2: inf fits the family's largest instance type.
FITS_FAMILY = _fits_largest("inf", "chips", CEL_MAX)

# Rule 7: platforms that restrict the device count of one container (trn1).
ALLOWED_CHIPS_TEMPLATE = "%s containers may use only %s chips, got %d; valid values are %s"
ALLOWED_CHIPS = {
    f.name: CrossFieldRule(
        "spec.compute.inf",
        "spec.compute",
        ALLOWED_CHIPS_TEMPLATE,
        f"self.family != {literal(f.name)} || !has(self.inf) || self.inf in {literal(list(f.allowed_chip_counts))}",
        (
            literal(f.name),
            literal(or_list(list(f.allowed_chip_counts))),
            "self.inf",
            literal(format_list(list(f.allowed_chip_counts))),
        ),
    )
    for f in FAMILY_LIST
    if f.allowed_chip_counts
}

# cores: only at LNC 1 (cores.core_request_counts says why), at most one instance's
# cores, and on platforms that restrict the devices of a container (trn1) one chip's
# cores or whole chips in the allowed shapes.
CORES_LNC = CrossFieldRule(
    "spec.compute.cores",
    "spec.compute",
    "NeuronCore requests are planned at lnc 1 only, and this %s replica has lnc %d: how the Neuron device plugin "
    "counts aws.amazon.com/neuroncore under a logical NeuronCore configuration is not documented; valid values are "
    "cores with lnc: 1, or whole chips with inf",
    f"!has(self.cores) || {C_LNC} == 1",
    ("self.family", C_LNC),
)
CORES_FIT = _fits_largest("cores", "NeuronCores", CEL_MAX_CORES, applies=f"{C_LNC} != 1 || ")
CORES_SHAPE = {
    f.name: CrossFieldRule(
        "spec.compute.cores",
        "spec.compute",
        f"{f.name} containers may use one chip's NeuronCores or whole chips in groups of "
        f"{or_list(list(f.allowed_chip_counts or ()))} (the Neuron scheduler extension), got %d NeuronCores; valid values are %s",
        f"self.family != {literal(f.name)} || !has(self.cores) || {C_LNC} != 1 || self.cores > {CEL_MAX_CORES}[self.family]"
        f" || self.cores in {literal(core_request_counts(f, 1))}",
        ("self.cores", f"{CEL_CORE_COUNTS_TEXT}[self.family]"),
    )
    for f in FAMILY_LIST
    if f.allowed_chip_counts
}

# instanceTypes: every entry belongs to the family, and one of them holds a replica.
_listed_known = f"self.instanceTypes.all(t, t in {CEL_TYPES}[self.family])"
UNKNOWN_INSTANCE_TYPE = CrossFieldRule(
    "spec.compute.instanceTypes",
    "spec.compute",
    "'%s' is not one of the %s instance types; valid values are %s",
    f"!has(self.instanceTypes) || {_listed_known}",
    (
        f"self.instanceTypes.filter(t, !(t in {CEL_TYPES}[self.family]))[0]",
        "self.family",
        f"{CEL_TYPES_TEXT}[self.family]",
    ),
)
SMALL_INSTANCE_TYPES = CrossFieldRule(
    "spec.compute.instanceTypes",
    "spec.compute",
    "none of the listed instance types has %d chips; %s types with at least %d chips: %s",
    f"!has(self.instanceTypes) || !{_listed_known} || !({C_ONE_REQUEST}) || !({C_LNC_OK}) || {C_CHIPS} > {CEL_MAX}[self.family]"
    f" || self.instanceTypes.exists(t, {CEL_TYPE_CHIPS}[t] >= {C_CHIPS})",
    (C_CHIPS, "self.family", C_CHIPS, f"{CEL_LARGE_ENOUGH_TEXT}[self.family][{C_CHIPS}]"),
)

# The replica's CPU and memory must fit what some allowed instance type with the chips
# leaves to pods (catalogue.HOSTS); checked only where the other compute rules hold.
_CPU, _MEMORY = "string(self.cpu)", "string(self.memory)"
CHIPS_TEXT = {n: "1 chip" if n == 1 else f"{n} chips" for n in range(1, max(f.max_chips for f in FAMILY_LIST) + 1)}
_TYPES_CONSIDERED = f"(has(self.instanceTypes) ? self.instanceTypes : {CEL_TYPES}[self.family])"
HOST_FITS = CrossFieldRule(
    "spec.compute",
    "spec.compute",
    "a replica asks for %s CPU and %s of memory, more than any %s instance type with %s leaves to pods after "
    "system reservations; valid values fit one of %s",
    f"!isQuantity({_CPU}) || {_CPU}.startsWith('-') || !isQuantity({_MEMORY}) || {_MEMORY}.startsWith('-')"
    f" || !({C_ONE_REQUEST}) || !({C_LNC_OK}) || {C_CHIPS} > {CEL_MAX}[self.family] || (has(self.instanceTypes) && !{_listed_known})"
    f" || (has(self.instanceTypes) && !self.instanceTypes.exists(t, {CEL_TYPE_CHIPS}[t] >= {C_CHIPS}))"
    f" || {_TYPES_CONSIDERED}.exists(t, {CEL_TYPE_CHIPS}[t] >= {C_CHIPS}"
    f" && quantity({_CPU}).compareTo(quantity({CEL_ALLOC_CPU}[t])) <= 0"
    f" && quantity({_MEMORY}).compareTo(quantity({CEL_ALLOC_MEMORY}[t])) <= 0)",
    # "N chips" from a literal map: string(int) concatenation trips the CRD cost estimator
    # (kubernetes#124234); the rule only fails where inf is at most a family's largest.
    (_CPU, _MEMORY, "self.family", f"{literal(CHIPS_TEXT)}[{C_CHIPS}]", f"{CEL_HOST_TEXT}[self.family]"),
)

# Logical NeuronCores: trn2 groups 1 or 2 physical cores into a logical one; every other
# family only 1 (NCC_EARG001).
LNC_VALUE = CrossFieldRule(
    "spec.compute.lnc",
    "spec.compute",
    "%d is not supported on %s; valid values are %s",
    f"!has(self.lnc) || self.lnc in {CEL_LNC_VALUES}[self.family]",
    ("self.lnc", "self.family", f"{CEL_LNC_TEXT}[self.family]"),
)

# Rule 3: the processes share the replica's NeuronCores evenly (an oversized inf is rule 2's).
DIVISIBLE = CrossFieldRule(
    "spec.processesPerReplica",
    "spec",
    "cannot evenly distribute %d %s %s (%d NeuronCores) over %d processes; valid values are %s",
    f"has(self.compute.cores) || !({CEL_FITS}) || {CEL_DIVIDES}",
    (CEL_INF, CEL_FAMILY, f"({CEL_INF} == 1 ? 'chip' : 'chips')", CEL_CORES, CEL_PROCESSES, f"{CEL_DIVISORS}[{CEL_CORES}]"),
)
DIVISIBLE_CORES = CrossFieldRule(
    "spec.processesPerReplica",
    "spec",
    "cannot evenly distribute %d %s NeuronCores over %d processes; valid values are %s",
    f"!has(self.compute.cores) || !({CEL_FITS}) || {CEL_DIVIDES}",
    ("self.compute.cores", CEL_FAMILY, CEL_PROCESSES, f"{CEL_DIVISORS}[{CEL_CORES}]"),
)

# Tensor-parallel groups on trn1: its runtime loads collectives only on 1, 2, 8, 16 or a
# multiple of 32 cores ("Unsupported topology", huggingface/optimum-neuron#619).
TENSOR_PARALLEL_GROUP = {
    f.name: CrossFieldRule(
        "spec.processesPerReplica",
        "spec",
        f"a {f.name} group of %d NeuronCores cannot run one model tensor parallel: the runtime loads collectives "
        f"only on {format_list(list(f.tensor_parallel_sizes or ()))} or a multiple of {f.tensor_parallel_multiple} "
        "cores (huggingface/optimum-neuron#619); valid values for %d NeuronCores are %s",
        f"{CEL_FAMILY} != {literal(f.name)} || !({CEL_FITS} && {CEL_DIVIDES})"
        f" || {CEL_GROUP} in {literal(list(f.tensor_parallel_sizes or ()))} || {CEL_GROUP} % {f.tensor_parallel_multiple} == 0",
        (CEL_GROUP, CEL_CORES, f"{CEL_TP_PROCESSES_TEXT}[{literal(f.name)}][{CEL_CORES}]"),
    )
    for f in TP_RESTRICTED
}

# Devices from AWS's Neuron DRA driver (spec.compute.allocation: dra; catalogue.DRA_DRIVER for
# the sources): it runs on Trainium and Inferentia2 nodes, hands out whole devices, and holds a
# claim to connected devices only where it publishes device groups (Trainium's grid).
CEL_DRA = "has(self.compute.allocation) && self.compute.allocation == 'dra'"
DRA_FAMILY = CrossFieldRule(
    "spec.compute.allocation",
    "spec",
    "dra does not run on %s: AWS's Neuron DRA driver runs on Trainium and Inferentia2 nodes; valid values on %s are devicePlugin",
    f"!({CEL_DRA}) || {CEL_FAMILY} in {literal([f.name for f in FAMILY_LIST if f.dra_groups is not None])}",
    (CEL_FAMILY, CEL_FAMILY),
)
DRA_CORES = CrossFieldRule(
    "spec.compute.cores",
    "spec",
    "%d NeuronCores cannot be claimed with allocation dra: AWS's Neuron DRA driver hands out whole Neuron devices; "
    "use compute.inf, or allocation devicePlugin for NeuronCores",
    f"!({CEL_DRA}) || !has(self.compute.cores)",
    ("self.compute.cores",),
)
DRA_CONNECTED = CrossFieldRule(
    "spec.compute.inf",
    "spec",
    "%d devices cannot be claimed connected on %s with allocation dra: the Neuron DRA driver publishes connected-device "
    "groups only for Trainium's grid topology; valid values with dra on %s are 1",
    f"!({CEL_DRA}) || !has(self.compute.inf) || self.compute.inf <= 1"
    f" || {CEL_FAMILY} in {literal([f.name for f in FAMILY_LIST if f.dra_groups])}",
    ("self.compute.inf", CEL_FAMILY, CEL_FAMILY),
)

# The vLLM preset: the operator runs vLLM on NxD Inference on inf2 and trn1
# (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/libraries/nxd-inference/vllm/index.html),
# and on the vLLM Neuron plugin on Trn2 and Trn3, where NxD Inference's support ends with Neuron 2.34
# (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/model-recipes/index.html;
# catalogue.Family.vllm). inf1 has neither.
VLLM_FAMILY = CrossFieldRule(
    "spec.serving.runtime",
    "spec",
    "vllm does not run on %s: vLLM on Neuron runs on NxD Inference (inf2, trn1) and the vLLM Neuron plugin "
    "(trn2, trn3) only; "
    "valid values on %s are custom",
    f"!has(self.serving.runtime) || self.serving.runtime != 'vllm' || !({CEL_FAMILY} in {literal(NEURON_CC_FAMILIES)})",
    (CEL_FAMILY, CEL_FAMILY),
)

# A compile step traces the model with the operator's compile program, which uses the PyTorch
# Neuron frameworks. TensorFlow on Neuron is not supported by it: tensorflow-neuron (TensorFlow
# on inf1) is archived by AWS, and a TensorFlow model is compiled in the user's own image.
_HAS_COMPILE_IMAGE = "has(self.compile) && has(self.compile.image)"
TENSORFLOW_COMPILE = CrossFieldRule(
    "spec.model.framework",
    "spec",
    "tensorflow cannot be compiled by the operator: its compile program traces PyTorch models with torch-neuron and "
    "torch-neuronx, and tensorflow-neuron (TensorFlow on inf1) is archived by AWS; valid values with compile.image "
    "are pytorch, or leave compile.image unset and compile in your serving image",
    f"!(self.model.framework == 'tensorflow' && {_HAS_COMPILE_IMAGE})",
    (),
)
# The compile Job uploads its artefact to S3 and serving pods fetch it from there.
COMPILE_STORE = CrossFieldRule(
    "spec.compile.outputUri",
    "spec",
    "compiled artefacts are uploaded to S3, and %s is not an s3:// URI; valid values start with s3:// "
    "(set compile.outputUri when the model's uri is not in S3)",
    f"!({_HAS_COMPILE_IMAGE}) || (has(self.compile.outputUri) ? self.compile.outputUri.startsWith('s3://') "
    ": self.model.uri.startsWith('s3://'))",
    ("has(self.compile.outputUri) ? self.compile.outputUri : self.model.uri",),
)

# Rule 4: CNN batch limits of neuron-cc, the Inf1 compiler (the Neuron batching tech note,
# https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-features/neuroncore-batching.html).
FP16_CNN_MAX_BATCH = 5
FP32_CNN_BATCH = CrossFieldRule(
    "spec.compile.batchSize",
    "spec",
    "a CNN in fp32 compiles only at batch size 1, got %d; valid values are 1 "
    f"(or use precision fp16 for batch sizes up to {FP16_CNN_MAX_BATCH})",
    f"!({CEL_FAMILY} in {literal(NEURON_CC_FAMILIES)} && self.model.architecture == 'cnn' && self.model.precision == 'fp32'"
    " && self.compile.batchSize > 1)",
    ("self.compile.batchSize",),
)

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

# Rule 5: how many buckets the weights allow (the bucketing application note,
# https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/appnotes/torch-neuron/bucketing-app-note.html).
BUCKET_BOUND = CrossFieldRule(
    "spec.compile.buckets",
    "spec",
    "%d buckets do not fit: a group of %d NeuronCores holds at most %d bucketed models of %d weights (round(%d / weights) per NeuronCore)",
    f"!has({CEL_WEIGHTS}) || !has(self.compile.buckets) || size(self.compile.buckets) == 0 || !({CEL_FITS} && {CEL_DIVIDES})"
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
_MEMORY_FITS = (
    f"!has({CEL_WEIGHTS}) || {CEL_FAMILY} in {literal(NEURON_CC_FAMILIES)} || !({CEL_FITS} && {CEL_DIVIDES}) || {_W} + {_RESERVE} <= {_HAS}"
)
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
# With the KV cache: no CEL twin, since the sequence length is the largest bucket's last
# dimension, a maximum over a list of lists that the API server's cost estimator cannot
# bound. The operator reports it in status, and validate prints it.
KV_NEEDS = (
    "%d %s weights, a KV cache of %d GiB (%d layers, %d KV heads of dimension %d, %d tokens, %d sequences) and the "
    "Neuron runtime's reserve need %d GiB of device memory a process, and a process has %d GiB on its %d %s; "
)
KV_FIT = {request: KV_NEEDS + valid for request, valid in AT_LEAST.items()}
KV_UNKNOWN = "only the weights were checked against the device memory: vLLM also holds a KV cache; set %s to check that it fits too"

# Rule 5, static weights. No CEL twin: the field is true, false or "auto", which a
# structural schema can only hold as x-kubernetes-preserve-unknown-fields, and CEL
# cannot see such a field (the API server refuses the CRD). The operator reports
# it in status instead.
STATIC_WEIGHTS_TOO_LARGE = (
    "true needs %s for %d %s weights, but a group of %d NeuronCores has a %s share of device memory; "
    "use auto or false, or fewer processesPerReplica"
)

# ---------------------------------------------------------------------------
# What the API server would refuse in a child, refused on the model instead (one verdict):
# the children are only ever what the model says, so a model that validates is a model
# whose children the API server stores.

# Kubernetes' quantity grammar (resource.ParseQuantity): a number, then a binary or decimal
# SI suffix or an exponent. Requests are never negative.
QUANTITY_GRAMMAR = r"^\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$"


def _quantity_rule(field: str, node: str = "spec.compute") -> CrossFieldRule:
    value = f"string(self.{field})"
    return CrossFieldRule(
        f"{node}.{field}",
        node,
        "'%s' is not a Kubernetes quantity; valid values are a non-negative number with an optional suffix "
        "(m, k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei, or an exponent such as e3), for example 500m, 2 or 4Gi",
        f"!has(self.{field}) || (isQuantity({value}) && !{value}.startsWith('-'))",
        (value,),
    )


QUANTITY = {field: _quantity_rule(field) for field in ("cpu", "memory")}
COMPILE_QUANTITY = {field: _quantity_rule(field, "spec.compile") for field in ("cpu", "memory")}
SCRATCH_QUANTITY = {field: _quantity_rule(field, "spec.serving") for field in ("homeSize", "tmpSize")}

_HUGEPAGES = "string(self.hugepages)"
# A request for part of a page, or for none, is one the kubelet cannot meet as asked.
HUGEPAGES_WHOLE = CrossFieldRule(
    "spec.compute.hugepages",
    "spec.compute",
    "'%s' is not a whole number of 2 MiB hugepages; valid values are a positive multiple of 2Mi, for example 256Mi (128 pages)",
    f"!has(self.hugepages) || (isQuantity({_HUGEPAGES}) && !{_HUGEPAGES}.startsWith('-')"
    f" && quantity({_HUGEPAGES}).isInteger() && quantity({_HUGEPAGES}).asInteger() > 0"
    f" && quantity({_HUGEPAGES}).asInteger() % {HUGEPAGE_BYTES} == 0)",
    (_HUGEPAGES,),
)


def _whole_hugepages(value: str) -> bool:
    """HUGEPAGES_WHOLE's test: a quantity of at least one whole 2 MiB page."""
    amount = quantity(value) if re.match(QUANTITY_GRAMMAR, value) else None
    return amount is not None and amount > 0 and amount % HUGEPAGE_BYTES == 0


# With a batching front end on the serving port, the processes start one port higher.
_FRONT_END = "(has(self.serving.batching) && (!has(self.serving.runtime) || self.serving.runtime != 'vllm') ? 1 : 0)"
_PORTS = f"(self.processesPerReplica + {_FRONT_END})"
PORTS_FIT = CrossFieldRule(
    "spec.serving.port",
    "spec",
    "the pod listens on ports %d to %d (%d ports: the processes, and the batching front end if any), past 65535; "
    "valid values are at most %d",
    f"self.serving.port + {_PORTS} - 1 <= 65535",
    ("self.serving.port", f"self.serving.port + {_PORTS} - 1", _PORTS, f"65536 - {_PORTS}"),
)

# Environment names: C identifiers, which every shell can export (the launcher does).
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
ENV_NAME = CrossFieldRule(
    "spec.serving.env",
    "spec.serving",
    "'%s' is not a valid environment variable name; valid names are letters, digits and '_', not starting with a digit",
    f"!has(self.env) || self.env.all(e, e.name.matches({json.dumps(ENV_NAME_PATTERN)}))",
    (f"self.env.filter(e, !e.name.matches({json.dumps(ENV_NAME_PATTERN)}))[0].name",),
)

# Object names (Secrets, ConfigMaps, ServiceAccounts): DNS-1123 subdomains, as the API
# server requires of every object name.
SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"

# valueFrom and envFrom: what the API server accepts in a container's env and envFrom,
# refused on the model with one message each (validate, the API server, the operator agree).
_SOURCES = ("secretKeyRef", "configMapKeyRef", "fieldRef", "resourceFieldRef")
_ONE_SOURCE = " + ".join(f"(has(e.valueFrom.{k}) ? 1 : 0)" for k in _SOURCES)
_ENV_SOURCE_OK = f"(!has(e.valueFrom) || (!has(e.value) && {_ONE_SOURCE} == 1))"
ENV_SOURCE = CrossFieldRule(
    "spec.serving.env",
    "spec.serving",
    "environment variable '%s' needs one value: either value, or valueFrom with exactly one of "
    "secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef",
    f"!has(self.env) || self.env.all(e, {_ENV_SOURCE_OK})",
    (f"self.env.filter(e, !{_ENV_SOURCE_OK})[0].name",),
)
# The downward API's fields and the resources a container's env may name (Kubernetes'
# own validation of EnvVarSource).
FIELD_PATHS = (
    "metadata.name", "metadata.namespace", "metadata.uid", "spec.nodeName", "spec.serviceAccountName",
    "status.hostIP", "status.hostIPs", "status.podIP", "status.podIPs",
)  # fmt: skip
FIELD_PATH_PATTERN = r"^metadata\.(labels|annotations)\['[-._a-zA-Z0-9/]+'\]$"
RESOURCES = tuple(f"{kind}.{r}" for kind in ("limits", "requests") for r in ("cpu", "memory", "ephemeral-storage"))
_FIELD_OK = (
    f"(!has(e.valueFrom) || !has(e.valueFrom.fieldRef) || e.valueFrom.fieldRef.fieldPath in {literal(list(FIELD_PATHS))}"
    f" || e.valueFrom.fieldRef.fieldPath.matches({json.dumps(FIELD_PATH_PATTERN)}))"
)
_RESOURCE_OK = (
    f"(!has(e.valueFrom) || !has(e.valueFrom.resourceFieldRef) || e.valueFrom.resourceFieldRef.resource in {literal(list(RESOURCES))})"
)
ENV_FIELD = CrossFieldRule(
    "spec.serving.env",
    "spec.serving",
    "environment variable '%s' refers to a field or resource a container cannot read; valid fieldRef.fieldPath values are "
    + ", ".join(FIELD_PATHS)
    + ", metadata.labels['<key>'], metadata.annotations['<key>']; valid resourceFieldRef.resource values are "
    + ", ".join(RESOURCES),
    f"!has(self.env) || self.env.all(e, {_FIELD_OK} && {_RESOURCE_OK})",
    (f"self.env.filter(e, !({_FIELD_OK} && {_RESOURCE_OK}))[0].name",),
)
CONFIG_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
_KEY_REF_OK = " && ".join(
    f"(!has(e.valueFrom) || !has(e.valueFrom.{k}) || (e.valueFrom.{k}.name.matches({json.dumps(SUBDOMAIN_PATTERN)})"
    f" && e.valueFrom.{k}.key.matches({json.dumps(CONFIG_KEY_PATTERN)})))"
    for k in ("secretKeyRef", "configMapKeyRef")
)
ENV_KEY_REF = CrossFieldRule(
    "spec.serving.env",
    "spec.serving",
    "environment variable '%s' names a Secret or ConfigMap key that cannot exist; valid names are lower-case letters, digits, "
    "'-' and '.', starting and ending with a letter or digit, and valid keys are letters, digits, '-', '_' and '.'",
    f"!has(self.env) || self.env.all(e, {_KEY_REF_OK})",
    (f"self.env.filter(e, !({_KEY_REF_OK}))[0].name",),
)
_ENV_FROM_OK = (
    "((has(s.secretRef) ? 1 : 0) + (has(s.configMapRef) ? 1 : 0) == 1"
    f" && (!has(s.secretRef) || s.secretRef.name.matches({json.dumps(SUBDOMAIN_PATTERN)}))"
    f" && (!has(s.configMapRef) || s.configMapRef.name.matches({json.dumps(SUBDOMAIN_PATTERN)}))"
    f" && (!has(s.prefix) || s.prefix.matches({json.dumps(ENV_NAME_PATTERN)})))"
)
ENV_FROM = CrossFieldRule(
    "spec.serving.envFrom",
    "spec.serving",
    "%d envFrom entries are not valid; valid entries have exactly one of secretRef and configMapRef, a valid object name "
    "(lower-case letters, digits, '-' and '.'), and an optional prefix that is a valid variable name",
    f"!has(self.envFrom) || self.envFrom.all(s, {_ENV_FROM_OK})",
    (f"size(self.envFrom.filter(s, !{_ENV_FROM_OK}))",),
)
ENV_REFERENCES = (ENV_SOURCE, ENV_FIELD, ENV_KEY_REF, ENV_FROM)


def _env_source_ok(e: EnvVar) -> bool:
    if e.value_from is None:
        return True
    sources = [e.value_from.secret_key_ref, e.value_from.config_map_key_ref, e.value_from.field_ref, e.value_from.resource_field_ref]
    return e.value is None and sum(x is not None for x in sources) == 1


def _env_field_ok(e: EnvVar) -> bool:
    source = e.value_from
    if source is None:
        return True
    field_ok = (
        source.field_ref is None
        or source.field_ref.field_path in FIELD_PATHS
        or bool(re.match(FIELD_PATH_PATTERN, source.field_ref.field_path))
    )
    return field_ok and (source.resource_field_ref is None or source.resource_field_ref.resource in RESOURCES)


def _env_key_ref_ok(e: EnvVar) -> bool:
    refs = [] if e.value_from is None else [e.value_from.secret_key_ref, e.value_from.config_map_key_ref]
    return all(r is None or bool(re.match(SUBDOMAIN_PATTERN, r.name) and re.match(CONFIG_KEY_PATTERN, r.key)) for r in refs)


def _env_from_ok(s: EnvFromSource) -> bool:
    refs = [r for r in (s.secret_ref, s.config_map_ref) if r is not None]
    return (
        len(refs) == 1
        and bool(re.match(SUBDOMAIN_PATTERN, refs[0].name))
        and (s.prefix is None or bool(re.match(ENV_NAME_PATTERN, s.prefix)))
    )


def _check_env_references(spec: InferentiaModelSpec) -> list[Finding]:
    env = spec.serving.env or []
    found = []
    for rule, ok in ((ENV_SOURCE, _env_source_ok), (ENV_FIELD, _env_field_ok), (ENV_KEY_REF, _env_key_ref_ok)):
        bad = [e.name for e in env if not ok(e)]
        if bad:
            found.append(rule.finding(bad[0]))
    bad_from = [s for s in spec.serving.env_from or [] if not _env_from_ok(s)]
    if bad_from:
        found.append(ENV_FROM.finding(len(bad_from)))
    return found


# Names of the Secret and ServiceAccount the pods refer to: DNS-1123 subdomains (SUBDOMAIN_PATTERN).


def _object_name_rule(path: str, node: str, field: str, kind: str) -> CrossFieldRule:
    return CrossFieldRule(
        path,
        node,
        f"'%s' is not a valid {kind} name; valid names are lower-case letters, digits, '-' and '.', "
        "starting and ending with a letter or digit, at most 253 characters",
        f"!has(self.{field}) || self.{field}.matches({json.dumps(SUBDOMAIN_PATTERN)})",
        (f"self.{field}",),
    )


OBJECT_NAMES = {
    "storageSecret": _object_name_rule("spec.compile.storageSecret", "spec.compile", "storageSecret", "Secret"),
    "serviceAccountName": _object_name_rule("spec.serviceAccountName", "spec", "serviceAccountName", "ServiceAccount"),
}

# Values reach a process as one argument or one line of its env file: a line break or a
# NUL would cut them short or add a line of its own.
BREAK = r"[\x00\n\r]"


def _single_line_rule(path: str, node: str, items: str, what: str) -> CrossFieldRule:
    return CrossFieldRule(
        path,
        node,
        f"%d {what} contain a line break or NUL, which cannot reach the process intact; valid values are single lines",
        f"!has(self.{items.split('.')[0]}) || self.{items}.all(x, !x.matches({json.dumps(BREAK)}))",
        (f"size(self.{items}.filter(x, x.matches({json.dumps(BREAK)})))",),
    )


SINGLE_LINE = {
    "args": _single_line_rule("spec.serving.args", "spec.serving", "args", "arguments"),
    "env": CrossFieldRule(
        "spec.serving.env",
        "spec.serving",
        "%d environment values contain a line break or NUL, which cannot reach the process intact; valid values are single lines",
        f"!has(self.env) || self.env.all(e, !has(e.value) || !e.value.matches({json.dumps(BREAK)}))",
        (f"size(self.env.filter(e, has(e.value) && e.value.matches({json.dumps(BREAK)})))",),
    ),
    "extraArgs": _single_line_rule("spec.compile.extraArgs", "spec.compile", "extraArgs", "compiler arguments"),
}

IMAGE_TEMPLATE = "'%s' is not a valid image reference: it contains white space"
_WHITE_SPACE = json.dumps(r"\s")  # as a CEL string literal
IMAGE = {
    "serving": CrossFieldRule(
        "spec.serving.image", "spec.serving", IMAGE_TEMPLATE, f"!self.image.matches({_WHITE_SPACE})", ("self.image",)
    ),
    "compile": CrossFieldRule(
        "spec.compile.image", "spec.compile", IMAGE_TEMPLATE, f"!has(self.image) || !self.image.matches({_WHITE_SPACE})", ("self.image",)
    ),
}

# Rolling-update bounds, as the Deployment takes them: a count or a percentage, never
# negative, maxUnavailable at most 100%, and not both zero (the rollout could never move).
_INT_OR_PERCENT = r"^(0|[1-9][0-9]{0,8})%?$"


def _bound_rule(field: str, most: str) -> CrossFieldRule:
    value = f"string(self.{field})"
    percent_ok = f"!{value}.endsWith('%') || int({value}.replace('%', '')) <= {most}" if most else "true"
    # The percent signs travel as arguments: the template is also a CEL format() string.
    return CrossFieldRule(
        f"spec.rollout.{field}",
        "spec.rollout",
        "'%s' is not valid; valid values are a whole number or a percentage%s, for example 1 or %s",
        f"!has(self.{field}) || ({value}.matches({json.dumps(_INT_OR_PERCENT)}) && ({percent_ok}))",
        (value, literal(f" up to {most}%" if most else ""), literal("25%")),
    )


ROLLOUT_VALUE = {"maxSurge": _bound_rule("maxSurge", ""), "maxUnavailable": _bound_rule("maxUnavailable", "100")}
ROLLOUT_MOVES = CrossFieldRule(
    "spec.rollout",
    "spec.rollout",
    "maxSurge and maxUnavailable cannot both be 0: no replica could ever be replaced; valid values make at least one of them positive",
    "!(has(self.maxSurge) && has(self.maxUnavailable)"
    " && string(self.maxSurge) in ['0', '0%'] && string(self.maxUnavailable) in ['0', '0%'])",
    (),
)

# Autoscaling (spec.autoscaling): a range that is one, and a signal to scale on.
AUTOSCALING_RANGE = CrossFieldRule(
    "spec.autoscaling.minReplicas",
    "spec.autoscaling",
    "%d is larger than maxReplicas %d; valid values are at most maxReplicas",
    "!has(self.minReplicas) || self.minReplicas <= self.maxReplicas",
    ("self.minReplicas", "self.maxReplicas"),
)
_VLLM = "(has(self.serving.runtime) && self.serving.runtime == 'vllm')"
AUTOSCALING_SIGNAL = CrossFieldRule(
    "spec.autoscaling",
    "spec",
    "needs each replica's count of in-flight requests, which only the batching front end and vLLM export; "
    "valid specs also set spec.serving.batching, or spec.serving.runtime: vllm",
    f"!has(self.autoscaling) || has(self.serving.batching) || {_VLLM}",
    (),
)
AUTOSCALING_TARGET = CrossFieldRule(
    "spec.autoscaling.targetInFlight",
    "spec",
    "is required for vLLM without spec.serving.batching, whose sequence limit is vLLM's own default; "
    "set it, or set spec.serving.batching.maxBatchSize (vLLM's --max-num-seqs), from which it defaults",
    f"!has(self.autoscaling) || has(self.autoscaling.targetInFlight) || has(self.serving.batching) || !{_VLLM}",
    (),
)

AUTOSCALING_ZERO = CrossFieldRule(
    "spec.autoscaling.minReplicas",
    "spec",
    "0 needs spec.compile.image: a replica that starts from zero must fetch its compiled artefact, not compile the model "
    "as it starts (tens of minutes for a large model, aws-neuron-sdk#1368); valid values without it are at least 1",
    "!has(self.autoscaling) || !has(self.autoscaling.minReplicas) || self.autoscaling.minReplicas > 0"
    " || (has(self.compile) && has(self.compile.image))",
    (),
)

CEL_RULES: list[CrossFieldRule] = [
    NAME,
    ONE_REQUEST,
    FITS_FAMILY,
    *ALLOWED_CHIPS.values(),
    CORES_LNC,
    CORES_FIT,
    *CORES_SHAPE.values(),
    UNKNOWN_INSTANCE_TYPE,
    SMALL_INSTANCE_TYPES,
    HOST_FITS,
    LNC_VALUE,
    DIVISIBLE,
    DIVISIBLE_CORES,
    *TENSOR_PARALLEL_GROUP.values(),
    DRA_FAMILY,
    DRA_CORES,
    DRA_CONNECTED,
    VLLM_FAMILY,
    TENSORFLOW_COMPILE,
    COMPILE_STORE,
    FP32_CNN_BATCH,
    BUCKET_DIMENSIONS,
    BUCKET_DUPLICATE,
    BUCKET_BOUND,
    *WEIGHTS_FIT.values(),
    *QUANTITY.values(),
    *COMPILE_QUANTITY.values(),
    *SCRATCH_QUANTITY.values(),
    HUGEPAGES_WHOLE,
    PORTS_FIT,
    ENV_NAME,
    *ENV_REFERENCES,
    *OBJECT_NAMES.values(),
    *SINGLE_LINE.values(),
    *IMAGE.values(),
    *ROLLOUT_VALUE.values(),
    ROLLOUT_MOVES,
    AUTOSCALING_RANGE,
    AUTOSCALING_SIGNAL,
    AUTOSCALING_TARGET,
    AUTOSCALING_ZERO,
]


def _check_one_request(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    if spec.compute.one_request:
        return []
    return [ONE_REQUEST.finding("both are set" if spec.compute.inf is not None else "neither is set")]


def _check_fits_family(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    name, most = fam.largest_instance
    if spec.compute.inf is None or spec.compute.inf <= most:
        return []
    return [FITS_FAMILY.finding(spec.compute.inf, fam.name, name, most, most)]


def _check_allowed_chip_counts(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    allowed, inf = fam.allowed_chip_counts, spec.compute.inf
    if allowed is None or inf is None or inf in allowed:
        return []
    return [ALLOWED_CHIPS[fam.name].finding(fam.name, or_list(list(allowed)), inf, format_list(list(allowed)))]


def _check_core_request(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    cores, lnc = spec.compute.cores, lnc_of(spec, fam)
    if cores is None:
        return []
    if lnc != 1:
        return [CORES_LNC.finding(fam.name, lnc)]
    most = fam.cores_per_chip(1) * fam.max_chips
    if cores > most:
        return [CORES_FIT.finding(cores, fam.name, fam.largest_instance[0], most, most)]
    if fam.name in CORES_SHAPE and cores not in core_request_counts(fam, 1):
        return [CORES_SHAPE[fam.name].finding(cores, format_list(core_request_counts(fam, 1)))]
    return []


def _check_instance_types(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    listed = spec.compute.instance_types
    if listed is None:
        return []
    unknown = [t for t in listed if t not in fam.instance_chips]
    if unknown:
        return [UNKNOWN_INSTANCE_TYPE.finding(unknown[0], fam.name, format_list(list(fam.instance_chips)))]
    if not spec.compute.one_request or lnc_of(spec, fam) not in fam.lnc_values:
        return []  # no chip count to compare (LNC_VALUE and ONE_REQUEST say why)
    inf = chips_needed(spec, fam)
    if inf > fam.max_chips or any(fam.instance_chips[t] >= inf for t in listed):
        return []
    large_enough = [t for t, chips in fam.instance_chips.items() if chips >= inf]
    return [SMALL_INSTANCE_TYPES.finding(inf, fam.name, inf, format_list(large_enough))]


def _check_host_fits(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    c = spec.compute
    cpu, memory = quantity(c.cpu), quantity(c.memory)
    if not (re.match(QUANTITY_GRAMMAR, c.cpu) and re.match(QUANTITY_GRAMMAR, c.memory)) or cpu is None or memory is None:
        return []
    if not c.one_request or lnc_of(spec, fam) not in fam.lnc_values:
        return []
    chips = chips_needed(spec, fam)
    if chips > fam.max_chips:
        return []
    if c.instance_types and any(t not in fam.instance_chips for t in c.instance_types):
        return []
    considered = c.instance_types or list(fam.instance_chips)
    with_chips = [t for t in considered if fam.instance_chips[t] >= chips]
    if not with_chips or any(host_fits(t, float(cpu) * 1000, float(memory)) for t in with_chips):
        return []
    return [HOST_FITS.finding(c.cpu, c.memory, fam.name, CHIPS_TEXT[chips], HOST_TEXT[fam.name])]


def _check_lnc(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    lnc = spec.compute.lnc
    if lnc is None or lnc in fam.lnc_values:
        return []
    return [LNC_VALUE.finding(lnc, fam.name, format_list(sorted(fam.lnc_values)))]


def _check_divisibility(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    inf, p = spec.compute.inf, spec.processes_per_replica
    cores = replica_cores(spec, fam)
    if not request_ok(spec, fam) or cores % p == 0:
        return []
    if inf is None:
        return [DIVISIBLE_CORES.finding(cores, fam.name, p, format_list(divisors(cores)))]
    chips = "chip" if inf == 1 else "chips"
    return [DIVISIBLE.finding(inf, fam.name, chips, cores, p, format_list(divisors(cores)))]


def _check_tensor_parallel(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    group = group_size_of(spec, fam)
    if group is None or fam.name not in TENSOR_PARALLEL_GROUP or fam.tensor_parallel_ok(group):
        return []
    cores = replica_cores(spec, fam)
    valid = format_list(tensor_parallel_processes(fam, cores))
    return [TENSOR_PARALLEL_GROUP[fam.name].finding(group, cores, valid)]


def _check_allocation(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    # Three independent rules, as the API server runs them: a spec may break all three.
    if spec.compute.allocation != "dra":
        return []
    found = []
    if fam.dra_groups is None:
        found.append(DRA_FAMILY.finding(fam.name, fam.name))
    if spec.compute.cores is not None:
        found.append(DRA_CORES.finding(spec.compute.cores))
    inf = spec.compute.inf or 0
    if inf > 1 and not fam.dra_groups:
        found.append(DRA_CONNECTED.finding(inf, fam.name, fam.name))
    return found


def _check_runtime(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    if spec.serving.runtime == "vllm" and not fam.neuronx:
        return [VLLM_FAMILY.finding(fam.name, fam.name)]
    return []


def _check_programs(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    """What the operator's compile program and model server need, and what starts without them."""
    found = []
    if spec.model.framework == "tensorflow" and spec.compile.image:
        found.append(TENSORFLOW_COMPILE.finding())
    if spec.compile.image:
        store = spec.compile.output_uri or spec.model.uri
        if not store.startswith("s3://"):
            found.append(COMPILE_STORE.finding(store))
    programs = spec.compiles_with_program or (spec.serves_with_program and not spec.compile.image)
    if programs and not spec.compile.buckets:
        found.append(
            Finding(
                "spec.compile.buckets",
                "the operator's compile program (without compile.image, its model server at start) traces the model with "
                "example inputs of each bucket's shape, and none is set, so it fails; set the input shape without the batch "
                "dimension, for example [[3, 224, 224]]",
                "warning",
            )
        )
    uri = spec.model.uri
    if programs and not uri.startswith(("s3://", "https://", "/", "file:///")):
        found.append(
            Finding(
                "spec.model.uri",
                f"'{uri}' is neither s3://, https:// nor an absolute path in the image, so the compile program cannot read "
                "the model; valid values look like s3://bucket/model.pt, https://host/model.pt or /models/model.pt",
                "warning",
            )
        )
    if not spec.serving.args and spec.serving.runtime == "custom" and not spec.serves_with_program and spec.processes_per_replica > 1:
        found.append(
            Finding(
                "spec.serving.args",
                f"with {spec.processes_per_replica} processes, no args and a {spec.model.framework} model (the operator's "
                "model server runs PyTorch only), the image's own entry point runs once and must start every process "
                "itself from /etc/inferentia/env-<i>, which AWS's images do not; set args to the per-process command",
                "warning",
            )
        )
    return found


def _check_neuron_cc_options(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    """Options that only neuron-cc (inf1) has: set on a neuronx-cc family, they mean nothing."""
    if not fam.neuronx or isinstance(spec.compile.static_weights, str):
        return []
    return [
        Finding(
            "spec.compile.staticWeights",
            f"{str(spec.compile.static_weights).lower()} has no effect on {fam.name}: static weights are a neuron-cc "
            "(inf1) option, and neuronx-cc has no --static-weights; remove it or leave it at auto",
            "warning",
        )
    ]


def _check_cnn_batch(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    model, b = spec.model, spec.compile.batch_size
    if fam.neuronx or model.architecture != "cnn" or b <= 1:
        return []  # the CNN batch limits are neuron-cc's
    if model.precision == "fp32":
        return [FP32_CNN_BATCH.finding(b)]
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


def _check_bucket_shapes(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    buckets = [list(b) for b in spec.compile.buckets or []]
    found = []
    if any(len(b) != len(buckets[0]) for b in buckets):
        found.append(BUCKET_DIMENSIONS.finding(str([len(b) for b in buckets]), len(buckets[0])))
    duplicates = [b for b in buckets if buckets.count(b) > 1]
    if duplicates:
        found.append(BUCKET_DUPLICATE.finding(str(duplicates[0])))
    return found


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
    if buckets and len(buckets) > bound:
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


def _check_memory_fit(spec: InferentiaModelSpec, fam: Family, lnc: int, group: int) -> list[Finding]:
    """The weights, then the KV cache where it is known, against a process's device memory."""
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
    need = weights_only + kv
    if need <= has:
        return []
    seqs = sequences(spec)
    assert seqs is not None and m.layers and m.kv_heads and m.head_dim
    text = KV_FIT[request] % (
        m.weights, m.precision, -(-kv // GIB), m.layers, m.kv_heads, m.head_dim, *seqs,
        -(-need // GIB), has // GIB, group, core_word, *valid(True),
    )  # fmt: skip
    return [Finding(f"spec.compute.{request}", text)]


def gib(size: int) -> str:
    """Bytes as people read them: 8 GiB, 1.5 GiB."""
    return f"{size / 2**30:.3g} GiB"


# Warnings only: allowed, but probably not what the user wants.
def _check_advice(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    p, group = spec.processes_per_replica, group_size_of(spec, fam)
    if group is None:
        return []
    cores, per_chip = replica_cores(spec, fam), fam.cores_per_chip(lnc_of(spec, fam))
    found = []
    if group < per_chip and per_chip % group or group > per_chip and group % per_chip:
        found.append(
            Finding(
                "spec.processesPerReplica",
                f"groups of {group} NeuronCores straddle chip boundaries ({per_chip} cores per chip); "
                f"values giving whole-chip or in-chip groups: "
                f"{format_list([d for d in divisors(cores) if (cores // d) % per_chip == 0 or per_chip % (cores // d) == 0])}",
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
    # vLLM batches sequences itself (--max-num-seqs); the compiled batch size is not its limit.
    if (
        batching
        and spec.serving.runtime != "vllm"
        and batching.max_batch_size > spec.compile.batch_size
        and not spec.compile.dynamic_batch_size
    ):
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
                f"throughput is usually best with one NeuronCore per group (processesPerReplica: {cores}); {p} gives groups of {group}",
                "warning",
            )
        )
    if spec.compile.optimize_for == "latency" and group == 1 and cores > 1:
        how = "tensor parallel" if fam.neuronx else "NeuronCore pipeline"
        found.append(
            Finding(
                "spec.processesPerReplica",
                f"latency usually improves with larger groups ({how}); {p} gives groups of 1 core",
                "warning",
            )
        )
    return found


def _check_child_values(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    """The values the API server would refuse in a child."""
    found = []
    for field, value in (("cpu", spec.compute.cpu), ("memory", spec.compute.memory)):
        if not re.match(QUANTITY_GRAMMAR, value):
            found.append(QUANTITY[field].finding(value))
    for field, optional in (("cpu", spec.compile.cpu), ("memory", spec.compile.memory)):
        if optional is not None and not re.match(QUANTITY_GRAMMAR, optional):
            found.append(COMPILE_QUANTITY[field].finding(optional))
    for field, value in (("homeSize", spec.serving.home_size), ("tmpSize", spec.serving.tmp_size)):
        if not re.match(QUANTITY_GRAMMAR, value):
            found.append(SCRATCH_QUANTITY[field].finding(value))
    hugepages = spec.compute.hugepages
    if hugepages is not None and not _whole_hugepages(hugepages):
        found.append(HUGEPAGES_WHOLE.finding(hugepages))
    port = spec.serving.port
    p = spec.processes_per_replica + (1 if spec.has_batching_front_end else 0)
    if port + p - 1 > 65535:
        found.append(PORTS_FIT.finding(port, port + p - 1, p, 65536 - p))
    env = spec.serving.env or []
    bad_names = [e.name for e in env if not re.match(ENV_NAME_PATTERN, e.name)]
    if bad_names:
        found.append(ENV_NAME.finding(bad_names[0]))
    found += _check_env_references(spec)
    for key, name in (("storageSecret", spec.compile.storage_secret), ("serviceAccountName", spec.service_account_name)):
        if name is not None and not re.match(SUBDOMAIN_PATTERN, name):
            found.append(OBJECT_NAMES[key].finding(name))
    for key, values in (
        ("args", spec.serving.args or []),
        ("env", [e.value for e in env if e.value is not None]),
        ("extraArgs", spec.compile.extra_args or []),
    ):
        broken = sum(1 for v in values if re.search(BREAK, v))
        if broken:
            found.append(SINGLE_LINE[key].finding(broken))
    for key, image in (("serving", spec.serving.image), ("compile", spec.compile.image)):
        if image is not None and re.search(r"\s", image):
            found.append(IMAGE[key].finding(image))
    bounds = {"maxSurge": spec.rollout.max_surge, "maxUnavailable": spec.rollout.max_unavailable}
    for key, bound in bounds.items():
        text = str(bound)
        if not re.match(_INT_OR_PERCENT, text) or (key == "maxUnavailable" and text.endswith("%") and int(text[:-1]) > 100):
            found.append(ROLLOUT_VALUE[key].finding(text, " up to 100%" if key == "maxUnavailable" else "", "25%"))
    if all(str(v) in ("0", "0%") for v in bounds.values()):
        found.append(ROLLOUT_MOVES.finding())
    return found


def _check_autoscaling(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    a = spec.autoscaling
    if a is None:
        return []
    found = []
    if a.min_replicas > a.max_replicas:
        found.append(AUTOSCALING_RANGE.finding(a.min_replicas, a.max_replicas))
    vllm = spec.serving.runtime == "vllm"
    if spec.serving.batching is None and not vllm:
        found.append(AUTOSCALING_SIGNAL.finding())
    if vllm and spec.serving.batching is None and a.target_in_flight is None:
        found.append(AUTOSCALING_TARGET.finding())
    if a.min_replicas == 0 and spec.compile.image is None:
        found.append(AUTOSCALING_ZERO.finding())
    elif spec.compile.image is None:
        found.append(
            Finding(
                "spec.autoscaling",
                "without spec.compile.image every new replica compiles the model as it starts (for a large model, tens of "
                "minutes: aws-neuron-sdk#1368), so a scale-up comes late; set spec.compile.image to compile once, "
                "and new replicas only fetch the artefact",
                "warning",
            )
        )
    return found


_CHECKS = (
    _check_child_values,
    _check_one_request,
    _check_fits_family,
    _check_allowed_chip_counts,
    _check_core_request,
    _check_instance_types,
    _check_host_fits,
    _check_lnc,
    _check_divisibility,
    _check_tensor_parallel,
    _check_allocation,
    _check_runtime,
    _check_programs,
    _check_neuron_cc_options,
    _check_cnn_batch,
    _check_bucket_shapes,
    _check_weights,
    _check_autoscaling,
    _check_advice,
)


def check_spec(spec: InferentiaModelSpec) -> list[Finding]:
    """Every cross-field finding for a spec that parsed."""
    fam = FAMILIES[spec.compute.family]
    return [finding for check in _CHECKS for finding in check(spec, fam)]
