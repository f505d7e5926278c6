"""render prints what a converged reconcile has written: the same parts (each core/<feature>/part.py), with
nothing observed. A reconcile is run to its fixed point here against an API server that
makes everything it is sent succeed (Jobs complete, Deployments available), and the kinds
and names it wrote are compared with render's, for every sample and for generated models,
with and without Prometheus (the ScaledObject) and with scale to zero (the holder)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from inferentia_operator.core.autoscaling import Prometheus
from inferentia_operator.core.catalogue import FAMILIES
from inferentia_operator.core.decide import decide, rendered
from inferentia_operator.core.model import check_model
from inferentia_operator.core.observed import Observed
from inferentia_operator.core.pod.artefact import job_output_uri
from inferentia_operator.core.proof import PROOF_ANNOTATION, Prover
from inferentia_operator.core.settings import Settings
from inferentia_operator.manifests import load_models
from specs import make_model, make_spec

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = sorted((ROOT / "manifests" / "samples").glob("*.yaml"))
NOW = "2026-11-25T10:00:00Z"
PROVER = Prover(b"r" * 32)
PLAIN = Settings(prover=PROVER)
WITH_PROMETHEUS = Settings(prometheus=Prometheus("http://prometheus.monitoring:9090"), prover=PROVER)


def as_converged(body: dict[str, Any], serial: int) -> dict[str, Any]:
    """``body`` as the API server stores it once everything about it has gone well."""
    out = copy.deepcopy(body)
    meta = out["metadata"]
    meta |= {"uid": f"uid-{serial}", "resourceVersion": str(serial), "generation": 1}
    kind = out["kind"]
    if kind == "Job":
        meta.setdefault("annotations", {})[PROOF_ANNOTATION] = PROVER.job(
            meta["namespace"], meta["name"], meta["uid"], job_output_uri(out) or ""
        )
        out["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    elif kind == "Deployment":
        n = out["spec"].get("replicas", 1)
        out["status"] = {
            "observedGeneration": 1, "replicas": n, "updatedReplicas": n, "readyReplicas": n, "availableReplicas": n,
            "conditions": [{"type": "Available", "status": "True"}],
        }  # fmt: skip
    elif kind == "ScaledObject":
        out["status"] = {"conditions": [{"type": "Ready", "status": "True"}]}
    return out


def converge(body: dict[str, Any], settings: Settings, rounds: int = 12) -> set[tuple[str, str]]:
    """The kinds and names of the children the reconcile has written once it writes nothing more."""
    live: dict[tuple[str, str], dict[str, Any]] = {}
    records: dict[str, list[dict[str, Any]]] = {}
    for serial in range(rounds):
        decision = decide(Observed.of(body, *live.values(), compile_records=records), NOW, settings)
        if not decision.apply and not decision.delete and decision.record is None:
            return set(live)
        for child in decision.apply:
            live[child["kind"], child["metadata"]["name"]] = as_converged(child, 100 * serial + len(live))
        for gone in decision.delete:
            live.pop(gone, None)
        if decision.record is not None:
            records.setdefault(decision.record["data"]["uri"], []).append(decision.record)
    raise AssertionError(
        f"no fixed point in {rounds} reconciles: still writing {[(c['kind'], c['metadata']['name']) for c in decision.apply]}"
    )


def printed(body: dict[str, Any], settings: Settings) -> set[tuple[str, str]]:
    meta = body["metadata"]
    checked = check_model(meta["name"], meta["namespace"], body["spec"], uid=meta["uid"], allocation=settings.allocation)
    assert checked.model is not None, checked.errors
    return {(o["kind"], o["metadata"]["name"]) for o in rendered(checked.model, settings)}


def with_uid(body: dict[str, Any]) -> dict[str, Any]:
    return {**body, "metadata": {**body["metadata"], "uid": "uid-model", "generation": 1}}


@pytest.mark.parametrize("settings", [PLAIN, WITH_PROMETHEUS], ids=["no-prometheus", "prometheus"])
@pytest.mark.parametrize("sample", SAMPLES, ids=[p.stem for p in SAMPLES])
def test_render_prints_what_a_converged_reconcile_wrote_for_every_sample(sample, settings):
    docs = load_models([str(sample)]).models
    assert docs, sample
    for doc in docs:
        body = with_uid(make_model(doc.name, doc.namespace, spec=doc.body["spec"]))
        assert printed(body, settings) == converge(body, settings)


def test_a_model_that_scales_to_zero_prints_its_holder_and_replicas_service():
    spec = make_spec(**{
        "serving.batching": {"maxBatchSize": 4}, "autoscaling": {"minReplicas": 0, "maxReplicas": 3}, "compile.image": "example.com/c:1",
    })  # fmt: skip
    body = with_uid(make_model("zero", "ns", spec=spec))
    names = printed(body, WITH_PROMETHEUS)
    assert {("Deployment", "zero-holder"), ("Service", "zero-replicas"), ("ScaledObject", "zero")} <= names
    assert names == converge(body, WITH_PROMETHEUS)


@st.composite
def valid_models(draw: st.DrawFn) -> dict[str, Any]:
    family = draw(st.sampled_from(sorted(FAMILIES.values(), key=lambda f: f.name)))
    chips = draw(st.sampled_from(family.allowed_chip_counts or range(1, min(family.max_chips, 4) + 1)))
    overrides: dict[str, Any] = {"compute.family": family.name, "compute.inf": chips}
    overrides["processesPerReplica"] = draw(st.sampled_from([1, 2]))
    if draw(st.booleans()):
        overrides["compile.image"] = "example.com/neuron-compile:1"
    if draw(st.booleans()):
        overrides["serving.batching"] = {"maxBatchSize": draw(st.sampled_from([1, 4]))}
        if draw(st.booleans()):
            low = draw(st.integers(0, 2))
            overrides["autoscaling"] = {"minReplicas": low, "maxReplicas": low + draw(st.integers(1, 3))}
    if family.name in ("trn2", "trn3") and draw(st.booleans()):
        overrides["compute.allocation"] = "dra"
    overrides["replicas"] = draw(st.integers(0, 3))
    body = with_uid(make_model(draw(st.sampled_from(["m", "llama", "a-b"])), "ns", spec=make_spec(**overrides)))
    assume(check_model(body["metadata"]["name"], "ns", body["spec"]).model is not None)
    return body


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(valid_models(), st.sampled_from([PLAIN, WITH_PROMETHEUS]))
def test_render_prints_what_a_converged_reconcile_wrote_for_generated_models(body, settings):
    assert printed(body, settings) == converge(body, settings)
