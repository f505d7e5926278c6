"""What AWS's Neuron Deep Learning Containers carry, by image tag: the versions a serving path
and a compile key depend on.

The operator reads a user's image only by its name. Where AWS publishes what a tag holds, this
catalogue says it, so that ``validate`` and status can tell, before anything runs, that an image
lacks what a feature needs (vLLM's V0 Neuron worker for replicas across nodes, torch-neuronx's
CPU backend for a compile Job without a device) or that a compile image and a serving image
would not share a compile cache.

Sources, each tag's versions as its Dockerfile pins them (``ARG`` lines) and as the repository's
README table lists the image (aws-neuron/deep-learning-containers, README.md "vllm-inference-neuronx"
and "pytorch-inference-neuronx", at the git tags 2.24.0 to 2.32.0;
https://github.com/aws-neuron/deep-learning-containers), and the Neuron release notes for the
vLLM Neuron plugin's versions ("0.21.0.1.0.0 (supports vLLM version 0.21.0; vllm-neuron version
is 1.0.0)", https://awsdocs-neuron.readthedocs-hosted.com/en/v2.33.0/release-notes/components/index.html).
An image not listed here (a user's own build, a newer tag) is unknown: the checks that need its
versions then warn, naming what to look for, instead of refusing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

REGISTRY = "public.ecr.aws/neuron/"
VLLM_REPOSITORY = "pytorch-inference-vllm-neuronx"
NEURONX_REPOSITORY = "pytorch-inference-neuronx"
NEURON_REPOSITORY = "pytorch-inference-neuron"

# What serves vLLM in an image:
# - "vllm-v0": vLLM's own V0 Neuron worker (vllm/worker/neuron_worker.py in vLLM up to 0.10.1.1,
#   and in AWS's fork aws-neuron/upstreaming-to-vllm that the 0.7.2 and 0.9.1 images carry). It
#   reads VLLM_NEURON_FRAMEWORK, takes --override-neuron-config, and is the only one that serves
#   across nodes (ENABLE_NEURON_MULTI_NODE, NEURON_RANK_ID). vLLM removed it: "[V0 deprecation]
#   Deprecate V0 Neuron backend" (vllm-project/vllm PR #21159, first absent from 0.10.2) and the V0
#   engine itself ("[V0 Deprecation] Remove LLMEngine", PR #25033, absent from 0.11.0).
# - "vllm-neuron": the vllm-neuron plugin on NxD Inference (vllm-project/vllm-neuron 0.1 to 0.5,
#   vLLM's V1 engine). Overrides go through --additional-config '{"override_neuron_config": ...}';
#   its worker starts a world of one (vllm_neuron/worker/neuron_worker.py,
#   init_distributed_environment(world_size=1, ...)), so it serves on one node only.
# - "vllm-neuron-plugin": the vLLM Neuron plugin for Trn2 and Trn3 (versions <vLLM>.<plugin>,
#   0.21.0.1.0.0 onwards), compiling at warm-up into $VLLM_CACHE_ROOT/neuron/compile_cache.
VLLM_V0 = "vllm-v0"
VLLM_NEURON_NXDI = "vllm-neuron"
VLLM_NEURON_PLUGIN = "vllm-neuron-plugin"


@dataclass(frozen=True)
class ImageVersions:
    """The packages of one published image that the operator's paths depend on."""

    repository: str
    tag: str
    sdk: str
    families: tuple[str, ...]
    torch_neuronx: str | None = None
    neuronx_cc: str | None = None
    nki: str | None = None
    # The trn2/trn3 plugin's images carry libtorch-neuronx-lite in torch-neuronx's place.
    libtorch_neuronx_lite: str | None = None
    vllm: str | None = None
    vllm_serving: str | None = None  # VLLM_V0, VLLM_NEURON_NXDI or VLLM_NEURON_PLUGIN
    vllm_neuron: str | None = None
    nxd_inference: str | None = None

    @property
    def image(self) -> str:
        return f"{REGISTRY}{self.repository}:{self.tag}"

    @property
    def compile_key_versions(self) -> dict[str, str | None]:
        """What the vLLM Neuron plugin's compile cache key hashes besides the graph: "torch_neuronx
        version, neuronxcc version, NKI version" ("Compilation Cache", Cache Key,
        https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/design/compilation/compilation_cache.html).
        A NEFF made by another compiler is also another artefact for NxD Inference and torch-neuronx."""
        return {
            "torch-neuronx": self.torch_neuronx or self.libtorch_neuronx_lite,
            "neuronx-cc": self.neuronx_cc,
            "nki": self.nki,
        }

    @property
    def serves_across_nodes(self) -> bool:
        return self.vllm_serving == VLLM_V0

    @property
    def distributions(self) -> dict[str, str]:
        """The image's Python distributions by their PyPI names, as ``importlib.metadata`` reads
        them in the image (what the local cluster's stand-in images carry for this tag)."""
        found = {
            "torch-neuronx": self.torch_neuronx, "neuronx-cc": self.neuronx_cc, "nki": self.nki,
            "libtorch-neuronx-lite": self.libtorch_neuronx_lite, "vllm": self.vllm, "vllm-neuron": self.vllm_neuron,
            "neuronx-distributed-inference": self.nxd_inference,
        }  # fmt: skip
        return {name: version for name, version in found.items() if version}


_V0_FAMILIES = ("inf2", "trn1", "trn2")  # the 0.7.2 and 0.9.1 images' "trn1, trn2, inf2"
_PLUGIN_FAMILIES = ("trn2", "trn3")  # the plugin's images list Trn2 and Trn3 only
_ALL = ("inf2", "trn1", "trn2", "trn3")

# pytorch-inference-vllm-neuronx: tag, Neuron release, what serves vLLM, vLLM, neuronx-cc,
# torch-neuronx, NxD Inference, vllm-neuron, NKI, libtorch-neuronx-lite, families.
_VLLM_TAGS = [
    # AWS's V0 fork, aws-neuron/upstreaming-to-vllm (branches neuron-2.24-vllm-v0.7.2, 2.25.0, 2.26.x).
    ("0.7.2-neuronx-py310-sdk2.24.0-ubuntu22.04", "2.24.0", VLLM_V0, "0.7.2", "2.19.8089.0", "2.7.0.2.8.6734", "0.4.7422", None, None, None, _V0_FAMILIES),
    ("0.7.2-neuronx-py310-sdk2.24.1-ubuntu22.04", "2.24.1", VLLM_V0, "0.7.2", "2.19.8089.0", "2.7.0.2.8.6734", "0.4.7422", None, None, None, _V0_FAMILIES),
    ("0.9.1-neuronx-py310-sdk2.25.0-ubuntu22.04", "2.25.0", VLLM_V0, "0.9.1", "2.20.9961.0", "2.7.0.2.9.9357", "0.5.9230", None, None, None, _V0_FAMILIES),
    ("0.9.1-neuronx-py311-sdk2.26.0-ubuntu22.04", "2.26.0", VLLM_V0, "0.9.1", "2.21.18209.0", "2.8.0.2.10.13553", "0.6.10598", None, None, None, _V0_FAMILIES),
    ("0.9.1-neuronx-py311-sdk2.26.1-ubuntu22.04", "2.26.1", VLLM_V0, "0.9.1", "2.21.33363.0", "2.8.0.2.10.16998", "0.6.10598", None, None, None, _V0_FAMILIES),
    # vllm-neuron on NxD Inference, vLLM's V1 engine.
    ("0.11.0-neuronx-py312-sdk2.27.0-ubuntu24.04", "2.27.0", VLLM_NEURON_NXDI, "0.11.0", "2.22.12471.0", "2.8.0.2.10.16998", "0.7.14366", "0.2.1", None, None, _ALL),
    ("0.11.0-neuronx-py312-sdk2.27.1-ubuntu24.04", "2.27.1", VLLM_NEURON_NXDI, "0.11.0", "2.22.12471.0", "2.8.0.2.11.19912", "0.7.15063", "0.2.2", None, None, _ALL),
    ("0.13.0-neuronx-py312-sdk2.27.1-ubuntu24.04", "2.27.1", VLLM_NEURON_NXDI, "0.13.0", "2.23.6484.0", "2.9.0.2.12.22436", "0.8.16251", "0.4.1", "0.2.0", None, _ALL),
    ("0.13.0-neuronx-py312-sdk2.28.0-ubuntu24.04", "2.28.0", VLLM_NEURON_NXDI, "0.13.0", "2.23.6484.0", "2.9.0.2.12.22436", "0.8.16251", "0.4.1", "0.2.0", None, _ALL),
    ("0.16.0-neuronx-py312-sdk2.29.0-ubuntu24.04", "2.29.0", VLLM_NEURON_NXDI, "0.16.0", "2.24.5133.0", "2.9.0.2.13.24727", "0.9.17334", "0.5.0", "0.3.0", None, _ALL),
    ("0.16.0-neuronx-py312-sdk2.29.1-ubuntu24.04", "2.29.1", VLLM_NEURON_NXDI, "0.16.0", "2.24.8799.0", "2.9.0.2.13.26312", "0.9.17334", "0.5.0", "0.3.0", None, _ALL),
    ("0.16.0-neuronx-py312-sdk2.30.0-ubuntu24.04", "2.30.0", VLLM_NEURON_NXDI, "0.16.0", "2.25.3371.0", "2.9.0.2.14.27725", "0.10.17970", "0.5.1", "0.4.0", None, _ALL),
    ("0.16.0-neuronx-py312-sdk2.31.0-ubuntu24.04", "2.31.0", VLLM_NEURON_NXDI, "0.16.0", "2.26.6360.0", "2.9.0.2.15.32035", "0.10.18399", "0.5.3", "0.5.0", None, _ALL),
    ("0.16.0-neuronx-py312-sdk2.31.1-ubuntu24.04", "2.31.1", VLLM_NEURON_NXDI, "0.16.0", "2.26.6360.0", "2.9.0.2.15.32035", "0.10.18399", "0.5.3", "0.5.0", None, _ALL),
    # The vLLM Neuron plugin for Trn2 and Trn3: no torch-neuronx, no NxD Inference.
    ("0.21.0.1.0.0-neuronx-py313-sdk2.31.0-ubuntu24.04", "2.31.0", VLLM_NEURON_PLUGIN, "0.21.0", "2.26.6360.0", None, None, "0.21.0.1.0.0", "0.5.0", "2.11.0.1.0.696", _PLUGIN_FAMILIES),
    ("0.21.0.1.0.0-neuronx-py313-sdk2.31.1-ubuntu24.04", "2.31.1", VLLM_NEURON_PLUGIN, "0.21.0", "2.26.6360.0", None, None, "0.21.0.1.0.0", "0.5.0", "2.11.0.1.0.696", _PLUGIN_FAMILIES),
    ("0.24.0.1.1.0-neuronx-py313-sdk2.32.0-ubuntu24.04", "2.32.0", VLLM_NEURON_PLUGIN, "0.24.0", "2.27.5334.0", None, None, "0.24.0.1.1.0", "0.6.0", "2.11.0.1.0.1284", _PLUGIN_FAMILIES),
    # Neuron 2.33's plugin, 0.29.0.1.2.0 (the 2.33.0 release notes above). The tag is the one the
    # trn2 sample names; the DLC repository's README (to 2.32.0) does not list it yet, so only the
    # versions the release notes give are here, and newest() never recommends it.
    ("0.29.0.1.2.0-neuronx-py314-sdk2.33.0-ubuntu26.04", "2.33.0", VLLM_NEURON_PLUGIN, "0.29.0", None, None, None, "0.29.0.1.2.0", None, None, _PLUGIN_FAMILIES),
]  # fmt: skip
# pytorch-inference-neuronx: tag, Neuron release, torch-neuronx, neuronx-cc, NxD Inference, NKI, families.
_NEURONX_TAGS = [
    ("1.13.1-neuronx-py310-sdk2.20.2-ubuntu20.04", "2.20.2", "1.13.1.1.16.0", "2.15.143.0", None, None, ("inf2", "trn1")),
    ("2.1.2-neuronx-py310-sdk2.20.2-ubuntu20.04", "2.20.2", "2.1.2.2.3.2", "2.15.143.0", None, None, ("inf2", "trn1")),
    ("2.5.1-neuronx-py310-sdk2.22.0-ubuntu22.04", "2.22.0", "2.5.1.2.6.0", "2.17.194.0", "0.2.0", None, ("inf2", "trn1", "trn2")),
    ("2.8.0-neuronx-py311-sdk2.26.1-ubuntu22.04", "2.26.1", "2.8.0.2.10.16998", "2.21.33363.0", "0.6.10598", None, ("inf2", "trn1", "trn2")),
    ("2.9.0-neuronx-py312-sdk2.31.1-ubuntu24.04", "2.31.1", "2.9.0.2.15.32035", "2.26.6360.0", "0.10.18399", "0.5.0", _ALL),
]  # fmt: skip
# pytorch-inference-neuron (inf1), frozen: AWS no longer supports torch-neuron; no check reads its versions.
_NEURON_TAGS = ["1.13.1-neuron-py310-sdk2.18.2-ubuntu20.04", "1.13.1-neuron-py310-sdk2.20.2-ubuntu20.04"]


def _catalogue() -> dict[str, ImageVersions]:
    images = [
        ImageVersions(VLLM_REPOSITORY, tag, sdk, families, torch_neuronx=torch_neuronx, neuronx_cc=cc, nki=nki,
                      libtorch_neuronx_lite=lite, vllm=vllm, vllm_serving=serving, vllm_neuron=plugin, nxd_inference=nxdi)
        for tag, sdk, serving, vllm, cc, torch_neuronx, nxdi, plugin, nki, lite, families in _VLLM_TAGS
    ] + [
        ImageVersions(NEURONX_REPOSITORY, tag, sdk, families, torch_neuronx=torch_neuronx, neuronx_cc=cc, nki=nki, nxd_inference=nxdi)
        for tag, sdk, torch_neuronx, cc, nxdi, nki, families in _NEURONX_TAGS
    ] + [ImageVersions(NEURON_REPOSITORY, tag, tag.split("-sdk")[1].split("-")[0], ("inf1",)) for tag in _NEURON_TAGS]  # fmt: skip
    return {v.image: v for v in images}


CATALOGUE: dict[str, ImageVersions] = _catalogue()


# Neuron's first release whose torch_neuronx.trace takes cpu_backend (its release notes: the trace
# API page "updated ... with support for CPU compilation", Neuron 2.21.0, 2024-12-20).
CPU_BACKEND_SDK = (2, 21, 0)


def sdk_of(image: str | None) -> tuple[int, ...] | None:
    """The Neuron release an AWS image's tag names (``...-sdk2.31.1-...``), catalogued or not."""
    found = re.search(r"-sdk(\d+)\.(\d+)\.(\d+)", image or "")
    return tuple(int(x) for x in found.groups()) if found and is_aws_neuron_image(image) else None


def lookup(image: str | None) -> ImageVersions | None:
    """The catalogued versions of ``image``, or None when AWS publishes none for that name."""
    return CATALOGUE.get(image or "")


def is_aws_neuron_image(image: str | None) -> bool:
    return bool(image) and str(image).startswith(REGISTRY)


def newest(serving: str) -> str:
    """The catalogued vLLM image of the newest Neuron release whose vLLM is served by ``serving``,
    among those whose compiler versions the sources give."""
    found = [v for v in CATALOGUE.values() if v.vllm_serving == serving and v.neuronx_cc]
    return max(found, key=lambda v: tuple(int(x) for x in v.sdk.split("."))).image


def multi_node_images() -> list[str]:
    """The catalogued images whose vLLM serves one model across nodes, newest first."""
    return sorted((v.image for v in CATALOGUE.values() if v.serves_across_nodes), reverse=True)
