"""Undefined names and unused imports fail the suite (pyflakes found a real one in a rarely run branch)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_pyflakes_finds_nothing():
    result = subprocess.run(
        [sys.executable, "-m", "pyflakes", "operator", "cluster", "charts", "tests"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
