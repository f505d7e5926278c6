"""The Argo CD health check, run as Lua 5.1 (Argo CD's dialect), and the shipped GitOps examples."""

from pathlib import Path

import pytest
import yaml
from lupa import lua51

from inferentia_operator.core.api import PENDING_STATUS

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
    status = {"observedGeneration": observed}
    if ready:
        status["conditions"] = [
            {"type": "Validated", "status": "True", "reason": "Valid", "message": ""},
            {"type": "Ready", "status": ready[0], "reason": ready[1], "message": ready[2]},
        ]
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


def test_the_argocd_cm_patch_carries_the_same_script():
    patch = yaml.safe_load((GITOPS / "argocd-cm-patch.yaml").read_text())
    assert patch["data"]["resource.customizations.health.inferentia.dev_InferentiaModel"] == SCRIPT


def test_examples_are_the_documented_kinds():
    kinds = {
        name: [d["kind"] for d in yaml.safe_load_all((GITOPS / name).read_text())]
        for name in ("flux-helmrelease.yaml", "argocd-application.yaml")
    }
    assert kinds == {"flux-helmrelease.yaml": ["GitRepository", "HelmRelease", "Kustomization"], "argocd-application.yaml": ["Application"]}
    [release] = [d for d in yaml.safe_load_all((GITOPS / "flux-helmrelease.yaml").read_text()) if d["kind"] == "HelmRelease"]
    assert release["spec"]["chart"]["spec"]["chart"] == "charts/inferentia-operator"
