"""A virtualenv with the operator's runtime dependencies alone, as its image installs them
(the Dockerfile: the package's wheel and its dependencies, no test tools).

make benchmark-scale runs the operator on it, so that its memory is the image's: the
project's own virtualenv also holds what the tests and the cluster's scripts need (the
official Kubernetes client among them), and kopf loads that client whenever it is installed.
The operator's code comes from the checkout (PYTHONPATH), the libraries from here. Cached
outside the checkout, keyed by the declared dependencies and this Python.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def python() -> Path:
    """The runtime virtualenv's interpreter, made on first use."""
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    key = hashlib.sha256(" ".join([sys.version, *dependencies]).encode()).hexdigest()[:12]
    cache = Path(
        os.environ.get("INFERENTIA_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "inferentia-operator"
    )
    venv = cache / f"runtime-deps-{key}"
    interpreter = venv / "bin" / "python"
    if not (venv / ".complete").exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(interpreter), "-m", "pip", "install", "--quiet", *dependencies], check=True)
        (venv / ".complete").write_text("\n".join(dependencies))
    return interpreter


def env() -> dict[str, str]:
    """The environment to run the operator's code from the checkout on :func:`python`."""
    return {**os.environ, "PYTHONPATH": str(ROOT / "operator")}
