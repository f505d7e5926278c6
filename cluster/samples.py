"""The samples of manifests/samples/ as they run on the local cluster's real node, for the
samples test and `make demo`.

What differs from a sample as written, and why (run_here changes these fields and no other):
- metadata.namespace: one whose pods go to the real node;
- spec.serving.image and spec.compile.image: for each of AWS's pytorch-inference-neuron,
  -neuronx and -vllm-neuronx images, its own stand-in (cluster/images.py, ``standin_image``):
  ``neuron-torch-standin:<short>-<tag>`` (Debian's CPU-only PyTorch with the torch-neuronx and
  torch-neuron stand-ins) for the framework images, ``neuron-standin:<short>-<tag>`` (the vLLM,
  NxD Inference and compiler stand-ins, no torch) for the vLLM images, each with the package
  versions AWS lists for that tag
  (inferentia_operator.core.neuron_images), which the stand-ins read as the real packages'
  are read; an image that catalogue lacks is refused. The operator gives every container its
  command, so their entry points never run;
- spec.compute.cpu and memory, and spec.compile.cpu and memory: this machine has 2 CPUs and
  a few GiB to spare, where the samples ask for what the real model needs on EKS (the unit
  test tests/test_samples_fit.py holds the samples' own sizes to the model's needs);
- spec.serving.batching.maxLatencyMs, for the batching front end: PyTorch on this CPU cannot
  meet the budget a NeuronCore would (20 ms for a ResNet-50 batch);
- spec.serviceAccountName is dropped and spec.compile.storageSecret names the local object
  store's credentials and endpoint, where on EKS the ServiceAccount would carry them (IRSA or
  EKS Pod Identity);
- spec.serving.storageClassName is dropped: the local cluster has no volume provisioner, so
  HOME and the artefact volume are emptyDirs of the same sizes;
- the Secret hf-token the gated samples read is made here with a token nobody checks: the
  vLLM stand-in downloads nothing;
- the models the samples name are the tests' own networks (tests/models/reference.py) of the
  same input kind, uploaded where the samples look; the buckets the samples write compiled
  artefacts to are made in the local store.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from images import TORCH_STANDIN_IMAGE, standin_image

# The stand-in that carries no AWS image's versions (the e2e tests' own specs name it).
TORCH_IMAGE = TORCH_STANDIN_IMAGE
AWS_IMAGES = (
    "public.ecr.aws/neuron/pytorch-inference-neuron:",
    "public.ecr.aws/neuron/pytorch-inference-neuronx:",
    "public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:",
)
STORE_SECRET = "store"
HF_TOKEN_SECRET = "hf-token"
MODELS_ACCOUNT = "models-reader"
# The network standing in for the model each sample names, its input dtype, and inputs to ask
# it with (None: an image, made by image_input()).
NETWORKS: dict[str, tuple[str, str, list | None]] = {
    # Token ids below the test embedding's 1,000 entries.
    "s3://models-example/bert-base-uncased/model.pt": ("tokens.pt", "int64", [[101, 203, 200, 103, 323, 102], [101, 759, 102]]),
    "s3://models-example/distilbert-base-uncased/model.pt": ("tokens.pt", "int64", [[101, 230, 102], [101, 1, 2, 3, 4, 102]]),
    "s3://models-example/gpt2/model.pt": ("tokens.pt", "int64", [[464, 329, 318], [154, 11, 995, 0]]),
    "s3://models-example/resnet50/model.pt": ("image.pt", "float32", None),
}
# The instance type the real node takes for each family's samples.
SHAPE = {"inf1": "inf1.6xlarge", "inf2": "inf2.24xlarge", "trn2": "trn2.48xlarge"}


def store_secret(namespace: str, endpoint: str) -> dict[str, Any]:
    """The Secret that gives pods the local object store: its endpoint and (moto's) credentials."""
    return {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": STORE_SECRET, "namespace": namespace},
        "stringData": {"AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local", "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint},
    }  # fmt: skip


def put_model(store: Any, uri: str, models: Path) -> tuple[str, str, list | None]:
    """Uploads the network that stands in for the sample's model to ``uri`` (creating its bucket
    when missing); returns that network's file name, input dtype and inputs to ask it with."""
    network, dtype, inputs = NETWORKS[uri]
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    if bucket not in [b["Name"] for b in store.list_buckets()["Buckets"]]:
        store.create_bucket(Bucket=bucket)
    store.upload_file(str(models / network), bucket, key)
    return network, dtype, inputs


def image_input() -> list:
    """One 3x224x224 image, values 0 to 0.8."""
    return [[[((c + i + j) % 5) / 5 for j in range(224)] for i in range(224)] for c in range(3)]


def run_here(doc: dict[str, Any], namespace: str) -> dict[str, Any]:
    """The sample ``doc`` as it runs on the real node (see the module's docstring)."""
    doc = copy.deepcopy(doc)
    doc["metadata"]["namespace"] = namespace
    spec = doc["spec"]
    for part in ("serving", "compile"):
        image = spec.get(part, {}).get("image")
        if image:
            if not image.startswith(AWS_IMAGES):
                raise ValueError(f"{image} is not an image AWS's Neuron DLC list names")
            spec[part]["image"] = standin_image(image)
    spec["compute"] |= {"cpu": "100m", "memory": "1536Mi" if spec.get("processesPerReplica", 1) > 1 else "1Gi"}
    if spec.get("compile", {}).get("image"):
        spec["compile"] |= {"cpu": "200m", "memory": "1Gi"}
    if spec["serving"].get("batching") and spec["serving"].get("runtime") != "vllm":
        spec["serving"]["batching"]["maxLatencyMs"] = max(spec["serving"]["batching"].get("maxLatencyMs", 100), 30_000)
    spec.pop("serviceAccountName", None)
    spec["serving"].pop("storageClassName", None)
    if store_uris(doc):
        spec.setdefault("compile", {})["storageSecret"] = STORE_SECRET
    return doc


def store_uris(doc: dict[str, Any]) -> list[str]:
    """The s3:// URIs a sample reads or writes: its model, its compiled artefacts' place."""
    spec = doc["spec"]
    return [uri for uri in (spec["model"]["uri"], spec.get("compile", {}).get("outputUri", "")) if uri.startswith("s3://")]


def prerequisites(namespace: str) -> list[dict[str, Any]]:
    """What the samples expect to find in their namespace, as docs/install.md has a platform
    team create it: the ServiceAccount models-reader (whose IRSA or Pod Identity role reads the
    store on EKS; the API server refuses a pod that names a ServiceAccount that does not exist)
    and the Secret hf-token."""
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": MODELS_ACCOUNT, "namespace": namespace}}
    return [account, token_secret(namespace)]


def on_simulated_fleet(doc: dict[str, Any], namespace: str) -> dict[str, Any]:
    """The sample as it runs on the kwok fleet: in ``namespace``, and without
    spec.serving.storageClassName, since the local cluster has no volume provisioner (a claim
    of a class nobody provisions would keep the pod from being scheduled). Nothing else changes."""
    doc = copy.deepcopy(doc)
    doc["metadata"]["namespace"] = namespace
    doc["spec"]["serving"].pop("storageClassName", None)
    return doc


def token_secret(namespace: str) -> dict[str, Any]:
    """The Secret hf-token that gated samples read their Hugging Face token from."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": HF_TOKEN_SECRET, "namespace": namespace},
        "stringData": {"token": "hf_local"},
    }


def make_buckets(store: Any, doc: dict[str, Any]) -> None:
    """Every bucket the sample's store URIs name, in the local store."""
    have = {b["Name"] for b in store.list_buckets()["Buckets"]}
    for bucket in {uri.removeprefix("s3://").partition("/")[0] for uri in store_uris(doc)} - have:
        store.create_bucket(Bucket=bucket)
