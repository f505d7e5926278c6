"""Every sample, rendered unchanged as `inferentia-operator render` prints it, sizes its pods
for the model it names (issue 40): each volume holds what the pod writes there, the serving
container holds each process's weights (or its compile), the startup probe waits as long as a
start may take, and every compile Job runs a program of the operator's in the image the
sample names. The needs come from core.sizing; what is checked is the rendered objects."""

from pathlib import Path

import pytest
import yaml

from inferentia_operator.cli import main
from inferentia_operator.core import sizing
from inferentia_operator.core.api import InferentiaModelSpec
from inferentia_operator.core.catalogue import FAMILIES
from inferentia_operator.core.cores import group_size_of, replica_cores
from inferentia_operator.core.drift import quantity
from inferentia_operator.core.names import COMPONENT_LABEL, PLAN_MOUNT
from inferentia_operator.programs import COMPILE_PROGRAM, NXDI_COMPILE_PROGRAM, VLLM_COMPILE_PROGRAM

SAMPLES = sorted((Path(__file__).parents[1] / "manifests" / "samples").glob("*.yaml"))


def rendered(path: Path, capsys) -> list[dict]:
    assert main(["render", str(path)]) == 0
    return [o for o in yaml.safe_load_all(capsys.readouterr().out) if o]


def volume_bytes(pod: dict, name: str) -> int:
    volume = {v["name"]: v for v in pod["volumes"]}[name]
    size = (
        volume["emptyDir"]["sizeLimit"]
        if "emptyDir" in volume
        else volume["ephemeral"]["volumeClaimTemplate"]["spec"]["resources"]["requests"]["storage"]
    )
    return int(quantity(size))


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.stem)
def test_every_sample_sizes_its_pods_for_its_model(path, capsys):
    doc = yaml.safe_load(path.read_text())
    spec = InferentiaModelSpec.model_validate(doc["spec"])
    assert spec.model.weights is not None, "a sample says how big its model is, or nothing can be sized"
    fam = FAMILIES[spec.compute.family]
    groups = replica_cores(spec, fam) // group_size_of(spec, fam)
    objects = rendered(path, capsys)

    # The serving Deployment, or with prefill and decode pools each pool's.
    serving = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["labels"][COMPONENT_LABEL] == "serving"]
    name = doc["metadata"]["name"]
    assert [d["metadata"]["name"] for d in serving] == ([f"{name}-prefill", f"{name}-decode"] if spec.disaggregation else [name])
    for deployment in serving:
        pod = deployment["spec"]["template"]["spec"]
        serve = pod["containers"][0]
        assert volume_bytes(pod, "home") >= sizing.home_bytes(spec)
        if spec.compile.image:
            assert volume_bytes(pod, "compiled") >= sizing.artefact_bytes(spec)
        assert quantity(serve["resources"]["requests"]["memory"]) >= sizing.replica_memory_bytes(spec, fam, groups)
        if sizing.compiles_in_pod(spec):
            assert quantity(serve["resources"]["requests"]["cpu"]) >= groups * int(sizing.compile_cpu(spec, fam))
        probe = serve["startupProbe"]
        assert probe["periodSeconds"] * probe["failureThreshold"] >= sizing.startup_seconds(spec)

    jobs = [o for o in objects if o["kind"] == "Job"]
    assert len(jobs) == (1 if spec.compile.image else 0)
    for job in jobs:
        job_pod = job["spec"]["template"]["spec"]
        (step,) = [c for c in job_pod["initContainers"] if c["name"] == "compile"]
        assert step["image"] == doc["spec"]["compile"]["image"]
        # A program the operator ships in the plan ConfigMap, never the image's own entry point.
        assert step["command"][0] == "python3"
        assert step["command"][1] in (f"{PLAN_MOUNT}/{p}" for p in (COMPILE_PROGRAM, VLLM_COMPILE_PROGRAM, NXDI_COMPILE_PROGRAM))
        assert quantity(step["resources"]["limits"]["memory"]) >= sizing.compile_memory_bytes(spec, fam)
        assert volume_bytes(job_pod, "compiled") >= sizing.artefact_bytes(spec)
        assert volume_bytes(job_pod, "home") >= sizing.compile_home_bytes(spec)
        if "model" in {v["name"] for v in job_pod["volumes"]}:
            assert volume_bytes(job_pod, "model") >= sizing.model_bytes(spec)


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.stem)
def test_no_sample_draws_a_warning(path, capsys):
    """On a cluster whose operator names the Neuron scheduler extension's scheduler, as docs/install.md sets it up."""
    assert main(["validate", "--scheduler-name", "my-scheduler", str(path)]) == 0
    out = capsys.readouterr().out
    assert "warning" not in out, out


def test_every_sample_that_compiles_compiles_ahead_in_a_job():
    """A compile at start makes every pod's start (from zero too) as slow as a compile, and sizes
    every pod for one: each sample that compiles names compile.image."""
    for path in SAMPLES:
        spec = InferentiaModelSpec.model_validate(yaml.safe_load(path.read_text())["spec"])
        assert not sizing.compiles_in_pod(spec), f"{path.name} compiles at start: name compile.image"


def test_a_gated_model_names_its_token_secret():
    for path in SAMPLES:
        spec = yaml.safe_load(path.read_text())["spec"]
        if spec["model"]["uri"].startswith("meta-llama/"):
            env = {e["name"]: e for e in spec["serving"].get("env", [])}
            assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "hf-token", path.name


def test_every_sample_in_a_store_names_how_it_reads_the_store():
    for path in SAMPLES:
        spec = yaml.safe_load(path.read_text())["spec"]
        if "s3://" in spec["model"]["uri"] or "s3://" in spec.get("compile", {}).get("outputUri", ""):
            assert spec.get("serviceAccountName") == "models-reader" or spec.get("compile", {}).get("storageSecret"), path.name
