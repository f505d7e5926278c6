"""The CRD's own CEL rules, run by a CEL interpreter, give the verdicts and messages that
validate gives: on every spec of the one-verdict corpus, every sample and generated specs
near the rules' edges.

The rules package writes each cross-field rule twice, in Python for validate and the operator and in
CEL for the API server (docs/design.md, "Validation" says why the CLI does not run the CEL
itself). The real API server judges the corpus in tests/e2e/test_control_plane.py. This test
runs the same CEL here, without a cluster, through common-expression-language (the Rust
cel-interpreter), so that a twin drifting from its rule fails the unit suite, on thousands of
specs the end-to-end corpus cannot afford.

Kubernetes adds library functions to CEL; the rules call the quantity library's isQuantity,
quantity, isInteger, asInteger and compareTo, and the strings library's format and replace
(https://kubernetes.io/docs/reference/using-api/cel/). They are written here, for this test only,
from the quantity grammar in Kubernetes' API reference
(https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/quantity/).
"""

from __future__ import annotations

import glob
import re
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import cel
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corpus import CEL_CASES, DIVERGENCE_CORPUS
from inferentia_operator.core.crd import crd
from inferentia_operator.core.findings import Finding, errors
from inferentia_operator.core.parsing import parse_spec
from inferentia_operator.core.rules import KV_FIT, STATIC_WEIGHTS_TOO_LARGE
from specs import DROP, make_spec

ROOT = Path(__file__).resolve().parent.parent

# <signedNumber><suffix>: binary SI, decimal SI (n and u included, as ParseQuantity takes
# them) or a decimal exponent.
_QUANTITY = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$")
_SUFFIX = {
    **{s: Decimal(1024) ** (i + 1) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
    **{s: Decimal(10) ** e for s, e in (("n", -9), ("u", -6), ("m", -3), ("k", 3), ("M", 6), ("G", 9), ("T", 12), ("P", 15), ("E", 18))},
}


def _amount(text: str) -> Decimal:
    match = _QUANTITY.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a quantity")
    number, suffix = match.groups()
    if suffix is None:
        return Decimal(number)
    if suffix in _SUFFIX:
        return Decimal(number) * _SUFFIX[suffix]
    return Decimal(number) * Decimal(10) ** int(suffix[1:])  # an exponent: e3, E-2


def _is_quantity(text: str) -> bool:
    try:
        _amount(text)
    except (ValueError, InvalidOperation):
        return False
    return True


def _compare(a: str, b: str) -> int:
    x, y = _amount(a), _amount(b)
    return (x > y) - (x < y)


KUBERNETES_LIBRARY = {
    "isQuantity": _is_quantity,
    "quantity": lambda text: text,  # a quantity travels as its text; the methods parse it
    "isInteger": lambda q: _amount(q) == _amount(q).to_integral_value(),
    "asInteger": lambda q: int(_amount(q)),
    "compareTo": _compare,
    "format": lambda template, args: template % tuple(args),
    "replace": lambda text, old, new: text.replace(old, new),
}


def _rules_by_node() -> list[tuple[tuple[str, ...], Any, Any]]:
    """Every CEL rule of the spec, compiled, with the path of the node it sits on."""
    found: list[tuple[tuple[str, ...], Any, Any]] = []

    def walk(node: dict[str, Any], path: tuple[str, ...]) -> None:
        for rule in node.get("x-kubernetes-validations", []):
            found.append((path, cel.compile(rule["rule"]), cel.compile(rule["messageExpression"])))
        for name, child in node.get("properties", {}).items():
            walk(child, (*path, name))

    walk(crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"], ())
    return found


RULES = _rules_by_node()


def refused_by_cel(spec: dict[str, Any]) -> list[str]:
    """The messages of the rules a spec (defaulted, as the API server defaults it) breaks."""
    messages = []
    for path, rule, message in RULES:
        node: Any = spec
        for name in path:
            node = node.get(name) if isinstance(node, dict) else None
        if node is None:
            continue  # the API server runs a rule only where its node is present
        context = cel.Context(variables={"self": node}, functions=KUBERNETES_LIBRARY)
        if not rule.execute(context):
            messages.append(message.execute(context))
    return sorted(messages)


def _without_twin(finding: Finding) -> bool:
    """Rules that CEL cannot express (rules.memory says why): the KV cache and static weights."""
    templates = [*KV_FIT.values(), STATIC_WEIGHTS_TOO_LARGE]
    pattern = [re.escape(t).replace("%d", r"-?\d+").replace("%s", ".*") for t in templates]
    return any(re.fullmatch(p, finding.message) for p in pattern)


def assert_one_verdict(raw: dict[str, Any]) -> None:
    spec, found = parse_spec(raw)
    if spec is None:
        return  # refused by the schema, before any CEL rule runs
    defaulted = spec.model_dump(by_alias=True, exclude_none=True, mode="json")
    by_python = sorted(f.message for f in errors(found) if not _without_twin(f))
    assert refused_by_cel(defaulted) == by_python, raw


def test_the_interpreter_runs_every_rule_and_each_can_refuse():
    """Every rule compiles, and the corpus sees each one refuse: a rule that never refuses
    here would make this test vacuous for it."""
    refusing = set()
    for raw in CEL_CASES.values():
        spec, _ = parse_spec(raw)
        assert spec is not None
        defaulted = spec.model_dump(by_alias=True, exclude_none=True, mode="json")
        for index, (path, rule, _message) in enumerate(RULES):
            node: Any = defaulted
            for name in path:
                node = node.get(name) if isinstance(node, dict) else None
            if node is not None and not rule.execute(cel.Context(variables={"self": node}, functions=KUBERNETES_LIBRARY)):
                refusing.add(index)
    assert len(RULES) > 40
    assert sorted(set(range(len(RULES))) - refusing) == []


@pytest.mark.parametrize("raw", [*CEL_CASES.values(), *[make_spec(**o) for o in DIVERGENCE_CORPUS]], ids=lambda r: repr(r)[:60])
def test_the_corpus_gets_one_verdict(raw):
    assert_one_verdict(raw)


@pytest.mark.parametrize("sample", sorted(glob.glob(str(ROOT / "manifests" / "samples" / "*.yaml"))), ids=lambda p: Path(p).name)
def test_the_samples_get_one_verdict(sample):
    assert_one_verdict(yaml.safe_load(Path(sample).read_text())["spec"])


def _maybe(values: list[Any]) -> st.SearchStrategy[Any]:
    return st.sampled_from([DROP, *values])


# Values at and around the rules' edges: sizes each family can and cannot place, groups that
# divide or not, weights that fit a core, a chip or nothing, quantities, ports, bounds.
EDGES = {
    "compute.family": st.sampled_from(["inf1", "inf2", "trn1", "trn2", "trn3"]),
    "compute.inf": _maybe([1, 2, 3, 4, 6, 8, 12, 16, 17, 32]),
    "compute.cores": _maybe([1, 2, 3, 4, 8, 16, 24, 25, 32, 64, 128, 129]),
    "compute.lnc": _maybe([1, 2, 4]),
    "processesPerReplica": st.sampled_from([1, 2, 3, 4, 8, 16, 24]),
    "compute.instanceTypes": _maybe([["inf2.xlarge"], ["inf2.48xlarge"], ["trn1.32xlarge"], ["trn2.48xlarge"], ["inf1.6xlarge"]]),
    "compute.cpu": _maybe(["1", "4", "3920m", "200", "1.2.3"]),
    "compute.memory": _maybe(["2Gi", "16Gi", "300Gi", "-1Gi"]),
    "compute.allocation": _maybe(["dra", "devicePlugin"]),
    "compute.hugepages": _maybe(["256Mi", "3Mi", "0"]),
    "model.weights": _maybe([100_000_000, 3_000_000_000, 20_000_000_000, 70_000_000_000]),
    "model.precision": _maybe(["fp32", "fp16", "bf16"]),
    "model.architecture": _maybe(["cnn", "transformer"]),
    "model.framework": _maybe(["tensorflow"]),
    "model.uri": _maybe(["https://example.com/model.pt"]),
    "compile.batchSize": _maybe([1, 2, 8]),
    "compile.buckets": _maybe([[[1], [2], [3]], [[64], [128, 128]], [[5], [5]], [[128]] * 1]),
    "compile.image": _maybe(["example.com/c:1", "example.com/c :1"]),
    "compile.outputUri": _maybe(["s3://b/out/", "gs://b/out/"]),
    "serving.runtime": _maybe(["vllm", "custom"]),
    "serving.batching": _maybe([{"maxBatchSize": 2}]),
    "serving.port": _maybe([8080, 65533]),
    "serving.args": _maybe([["serve"], ["a\nb"]]),
    "autoscaling": _maybe([{"maxReplicas": 2}, {"minReplicas": 0, "maxReplicas": 2}, {"minReplicas": 3, "maxReplicas": 2}]),
    "rollout.maxSurge": _maybe([0, "0%", "250%", -1]),
    "rollout.maxUnavailable": _maybe([0, "101%", 1]),
}


@st.composite
def specs_near_the_edges(draw: st.DrawFn) -> dict[str, Any]:
    fields = draw(st.sets(st.sampled_from(sorted(EDGES)), min_size=1, max_size=8))
    return make_spec(**{field: draw(EDGES[field]) for field in sorted(fields | {"compute.family"})})


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs_near_the_edges())
def test_generated_specs_get_one_verdict(raw):
    assert_one_verdict(raw)
