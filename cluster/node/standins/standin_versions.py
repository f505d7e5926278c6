"""Which of vLLM's Neuron paths an image has, from the packages installed in it, as for real: the
installed package decides, not an environment variable.

- vLLM up to 0.10.1.1 (and AWS's fork aws-neuron/upstreaming-to-vllm of 0.7.2 and 0.9.1) carries
  the V0 Neuron worker (vllm/worker/neuron_worker.py): it reads VLLM_NEURON_FRAMEWORK, takes
  --override-neuron-config, and serves across nodes. vLLM removed it ("[V0 deprecation] Deprecate
  V0 Neuron backend", vllm-project/vllm PR #21159, first absent from 0.10.2).
- vllm-neuron 0.1 to 0.5 (vllm-project/vllm-neuron) is the V1 plugin on NxD Inference: it reads
  neither VLLM_NEURON_FRAMEWORK nor any multi-node variable, its worker starts a world of one
  (vllm_neuron/worker/neuron_worker.py), and overrides go through --additional-config.
- vllm-neuron 0.21.0.1.0.0 onwards (<vLLM>.<plugin>) is the vLLM Neuron plugin for Trn2 and Trn3.

The versions are the image's dist-info entries (importlib.metadata), as pip installs them.
"""

from __future__ import annotations

import importlib.metadata
import re

VLLM_V0 = "vllm-v0"
VLLM_NEURON_NXDI = "vllm-neuron"
VLLM_NEURON_PLUGIN = "vllm-neuron-plugin"


def installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def release(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version.split("+")[0]))


def vllm_serving() -> str | None:
    """What serves vLLM here, or None when the image has no vLLM with a Neuron path."""
    vllm, plugin = installed("vllm"), installed("vllm-neuron")
    if vllm is None:
        return None
    if plugin is not None:
        return VLLM_NEURON_PLUGIN if release(plugin) >= (0, 21) else VLLM_NEURON_NXDI
    return VLLM_V0 if release(vllm) < (0, 10, 2) else None


def compiler_versions() -> dict[str, str | None]:
    """What the vLLM Neuron plugin's compile cache key hashes besides the graph: "torch_neuronx
    version, neuronxcc version, NKI version" ("Compilation Cache", Cache Key,
    https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/design/compilation/compilation_cache.html);
    the plugin's images carry libtorch-neuronx-lite in torch-neuronx's place."""
    return {
        "torch-neuronx": installed("torch-neuronx") or installed("libtorch-neuronx-lite"),
        "neuronx-cc": installed("neuronx-cc"),
        "nki": installed("nki"),
    }
