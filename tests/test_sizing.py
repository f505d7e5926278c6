"""Pods sized from the model (issue 40, item 1): the disk each pod's volumes get, the host
memory and CPU a replica needs, and how long it may take to start, computed from
spec.model.weights and precision, shown by plan, applied by the builders, and a warning from
validate when the spec overrides one of them with less."""

import pytest

from inferentia_operator.core.api import InferentiaModelSpec
from inferentia_operator.core.catalogue import GIB
from inferentia_operator.core.compile.job import compile_job
from inferentia_operator.core.planner import plan
from inferentia_operator.core.pod.model import Model
from inferentia_operator.core.rules import check_spec
from inferentia_operator.core.serving.deployment import serving_deployment
from specs import DROP, make_spec

LLAMA_8B = {
    "model.uri": "meta-llama/Llama-3.1-8B-Instruct",
    "model.architecture": "transformer",
    "model.precision": "bf16",
    "model.weights": 8_030_000_000,
    "compute.family": "inf2",
    "serving.runtime": "vllm",
    "serving.port": 8000,
    "model.layers": 32,
    "model.kvHeads": 8,
    "model.headDim": 128,
    "serving.batching": {"maxBatchSize": 8},
    "compile.buckets": [[4096]],
    # Where a compile Job uploads the artefact of a model that is not in S3.
    "compile.outputUri": "s3://compiled/llama/",
}
LLAMA_70B = {
    **LLAMA_8B,
    "model.weights": 70_600_000_000,
    "model.layers": 80,
    "compute.family": "trn2",
    "compute.inf": 4,
    "compile.buckets": DROP,
}


def model_of(**overrides) -> Model:
    spec = InferentiaModelSpec.model_validate(make_spec(**overrides))
    return Model("m", "default", "u", spec, plan(spec))


def volumes(pod: dict) -> dict[str, dict]:
    return {v["name"]: v for v in pod["volumes"]}


def size_limit(pod: dict, name: str) -> int:
    from inferentia_operator.core.drift import quantity

    return int(quantity(volumes(pod)[name]["emptyDir"]["sizeLimit"]))


def warnings_of(**overrides) -> list[str]:
    return [str(f) for f in check_spec(InferentiaModelSpec.model_validate(make_spec(**overrides))) if f.severity == "warning"]


def test_a_model_of_unknown_size_keeps_the_fixed_sizes():
    sizes = model_of(**{"compile.image": "img:1"}).plan.sizes
    assert (sizes.home_bytes, sizes.artefact_bytes) == (20 * GIB, 50 * GIB)
    assert sizes.memory_bytes is None and sizes.compiles_in_pod is False
    assert sizes.startup_seconds == 1800
    # Without compile.image the operator's model server compiles at start: the compile's budget too.
    assert model_of().plan.sizes.startup_seconds == 1800 + 6 * 3600


def test_a_hugging_face_model_is_downloaded_once_by_its_compile_and_its_replicas_read_the_artefact():
    # 70.6 billion bf16 weights are 141 GB: the compile Job downloads them (the plugin's vllm.LLM),
    # into the artefact it uploads, which holds them with room; the replicas fetch that artefact
    # and download nothing from the Hub, so their HOME is not sized for the weights.
    m = model_of(**{**LLAMA_70B, "compile.image": "img:1"})
    weights = 70_600_000_000 * 2
    assert m.plan.sizes.artefact_bytes >= weights and m.plan.sizes.home_bytes < weights
    pod = serving_deployment(m)["spec"]["template"]["spec"]
    assert size_limit(pod, "home") == m.plan.sizes.home_bytes
    job = compile_job(m)["spec"]["template"]["spec"]
    assert size_limit(job, "home") >= weights
    assert m.plan.sizes.startup_seconds == 1800


def test_without_a_compile_step_each_replica_downloads_the_hub_model_into_home():
    m = model_of(**LLAMA_70B)
    weights = 70_600_000_000 * 2
    assert m.plan.sizes.home_bytes >= weights
    # Loading takes longer than a small model's: the download at 100 MiB/s on top of the load budget.
    assert m.plan.sizes.startup_seconds >= 1800 + weights // (100 * 2**20)


def test_a_compile_in_the_pod_gets_the_compile_jobs_memory_and_budget():
    m = model_of(**LLAMA_8B)  # no compile.image: vLLM compiles at start
    sizes = m.plan.sizes
    assert sizes.compiles_in_pod is True
    # The compile Job's own rule: twice the weights, at least 8 GiB (30 GiB here).
    assert sizes.memory_bytes == 30 * GIB
    assert sizes.startup_seconds >= 1800 + m.spec.compile.timeout_seconds
    probe = serving_deployment(m)["spec"]["template"]["spec"]["containers"][0]["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] >= sizes.startup_seconds
    assert warnings_of(**{**LLAMA_8B, "compute.memory": "12Gi"}) == [
        "warning: spec.compute.memory: 12Gi is less than the 30Gi a replica of this model needs to compile "
        "in the pod (1 process x 30Gi: twice its 16.1 GB of bf16 weights, at least 8Gi); use at least 30Gi, or set compile.image",
        "warning: spec.compute.cpu: 1 is less than the 4 a replica needs to compile in the pod (1 process x 4, a compile Job's CPU); "
        "use at least 4, or set compile.image",
    ]


def test_a_compiled_artefact_holds_the_weights_once_per_bucket():
    m = model_of(**{"model.weights": 124_000_000, "model.precision": "bf16", "compute.family": "inf2",
                    "compile.buckets": [[128], [256]], "compile.image": "img:1"})  # fmt: skip
    artefact = m.plan.sizes.artefact_bytes
    assert artefact >= 2 * 124_000_000 * 2  # torch_neuronx.trace inlines the weights in each NEFF
    assert artefact < 3 * GIB
    for pod in (serving_deployment(m)["spec"]["template"]["spec"], compile_job(m)["spec"]["template"]["spec"]):
        assert size_limit(pod, "compiled") == artefact
    # The compile Job fetches the uncompiled model, which may be saved at fp32: four bytes a weight.
    assert size_limit(compile_job(m)["spec"]["template"]["spec"], "model") >= 124_000_000 * 4


def test_serving_memory_holds_each_processs_copy_of_the_weights():
    m = model_of(**{**LLAMA_8B, "compile.image": "img:1", "compute.memory": "12Gi"})
    assert m.plan.sizes.memory_bytes == 8_030_000_000 * 2
    memory_warnings = lambda **spec: [w for w in warnings_of(**spec) if "spec.compute.memory" in w]  # noqa: E731
    assert memory_warnings(**{**LLAMA_8B, "compile.image": "img:1", "compute.memory": "12Gi"}) == [
        "warning: spec.compute.memory: 12Gi is less than the 15Gi a replica of this model needs to load it "
        "(1 process x 16.1 GB of bf16 weights, which pass through host memory on their way to the device); use at least 15Gi"
    ]
    assert memory_warnings(**{**LLAMA_8B, "compile.image": "img:1", "compute.memory": "16Gi"}) == []


@pytest.mark.parametrize(
    "field,value,words",
    [
        ("serving.homeSize", "20Gi", "spec.serving.homeSize: 20Gi is less than the"),
        ("compile.memory", "16Gi", "spec.compile.memory: 16Gi is less than the 30Gi"),
        ("serving.startupSeconds", 600, "spec.serving.startupSeconds: 600 is less than the"),
    ],
)
def test_an_override_below_the_computed_need_is_a_warning_naming_it(field, value, words):
    big = {**LLAMA_70B, "compute.memory": "300Gi", "compile.image": "img:1"}
    if field == "serving.homeSize":
        big = {**LLAMA_70B, "compute.memory": "300Gi"}  # each replica downloads the weights into HOME
    if field == "compile.memory":
        big = {**LLAMA_8B, "compile.image": "img:1", "compute.memory": "16Gi"}
    found = warnings_of(**{**big, field: value})
    assert any(words in w for w in found), found


def test_a_storage_class_puts_the_sized_volumes_on_a_claim_per_pod():
    m = model_of(**{**LLAMA_8B, "compile.image": "img:1", "serving.storageClassName": "gp3"})
    pod = serving_deployment(m)["spec"]["template"]["spec"]
    home = volumes(pod)["home"]
    assert "emptyDir" not in home
    claim = home["ephemeral"]["volumeClaimTemplate"]["spec"]
    assert claim["storageClassName"] == "gp3" and claim["accessModes"] == ["ReadWriteOnce"]
    assert claim["resources"]["requests"]["storage"] == f"{m.plan.sizes.home_bytes // GIB}Gi"
    assert "ephemeral" in volumes(pod)["compiled"] and "emptyDir" in volumes(pod)["tmp"]
    assert "ephemeral" in volumes(compile_job(m)["spec"]["template"]["spec"])["home"]


def test_a_compile_cpu_in_millicores_is_a_quantity_not_a_crash():
    """compile.cpu is a Kubernetes quantity: 500m is valid, and two processes compiling at
    start need 1 CPU from it."""
    found = warnings_of(**{**LLAMA_8B, "compile.cpu": "500m", "compute.memory": "64Gi", "compute.cpu": "250m"})
    assert (
        "warning: spec.compute.cpu: 250m is less than the 0.5 a replica needs to compile in the pod (1 process x 500m, a compile Job's CPU); use at least 0.5, or set compile.image"
        in found
    )


# 405 billion bf16 weights (810 GB) across whole trn1.32xlarge nodes, as test_rules holds them.
LLAMA_405B_ACROSS = {
    "model.uri": "s3://models/llama-405b/", "model.weights": 405_000_000_000, "model.precision": "bf16",
    "model.architecture": "transformer", "model.layers": 126, "model.kvHeads": 8, "model.headDim": 128,
    "compile.buckets": [[4096]], "serving.runtime": "vllm", "serving.batching": {"maxBatchSize": 8},
    "compute.family": "trn1", "compute.inf": 16, "compute.cpu": "8",
}  # fmt: skip


@pytest.mark.parametrize("nodes", [2, 3])
def test_a_replica_across_nodes_needs_each_nodes_share_of_the_weights_in_host_memory(nodes):
    """Each pod of a group loads only its own node's ranks: its host memory is the weights over
    the nodes, not the whole 810 GB, which no trn1.32xlarge (512 GiB) could give it."""
    whole = 405_000_000_000 * 2
    share = -(-whole // nodes)
    m = model_of(**{**LLAMA_405B_ACROSS, "compute.nodes": nodes})
    assert m.plan.sizes.memory_bytes == share < whole
    # validate asks for the share, not the whole: memory that holds one node's share is enough.
    holds_share = f"{-(-share // GIB)}Gi"
    memory_warnings = lambda memory: [  # noqa: E731
        w for w in warnings_of(**{**LLAMA_405B_ACROSS, "compute.nodes": nodes, "compute.memory": memory}) if "spec.compute.memory" in w
    ]
    assert memory_warnings(holds_share) == []
    [short] = memory_warnings(f"{share // GIB - 1}Gi")
    assert f"is less than the {holds_share} each of a replica's {nodes} pods needs to load its node's share" in short, short
    # Not a compile's "twice its weights", and no advice to compile ahead: groups across nodes always do.
    assert "twice" not in short and "compile.image" not in short
