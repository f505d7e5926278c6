"""Every child field against the plan, without a cluster; and the compile-reuse contract."""

import json

import pytest

from inferentia_operator import children
from inferentia_operator.api import InferentiaModelSpec
from inferentia_operator.children import Model
from inferentia_operator.planner import plan
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
    d = children.serving_deployment(m)
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
        "requests": {"aws.amazon.com/neuron": "1", "hugepages-2Mi": "256Mi", "cpu": "1", "memory": "2Gi"},
        "limits": {"aws.amazon.com/neuron": "1", "hugepages-2Mi": "256Mi", "memory": "2Gi"},
    }
    assert pod["tolerations"] == [{"key": "aws.amazon.com/neuron", "operator": "Exists", "effect": "NoSchedule"}]
    [term] = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [
        {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": m.plan.instance_types}
    ]
    assert pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"] == 100
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["NEURON_CC_FLAGS"] == " ".join(m.plan.compiler_args)
    assert env["INFERENTIA_PROCESSES"] == "4"
    assert env["INFERENTIA_COMPILED_MODEL_URI"] == children.compiled_uri(m)
    assert "NEURON_RT_VISIBLE_CORES" not in env  # four processes: each gets its own from env-<i>
    assert [p["containerPort"] for p in container["ports"]] == [8500, 8501, 8502, 8503]
    assert container["command"] == ["/bin/sh", "/etc/inferentia/launch.sh"]
    assert container["args"] == ["serve", "--model", "/models"]
    assert container["readinessProbe"]["tcpSocket"] == {"port": "serve-0"}
    assert spec["template"]["metadata"]["annotations"] == {"inferentia.dev/plan-hash": children.plan_hash(m.plan)}
    assert pod["volumes"] == [{"name": "plan", "configMap": {"name": children.plan_configmap_name(m)}}]


def test_one_process_gets_its_group_in_the_container_environment():
    m = model(**{"compute.inf": 4})
    [container] = children.serving_deployment(m)["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["NEURON_RT_VISIBLE_CORES"] == "0-15"
    assert env["NEURON_MAX_NUM_INFERS"] == "19"
    assert "command" not in container  # no args: the image's own entrypoint runs
    assert "INFERENTIA_COMPILED_MODEL_URI" not in env  # no compile image


def test_user_env_wins_over_planned_env():
    m = model(**{"serving.env": [{"name": "INFERENTIA_THREADS", "value": "32"}]})
    [container] = children.serving_deployment(m)["spec"]["template"]["spec"]["containers"]
    assert [e for e in container["env"] if e["name"] == "INFERENTIA_THREADS"] == [{"name": "INFERENTIA_THREADS", "value": "32"}]


def test_plan_configmap_holds_the_plan_and_each_process_environment():
    m = model(**THROUGHPUT)
    cm = children.plan_configmap(m)
    assert cm["immutable"] is True
    assert json.loads(cm["data"]["plan.json"])["visibleCores"] == ["0", "1", "2", "3"]
    assert cm["data"]["env-2"].splitlines()[0] == "NEURON_RT_VISIBLE_CORES=2"
    assert "launch.sh" in cm["data"]


def test_compile_job_runs_the_compiler_with_the_planned_flags():
    m = model(**THROUGHPUT)
    job = children.compile_job(m)
    assert job["metadata"]["name"] == f"resnet-compile-{children.compile_hash(m)}"
    pod = job["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["image"] == "example.com/compile:1"
    assert container["args"][-len(m.plan.compiler_args) :] == m.plan.compiler_args
    assert "tolerations" not in pod  # compiling needs no Neuron node
    assert children.compile_job(model()) is None


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
    assert (children.compile_job_name(before) != children.compile_job_name(after)) is recompiles


def test_service_exposes_every_process_port():
    m = model(**THROUGHPUT)
    svc = children.service(m)
    assert [(p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == [
        (8500, "serve-0"), (8501, "serve-1"), (8502, "serve-2"), (8503, "serve-3"),
    ]  # fmt: skip
    assert svc["spec"]["selector"] == children.selector(m)


def test_children_carry_the_standard_labels():
    m = model(**THROUGHPUT)
    for child in (children.serving_deployment(m), children.service(m), children.plan_configmap(m), children.compile_job(m)):
        labels = child["metadata"]["labels"]
        assert labels["app.kubernetes.io/managed-by"] == "inferentia-operator"
        assert labels["inferentia.dev/model"] == "resnet"
        assert labels["app.kubernetes.io/instance"] == "resnet"


def test_the_launcher_gives_each_process_its_group_and_port(tmp_path):
    import os
    import subprocess

    m = model(**THROUGHPUT)
    for name, text in children.plan_configmap(m)["data"].items():
        (tmp_path / name).write_text(text)
    out = tmp_path / "started"
    env = {"PATH": os.environ["PATH"], "INFERENTIA_PLAN_DIR": str(tmp_path), "INFERENTIA_PROCESSES": "4", "INFERENTIA_BASE_PORT": "8500"}
    # Each "serving process" records what it was given, then the first to exit ends the launcher.
    record = f'echo "$INFERENTIA_PROCESS_INDEX $NEURON_RT_VISIBLE_CORES $NEURON_RT_NUM_CORES $PORT $NEURON_CC_FLAGS" >> {out}; sleep 0.2'
    result = subprocess.run(["/bin/sh", str(tmp_path / "launch.sh"), "sh", "-c", record], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 1 and "exited with 0; stopping the others" in result.stderr
    flags = " ".join(m.plan.compiler_args)
    assert sorted(out.read_text().splitlines()) == [f"{i} {i} 1 {8500 + i} {flags}" for i in range(4)]


def test_the_plan_configmap_name_follows_its_whole_content(monkeypatch):
    m = model(**THROUGHPUT)
    before = children.plan_configmap_name(m)
    assert children.plan_configmap(m)["metadata"]["name"] == before
    assert children.plan_configmap_name(model(**{**THROUGHPUT, "replicas": 9})) == before  # same content
    monkeypatch.setattr(children, "LAUNCHER", children.LAUNCHER + "# a newer operator\n")
    assert children.plan_configmap_name(m) != before  # an immutable ConfigMap is replaced, never edited
