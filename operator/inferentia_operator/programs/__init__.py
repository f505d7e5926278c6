"""Programs the operator ships into the user's Neuron framework image through the plan
ConfigMap: the compile program (``neuron_compile.py``), the model server
(``neuron_serve.py``), the vLLM Neuron plugin's compile step (``vllm_compile.py``) and vLLM on
NxD Inference's compile step (``nxdi_compile.py``) with the module both keep a Hub model's
snapshot with (``hub_snapshot.py``), and the worker ranks of vLLM across nodes
(``vllm_worker.py``), and the proxy in front of disaggregated prefill and decode servers
(``pd_proxy.py``). They run with that image's Python, torch and Neuron framework, so they
import nothing of this package (tests/test_programs.py checks it)."""

from __future__ import annotations

from functools import cache
from importlib import resources

COMPILE_PROGRAM = "neuron_compile.py"
# The compile program's artefact format (bucket-<i>.pt, manifest.json), part of the compile key:
# raised when a change to the program makes earlier artefacts unfit, and only then, so that an
# operator upgrade recompiles nothing it need not.
COMPILE_PROGRAM_VERSION = 1
SERVE_PROGRAM = "neuron_serve.py"
VLLM_COMPILE_PROGRAM = "vllm_compile.py"
NXDI_COMPILE_PROGRAM = "nxdi_compile.py"
VLLM_WORKER_PROGRAM = "vllm_worker.py"
# The proxy in front of disaggregated prefill and decode servers (the toy proxy's command line; its
# docstring says why the project ships it rather than the plugin).
PD_PROXY_PROGRAM = "pd_proxy.py"
# Imported by both vLLM compile steps: the Hub snapshot they read, kept in the artefact.
HUB_SNAPSHOT_MODULE = "hub_snapshot.py"
# Where, under the compiled directory, the artefact keeps a Hub model's snapshot (its layout
# is part of the compile key: an artefact made before it has none, and is compiled again).
HUB_SNAPSHOT_DIR = "hf-hub"
HUB_SNAPSHOT_VERSION = 1
# Its compiled layout (NxD Inference's, with presharded weights), part of the compile key as above.
# 2: the NeuronConfig is vllm-neuron's loader's (paged-attention blocks, on-device sampling, dtype),
# which a model compiled by version 1 lacks.
NXDI_COMPILE_PROGRAM_VERSION = 2


@cache
def source(name: str) -> str:
    """The program's text, read once: every reconcile of a model that runs it puts it in the plan."""
    return resources.files(__name__).joinpath(name).read_text()
