"""Stand-in for torch-neuronx: ``torch_neuronx.trace`` with the documented signature
(https://awsdocs-neuron.readthedocs-hosted.com/en/latest/frameworks/torch/torch-neuronx/api-reference-guide/inference/api-torch-neuronx-trace.html),
checking ``compiler_args`` as neuronx-cc would and tracing with ``torch.jit.trace``.

Where it traces, as the real one does:
- on a Neuron device by default: without one, torch 2.x's PJRT client fails to start
  ("Init: error condition !(num_devices > 0)", aws-neuron/aws-neuron-sdk#902 and #910, where AWS
  answered "a Neuron device is currently required for torch 2.x compilation");
- on the CPU with ``cpu_backend=True``, which "needs to be used with the compiler_args option to
  set the --target flag" (the trace API page above), or with the target set before the import in
  ``NEURON_PLATFORM_TARGET_OVERRIDE`` (huggingface/optimum-neuron PR #961); with neither it
  raises the message that PR quotes. ``cpu_backend`` came with Neuron 2.21 (its release notes:
  the trace API page "updated ... with support for CPU compilation"): a torch-neuronx of an
  earlier release (its Neuron part below 2.4.0, e.g. 2.1.2.2.3.2 of Neuron 2.20) has no such
  keyword, and passing it is a TypeError. torch-neuronx for torch 1.13 traces on any machine: "By
  default, torch_neuronx.trace() supports compilation on non-Neuron devices for torch 1.13"
  (aws-neuron/aws-neuron-sdk#910).

The installed version is the image's (``importlib.metadata``), as the real package's is; an
image that carries no metadata for it counts as the newest.

torch-neuronx's own op name is not documented; this stand-in's graph calls ``neuron::forward_v2``,
registered on import, so a saved model loads only after ``import torch_neuronx``, as with the real one."""

from __future__ import annotations

import glob
import importlib.metadata
import os
import re
from typing import Any

import neuron_torch_standin

try:
    __version__ = importlib.metadata.version("torch-neuronx")
except importlib.metadata.PackageNotFoundError:
    __version__ = "0.0.0+standin"
_OP = "forward_v2"
neuron_torch_standin.register(_OP)
# Read once, at import, as the libraries read it: set later, it is not seen.
_TARGET_AT_IMPORT = os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE")
CPU_TARGETS = ("trn1", "inf2", "trn1n", "trn2")
NO_DEVICE = (
    "Bad StatusOr access: INVALID_ARGUMENT: PJRT_Client_Create: error condition nullptr != (args)->client->Error(): "
    "Init: error condition !(num_devices > 0)"
)
NO_TARGET = (
    "If you want to compile on CPU, please supply compiler argument target, with one of options "
    f'{", ".join(CPU_TARGETS[:-1])}, or {CPU_TARGETS[-1]}. Ex: "--target trn1"'
)


def _has_cpu_backend(version: str) -> bool:
    """torch-neuronx versions are <torch version>.<Neuron release>: 2.5.1.2.4.0 is Neuron 2.4.0's build for torch 2.5.1."""
    parts = [int(p) for p in re.findall(r"\d+", version.split("+")[0])]
    return len(parts) < 6 or tuple(parts[3:6]) >= (2, 4, 0)


def _traces_anywhere(version: str) -> bool:
    """torch-neuronx for torch 1.13 (1.13.1.1.16.0 of Neuron 2.20): no device needed."""
    parts = re.findall(r"\d+", version.split("+")[0])
    return len(parts) >= 6 and int(parts[0]) < 2


def _device_present() -> bool:
    # NEURON_STANDIN_DEV_DIR: where the tests outside a pod keep stand-in device files.
    return bool(glob.glob(f"{os.environ.get('NEURON_STANDIN_DEV_DIR', '/dev')}/neuron[0-9]*"))


def _target(compiler_args: str | list[str] | None) -> str | None:
    args = compiler_args.split() if isinstance(compiler_args, str) else list(compiler_args or [])
    for i, arg in enumerate(args):
        if arg == "--target" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--target="):
            return arg.split("=", 1)[1]
    return None


def _trace(func: Any, example_inputs: Any, compiler_args: str | list[str] | None, cpu_backend: bool) -> Any:
    if cpu_backend:
        if not (_target(compiler_args) or _TARGET_AT_IMPORT):
            raise RuntimeError(NO_TARGET)
    elif not _device_present() and not _traces_anywhere(__version__):
        raise RuntimeError(NO_DEVICE)
    return neuron_torch_standin.trace("neuronx-cc", _OP, func, example_inputs, compiler_args)


if _has_cpu_backend(__version__):

    def trace(
        func: Any,
        example_inputs: Any,
        *_: Any,
        input_output_aliases: dict | None = None,
        compiler_workdir: str | None = None,
        compiler_args: str | list[str] | None = None,
        partitioner_config: Any = None,
        inline_weights_to_neff: bool = True,
        cpu_backend: bool = False,
    ) -> Any:
        return _trace(func, example_inputs, compiler_args, cpu_backend)

else:

    def trace(  # type: ignore[misc]
        func: Any,
        example_inputs: Any,
        *_: Any,
        input_output_aliases: dict | None = None,
        compiler_workdir: str | None = None,
        compiler_args: str | list[str] | None = None,
        partitioner_config: Any = None,
        inline_weights_to_neff: bool = True,
    ) -> Any:
        return _trace(func, example_inputs, compiler_args, False)
