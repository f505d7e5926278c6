"""The CRD's own CEL rules, run by a CEL interpreter, give the verdicts and messages that
validate gives: on every spec of the one-verdict corpus, every sample and generated specs
near the rules' edges.

The rules package writes each cross-field rule twice, in Python for validate and the operator and in
CEL for the API server (docs/design.md, "Validation" says why the CLI does not run the CEL
itself). The real API server judges the corpus in tests/e2e/test_control_plane.py. This test
runs the same CEL here, without a cluster, through common-expression-language (the Rust
cel-interpreter), so that a twin drifting from its rule fails the unit suite, on thousands of
specs the end-to-end corpus cannot afford.

The Kubernetes library functions the rules call are in tests/crd_cel.py.
"""

from __future__ import annotations

import glob
import re
from pathlib import Path
from typing import Any

import cel
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corpus import CEL_CASES, DIVERGENCE_CORPUS
from crd_cel import KUBERNETES_LIBRARY, node_at, spec_rules
from inferentia_operator.core.findings import Finding, errors
from inferentia_operator.core.parsing import parse_spec
from inferentia_operator.core.rules import KV_FIT, NODES_KV_FIT, STATIC_WEIGHTS_TOO_LARGE, TOKENS_PAST_MAX_MODEL_LEN
from specs import DROP, make_spec

ROOT = Path(__file__).resolve().parent.parent

# Every rule, compiled, with the path of its node.
RULES = [(path, cel.compile(rule), cel.compile(message)) for path, rule, message in spec_rules()]


def broken_rules(spec: dict[str, Any]) -> list[int]:
    """The indexes in RULES of the rules a spec (defaulted, as the API server defaults it) breaks."""
    broken = []
    for index, (path, rule, _message) in enumerate(RULES):
        node = node_at(spec, path)
        if node is not None and not rule.execute(cel.Context(variables={"self": node}, functions=KUBERNETES_LIBRARY)):
            broken.append(index)
    return broken


def refused_by_cel(spec: dict[str, Any]) -> list[str]:
    """The messages of the rules a spec breaks, as the API server renders them."""
    messages = []
    for index in broken_rules(spec):
        path, _rule, message = RULES[index]
        messages.append(message.execute(cel.Context(variables={"self": node_at(spec, path)}, functions=KUBERNETES_LIBRARY)))
    return sorted(messages)


def _without_twin(finding: Finding) -> bool:
    """Rules that CEL cannot express (rules.memory says why): the KV cache, static weights and the
    speculative tokens against max_model_len (rules.speculation)."""
    templates = [*KV_FIT.values(), NODES_KV_FIT, STATIC_WEIGHTS_TOO_LARGE, TOKENS_PAST_MAX_MODEL_LEN]
    pattern = [re.escape(t).replace("%d", r"-?\d+").replace("%s", ".*") for t in templates]
    return any(re.fullmatch(p, finding.message) for p in pattern)


def assert_one_verdict(raw: dict[str, Any]) -> None:
    spec, found = parse_spec(raw)
    if spec is None:
        return  # refused by the schema, before any CEL rule runs
    # The API server runs the rules on what was written, with its defaults filled in: a value
    # the models read differently (text "01" read as the count 1) must still get one verdict.
    as_written = _over(spec.model_dump(by_alias=True, exclude_none=True, mode="json"), raw)
    by_python = sorted(f.message for f in errors(found) if not _without_twin(f))
    assert refused_by_cel(as_written) == by_python, raw


def _over(defaults: Any, written: Any) -> Any:
    """``written`` with ``defaults`` filled in where an object lacks a field. A null is no field:
    the API server prunes nulls of fields that are not nullable before it defaults."""
    if isinstance(defaults, dict) and isinstance(written, dict):
        given = {key: _over(defaults.get(key), value) for key, value in written.items() if value is not None}
        return {**defaults, **given}
    return written


def test_the_interpreter_runs_every_rule_and_each_can_refuse():
    """Every rule compiles, and the corpus sees each one refuse: a rule that never refuses
    here would make this test vacuous for it."""
    refusing = set()
    for raw in CEL_CASES.values():
        spec, _ = parse_spec(raw)
        assert spec is not None
        refusing.update(broken_rules(spec.model_dump(by_alias=True, exclude_none=True, mode="json")))
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
    "disaggregation": _maybe(
        [
            {},
            {"prefill": {"autoscaling": {"minReplicas": 0, "maxReplicas": 2}}, "decode": {"autoscaling": {"maxReplicas": 2}}},
            {"prefill": {"replicas": 0, "autoscaling": {"minReplicas": 3, "maxReplicas": 2, "targetWaiting": 2}}},
            {"decode": {"autoscaling": {"maxReplicas": 3, "targetRunning": 4, "targetKvCachePercent": 70}}},
        ]
    ),
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
