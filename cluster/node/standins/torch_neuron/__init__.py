"""Stand-in for torch-neuron (inf1): ``torch_neuron.trace(model, example_inputs, **kwargs)``
(https://awsdocs-neuron.readthedocs-hosted.com/en/latest/frameworks/torch/torch-neuron/api-compilation-python-api.html),
checking ``compiler_args`` as neuron-cc would and tracing with ``torch.jit.trace``.

Its graph calls ``neuron::forward_1``, registered on import: without ``import torch_neuron``,
``torch.jit.load`` fails with "Unknown builtin op: neuron::forward_1", as the troubleshooting guide says."""

from __future__ import annotations

from typing import Any

import neuron_torch_standin

__version__ = "0.0.0+standin"
_OP = "forward_1"
neuron_torch_standin.register(_OP)

# torch.jit.trace keyword arguments torch_neuron.trace passes through (strict=False, for example).
_TRACE_KWARGS = ("strict", "check_trace", "check_tolerance")


def trace(model: Any, example_inputs: Any, **kwargs: Any) -> Any:
    trace_kwargs = {k: kwargs[k] for k in _TRACE_KWARGS if k in kwargs}
    return neuron_torch_standin.trace("neuron-cc", _OP, model, example_inputs, kwargs.get("compiler_args"), **trace_kwargs)
