"""Specs and models for tests: BASE_SPEC with dotted-path overrides."""

import copy
from typing import Any


# An override that removes the key: make_spec(**{"compute.inf": DROP, "compute.cores": 1}).
class _Drop:
    def __repr__(self) -> str:
        return "DROP"  # the same in every process: pytest-xdist's workers must collect the same test ids


DROP = _Drop()

BASE_SPEC: dict[str, Any] = {
    "model": {"uri": "s3://models/resnet50/", "framework": "pytorch"},
    "compute": {"inf": 1, "family": "inf1"},
    # The input shape: the operator's compile program and model server trace with it.
    "compile": {"buckets": [[3, 224, 224]]},
    "serving": {"image": "example.com/serve:1"},
}


def make_spec(base: dict[str, Any] | None = None, **overrides: Any) -> dict[str, Any]:
    """``base`` (BASE_SPEC by default) with dotted-path overrides: make_spec(**{"compute.inf": 2}); DROP removes a key."""
    spec = copy.deepcopy(BASE_SPEC if base is None else base)
    for dotted, value in overrides.items():
        node = spec
        *parents, leaf = dotted.split(".")
        for name in parents:
            node = node.setdefault(name, {})
        if value is DROP:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return spec


def make_model(name: str = "m", namespace: str = "default", spec: dict[str, Any] | None = None, **overrides: Any) -> dict[str, Any]:
    """An InferentiaModel with ``spec``, or BASE_SPEC with the overrides."""
    return {
        "apiVersion": "inferentia.dev/v1alpha1",
        "kind": "InferentiaModel",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec if spec is not None else make_spec(**overrides),
    }


# Prefill and decode pools (spec.disaggregation) on AWS's vLLM Neuron image.
PD_IMAGE = "public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:0.29.0.1.2.0-neuronx-py314-sdk2.33.0-ubuntu26.04"


def pd_spec(**overrides):
    """A trn2 vLLM model with a prefill pool of one chip (TP4) and a decode pool of two chips
    (TP8), the tutorial's shape scaled down (without its data parallelism, which is refused)."""
    base = {
        "model": {"uri": "meta-llama/Llama-3.1-8B-Instruct", "framework": "pytorch", "architecture": "transformer", "precision": "bf16"},
        "compute": {"family": "trn2", "inf": 1, "cpu": "4", "memory": "32Gi"},
        "compile": {"buckets": [[4096]]},
        "serving": {"runtime": "vllm", "image": PD_IMAGE, "port": 8000},
        "disaggregation": {"prefill": {"replicas": 2}, "decode": {"inf": 2}},
    }
    return make_spec(base, **overrides)
