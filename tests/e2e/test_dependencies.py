"""The declared dependency ranges hold at their lower bounds: a virtualenv with exactly the
lowest version of every runtime dependency pyproject.toml declares runs the operator
against the cluster, and it reconciles a model.

A lower bound that no test installs is a guess: `kopf>=1.37` once allowed a kopf without
the `settings.watching.label_selectors` the operator sets. The virtualenv is cached outside
the checkout, keyed by the bounds, so only a change of bounds downloads again."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from kit import ROOT, OperatorProcess, wait_for

import runtime_venv
from specs import make_model


def lowest_pins() -> list[str]:
    """``name==lower`` for every runtime dependency (each must declare a lower bound)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = []
    for requirement in project["dependencies"]:
        match = re.match(r"^([A-Za-z0-9_.\-\[\]]+)\s*>=\s*([0-9][0-9.]*)", requirement)
        assert match, f"{requirement!r} declares no lower bound"
        pins.append(f"{match.group(1)}=={match.group(2)}")
    return pins


def test_every_import_of_the_package_is_a_declared_dependency():
    """What the code imports from outside the standard library is declared."""
    declared = {
        re.split(r"[<>=\[ ]", r)[0].lower().replace("-", "_")
        for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    }
    names = {"prometheus_client": "prometheus_client", "yaml": "pyyaml", "grpc": "grpcio", "google": "protobuf"}
    imported = set()
    for path in (ROOT / "operator" / "inferentia_operator").rglob("*.py"):
        if "programs" in path.parts:
            continue  # they run in the user's Neuron image, with its torch (tests/test_programs.py checks their imports)
        # The import statements themselves, at any depth: a line of prose that starts with
        # "from the" is none, and an import inside a function is one.
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                tops = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                tops = [node.module.split(".")[0]]
            else:
                continue
            imported |= {names.get(t, t) for t in tops if t not in sys.stdlib_module_names and t != "inferentia_operator"}
    # The extras' packages (boto3 for `fetch`, kubernetes for a kubeconfig's login), imported only where they are used.
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    optional = {re.split(r"[<>=\[ ]", r)[0].lower().replace("-", "_") for extra in ("s3", "kubeconfig") for r in extras[extra]}
    assert optional == {"boto3", "kubernetes"}
    assert imported - optional <= declared, imported - optional - declared
    assert {"boto3", "kubernetes", "pydantic", "kopf"} <= imported  # the check sees imports at every depth


@pytest.fixture(scope="module")
def lowest_venv() -> Path:
    # Cached outside the checkout, keyed by the bounds (cluster/runtime_venv.py).
    python = runtime_venv.venv(lowest_pins(), "lowest-deps")
    venv = python.parent.parent
    # This checkout's package on top, without letting pip move any pinned version.
    result = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall", str(ROOT)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return venv


def test_the_operator_runs_on_the_lowest_declared_versions(lowest_venv, crd_installed, namespace, tmp_path):
    cluster = crd_installed
    versions = subprocess.run(
        [str(lowest_venv / "bin" / "python"), "-m", "pip", "freeze"], capture_output=True, text=True, check=True
    ).stdout.lower()
    for pin in lowest_pins():
        assert pin.lower().replace("_", "-") in versions.replace("_", "-"), f"{pin} is not what the virtualenv holds"
    op = OperatorProcess(
        cluster.kubeconfig, tmp_path / "operator.log", peering=f"lowest-{namespace}", python=str(lowest_venv / "bin" / "python"),
        extra_args=("--namespace", namespace),
    )  # fmt: skip
    op.start()
    try:
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(make_model("lowest", namespace)))

        def validated() -> bool:
            conditions = cluster.get("inferentiamodel", "lowest", "-n", namespace).get("status", {}).get("conditions") or []
            return any(c["type"] == "Validated" and c["status"] == "True" for c in conditions)

        wait_for(validated, 60, "the model Validated by the operator on the lowest versions")
        assert cluster.get("deployment", "lowest", "-n", namespace)["metadata"]["name"] == "lowest"
        # Deleted while this operator still runs: its finalizer goes with it, and no later
        # operator of the suite is left to finish a deletion in a terminating namespace.
        cluster.kubectl("delete", "inferentiamodel", "lowest", "-n", namespace, "--wait=true", "--timeout=60s")
    finally:
        op.stop()
    assert "Traceback" not in op.log()
