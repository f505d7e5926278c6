"""The Argo CD health check, run as Lua 5.1 (Argo CD's dialect), and the shipped GitOps examples."""

from pathlib import Path

import pytest
import yaml
from lupa import lua51

from inferentia_operator.core.api import PENDING_STATUS
from inferentia_operator.core.status import STALLED_REASONS

ROOT = Path(__file__).resolve().parent.parent
GITOPS = ROOT / "manifests" / "gitops"
SCRIPT = (GITOPS / "argocd-health.lua").read_text()


def health(obj: dict) -> tuple[str, str]:
    lua = lua51.LuaRuntime(unpack_returned_tuples=True)

    def table(value):
        if isinstance(value, dict):
            return lua.table_from({k: table(v) for k, v in value.items()})
        if isinstance(value, list):
            return lua.table_from([table(v) for v in value])
        return value

    lua.globals().obj = table(obj)
    result = lua.execute(SCRIPT)
    return result["status"], result["message"]


def model(generation=2, observed=2, ready=None):
    """A model's status with its Ready condition, and Stalled as the operator sets it (status.STALLED_REASONS)."""
    status = {"observedGeneration": observed}
    if ready:
        stalled = ready[1] in STALLED_REASONS
        status["conditions"] = [
            {"type": "Validated", "status": "True", "reason": "Valid", "message": ""},
            {"type": "Ready", "status": ready[0], "reason": ready[1], "message": ready[2]},
            {"type": "Stalled", "status": "True" if stalled else "False", "reason": ready[1] if stalled else "NotStalled",
             "message": ready[2] if stalled else ""},
        ]  # fmt: skip
    return {"metadata": {"name": "m", "generation": generation}, "status": status}


@pytest.mark.parametrize(
    "obj,expected",
    [
        (model(ready=("True", "Ready", "2 of 2 replicas ready")), ("Healthy", "2 of 2 replicas ready")),
        (model(ready=("False", "InvalidSpec", "spec.x: bad")), ("Degraded", "spec.x: bad")),
        (model(ready=("False", "CompileFailed", "Job j failed")), ("Degraded", "Job j failed")),
        (model(ready=("False", "Compiling", "Job j is compiling")), ("Progressing", "Job j is compiling")),
        (model(ready=("False", "Unschedulable", "no node")), ("Progressing", "no node")),
        (model(observed=1, ready=("True", "Ready", "old")), ("Progressing", "Waiting for the operator to observe generation 2")),
        (model(ready=("False", "ProgressDeadlineExceeded", "timed out")), ("Degraded", "timed out")),
        ({"metadata": {"name": "m", "generation": 1}}, ("Progressing", "Waiting for the operator to report status")),
        (
            {"metadata": {"name": "m", "generation": 1}, "status": PENDING_STATUS},
            ("Progressing", "Waiting for the operator to observe generation 1"),
        ),
    ],
)
def test_argocd_health(obj, expected):
    assert health(obj) == expected


@pytest.mark.parametrize("reason", sorted(STALLED_REASONS))
def test_argocd_marks_degraded_every_failure_kstatus_calls_stalled(reason):
    """One source of truth: FailedCreate, NameConflict and CompileJobUnverified stayed Progressing for ever."""
    assert health(model(ready=("False", reason, f"{reason}: someone must act"))) == ("Degraded", f"{reason}: someone must act")


def test_the_argocd_cm_patch_carries_the_same_script():
    patch = yaml.safe_load((GITOPS / "argocd-cm-patch.yaml").read_text())
    assert patch["data"]["resource.customizations.health.inferentia.dev_InferentiaModel"] == SCRIPT


def test_examples_are_the_documented_kinds():
    kinds = {
        name: [d["kind"] for d in yaml.safe_load_all((GITOPS / name).read_text())]
        for name in ("flux-helmrelease.yaml", "argocd-application.yaml")
    }
    assert kinds == {
        "flux-helmrelease.yaml": ["GitRepository", "HelmRelease", "GitRepository", "Kustomization", "Kustomization"],
        "argocd-application.yaml": ["Application", "Application"],
    }
    [release] = [d for d in yaml.safe_load_all((GITOPS / "flux-helmrelease.yaml").read_text()) if d["kind"] == "HelmRelease"]
    assert release["spec"]["chart"]["spec"]["chart"] == "charts/inferentia-operator"


def _key(doc: dict, namespace: str | None = None) -> tuple[str, str, str]:
    return doc["kind"], namespace or doc["metadata"].get("namespace", ""), doc["metadata"]["name"]


def test_the_flux_example_keeps_fluxs_dependency_rules():
    """Flux's own rules, which its controllers enforce at reconcile time: a Kustomization
    depends only on Kustomizations and a HelmRelease only on HelmReleases (an object of
    another kind never becomes ready for it, so the dependant waits forever), each in its
    own namespace unless the entry names one; and every sourceRef names a source defined here."""
    docs = list(yaml.safe_load_all((GITOPS / "flux-helmrelease.yaml").read_text()))
    defined = {_key(d) for d in docs}
    sources = {(kind, namespace, name) for kind, namespace, name in defined if kind == "GitRepository"}
    checked = 0
    for doc in docs:
        namespace = doc["metadata"]["namespace"]
        for dependency in doc["spec"].get("dependsOn", []):
            target = (doc["kind"], dependency.get("namespace", namespace), dependency["name"])
            assert target in defined, f"{doc['kind']} {doc['metadata']['name']} depends on {target}, which is not one of its kind here"
            checked += 1
        ref = doc["spec"].get("sourceRef") or doc["spec"].get("chart", {}).get("spec", {}).get("sourceRef")
        if ref:
            assert (ref["kind"], ref.get("namespace", namespace), ref["name"]) in sources, ref
            checked += 1
    [models] = [d for d in docs if d["metadata"]["name"] == "models"]
    [operator] = models["spec"]["dependsOn"]
    [wrapper] = [d for d in docs if _key(d) == ("Kustomization", "flux-system", operator["name"])]
    assert wrapper["spec"]["wait"] is True, "the operator's Kustomization must be healthy only once its HelmRelease is"
    assert checked == 4  # one dependency and three source references


def test_the_examples_pin_no_tag_that_does_not_exist():
    import subprocess

    tags = set(subprocess.run(["git", "tag", "--list"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split())
    for name in ("flux-helmrelease.yaml", "argocd-application.yaml"):
        for doc in yaml.safe_load_all((GITOPS / name).read_text()):
            ref = doc["spec"].get("ref", {}).get("tag") or doc["spec"].get("source", {}).get("targetRevision", "")
            assert not ref.startswith("v") or ref in tags, f"{name}: {ref} is not a tag of this repository"


def test_the_argo_cd_example_orders_the_operator_before_the_models():
    """Sync waves order Applications only when Argo CD assesses an Application's health, which
    the cm patch restores; the operator's Application is in an earlier wave than the models'."""
    apps = {d["metadata"]["name"]: d for d in yaml.safe_load_all((GITOPS / "argocd-application.yaml").read_text())}
    wave = {name: int(app["metadata"]["annotations"]["argocd.argoproj.io/sync-wave"]) for name, app in apps.items()}
    assert wave["inferentia-operator"] < wave["models"]
    patch = yaml.safe_load((GITOPS / "argocd-cm-patch.yaml").read_text())
    script = patch["data"]["resource.customizations.health.argoproj.io_Application"]
    lua = lua51.LuaRuntime(unpack_returned_tuples=True)
    for status, expected in (
        (None, "Progressing"),
        ({"health": {"status": "Healthy"}}, "Healthy"),
        ({"health": {"status": "Degraded", "message": "x"}}, "Degraded"),
    ):
        obj = {"metadata": {"name": "inferentia-operator"}} | ({"status": status} if status else {})
        lua.globals().obj = lua.table_from(
            {k: lua.table_from({kk: lua.table_from(vv) if isinstance(vv, dict) else vv for kk, vv in v.items()}) for k, v in obj.items()}
        )
        assert lua.execute(script)["status"] == expected
