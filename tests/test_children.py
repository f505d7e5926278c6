"""Every child field against the plan, without a cluster; and the compile-reuse contract."""

import json

import pytest

from inferentia_operator import programs
from inferentia_operator.core.api import InferentiaModelSpec
from inferentia_operator.core.compile.job import compile_job, compile_resources
from inferentia_operator.core.decide import rendered
from inferentia_operator.core.device_claims.template import resource_claim_template
from inferentia_operator.core.launcher import LAUNCHER
from inferentia_operator.core.names import DEFAULT_OPERATOR_IMAGE, TRAFFIC_LABEL
from inferentia_operator.core.planner import plan
from inferentia_operator.core.pod import model as model_module
from inferentia_operator.core.pod.artefact import compile_hash, compile_inputs, compile_job_name, compiled_uri
from inferentia_operator.core.pod.containers import CONTAINER_SECURITY
from inferentia_operator.core.pod.contribution import PodContribution, combined
from inferentia_operator.core.pod.dirs import COMPILED_DIR, MODEL_DIR
from inferentia_operator.core.pod.meta import selector
from inferentia_operator.core.pod.model import Model, plan_configmap_name, plan_document, plan_hash
from inferentia_operator.core.pod.vllm import vllm_engine_args
from inferentia_operator.core.scale_to_zero.holder import replicas_service
from inferentia_operator.core.serving.deployment import serving_deployment
from inferentia_operator.core.serving.drain import DRAIN_SECONDS, UNBOUNDED_REQUEST_SECONDS
from inferentia_operator.core.serving.runtime import vllm_args
from inferentia_operator.core.serving.service import plan_configmap, serving_network_policy
from inferentia_operator.core.serving.service import service as service_of
from specs import make_spec


def model(**overrides) -> Model:
    spec = InferentiaModelSpec.model_validate(make_spec(**overrides))
    return Model("resnet", "team", "uid-1", spec, plan(spec))


THROUGHPUT = {
    "model.architecture": "cnn",
    "processesPerReplica": 4,
    "compile.batchSize": 4,
    "compile.image": "example.com/compile:1",
    "serving.port": 8500,
    "serving.args": ["serve", "--model", "/models"],
    "replicas": 3,
}


def test_deployment_carries_the_plan():
    m = model(**THROUGHPUT)
    d = serving_deployment(m)
    assert d["metadata"]["ownerReferences"][0] | {} == {
        "apiVersion": "inferentia.dev/v1alpha1", "kind": "InferentiaModel", "name": "resnet",
        "uid": "uid-1", "controller": True, "blockOwnerDeletion": True,
    }  # fmt: skip
    spec = d["spec"]
    assert spec["replicas"] == 3
    assert spec["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    pod = spec["template"]["spec"]
    [container] = pod["containers"]
    assert container["resources"] == {
        "requests": {"aws.amazon.com/neuron": "1", "cpu": "1", "memory": "2Gi"},
        "limits": {"aws.amazon.com/neuron": "1", "memory": "2Gi"},
    }
    assert pod["tolerations"] == [{"key": "aws.amazon.com/neuron", "operator": "Exists", "effect": "NoSchedule"}]
    [term] = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": m.plan.instance_types}]
    assert pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"] == 100
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["NEURON_CC_FLAGS"] == " ".join(m.plan.compiler_args)
    assert env["INFERENTIA_PROCESSES"] == "4"
    assert env["INFERENTIA_COMPILED_MODEL_URI"] == compiled_uri(m)
    assert "NEURON_RT_VISIBLE_CORES" not in env  # four processes: each gets its own from env-<i>
    assert [p["containerPort"] for p in container["ports"]] == [8500, 8501, 8502, 8503]
    assert container["command"] == ["/bin/sh", "/etc/inferentia/launch.sh"]
    assert container["args"] == ["serve", "--model", "/models"]
    assert container["readinessProbe"]["tcpSocket"] == {"port": "serve-0"}
    assert spec["template"]["metadata"]["annotations"] == {"inferentia.dev/plan-hash": plan_hash(m.plan)}
    assert pod["volumes"] == [
        {"name": "plan", "configMap": {"name": plan_configmap_name(m)}},
        {"name": "home", "emptyDir": {"sizeLimit": "20Gi"}},
        {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
        {"name": "compiled", "emptyDir": {"sizeLimit": "50Gi"}},
    ]


def test_one_process_gets_its_group_in_the_container_environment_but_never_its_cores():
    m = model(**{"compute.inf": 4})
    [container] = serving_deployment(m)["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    # The device plugin sets the granted cores; a literal value in the pod spec would win over it.
    assert "NEURON_RT_VISIBLE_CORES" not in env
    assert env["NEURON_RT_NUM_CORES"] == "16"
    assert env["NEURON_MAX_NUM_INFERS"] == "19"
    # A PyTorch model without args: the launcher runs the operator's model server, which traces
    # the model it fetched (no compile image) at start.
    assert container["command"] == ["/bin/sh", "/etc/inferentia/launch.sh"]
    assert container["args"] == ["python3", "/etc/inferentia/neuron_serve.py"]
    assert env["INFERENTIA_MODEL_PATH"] == "/var/lib/inferentia/model"
    assert "INFERENTIA_COMPILED_MODEL_URI" not in env  # no compile image
    [fetch] = serving_deployment(m)["spec"]["template"]["spec"]["initContainers"]
    assert fetch["args"] == ["fetch", "--model", "--from", "s3://models/resnet50/", "--to", "/var/lib/inferentia/model"]
    assert fetch["image"] == m.operator_image


def test_user_env_wins_over_planned_env():
    m = model(**{"serving.env": [{"name": "INFERENTIA_THREADS", "value": "32"}]})
    [container] = serving_deployment(m)["spec"]["template"]["spec"]["containers"]
    assert [e for e in container["env"] if e["name"] == "INFERENTIA_THREADS"] == [{"name": "INFERENTIA_THREADS", "value": "32"}]


def test_user_env_wins_in_every_process_the_launcher_starts(tmp_path):
    """The launcher exports each group's env-i over the container's environment: a name the
    user set must not be in env-i, or the planned value would win in every process."""
    m = model(**THROUGHPUT, **{"serving.env": [{"name": "NEURON_CC_FLAGS", "value": "--mine"}]})
    assert all("NEURON_CC_FLAGS=" not in text for name, text in plan_configmap(m)["data"].items() if name.startswith("env-"))
    _, started = run_launcher(tmp_path, m, extra_env={"NEURON_CC_FLAGS": "--mine"})
    assert [line.split(" ", 4)[4] for line in started] == ["--mine"] * 4


def test_plan_configmap_holds_the_plan_and_each_process_environment():
    m = model(**THROUGHPUT)
    cm = plan_configmap(m)
    assert cm["immutable"] is True
    assert json.loads(cm["data"]["plan.json"])["visibleCores"] == ["0", "1", "2", "3"]
    assert cm["data"]["env-2"].splitlines()[0] == "NEURON_RT_VISIBLE_CORES=2"
    assert "launch.sh" in cm["data"]


def test_a_plan_configmap_built_once_is_each_callers_own():
    """A model builds its plan ConfigMap's content once (it is named by its hash in three
    children); a body that a caller changes leaves the next body, and the name, as planned."""
    m = model(**THROUGHPUT)
    first = plan_configmap(m)
    name = first["metadata"]["name"]
    first["data"]["plan.json"] = "changed"
    first["data"]["extra"] = "x"
    again = plan_configmap(m)
    assert again["data"] == plan_configmap(model(**THROUGHPUT))["data"] and "extra" not in again["data"]
    assert again["metadata"]["name"] == name == plan_configmap_name(m)


def test_compile_job_fetches_compiles_in_the_users_image_and_uploads_marker_last():
    """The compile Job's pod: the operator's image fetches the model, the user's image runs the
    operator's compile program from the plan, the operator's image uploads the artefact."""
    m = model(**THROUGHPUT)
    job = compile_job(m)
    assert job["metadata"]["name"].startswith(f"compile-{compile_hash(m)}-")
    pod = job["spec"]["template"]["spec"]
    fetch, compile_step = pod["initContainers"]
    [upload] = pod["containers"]
    assert (fetch["image"], upload["image"]) == (m.operator_image, m.operator_image)
    assert fetch["args"] == ["fetch", "--model", "--from", "s3://models/resnet50/", "--to", "/var/lib/inferentia/model"]
    assert upload["args"] == ["upload", "--from", "/var/lib/inferentia/compiled", "--to", compiled_uri(m)]
    assert compile_step["image"] == "example.com/compile:1"
    assert compile_step["command"] == ["python3", "/etc/inferentia/neuron_compile.py"]
    env = {e["name"]: e["value"] for e in compile_step["env"]}
    assert env["INFERENTIA_MODEL_PATH"] == "/var/lib/inferentia/model"
    assert env["INFERENTIA_COMPILED_MODEL_DIR"] == "/var/lib/inferentia/compiled"
    # Only what the programs read: the compile shape is in the plan file, not in variables nobody reads.
    assert env["NEURON_CC_FLAGS"] == " ".join(m.plan.compiler_args) and "INFERENTIA_COMPILER_ARGS" not in env
    # The plan the program reads carries what it traces with; the program itself is in the ConfigMap.
    plan_json = json.loads(plan_configmap(m)["data"]["plan.json"])
    assert (plan_json["compilerArgs"], plan_json["buckets"], plan_json["inputDtype"]) == (m.plan.compiler_args, [[3, 224, 224]], "float32")
    assert "neuron_compile.py" in plan_configmap(m)["data"]
    assert "neuron_serve.py" not in plan_configmap(m)["data"]  # serving.args: the user's own server
    # Storage credentials reach the operator's containers only, never the user's image.
    assert "envFrom" not in compile_step
    assert "tolerations" not in pod  # compiling needs no Neuron node
    assert compile_job(model()) is None


@pytest.mark.parametrize(
    "change,recompiles",
    [
        ({"processesPerReplica": 2}, True),  # new group size, new flags
        ({"model.uri": "s3://models/resnet50-v2/"}, True),
        ({"compute.family": "inf2", "processesPerReplica": 2}, True),
        ({"compile.image": "example.com/compile:2"}, True),
        ({"replicas": 7}, False),
        ({"serving.image": "example.com/serve:2"}, False),
        ({"compute.cpu": "4"}, False),
    ],
)
def test_only_compile_inputs_change_the_compile_job(change, recompiles):
    before = model(**THROUGHPUT)
    after = model(**{**THROUGHPUT, **change})
    assert (compile_job_name(before) != compile_job_name(after)) is recompiles


def test_service_exposes_every_process_port():
    m = model(**THROUGHPUT)
    svc = service_of(m)
    assert [(p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == [
        (8500, "serve-0"), (8501, "serve-1"), (8502, "serve-2"), (8503, "serve-3"),
    ]  # fmt: skip
    assert svc["spec"]["selector"] == {**selector(m), TRAFFIC_LABEL: "on"}


def test_children_carry_the_standard_labels():
    m = model(**THROUGHPUT)
    for child in (serving_deployment(m), service_of(m), plan_configmap(m), compile_job(m)):
        labels = child["metadata"]["labels"]
        assert labels["app.kubernetes.io/managed-by"] == "inferentia-operator"
        assert labels["inferentia.dev/model"] == "resnet"
        assert labels["app.kubernetes.io/instance"] == "resnet"


def run_launcher(tmp_path, m, granted=None, extra_env=None):
    """Runs launch.sh from the plan ConfigMap; each "serving process" records what it was
    given, then the first to exit ends the launcher. Returns (result, recorded lines)."""
    import os
    import subprocess

    for name, text in plan_configmap(m)["data"].items():
        (tmp_path / name).write_text(text)
    out = tmp_path / "started"
    env = {
        "PATH": os.environ["PATH"],
        "INFERENTIA_PLAN_DIR": str(tmp_path),
        "INFERENTIA_PROCESSES": str(m.plan.groups),
        "INFERENTIA_GROUP_SIZE": str(m.plan.group_size),
        "INFERENTIA_BASE_PORT": str(m.spec.serving.port),
        **(extra_env or {}),
    }
    if granted is not None:
        env["NEURON_RT_VISIBLE_CORES"] = granted
    record = f'echo "$INFERENTIA_PROCESS_INDEX $NEURON_RT_VISIBLE_CORES $NEURON_RT_NUM_CORES $PORT $NEURON_CC_FLAGS" >> {out}; sleep 0.2'
    result = subprocess.run(
        ["/bin/sh", str(tmp_path / "launch.sh"), "sh", "-c", record], env=env, capture_output=True, text=True, timeout=30
    )
    return result, sorted(out.read_text().splitlines()) if out.exists() else []


def test_the_launcher_gives_each_process_its_group_and_port(tmp_path):
    m = model(**THROUGHPUT)
    result, started = run_launcher(tmp_path, m)
    assert result.returncode == 1 and "exited with 0; stopping the others" in result.stderr
    flags = " ".join(m.plan.compiler_args)
    assert started == [f"{i} {i} 1 {8500 + i} {flags}" for i in range(4)]


def test_the_launcher_splits_the_cores_the_container_was_granted(tmp_path):
    # inf2, 2 chips = 4 cores, two tensor-parallel groups of 2; the device plugin granted 4-7.
    m = model(**{"compute.family": "inf2", "compute.inf": 2, "processesPerReplica": 2, "serving.args": ["serve"]})
    assert m.plan.visible_cores == ["0-1", "2-3"]
    _, started = run_launcher(tmp_path, m, granted="4-7")
    flags = " ".join(m.plan.compiler_args)
    assert started == [f"0 4-5 2 8080 {flags}", f"1 6-7 2 8081 {flags}"]


@pytest.mark.parametrize(
    "granted,groups",
    [("2,3,6,7", ["2-3", "6-7"]), ("0-1,5", None), ("1,3,5,7", ["1,3", "5,7"]), ("12-15", ["12-13", "14-15"])],
)
def test_the_launcher_takes_lists_and_ranges_and_refuses_a_wrong_count(tmp_path, granted, groups):
    m = model(**{"compute.family": "inf2", "compute.inf": 2, "processesPerReplica": 2, "serving.args": ["serve"]})
    result, started = run_launcher(tmp_path, m, granted=granted)
    if groups is None:
        assert result.returncode == 1 and "are 3, but the plan needs 2 groups of 2" in result.stderr
        assert started == []
    else:
        assert [line.split()[1] for line in started] == groups


def test_the_launcher_refuses_a_core_list_it_cannot_read(tmp_path):
    m = model(**{"compute.family": "inf2", "processesPerReplica": 2, "serving.args": ["serve"]})
    result, started = run_launcher(tmp_path, m, granted="0-x")
    assert result.returncode != 0 and "is not a list of cores" in result.stderr and started == []


VLLM = {
    "model.uri": "s3://models/llama-3.1-8b/",
    "model.framework": "pytorch",
    "model.architecture": "transformer",
    "model.precision": "bf16",
    "compute.family": "inf2",
    "compute.inf": 6,
    "processesPerReplica": 3,
    "compile.buckets": [[1024], [4096]],
    "serving.port": 8000,
    "serving.runtime": "vllm",
    "serving.batching": {"maxBatchSize": 8},
    "serving.args": ["--block-size", "32"],
}


def test_the_vllm_preset_runs_one_tensor_parallel_server_per_group():
    m = model(**VLLM, **{"compile.image": "example.com/compile:1"})
    [container] = serving_deployment(m)["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["/bin/sh", "/etc/inferentia/launch.sh"]
    assert container["args"] == [
        "/bin/sh", "-c", 'exec python3 -m vllm.entrypoints.openai.api_server --port "$PORT" "$@"', "vllm",
        "--model", MODEL_DIR, "--served-model-name", "s3://models/llama-3.1-8b/", "--tensor-parallel-size", "4",
        "--max-model-len", "4096", "--max-num-seqs", "8",
        # vLLM on NxD Inference: the KV cache as the compiled model has it (pod.vllm.vllm_engine_args).
        "--no-enable-prefix-caching", "--num-gpu-blocks-override", "8",
        "--block-size", "32",
    ]  # fmt: skip
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["VLLM_NEURON_FRAMEWORK"] == "neuronx-distributed-inference"
    # The artefact is fetched into a local directory before the server starts, and a cache
    # miss there ends the server instead of compiling in the serving pod.
    assert env["NEURON_COMPILED_ARTIFACTS"] == COMPILED_DIR
    assert env["VLLM_NEURON_DISABLE_WARMUP_COMPILE"] == "1"
    # The compiled model, and the store's model (vLLM reads no object store without the Run:ai streamer).
    [fetch, fetch_model] = serving_deployment(m)["spec"]["template"]["spec"]["initContainers"]
    assert fetch["args"] == ["fetch", "--from", compiled_uri(m), "--to", COMPILED_DIR]
    assert fetch_model["args"] == ["fetch", "--model", "--from", "s3://models/llama-3.1-8b/", "--to", MODEL_DIR]
    assert {"name": "compiled", "mountPath": COMPILED_DIR, "readOnly": True} in container["volumeMounts"]
    assert container["startupProbe"]["httpGet"] == {"path": "/health", "port": "serve-0"}
    assert container["startupProbe"]["failureThreshold"] * container["startupProbe"]["periodSeconds"] >= 600
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"


TRN2_VLLM = {**VLLM, "compute.family": "trn2", "compute.inf": 1, "processesPerReplica": 1, "compile.image": "example.com/vllm-neuronx:2.31"}


@pytest.mark.parametrize("family", ["trn2", "trn3"])
def test_on_trn2_and_trn3_vllm_runs_on_the_neuron_plugin_from_the_cache_its_compile_job_fills(family):
    m = model(**{**TRN2_VLLM, "compute.family": family})
    [container] = serving_deployment(m)["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    # The plugin registers itself: no NxD Inference framework, no NxD Inference artefact.
    assert "VLLM_NEURON_FRAMEWORK" not in env and "NEURON_COMPILED_ARTIFACTS" not in env
    assert (env["VLLM_CACHE_ROOT"], env["VLLM_NEURON_DISABLE_WARMUP_COMPILE"]) == (COMPILED_DIR, "1")
    # The plugin locks its cache's entries: the fetched cache is writable for the server.
    # Writable (no readOnly: the API server drops a false one).
    assert {"name": "compiled", "mountPath": COMPILED_DIR} in container["volumeMounts"]
    assert container["args"][4:10] == [
        "--model", MODEL_DIR, "--served-model-name", "s3://models/llama-3.1-8b/", "--tensor-parallel-size", "4",
    ]  # fmt: skip
    job = compile_job(m)
    compile_step = job["spec"]["template"]["spec"]["initContainers"][-1]
    assert compile_step["command"] == ["python3", "/etc/inferentia/vllm_compile.py"]
    jenv = {e["name"]: e["value"] for e in compile_step["env"]}
    assert (jenv["VLLM_NEURON_CPU_COMPILE"], jenv["NEURON_PLATFORM_TARGET_OVERRIDE"], jenv["VLLM_CACHE_ROOT"]) == (
        "1",
        family,
        COMPILED_DIR,
    )
    engine = json.loads(jenv["INFERENTIA_VLLM_ENGINE_ARGS"])
    # serving.args' --block-size is the cache's shape, which the plugin compiles in: the compile step gets it too.
    assert engine == {"model": MODEL_DIR, "served_model_name": "s3://models/llama-3.1-8b/", "tensor_parallel_size": 4,
                      "max_model_len": 4096, "max_num_seqs": 8, "block_size": 32}  # fmt: skip
    # The same engine as the serving flags: the graphs the server warms up are those compiled.
    flags = container["args"][4:16]
    assert dict(zip(flags[::2], flags[1::2], strict=True)) == {f"--{k.replace('_', '-')}": str(v) for k, v in engine.items()}
    assert "vllm_compile.py" in plan_configmap(m)["data"]
    assert compile_inputs(m)["engineArgs"] == engine
    # Compiling needs no Neuron device: the Job asks for none.
    assert not any(k.startswith("aws.amazon.com/") for k in compile_step["resources"]["requests"])


@pytest.mark.parametrize("family", ["inf2", "trn1"])
def test_on_inf2_and_trn1_vllm_is_compiled_by_the_operators_nxd_inference_program(family):
    """vLLM on NxD Inference loads a compiled model from NEURON_COMPILED_ARTIFACTS; the compile
    Job makes it with the operator's program, in the image the spec names (AWS's own vLLM
    image), never the image's entry point."""
    m = model(**{**TRN2_VLLM, "compute.family": family})
    [container] = serving_deployment(m)["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["VLLM_NEURON_FRAMEWORK"] == "neuronx-distributed-inference" and "VLLM_CACHE_ROOT" not in env
    assert env["NEURON_COMPILED_ARTIFACTS"] == COMPILED_DIR
    job = compile_job(m)
    compile_step = job["spec"]["template"]["spec"]["initContainers"][-1]
    assert compile_step["command"] == ["python3", "/etc/inferentia/nxdi_compile.py"]
    assert compile_step["image"] == "example.com/vllm-neuronx:2.31"
    jenv = {e["name"]: e["value"] for e in compile_step["env"]}
    # No Neuron device in the Job: the target is named, as AWS requires when none is present.
    assert (jenv["NEURON_PLATFORM_TARGET_OVERRIDE"], jenv["INFERENTIA_COMPILED_MODEL_DIR"]) == (family, COMPILED_DIR)
    assert "VLLM_NEURON_CPU_COMPILE" not in jenv  # the plugin's, which NxD Inference never reads
    engine = json.loads(jenv["INFERENTIA_VLLM_ENGINE_ARGS"])
    # The engine the serving flags start: the compiled model is the one vLLM would have compiled.
    assert engine["enable_prefix_caching"] is False and "--no-enable-prefix-caching" in container["args"]
    flags = [a for a in container["args"][4:-2] if a != "--no-enable-prefix-caching"]  # less serving.args
    valued = {f"--{k.replace('_', '-')}": str(v) for k, v in engine.items() if k != "enable_prefix_caching"}
    assert dict(zip(flags[::2], flags[1::2], strict=True)) == valued
    # The store's model is fetched for the program, which reads a local checkpoint.
    assert [c["name"] for c in job["spec"]["template"]["spec"]["initContainers"]] == ["fetch-model", "compile"]
    assert jenv["INFERENTIA_MODEL_PATH"] == MODEL_DIR
    data = plan_configmap(m)["data"]
    assert "nxdi_compile.py" in data and "vllm_compile.py" not in data
    inputs = compile_inputs(m)
    assert (inputs["vllm"], inputs["engineArgs"]) == ("nxd-inference", engine) and inputs["program"] >= 1
    assert not any(k.startswith("aws.amazon.com/") for k in compile_step["resources"]["requests"])


def test_the_vllm_preset_without_a_compile_job_loads_the_model_uri():
    m = model(**{**VLLM, "serving.args": None, "serving.batching": None, "compile.buckets": None, "processesPerReplica": 1})
    [container] = serving_deployment(m)["spec"]["template"]["spec"]["containers"]
    assert container["args"][4:] == [
        "--model", MODEL_DIR, "--served-model-name", "s3://models/llama-3.1-8b/", "--tensor-parallel-size", "12",
        "--no-enable-prefix-caching",
    ]  # fmt: skip
    assert "NEURON_COMPILED_ARTIFACTS" not in {e["name"] for e in container["env"]}
    [fetch_model] = serving_deployment(m)["spec"]["template"]["spec"]["initContainers"]
    assert fetch_model["args"][-1] == MODEL_DIR


def test_the_compile_key_holds_what_invalidates_an_artefact_and_nothing_else():
    base = model(**VLLM, **{"compile.image": "example.com/compile:2.21"})
    key = compile_hash(base)
    # Replicas, resources and serving options never recompile.
    for same in ({"replicas": 5}, {"compute.cpu": "8"}, {"compute.memory": "64Gi"}, {"serving.port": 9000}):
        assert compile_hash(model(**{**VLLM, "compile.image": "example.com/compile:2.21", **same})) == key, same
    # The SDK (as the compile image names it), the compiler's flags and the tensor-parallel degree do.
    for other in ({"compile.image": "example.com/compile:2.22"}, {"compile.extraArgs": ["-O3"]}, {"processesPerReplica": 6}):
        assert compile_hash(model(**{**VLLM, "compile.image": "example.com/compile:2.21", **other})) != key, other
    inputs = compile_inputs(base)
    assert {"compiler", "lnc", "tensorParallelSize", "buckets", "compilerArgs", "image"} <= set(inputs)
    annotation = compile_job(base)["metadata"]["annotations"]["inferentia.dev/compile-inputs"]
    assert json.loads(annotation) == inputs


def test_storage_credentials_reach_the_compile_job_and_the_fetch_only():
    m = model(**VLLM, **{"compile.image": "example.com/compile:1", "compile.storageSecret": "s3-creds"}, serviceAccountName="models")
    secret = [{"secretRef": {"name": "s3-creds"}}]
    job_pod = compile_job(m)["spec"]["template"]["spec"]
    pod = serving_deployment(m)["spec"]["template"]["spec"]
    assert job_pod["containers"][0]["envFrom"] == secret and pod["initContainers"][0]["envFrom"] == secret
    assert "envFrom" not in pod["containers"][0]  # the server itself never sees the store's keys
    assert job_pod["serviceAccountName"] == pod["serviceAccountName"] == "models"


def test_the_vllm_command_passes_user_text_as_arguments_not_shell(tmp_path):
    """The flags reach vLLM as separate arguments: a model URI with shell syntax stays literal."""
    import subprocess

    m = model(**{**VLLM, "model.uri": "s3://x/$(touch pwned);y", "serving.args": None})
    script_args = vllm_args(m)
    # Stand in for python3: print each argument vLLM would receive on its own line.
    fake = tmp_path / "python3"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    fake.chmod(0o755)
    result = subprocess.run(
        script_args, env={"PATH": f"{tmp_path}:/usr/bin:/bin", "PORT": "8001"}, cwd=tmp_path, capture_output=True, text=True
    )
    assert result.stdout.splitlines()[:8] == [
        "-m", "vllm.entrypoints.openai.api_server", "--port", "8001", "--model", MODEL_DIR,
        "--served-model-name", "s3://x/$(touch pwned);y",
    ]  # fmt: skip
    assert not (tmp_path / "pwned").exists()


def test_the_compiler_is_a_compile_input_of_neuronx_families():
    m = model(**VLLM, **{"compile.image": "example.com/compile:1"})
    assert compile_inputs(m)["compiler"] == "neuronx-cc"
    job = compile_job(m)
    compile_step = job["spec"]["template"]["spec"]["initContainers"][-1]
    env = {e["name"]: e["value"] for e in compile_step["env"]}
    assert env["INFERENTIA_COMPILER"] == "neuronx-cc"
    # The vLLM preset's compile runs the operator's NxD Inference program, never the image's entry point.
    assert compile_step["command"] == ["python3", "/etc/inferentia/nxdi_compile.py"]
    assert "compiler" not in compile_inputs(model(**THROUGHPUT))  # inf1 hashes stay as they were


def test_the_plan_configmap_name_follows_its_whole_content(monkeypatch):
    m = model(**THROUGHPUT)
    before = plan_configmap_name(m)
    assert plan_configmap(m)["metadata"]["name"] == before
    assert plan_configmap_name(model(**{**THROUGHPUT, "replicas": 9})) == before  # same content
    monkeypatch.setattr(model_module, "LAUNCHER", LAUNCHER + "# a newer operator\n")
    # A newer operator builds the model afresh: an immutable ConfigMap is replaced, never edited.
    assert plan_configmap_name(model(**THROUGHPUT)) != before


def test_serving_and_compile_pods_are_hardened_by_default():
    m = model(**THROUGHPUT)
    pods = [serving_deployment(m)["spec"]["template"]["spec"], compile_job(m)["spec"]["template"]["spec"]]
    for pod in pods:
        assert pod["automountServiceAccountToken"] is False
        assert pod["securityContext"] == {
            "runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532, "seccompProfile": {"type": "RuntimeDefault"},
        }  # fmt: skip
        [container] = pod["containers"]
        assert container["securityContext"] == {
            "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": True,
        }  # fmt: skip
        # A read-only root and a non-root user: HOME, the caches and TMPDIR are size-limited emptyDirs.
        env = {e["name"]: e["value"] for e in container["env"]}
        mounts = {v["mountPath"] for v in container["volumeMounts"]}
        assert {env["HOME"], env["TMPDIR"]} <= mounts and env["HF_HOME"].startswith(env["HOME"] + "/")
        assert all(v["emptyDir"]["sizeLimit"] for v in pod["volumes"] if "emptyDir" in v)


def test_run_as_root_is_an_explicit_escape_hatch():
    m = model(**THROUGHPUT, runAsRoot=True)
    pod = serving_deployment(m)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == 0 and pod["securityContext"]["runAsNonRoot"] is False
    assert pod["containers"][0]["securityContext"]["allowPrivilegeEscalation"] is False


def test_batching_adds_a_front_end_on_the_serving_port_and_moves_the_processes_up_one():
    m = model(**THROUGHPUT, **{"serving.batching": {"maxBatchSize": 4, "maxLatencyMs": 50}, "compile.buckets": [[64], [128]]})
    # The plan says so, and status.plan and render show it.
    assert plan_document(m.plan)["frontEnd"] == {"port": 8500, "processBasePort": 8501, "maxBatchSize": 4, "maxLatencyMs": 50}
    pod = serving_deployment(m)["spec"]["template"]["spec"]
    serve, batcher = pod["containers"]
    assert [p["containerPort"] for p in serve["ports"]] == [8501, 8502, 8503, 8504]
    assert {e["name"]: e["value"] for e in serve["env"]}["INFERENTIA_BASE_PORT"] == "8501"
    assert batcher["image"] == DEFAULT_OPERATOR_IMAGE
    assert batcher["args"] == [
        "batch", "--port", "8500", "--processes", "4", "--process-base-port", "8501",
        "--max-batch-size", "4", "--max-latency-ms", "50", "--buckets", "[[64], [128]]",
    ]  # fmt: skip
    assert batcher["ports"] == [{"name": "batch", "containerPort": 8500, "protocol": "TCP"}]
    assert batcher["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "batch", "scheme": "HTTP"}
    assert batcher["securityContext"] == CONTAINER_SECURITY
    # The front end is the model's one door: its processes' ports are for it alone, on the pod.
    for service in (service_of(m), replicas_service(m)):
        assert [(p["name"], p["port"]) for p in service["spec"]["ports"]] == [("batch", 8500)]
    # The image can be set per model, or for the whole operator.
    custom = model(**THROUGHPUT, **{"serving.batching": {"image": "registry.example.com/batcher:2"}})
    assert serving_deployment(custom)["spec"]["template"]["spec"]["containers"][1]["image"] == "registry.example.com/batcher:2"


def test_no_front_end_without_batching_or_with_vllm():
    assert len(serving_deployment(model(**THROUGHPUT))["spec"]["template"]["spec"]["containers"]) == 1
    m = model(**VLLM)  # vLLM batches sequences itself: batching becomes --max-num-seqs
    assert len(serving_deployment(m)["spec"]["template"]["spec"]["containers"]) == 1
    assert m.plan.front_end is None and "frontEnd" not in plan_document(model(**THROUGHPUT).plan)


def test_the_compile_job_has_resources_a_deadline_and_bounded_retries():
    job = compile_job(model(**{"compile.image": "example.com/compile:1"}))
    container = next(c for c in job["spec"]["template"]["spec"]["initContainers"] if c["name"] == "compile")
    assert container["resources"] == {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"memory": "8Gi"}}  # never BestEffort
    assert job["spec"]["backoffLimit"] == 1 and job["spec"]["activeDeadlineSeconds"] == 6 * 3600
    # 70B bf16 weights: 2 x 140 GB, on neuronx-cc; overrides win and change no compile hash.
    # 140 GB of weights fit one process on inf2.48xlarge's 12 chips (384 GiB), not three on 6.
    BIG = {**VLLM, "compute.inf": 12, "processesPerReplica": 1}
    big = model(**{**BIG, "compile.buckets": None, "compile.image": "example.com/compile:1", "model.weights": 70_000_000_000})
    assert compile_resources(big) == {"requests": {"cpu": "4", "memory": "261Gi"}, "limits": {"memory": "261Gi"}}
    tuned = model(**{**BIG, "compile.buckets": None, "compile.image": "example.com/compile:1", "model.weights": 70_000_000_000,
                     "compile.cpu": "16", "compile.memory": "600Gi", "compile.timeoutSeconds": 7200})  # fmt: skip
    assert compile_resources(tuned)["requests"] == {"cpu": "16", "memory": "600Gi"}
    assert compile_job(tuned)["spec"]["activeDeadlineSeconds"] == 7200
    assert compile_hash(tuned) == compile_hash(big)


def test_scratch_sizes_and_the_read_only_root_are_the_users_to_set():
    m = model(**{"serving.homeSize": "200Gi", "serving.tmpSize": "4Gi", "serving.readOnlyRootFilesystem": False})
    pod = serving_deployment(m)["spec"]["template"]["spec"]
    sizes = {v["name"]: v["emptyDir"]["sizeLimit"] for v in pod["volumes"] if "emptyDir" in v}
    assert sizes == {"home": "200Gi", "tmp": "4Gi", "model": "50Gi"}  # the model the server traces at start
    assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is False


def test_a_going_pod_drains_then_the_processes_outlive_the_front_ends_requests():
    batched = model(**{**THROUGHPUT, "serving.batching": {"maxBatchSize": 4, "maxLatencyMs": 2500}})
    pod = serving_deployment(batched)["spec"]["template"]["spec"]
    serve, batcher = pod["containers"]
    assert batcher["lifecycle"] == {"preStop": {"sleep": {"seconds": DRAIN_SECONDS}}}
    # The processes stop only once the front end has drained and answered what it held (2.5 s, rounded up, and one).
    assert serve["lifecycle"] == {"preStop": {"sleep": {"seconds": DRAIN_SECONDS + 4}}}
    assert pod["terminationGracePeriodSeconds"] == DRAIN_SECONDS + 4 + 10
    alone = serving_deployment(model(**THROUGHPUT))["spec"]["template"]["spec"]
    assert alone["containers"][0]["lifecycle"] == {"preStop": {"sleep": {"seconds": DRAIN_SECONDS}}}
    assert alone["terminationGracePeriodSeconds"] == DRAIN_SECONDS + UNBOUNDED_REQUEST_SECONDS + 10


def test_the_launcher_passes_sigterm_on_and_exits_0_once_every_process_has(tmp_path):
    """As PID 1, sh ignores a SIGTERM it has no trap for: the processes would be killed at the
    end of the grace period, with whatever they held."""
    import os
    import signal
    import subprocess
    import time

    m = model(**THROUGHPUT)
    for name, text in plan_configmap(m)["data"].items():
        (tmp_path / name).write_text(text)
    done = tmp_path / "done"
    # Each process, on SIGTERM, "finishes what it holds" (0.3 s), records it, and exits.
    process = f"trap 'sleep 0.3; echo $PORT >> {done}; exit 0' TERM; while :; do sleep 0.1; done"
    env = {
        "PATH": os.environ["PATH"],
        "INFERENTIA_PLAN_DIR": str(tmp_path),
        "INFERENTIA_PROCESSES": str(m.plan.groups),
        "INFERENTIA_GROUP_SIZE": str(m.plan.group_size),
        "INFERENTIA_BASE_PORT": "9000",
    }
    launcher = subprocess.Popen(["/bin/sh", str(tmp_path / "launch.sh"), "sh", "-c", process], env=env, stderr=subprocess.PIPE, text=True)
    time.sleep(1)
    launcher.send_signal(signal.SIGTERM)
    assert launcher.wait(10) == 0, launcher.stderr.read()
    assert sorted(done.read_text().split()) == [str(9000 + i) for i in range(m.plan.groups)]


def test_pods_with_request_gauges_say_where_prometheus_scrapes_them():
    batched = serving_deployment(model(**{**THROUGHPUT, "serving.batching": {"maxBatchSize": 4}}))
    annotations = batched["spec"]["template"]["metadata"]["annotations"]
    assert {k: v for k, v in annotations.items() if k.startswith("prometheus.io/")} == {
        "prometheus.io/scrape": "true", "prometheus.io/port": "8500", "prometheus.io/path": "/metrics",
    }  # fmt: skip
    # The port's name too, for the chart's PodMonitor: the front end's, not the processes' behind it.
    assert annotations["inferentia.dev/metrics-port"] == "batch"
    vllm = serving_deployment(model(**VLLM))["spec"]["template"]["metadata"]["annotations"]
    # Every process's port (serve-<i>); the prometheus.io port, for a Prometheus that scrapes one, the first.
    assert (vllm["prometheus.io/port"], vllm["inferentia.dev/metrics-port"]) == ("8000", "serve")
    plain = serving_deployment(model(**THROUGHPUT))["spec"]["template"]["metadata"]["annotations"]
    assert not any(k.startswith("prometheus.io/") for k in plain)  # nothing there exports them


# --- allocation dra: AWS's Neuron DRA driver ------------------------------------------------------


def dra_model(**overrides):
    return model(**{"compute.family": "trn2", "compute.inf": 4, "compute.allocation": "dra", **overrides})


def test_a_dra_replica_claims_its_devices_from_a_template_and_requests_no_device_plugin_resource():
    m = dra_model()
    template = resource_claim_template(m)
    pod = serving_deployment(m)["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert not any(k.startswith("aws.amazon.com/") for part in ("requests", "limits") for k in container["resources"][part])
    assert container["resources"]["claims"] == [{"name": "neurons"}]
    assert pod["resourceClaims"] == [{"name": "neurons", "resourceClaimTemplateName": template["metadata"]["name"]}]
    # The claim's CEL selector on the devices' instanceType replaces the node affinity, as in AWS's templates.
    assert "nodeAffinity" not in pod["affinity"]
    assert pod["tolerations"] == [{"key": "aws.amazon.com/neuron", "operator": "Exists", "effect": "NoSchedule"}]
    devices = template["spec"]["spec"]["devices"]
    [request] = devices["requests"]
    assert request == {
        "name": "neurons",
        "exactly": {
            "deviceClassName": "neuron.aws.com", "allocationMode": "ExactCount", "count": 4,
            # Every trn2 type with the chips: the UltraServer's trn2u.48xlarge too.
            "selectors": [{"cel": {"expression": "device.attributes['neuron.aws.com'].instanceType in ['trn2.48xlarge', 'trn2u.48xlarge']"}}],
        },
    }  # fmt: skip
    assert devices["constraints"] == [{"requests": ["neurons"], "matchAttribute": "resource.aws.com/devicegroup4_id"}]
    assert devices["config"] == [
        {
            "requests": ["neurons"],
            "opaque": {
                "driver": "neuron.aws.com",
                "parameters": {"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": 2},
            },
        }
    ]
    assert template["metadata"]["ownerReferences"][0]["controller"] is True
    assert template in rendered(m)


@pytest.mark.parametrize(
    ("overrides", "group"),
    [({"compute.inf": 1}, None), ({"compute.inf": 2}, 4), ({"compute.inf": 8}, 8), ({"compute.inf": 16}, 16),
     ({"compute.family": "trn1", "compute.inf": 4}, 4), ({"compute.family": "inf2", "compute.inf": 1}, None)],
)  # fmt: skip
def test_a_dra_claim_holds_several_devices_to_the_smallest_connected_group_that_has_them(overrides, group):
    devices = resource_claim_template(dra_model(**overrides))["spec"]["spec"]["devices"]
    assert devices.get("constraints", [{}])[0].get("matchAttribute") == (f"resource.aws.com/devicegroup{group}_id" if group else None)


def test_only_trn2_and_trn3_claims_set_the_lnc_and_a_new_plan_makes_a_new_template():
    assert "config" not in resource_claim_template(dra_model(**{"compute.family": "trn1"}))["spec"]["spec"]["devices"]
    lnc1 = resource_claim_template(dra_model(**{"compute.lnc": 1}))
    assert lnc1["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]["logicalNeuronCore"] == 1
    assert lnc1["metadata"]["name"] != resource_claim_template(dra_model())["metadata"]["name"]


def test_the_device_plugin_path_renders_no_claim():
    m = model(**{"compute.family": "trn2", "compute.inf": 4})
    assert resource_claim_template(m) is None
    pod = serving_deployment(m)["spec"]["template"]["spec"]
    assert "resourceClaims" not in pod and pod["affinity"]["nodeAffinity"]
    assert pod["containers"][0]["resources"]["requests"]["aws.amazon.com/neuron"] == "4"


def test_no_child_says_false_where_the_api_server_drops_false():
    """A volume mount's readOnly is a plain bool the API server omits when false: a builder that
    writes readOnly: false would see it missing in the live object, as drift, on every reconcile
    (the trn2 sample's plugin cache mount once did)."""
    from pathlib import Path

    from inferentia_operator.core.decide import rendered
    from inferentia_operator.manifests import load_models

    samples = Path(__file__).resolve().parents[1] / "manifests" / "samples"
    mounts = 0
    for doc in load_models([str(samples)]).models:
        if doc.model is None:
            continue
        for child in rendered(doc.model):
            pod = child.get("spec", {}).get("template", {}).get("spec", {})
            for container in [*pod.get("initContainers", []), *pod.get("containers", [])]:
                for mount in container.get("volumeMounts", []):
                    mounts += 1
                    assert mount.get("readOnly", True) is True, (doc.key, child["kind"], container["name"], mount)
    assert mounts > 20


def test_with_a_node_cache_the_artefact_fetch_asks_it_first():
    """run --node-cache-url: the serving pods' fetch-artifacts container reads through the node's cache."""
    from dataclasses import replace

    m = model(**VLLM, **{"compile.image": "example.com/compile:1"})
    [fetch, _] = serving_deployment(m)["spec"]["template"]["spec"]["initContainers"]
    assert "INFERENTIA_NODE_CACHE" not in {e["name"] for e in fetch["env"]}
    assert "node-cache-token" not in {v["name"] for v in serving_deployment(m)["spec"]["template"]["spec"]["volumes"]}
    cached = replace(m, node_cache_url="http://inferentia-operator-node-cache.inferentia-system.svc:8080")
    pod = serving_deployment(cached)["spec"]["template"]["spec"]
    [fetch, fetch_model] = pod["initContainers"]
    assert {"name": "INFERENTIA_NODE_CACHE", "value": "http://inferentia-operator-node-cache.inferentia-system.svc:8080"} in fetch["env"]
    # The cache answers only pods of its node that show a token projected for it: each fetch that
    # asks it (the artefact, and the checkpoint vLLM reads beside it) mounts one; the serving
    # container does not, and the pod still mounts no token for the API.
    for fetching in (fetch, fetch_model):
        token = {e["name"]: e["value"] for e in fetching["env"]}["INFERENTIA_NODE_CACHE_TOKEN"]
        [mount] = [m for m in fetching["volumeMounts"] if m["name"] == "node-cache-token"]
        assert token == f"{mount['mountPath']}/token" and mount["readOnly"] is True
    assert "node-cache-token" not in {m["name"] for c in pod["containers"] for m in c.get("volumeMounts", [])}
    [volume] = [v for v in pod["volumes"] if v["name"] == "node-cache-token"]
    assert volume["projected"]["sources"] == [
        {"serviceAccountToken": {"audience": "node-cache.inferentia.dev", "expirationSeconds": 600, "path": "token"}}
    ]
    assert pod["automountServiceAccountToken"] is False


def test_with_a_node_cache_a_replica_prefers_a_node_that_holds_its_artefact():
    """The preference names the label the node cache's pod carries for this artefact (the hash
    of its URI, as fetch records it), in the cache's namespace; a preference below the spread
    of the model's replicas, never a requirement."""
    from dataclasses import replace

    from inferentia_operator.core.holds import hold_label

    m = model(**VLLM, **{"compile.image": "example.com/compile:1"})
    assert "podAffinity" not in serving_deployment(m)["spec"]["template"]["spec"]["affinity"]
    cached = replace(m, node_cache_url="http://c.inferentia-system.svc:8080", node_cache_namespace="inferentia-system")
    affinity = serving_deployment(cached)["spec"]["template"]["spec"]["affinity"]
    # What it fetches: the compiled artefact, and the checkpoint vLLM reads (its weights too):
    # a node holding both weighs most, never more than the spread of the model's replicas.
    compiled, weights = affinity["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in affinity["podAffinity"]
    for preferred, uri in ((compiled, compiled_uri(m)), (weights, m.spec.model.uri)):
        term = preferred["podAffinityTerm"]
        assert term["namespaces"] == ["inferentia-system"] and term["topologyKey"] == "kubernetes.io/hostname"
        assert term["labelSelector"]["matchExpressions"] == [{"key": hold_label(uri), "operator": "Exists"}]
    [spread] = affinity["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert compiled["weight"] + weights["weight"] < spread["weight"]
    # A model without a compile step, served from a path in its image, fetches nothing, so it has nothing to prefer.
    in_image = model(**{"model.uri": "file:///models/resnet"})
    plain = replace(in_image, node_cache_url="http://c.inferentia-system.svc:8080", node_cache_namespace="inferentia-system")
    assert "podAffinity" not in serving_deployment(plain)["spec"]["template"]["spec"]["affinity"]


def test_with_a_node_cache_an_uncompiled_model_is_fetched_through_it_and_preferred_where_held():
    """No compile step, a model in S3: the serving pod's fetch-model reads through the node's
    cache (by the SHA-256s of the model's marker, when it has one), and its replicas prefer a
    node whose cache holds the model, under the hash of the model's own URI."""
    from dataclasses import replace

    from inferentia_operator.core.holds import hold_label

    m = model(**{"model.uri": "s3://models/resnet/"})
    cached = replace(m, node_cache_url="http://c.inferentia-system.svc:8080", node_cache_namespace="inferentia-system")
    pod = serving_deployment(cached)["spec"]["template"]["spec"]
    [fetch] = pod["initContainers"]
    assert fetch["name"] == "fetch-model"
    assert {"name": "INFERENTIA_NODE_CACHE", "value": "http://c.inferentia-system.svc:8080"} in fetch["env"]
    [preferred] = pod["affinity"]["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred["podAffinityTerm"]["labelSelector"]["matchExpressions"] == [
        {"key": hold_label("s3://models/resnet/"), "operator": "Exists"}
    ]
    # The compile Job's fetch may run on a node with no cache (it needs no Neuron device): it
    # reads the store, never waiting on a cache that is not there.
    compiling = replace(model(**VLLM, **{"compile.image": "example.com/compile:1"}), node_cache_url="http://c:8080")
    job_fetch = compile_job(compiling)["spec"]["template"]["spec"]["initContainers"][0]
    assert job_fetch["name"] == "fetch-model" and "INFERENTIA_NODE_CACHE" not in {e["name"] for e in job_fetch["env"]}


def test_with_the_node_plugin_each_fetched_artefacts_view_is_mounted_where_fetch_links_and_the_server_reads():
    """run --node-views: one read-only CSI ephemeral inline volume of the node plugin per
    artefact the pod fetches (the compiled artefact and the checkpoint), named by its key,
    mounted at the same path in each fetch (which links to it) and in the serving container
    (which reads through the links); the front end and the compile Job see none."""
    from dataclasses import replace

    from inferentia_operator.core.holds import NODE_VIEW_DIR, NODE_VIEW_DRIVER, hold_key

    m = model(**VLLM, **{"compile.image": "example.com/compile:1"})
    cached = replace(m, node_cache_url="http://c.inferentia-system.svc:8080", node_cache_namespace="inferentia-system")
    assert not [v for v in serving_deployment(cached)["spec"]["template"]["spec"]["volumes"] if "csi" in v]
    pod = serving_deployment(replace(cached, node_views=True))["spec"]["template"]["spec"]
    keys = [hold_key(compiled_uri(m)), hold_key(m.spec.model.uri)]
    views = [v for v in pod["volumes"] if "csi" in v]
    assert [v["csi"] for v in views] == [{"driver": NODE_VIEW_DRIVER, "readOnly": True, "volumeAttributes": {"key": k}} for k in keys]
    wanted = [{"name": v["name"], "mountPath": f"{NODE_VIEW_DIR}/{k}", "readOnly": True} for v, k in zip(views, keys, strict=True)]
    [fetch, fetch_model] = pod["initContainers"]
    server = pod["containers"][0]
    for container in (fetch, fetch_model, server):
        assert [m for m in container["volumeMounts"] if m["name"].startswith("node-view-")] == wanted, container["name"]
    for fetching in (fetch, fetch_model):
        assert {"name": "INFERENTIA_NODE_VIEW", "value": NODE_VIEW_DIR} in fetching["env"]
    job = compile_job(replace(cached, node_views=True))["spec"]["template"]["spec"]
    assert not [v for v in job["volumes"] if "csi" in v]
    # Without the node cache there is nothing to view.
    alone = serving_deployment(replace(m, node_views=True))["spec"]["template"]["spec"]
    assert not [v for v in alone["volumes"] if "csi" in v]
    # The vLLM Neuron plugin locks files in its artefact: it copies, with no view and no env.
    plugin = replace(model(**TRN2_VLLM), node_cache_url="http://c:8080", node_views=True)
    pod = serving_deployment(plugin)["spec"]["template"]["spec"]
    assert not [v for v in pod["volumes"] if "csi" in v]
    assert "INFERENTIA_NODE_VIEW" not in {e["name"] for c in pod["initContainers"] for e in c["env"]}


@pytest.mark.parametrize(("family", "target"), [("inf2", "inf2"), ("trn1", "trn1"), ("inf1", None)])
def test_a_torch_neuronx_compile_job_names_its_target_for_tracing_without_a_device(family, target):
    """The Job's node has no Neuron device: torch-neuronx traces on its CPU backend for the target
    set before the import (neuron_compile.py); neuron-cc (inf1) compiles on any machine."""
    m = model(**{"compute.family": family, "compute.inf": 1, "compile.image": "example.com/compile:1", "compile.buckets": [[8]]})
    compile_step = compile_job(m)["spec"]["template"]["spec"]["initContainers"][-1]
    env = {e["name"]: e["value"] for e in compile_step["env"]}
    assert env.get("NEURON_PLATFORM_TARGET_OVERRIDE") == target
    assert compile_step["command"] == ["python3", "/etc/inferentia/neuron_compile.py"]


@pytest.mark.parametrize("family", ["inf2", "trn1", "trn2", "trn3"])
def test_a_hub_model_is_downloaded_by_its_compile_job_into_the_artefact_and_read_offline_by_every_replica(family):
    """Named by a Hugging Face id, a compiled vLLM model is read from the Hub once: the compile Job
    keeps the model's files in the artefact (INFERENTIA_HUB_CACHE, with the module that does it
    beside the program), and each serving pod reads them from its fetched copy with the Hub
    client offline; the layout is part of the compile key, so an artefact made before it (with
    no snapshot) is compiled again rather than served offline without its files."""
    hub_id = {
        **TRN2_VLLM,
        "compute.family": family,
        "model.uri": "meta-llama/Llama-3.1-8B-Instruct",
        "compile.outputUri": "s3://out/llama/",
    }
    m = model(**hub_id)
    [container] = serving_deployment(m)["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert (env["HF_HUB_CACHE"], env["HF_HUB_OFFLINE"]) == (f"{COMPILED_DIR}/{programs.HUB_SNAPSHOT_DIR}", "1")
    assert (
        "--model" in container["args"] and container["args"][container["args"].index("--model") + 1] == "meta-llama/Llama-3.1-8B-Instruct"
    )
    compile_step = compile_job(m)["spec"]["template"]["spec"]["initContainers"][-1]
    jenv = {e["name"]: e.get("value") for e in compile_step["env"]}
    assert jenv["INFERENTIA_HUB_CACHE"] == env["HF_HUB_CACHE"] and "HF_HUB_OFFLINE" not in jenv
    assert programs.HUB_SNAPSHOT_MODULE in plan_configmap(m)["data"]
    assert compile_inputs(m)["hubSnapshot"] == programs.HUB_SNAPSHOT_VERSION
    # A store's model or one without a compile step: nothing kept, nothing offline.
    for other in (model(**{**hub_id, "model.uri": "s3://models/llama/"}), model(**{**hub_id, "compile.image": None})):
        [served] = serving_deployment(other)["spec"]["template"]["spec"]["containers"]
        assert not {"HF_HUB_OFFLINE", "HF_HUB_CACHE"} & {e["name"] for e in served["env"]}
        assert "hubSnapshot" not in compile_inputs(other)


def test_vllm_on_nxd_inference_turns_prefix_caching_off_and_sizes_its_blocks_only_where_vllm_takes_it():
    """vllm-neuron asserts a block size when prefix caching is on; vLLM's V0 worker asserts its own block count."""
    bare = model(**{**VLLM, "serving.args": None, "serving.batching": None, "compile.buckets": None, "processesPerReplica": 1})
    engine = vllm_engine_args(bare)
    assert engine["enable_prefix_caching"] is False and "num_gpu_blocks_override" not in engine
    v1 = vllm_engine_args(model(**VLLM))
    assert v1["num_gpu_blocks_override"] == 8
    v0 = model(
        **{**VLLM, "serving.image": "public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:0.9.1-neuronx-py311-sdk2.26.1-ubuntu22.04"}
    )
    assert "num_gpu_blocks_override" not in vllm_engine_args(v0)


def test_behind_the_front_end_only_its_port_admits_other_pods():
    """A NetworkPolicy over the serving pods opens the front end's port to anyone and nothing
    else, so no pod reaches a model process past the front end's limits (the node's own
    traffic, the kubelet's probes of the processes among it, is always allowed:
    https://kubernetes.io/docs/concepts/services-networking/network-policies/). A model without a
    front end gets none: its processes are its doors."""
    m = model(**THROUGHPUT, **{"serving.batching": {"maxBatchSize": 4, "maxLatencyMs": 50}})
    policy = serving_network_policy(m)
    assert policy["metadata"]["name"] == "resnet-front-end" and policy["metadata"]["labels"]["app.kubernetes.io/component"] == "serving"
    assert policy["spec"]["podSelector"] == {"matchLabels": selector(m)}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == [{"ports": [{"port": 8500, "protocol": "TCP"}]}]
    assert serving_network_policy(model(**THROUGHPUT)) is None


def test_a_command_and_its_args_are_one_choice_when_contributions_are_combined():
    """The last contribution that gives a command gives the args too: a later command without
    args drops an earlier one's args rather than running with them; args alone are refused."""
    first = PodContribution(command=("a",), args=("--x",))
    assert (combined([first]).command, combined([first]).args) == (("a",), ("--x",))
    later = combined([first, PodContribution(command=("b",))])
    assert (later.command, later.args) == (("b",), ())
    kept = combined([first, PodContribution(env={"K": "v"})])
    assert (kept.command, kept.args) == (("a",), ("--x",))
    with pytest.raises(AssertionError):
        combined([PodContribution(args=("--y",))])
