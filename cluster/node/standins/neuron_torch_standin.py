"""What the torch_neuronx and torch_neuron stand-ins share: trace and load as the real ones do,
with the checks a Neuron compiler and runtime make, and the model's arithmetic left to torch.

- ``trace``: checks ``compiler_args`` as the family's compiler would (neuron_standin), refusing
  what it refuses, then records the model with ``torch.jit.trace``. The recorded graph calls a
  Neuron op first, as a real traced graph does, so ``torch.jit.load`` of it fails with
  "Unknown builtin op" unless the framework was imported first (the failure the torch-neuron
  troubleshooting guide describes for ``neuron::forward_1``:
  https://awsdocs-neuron.readthedocs-hosted.com/en/latest/frameworks/torch/torch-neuron/troubleshooting-guide.html).
- The op, the first time it runs outside a trace, does what the runtime does when a model is
  loaded onto NeuronCores: the cores in NEURON_RT_VISIBLE_CORES must be on the Neuron devices
  mounted in the container, and there must be as many as the model was compiled for. Otherwise
  it raises with the runtime's kind of message (nrt_allocate_neuron_cores).
"""

from __future__ import annotations

import glob
import json
import logging
import os
import sys
import threading
import time
from typing import Any

import torch
from neuron_standin import CompilerRefused, check_compiler_args, expand, held_message, hold_cores

_tracing = threading.local()
_loaded: dict[str, list[int]] = {}


def _nrt_error(function: str, message: str) -> RuntimeError:
    line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} ERROR  NRT:{function}  {message}"
    print(line, file=sys.stderr, flush=True)
    return RuntimeError(line)


def runtime_load(meta: dict[str, Any]) -> list[int]:
    """The cores a model compiled as ``meta`` says would be loaded onto, or the runtime's error."""
    key = json.dumps(meta, sort_keys=True)
    if key in _loaded:
        return _loaded[key]
    # NEURON_STANDIN_DEV_DIR: where the tests outside a pod keep stand-in device files.
    dev = os.environ.get("NEURON_STANDIN_DEV_DIR", "/dev")
    devices = sorted(glob.glob(f"{dev}/neuron[0-9]*"), key=lambda d: int(d.rsplit("neuron", 1)[1]))
    if not devices:
        raise _nrt_error("nrt_init", "No neuron device available")
    # As many cores per device as the node's chips have: the device plugin stand-in says how many.
    per_device = int(os.environ.get("NEURON_STANDIN_CORES_PER_DEVICE", "2"))
    mounted = [int(d.rsplit("neuron", 1)[1]) * per_device + k for d in devices for k in range(per_device)]
    visible = os.environ.get("NEURON_RT_VISIBLE_CORES")
    cores = expand(visible) if visible else mounted
    absent = [c for c in cores if c not in mounted]
    if absent:
        raise _nrt_error(
            "nrt_allocate_neuron_cores",
            f"Logical Neuron Core(s) not available - Requested: {visible} Available: {','.join(map(str, mounted))}",
        )
    needed = meta["pipelineCores"]
    if len(cores) < needed:
        raise _nrt_error("nrt_load", f"the model needs {needed} NeuronCores, {len(cores)} visible ({visible})")
    lnc = int(os.environ.get("NEURON_LOGICAL_NC_CONFIG", "1"))
    if meta["compiler"] == "neuronx-cc" and meta["lnc"] != lnc:
        raise _nrt_error("nrt_load", f"NEFF compiled for LNC={meta['lnc']} cannot load with NEURON_LOGICAL_NC_CONFIG={lnc}")
    busy = hold_cores(cores[:needed])
    if busy:
        raise _nrt_error("nrt_allocate_neuron_cores", held_message(visible or ",".join(map(str, cores)), cores[:needed], busy))
    _loaded[key] = cores[:needed]
    return _loaded[key]


def register(op: str) -> None:
    """Define the framework's Neuron op (importing the framework does this)."""
    library = torch.library.Library("neuron", "DEF")
    library.define(f"{op}(Tensor x, str meta) -> Tensor")

    def run(x: torch.Tensor, meta: str) -> torch.Tensor:
        if not getattr(_tracing, "active", False):
            runtime_load(json.loads(meta))
        return x

    library.impl(op, run, "CPU")
    # Keep the library alive: the registration ends when it is collected.
    globals().setdefault("_libraries", []).append(library)


class NeuronGraph(torch.nn.Module):
    """The traced model: the Neuron op (load and run on the cores) and then the model itself."""

    def __init__(self, model: Any, op: Any, meta: str) -> None:
        super().__init__()
        self.model = model
        self.op = op
        self.meta = meta

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(self.op(x, self.meta))


def trace(prog: str, op_name: str, model: Any, example_inputs: Any, compiler_args: Any, **trace_kwargs: Any) -> torch.jit.ScriptModule:
    args = compiler_args.split() if isinstance(compiler_args, str) else list(compiler_args or [])
    try:
        meta = check_compiler_args(prog, args)
    except CompilerRefused as exc:
        # The frameworks raise when the compiler exits non-zero, with its output.
        raise RuntimeError(f"{prog} failed: {exc}") from None
    meta.pop("output", None)
    meta.pop("model", None)
    example = example_inputs[0] if isinstance(example_inputs, tuple) and len(example_inputs) == 1 else example_inputs
    op = getattr(torch.ops.neuron, op_name)
    _tracing.active = True
    try:
        traced = torch.jit.trace(NeuronGraph(model, op, json.dumps(meta, sort_keys=True)), example, **trace_kwargs)
    finally:
        _tracing.active = False
    if prog == "neuron-cc":
        report_partition(traced)
    return traced


# Operators the stand-in's "compiler" leaves on the CPU, as torch-neuron's partitioner leaves
# what neuron-cc does not support: none unless a test names them (NEURON_STANDIN_CPU_OPS,
# comma-separated aten names). The operator reads only the log line, never this knob.
def report_partition(traced: torch.jit.ScriptModule) -> None:
    """torch-neuron's report after a trace, on its ``Neuron`` logger: "Number of arithmetic
    operators (post-compilation) before = N, compiled = M, percent compiled = P%"."""
    on_cpu = {op for op in os.environ.get("NEURON_STANDIN_CPU_OPS", "").split(",") if op}
    kinds = [node.kind() for node in traced.inlined_graph.nodes() if node.kind().startswith("aten::")]
    compiled = sum(1 for kind in kinds if kind not in on_cpu)
    percent = 100.0 * compiled / len(kinds) if kinds else 100.0
    logging.getLogger("Neuron").info(
        "Number of arithmetic operators (post-compilation) before = %d, compiled = %d, percent compiled = %.2f%%",
        len(kinds),
        compiled,
        percent,
    )
