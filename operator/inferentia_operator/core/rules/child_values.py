"""What the API server would refuse in a child, refused on the model instead (one verdict)."""

from __future__ import annotations

import json
import re

from inferentia_operator.core.api import EnvFromSource, EnvVar, InferentiaModelSpec
from inferentia_operator.core.catalogue import HUGEPAGE_BYTES, Family
from inferentia_operator.core.cel import (
    CrossFieldRule,
    literal,
)
from inferentia_operator.core.drift import quantity
from inferentia_operator.core.findings import Finding

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
    amount = quantity(value) if re.fullmatch(QUANTITY_GRAMMAR, value) else None
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
        or bool(re.fullmatch(FIELD_PATH_PATTERN, source.field_ref.field_path))
    )
    return field_ok and (source.resource_field_ref is None or source.resource_field_ref.resource in RESOURCES)


def _env_key_ref_ok(e: EnvVar) -> bool:
    refs = [] if e.value_from is None else [e.value_from.secret_key_ref, e.value_from.config_map_key_ref]
    return all(r is None or bool(re.fullmatch(SUBDOMAIN_PATTERN, r.name) and re.fullmatch(CONFIG_KEY_PATTERN, r.key)) for r in refs)


def _env_from_ok(s: EnvFromSource) -> bool:
    refs = [r for r in (s.secret_ref, s.config_map_ref) if r is not None]
    return (
        len(refs) == 1
        and bool(re.fullmatch(SUBDOMAIN_PATTERN, refs[0].name))
        and (s.prefix is None or bool(re.fullmatch(ENV_NAME_PATTERN, s.prefix)))
    )


def object_name_rule(path: str, node: str, field: str, kind: str) -> CrossFieldRule:
    return CrossFieldRule(
        path,
        node,
        f"'%s' is not a valid {kind} name; valid names are lower-case letters, digits, '-' and '.', "
        "starting and ending with a letter or digit, at most 253 characters",
        f"!has(self.{field}) || self.{field}.matches({json.dumps(SUBDOMAIN_PATTERN)})",
        (f"self.{field}",),
    )


OBJECT_NAMES = {
    "storageSecret": object_name_rule("spec.compile.storageSecret", "spec.compile", "storageSecret", "Secret"),
    "serviceAccountName": object_name_rule("spec.serviceAccountName", "spec", "serviceAccountName", "ServiceAccount"),
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
INT_OR_PERCENT = r"^(0|[1-9][0-9]{0,8})%?$"


def bound_rule(field: str, most: str, node: str = "spec.rollout") -> CrossFieldRule:
    value = f"string(self.{field})"
    percent_ok = f"!{value}.endsWith('%') || int({value}.replace('%', '')) <= {most}" if most else "true"
    # The percent signs travel as arguments: the template is also a CEL format() string.
    return CrossFieldRule(
        f"{node}.{field}",
        node,
        "'%s' is not valid; valid values are a whole number or a percentage%s, for example 1 or %s",
        f"!has(self.{field}) || ({value}.matches({json.dumps(INT_OR_PERCENT)}) && ({percent_ok}))",
        (value, literal(f" up to {most}%" if most else ""), literal("25%")),
    )


ROLLOUT_VALUE = {"maxSurge": bound_rule("maxSurge", ""), "maxUnavailable": bound_rule("maxUnavailable", "100")}


def bound_findings(rule: CrossFieldRule, value: int | str, most: str) -> list[Finding]:
    """``rule``'s finding when ``value`` is no count or percentage (above ``most`` per cent, if given)."""
    text = str(value)
    if re.fullmatch(INT_OR_PERCENT, text) and not (most and text.endswith("%") and int(text[:-1]) > int(most)):
        return []
    return [rule.finding(text, f" up to {most}%" if most else "", "25%")]


ROLLOUT_MOVES = CrossFieldRule(
    "spec.rollout",
    "spec.rollout",
    "maxSurge and maxUnavailable cannot both be 0: no replica could ever be replaced; valid values make at least one of them positive",
    "!(has(self.maxSurge) && has(self.maxUnavailable)"
    " && string(self.maxSurge) in ['0', '0%'] && string(self.maxUnavailable) in ['0', '0%'])",
    (),
)


def _check_child_values(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    """The values the API server would refuse in a child."""
    found = []
    for field, value in (("cpu", spec.compute.cpu), ("memory", spec.compute.memory)):
        if not re.fullmatch(QUANTITY_GRAMMAR, value):
            found.append(QUANTITY[field].finding(value))
    for field, optional in (("cpu", spec.compile.cpu), ("memory", spec.compile.memory)):
        if optional is not None and not re.fullmatch(QUANTITY_GRAMMAR, optional):
            found.append(COMPILE_QUANTITY[field].finding(optional))
    for field, scratch in (("homeSize", spec.serving.home_size), ("tmpSize", spec.serving.tmp_size)):
        if scratch is not None and not re.fullmatch(QUANTITY_GRAMMAR, scratch):
            found.append(SCRATCH_QUANTITY[field].finding(scratch))
    hugepages = spec.compute.hugepages
    if hugepages is not None and not _whole_hugepages(hugepages):
        found.append(HUGEPAGES_WHOLE.finding(hugepages))
    port = spec.serving.port
    p = spec.processes_per_replica + (1 if spec.has_batching_front_end else 0)
    if port + p - 1 > 65535:
        found.append(PORTS_FIT.finding(port, port + p - 1, p, 65536 - p))
    env = spec.serving.env or []
    bad_names = [e.name for e in env if not re.fullmatch(ENV_NAME_PATTERN, e.name)]
    if bad_names:
        found.append(ENV_NAME.finding(bad_names[0]))
    found += _check_env_references(spec)
    for key, name in (("storageSecret", spec.compile.storage_secret), ("serviceAccountName", spec.service_account_name)):
        if name is not None and not re.fullmatch(SUBDOMAIN_PATTERN, name):
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
    found += bound_findings(ROLLOUT_VALUE["maxSurge"], spec.rollout.max_surge, "")
    found += bound_findings(ROLLOUT_VALUE["maxUnavailable"], spec.rollout.max_unavailable, "100")
    if all(str(v) in ("0", "0%") for v in bounds.values()):
        found.append(ROLLOUT_MOVES.finding())
    return found


RULES: list[CrossFieldRule] = [
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
]
CHECKS = (_check_child_values,)
