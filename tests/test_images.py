"""The stand-in images of AWS's Neuron images (cluster/images.py): one per catalogued tag, each
carrying the package versions AWS lists for it, all in one archive."""

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

import images
import samples
from inferentia_operator.core import neuron_images

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = sorted((ROOT / "manifests" / "samples").glob("*.yaml"))


def test_the_written_distributions_are_what_importlib_metadata_reads(tmp_path):
    """A stand-in reads its image's versions as the real packages are read: by PyPI name,
    dashes and all, through importlib.metadata."""
    distributions = {
        "vllm": "0.11.0",
        "vllm-neuron": "0.2.1",
        "neuronx-distributed-inference": "0.7.14366",
        "torch-neuronx": "2.8.0.2.10.16998",
    }
    images.write_distributions(tmp_path, distributions)
    program = "import importlib.metadata, json, sys; print(json.dumps({n: importlib.metadata.version(n) for n in json.loads(sys.argv[1])}))"
    out = subprocess.run(
        [sys.executable, "-c", program, json.dumps(list(distributions))],
        env={**os.environ, "PYTHONPATH": str(tmp_path)}, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert json.loads(out.stdout) == distributions


def test_each_catalogued_image_has_a_stand_in_named_after_its_repository_and_tag():
    image = "public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:0.9.1-neuronx-py310-sdk2.25.0-ubuntu22.04"
    # vLLM's images stand on the light stand-in every real node holds; the framework images on torch's.
    assert images.standin_image(image) == "neuron-standin:vllm-neuronx-0.9.1-neuronx-py310-sdk2.25.0-ubuntu22.04"
    neuronx = "public.ecr.aws/neuron/pytorch-inference-neuronx:2.9.0-neuronx-py312-sdk2.31.1-ubuntu24.04"
    assert images.standin_image(neuronx) == "neuron-torch-standin:neuronx-2.9.0-neuronx-py312-sdk2.31.1-ubuntu24.04"
    light, torch = images.catalogue_variants(images.STANDIN_IMAGE), images.catalogue_variants(images.TORCH_STANDIN_IMAGE)
    variants = light | torch
    assert len(light) + len(torch) == len(variants) == len(neuron_images.CATALOGUE)  # no two tags share a stand-in
    assert images.TORCH_STANDIN_IMAGE not in variants and images.STANDIN_IMAGE not in variants
    for image, versions in neuron_images.CATALOGUE.items():
        assert variants[images.standin_image(image)] == versions.distributions


def test_an_image_the_catalogue_lacks_has_no_stand_in():
    image = "public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:0.0.1-neuronx-py310-sdk2.0.0-ubuntu22.04"
    with pytest.raises(ValueError, match=r"pytorch-inference-vllm-neuronx:0\.0\.1"):
        images.standin_image(image)


def test_one_archive_holds_several_images_and_each_blob_once(tmp_path):
    base, standins = b"base layer", b"stand-ins layer"
    variant_layer = images.distributions_layer({"vllm": "0.9.1"})
    config = {"Cmd": ["python3"]}
    out = tmp_path / "images.oci.tar"
    images.write_oci_images(
        out, [("neuron-torch-standin:0.1.0", [base, standins], config), ("neuron-torch-standin:v", [base, standins, variant_layer], config)]
    )

    with tarfile.open(out) as tar:
        names = tar.getnames()
        files = {name: tar.extractfile(name).read() for name in names if tar.getmember(name).isfile()}
    assert len(names) == len(set(names))
    index = json.loads(files["index.json"])
    by_name = {m["annotations"]["io.containerd.image.name"]: m for m in index["manifests"]}
    assert list(by_name) == ["docker.io/library/neuron-torch-standin:0.1.0", "docker.io/library/neuron-torch-standin:v"]
    assert [m["annotations"]["org.opencontainers.image.ref.name"] for m in index["manifests"]] == ["0.1.0", "v"]

    def blob(digest: str) -> bytes:
        return files[f"blobs/sha256/{digest.removeprefix('sha256:')}"]

    layers = {name: [d["digest"] for d in json.loads(blob(m["digest"]))["layers"]] for name, m in by_name.items()}
    shared = layers["docker.io/library/neuron-torch-standin:0.1.0"]
    assert [blob(d) for d in shared] == [base, standins]
    assert layers["docker.io/library/neuron-torch-standin:v"][:2] == shared
    assert blob(layers["docker.io/library/neuron-torch-standin:v"][2]) == variant_layer
    # Two manifests, two configs, three layers: nothing written twice.
    assert len([n for n in names if n.startswith("blobs/sha256/")]) == 7
    with tarfile.open(fileobj=io.BytesIO(variant_layer)) as layer:
        assert f"{images.SITE}/vllm-0.9.1.dist-info/METADATA" in layer.getnames()


def test_one_image_archives_are_as_before(tmp_path):
    out = tmp_path / "pause.oci.tar"
    images.write_oci(out, "inferentia-pause:1", [b"pause"], {"Entrypoint": ["/pause"]})
    with tarfile.open(out) as tar:
        index = json.loads(tar.extractfile("index.json").read())
    [manifest] = index["manifests"]
    assert manifest["annotations"] == {
        "io.containerd.image.name": "docker.io/library/inferentia-pause:1",
        "org.opencontainers.image.ref.name": "1",
    }


@pytest.mark.parametrize("path", SAMPLES, ids=[p.stem for p in SAMPLES])
def test_every_aws_image_a_sample_names_is_catalogued(path):
    """run_here gives each AWS image the stand-in of its own tag, so each must be catalogued."""
    spec = yaml.safe_load(path.read_text())["spec"]
    for part in ("serving", "compile"):
        image = (spec.get(part) or {}).get("image")
        if image and neuron_images.is_aws_neuron_image(image):
            assert neuron_images.lookup(image), f"{path.name}: {part}.image {image} is not in neuron_images.CATALOGUE"


def test_a_sample_runs_here_in_the_stand_in_of_its_own_tag():
    doc = yaml.safe_load((ROOT / "manifests" / "samples" / "llama-inf2-vllm.yaml").read_text())
    here = samples.run_here(doc, "here")
    for part in ("serving", "compile"):
        assert here["spec"][part]["image"] == images.standin_image(doc["spec"][part]["image"])


def test_run_here_refuses_an_image_it_has_no_stand_in_for():
    doc = yaml.safe_load((ROOT / "manifests" / "samples" / "llama-inf2-vllm.yaml").read_text())
    doc["spec"]["serving"]["image"] = "example.com/vllm:1"
    with pytest.raises(ValueError, match="not an image AWS"):
        samples.run_here(doc, "here")
    doc["spec"]["serving"]["image"] = "public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:0.0.1-neuronx-py310-sdk2.0.0-ubuntu22.04"
    with pytest.raises(ValueError, match="CATALOGUE"):
        samples.run_here(doc, "here")
