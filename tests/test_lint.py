"""The linters the project configures (pyproject.toml [tool.ruff]) fail the suite: undefined
names, unused imports, import order, bugbear's traps, blind excepts, private access, a
noqa that silences nothing, and the pure core importing kopf or the Kubernetes client."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_finds_nothing():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_pure_core_may_not_import_kubernetes(tmp_path):
    """The ban itself works: a pure module that imports kopf is refused."""
    core = tmp_path / "operator" / "inferentia_operator"
    core.mkdir(parents=True)
    (core / "planner.py").write_text("import kopf\n\nkopf.event\n")
    config = (ROOT / "pyproject.toml").read_text()
    (tmp_path / "pyproject.toml").write_text(config)
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 1 and "TID251" in result.stdout and "must not import kopf" in result.stdout
