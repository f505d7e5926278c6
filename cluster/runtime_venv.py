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

import images

ROOT = Path(__file__).resolve().parent.parent


def venv(requirements: list[str], name: str) -> Path:
    """The interpreter of a virtualenv holding ``requirements`` alone, made once: cached as
    ``name`` under the project's cache directory, keyed by the requirements and this Python."""
    key = hashlib.sha256(" ".join([sys.version, *requirements]).encode()).hexdigest()[:12]
    directory = images.cache_dir().parent / f"{name}-{key}"
    interpreter = directory / "bin" / "python"
    if not (directory / ".complete").exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(directory)], check=True)
        result = subprocess.run([str(interpreter), "-m", "pip", "install", "--quiet", *requirements], capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(requirements)} do not install together: {result.stderr[-2000:]}")
        (directory / ".complete").write_text("\n".join(requirements))
    return interpreter


def python() -> Path:
    """The runtime virtualenv's interpreter: the operator's declared dependencies, made on first use."""
    return venv(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"], "runtime-deps")


def env() -> dict[str, str]:
    """The environment to run the operator's code from the checkout on :func:`python`."""
    return {**os.environ, "PYTHONPATH": str(ROOT / "operator")}
