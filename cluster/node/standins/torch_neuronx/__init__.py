"""Stand-in for torch-neuronx: ``torch_neuronx.trace`` with the documented signature
(https://awsdocs-neuron.readthedocs-hosted.com/en/latest/frameworks/torch/torch-neuronx/api-reference-guide/inference/api-torch-neuronx-trace.html),
checking ``compiler_args`` as neuronx-cc would and tracing with ``torch.jit.trace``.

torch-neuronx's own op name is not documented; this stand-in's graph calls ``neuron::forward_v2``,
registered on import, so a saved model loads only after ``import torch_neuronx``, as with the real one."""

from __future__ import annotations

from typing import Any

import neuron_torch_standin

__version__ = "0.0.0+standin"
_OP = "forward_v2"
neuron_torch_standin.register(_OP)


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
    return neuron_torch_standin.trace("neuronx-cc", _OP, func, example_inputs, compiler_args)
