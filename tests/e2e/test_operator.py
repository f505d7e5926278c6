"""The operator against a real API server: children, compile, rollout, drift, restarts, status."""

from __future__ import annotations

import collections
import json
import re
import sys
import time

import pytest
import yaml
from kit import OperatorProcess, bind_user_to_namespaced_roles, bind_user_to_operator_role, condition, wait_for

from conftest import OPERATOR_USER
from inferentia_operator.core.api import InferentiaModelSpec
from inferentia_operator.core.compile.job import compile_job, compile_record_name
from inferentia_operator.core.drift import applied
from inferentia_operator.core.planner import plan
from inferentia_operator.core.pod.artefact import compile_hash, compile_job_name, compiled_uri
from inferentia_operator.core.pod.meta import selector_string
from inferentia_operator.core.pod.model import Model, plan_configmap_name, plan_document
from inferentia_operator.core.serving.deployment import serving_deployment
from inferentia_operator.core.serving.runtime import vllm_args
from inferentia_operator.core.serving.service import plan_configmap, service
from specs import DROP, make_model

COMPILE_IMAGE = "example.com/neuron-compile:1"


def apply_model(cluster, namespace, name, **overrides) -> dict:
    body = make_model(name, namespace, **overrides)
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(body))
    return body


def get_model(cluster, namespace, name) -> dict:
    return cluster.get("inferentiamodel", name, "-n", namespace)


def wait_ready(cluster, namespace, name, timeout=90):
    waited = cluster.kubectl(
        "wait", "--for=condition=Ready", f"inferentiamodel/{name}", "-n", namespace, f"--timeout={timeout}s", check=False
    )
    if waited.returncode:
        # Say where the model stood: its conditions, its children and the namespace's events.
        seen = cluster.kubectl("get", "inferentiamodel,job,deployment,pods,configmaps,events", "-n", namespace, "-o", "wide", check=False)
        status = cluster.kubectl("get", "inferentiamodel", name, "-n", namespace, "-o", "jsonpath={.status}", check=False)
        raise AssertionError(f"{name} not Ready in {timeout} s: {waited.stderr}\n{status.stdout}\n{seen.stdout}{seen.stderr}")
    body = get_model(cluster, namespace, name)
    # Ready speaks for the current generation only.
    assert body["status"]["observedGeneration"] == body["metadata"]["generation"]
    return body


def wait_condition(cluster, namespace, name, type_, status, reason=None, timeout=60):
    def check():
        body = get_model(cluster, namespace, name)
        c = condition(body, type_)
        return body if c.get("status") == status and (reason is None or c.get("reason") == reason) else None

    return wait_for(check, timeout, f"{type_}={status} ({reason}) on {namespace}/{name}")


def model_of(body) -> Model:
    spec = InferentiaModelSpec.model_validate(body["spec"])
    return Model(body["metadata"]["name"], body["metadata"]["namespace"], body["metadata"]["uid"], spec, plan(spec))


def items(cluster, kind, namespace, name):
    return cluster.get(kind, "-n", namespace, "-l", f"inferentia.dev/model={name}")["items"]


def test_a_model_is_compiled_scheduled_and_ready_with_children_matching_the_plan(cluster, operator, namespace):
    apply_model(
        cluster, namespace, "resnet",
        **{"model.architecture": "cnn", "processesPerReplica": 4, "compile.batchSize": 4,
           "compile.image": COMPILE_IMAGE, "replicas": 2, "serving.port": 8500},
    )  # fmt: skip
    body = wait_ready(cluster, namespace, "resnet")
    m = model_of(body)
    live = {
        "configmap": cluster.get("configmap", plan_configmap_name(m), "-n", namespace),
        "job": cluster.get("job", compile_job_name(m), "-n", namespace),
        "deployment": cluster.get("deployment", "resnet", "-n", namespace),
        "service": cluster.get("service", "resnet", "-n", namespace),
    }
    desired = {
        "configmap": plan_configmap(m),
        "job": compile_job(m),
        "deployment": serving_deployment(m),
        "service": service(m),
    }
    for kind in desired:
        assert applied(desired[kind], live[kind]), f"the live {kind} differs from the plan"
    assert condition(live["job"], "Complete")["status"] == "True"
    status = body["status"]
    assert status["plan"] == plan_document(m.plan)
    assert (status["replicas"], status["readyReplicas"], status["updatedReplicas"]) == (2, 2, 2)
    assert status["compileJob"] == compile_job_name(m)
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "Validated": "True", "Compiled": "True", "Scheduled": "True",
        "Progressing": "False", "Available": "True", "Ready": "True",
        "Reconciling": "False", "Stalled": "False",
    }  # fmt: skip
    pods = cluster.get("pods", "-n", namespace, "-l", status["selector"])["items"]
    assert len(pods) == 2
    for pod in pods:
        node = cluster.get("node", pod["spec"]["nodeName"])
        assert node["metadata"]["labels"]["node.kubernetes.io/instance-type"] in m.plan.instance_types
    table = cluster.kubectl("get", "inferentiamodel", "resnet", "-n", namespace).stdout
    assert table.split("\n")[1].split()[:7] == ["resnet", "1", "4", "1", "2", "2", "Ready"]
    reasons = {e["reason"] for e in cluster.get("events", "-n", namespace, "--field-selector", "involvedObject.name=resnet")["items"]}
    assert {"Ready", "Compiled"} <= reasons


def test_changing_processes_recompiles_and_rolls_the_new_cores(cluster, operator, namespace):
    apply_model(cluster, namespace, "m", **{"processesPerReplica": 4, "compile.image": COMPILE_IMAGE})
    first = model_of(wait_ready(cluster, namespace, "m"))
    apply_model(cluster, namespace, "m", **{"processesPerReplica": 2, "compile.image": COMPILE_IMAGE})
    body = wait_ready(cluster, namespace, "m")
    assert body["metadata"]["generation"] == 2
    second = model_of(body)
    assert compile_job_name(first) != compile_job_name(second)
    jobs = sorted(j["metadata"]["name"] for j in items(cluster, "jobs", namespace, "m"))
    assert jobs == sorted([compile_job_name(first), compile_job_name(second)])
    deployment = cluster.get("deployment", "m", "-n", namespace)
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NEURON_CC_FLAGS"].startswith("--neuroncore-pipeline-cores 2")
    cm = cluster.get("configmap", plan_configmap_name(second), "-n", namespace)
    assert [cm["data"][f"env-{i}"].splitlines()[0] for i in range(2)] == [
        "NEURON_RT_VISIBLE_CORES=0-1", "NEURON_RT_VISIBLE_CORES=2-3",
    ]  # fmt: skip
    # The first plan's ConfigMap goes once no pod reads it.
    wait_for(lambda: len(items(cluster, "configmaps", namespace, "m")) == 1, 30, "the superseded plan ConfigMap to go")
    # Going back to the first plan reuses its finished compile: no third Job.
    apply_model(cluster, namespace, "m", **{"processesPerReplica": 4, "compile.image": COMPILE_IMAGE})
    wait_ready(cluster, namespace, "m")
    assert len(items(cluster, "jobs", namespace, "m")) == 2


@pytest.mark.faults
def test_an_invalid_edit_leaves_the_running_deployment_alone(cluster, operator, namespace):
    apply_model(cluster, namespace, "m", **{"model.weights": 1_000_000})
    wait_ready(cluster, namespace, "m")
    before = cluster.get("deployment", "m", "-n", namespace)
    # Static weights that cannot fit: a rule only the operator checks (CEL cannot see staticWeights).
    apply_model(cluster, namespace, "m", **{"model.weights": 100_000_000_000, "compile.staticWeights": True, "compile.buckets": DROP})
    body = wait_condition(cluster, namespace, "m", "Validated", "False", "InvalidSpec")
    message = condition(body, "Validated")["message"]
    assert message.startswith("spec.compile.staticWeights: true needs 186 GiB")
    assert condition(body, "Ready")["reason"] == "InvalidSpec"
    assert body["status"]["observedGeneration"] == 2
    time.sleep(operator.resync_seconds * 2)
    after = cluster.get("deployment", "m", "-n", namespace)
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    assert after["spec"] == before["spec"]
    warnings = cluster.get("events", "-n", namespace, "--field-selector", "involvedObject.name=m,type=Warning")["items"]
    assert any(e["reason"] == "InvalidSpec" and "true needs" in e["message"] for e in warnings)


@pytest.mark.faults
def test_a_deleted_or_edited_child_is_put_back_and_others_fields_are_kept(cluster, operator, namespace):
    apply_model(cluster, namespace, "m")
    wait_ready(cluster, namespace, "m")
    uid = cluster.get("deployment", "m", "-n", namespace)["metadata"]["uid"]
    cluster.kubectl("delete", "deployment", "m", "-n", namespace)
    back = wait_for(
        lambda: (
            (d := cluster.kubectl("get", "deployment", "m", "-n", namespace, "-o", "json", check=False)).returncode == 0
            and json.loads(d.stdout)["metadata"]["uid"] != uid
        ),
        60,
        "the Deployment to come back",
    )
    assert back
    wait_ready(cluster, namespace, "m")
    cluster.kubectl("annotate", "deployment", "m", "-n", namespace, "team.example.com/owner=ml")
    cluster.kubectl("set", "image", "deployment/m", "-n", namespace, "serve=example.com/not-the-plan:1")

    def image_restored():
        d = cluster.get("deployment", "m", "-n", namespace)
        return d["spec"]["template"]["spec"]["containers"][0]["image"] == "example.com/serve:1" and d

    d = wait_for(image_restored, 60, "the planned image to be put back")
    assert d["metadata"]["annotations"]["team.example.com/owner"] == "ml"
    cluster.kubectl("delete", "service", "m", "-n", namespace)
    wait_for(lambda: cluster.kubectl("get", "service", "m", "-n", namespace, check=False).returncode == 0, 60, "the Service to come back")


def test_scale_subresource_drives_the_deployment(cluster, operator, namespace):
    apply_model(cluster, namespace, "m")
    wait_ready(cluster, namespace, "m")
    cluster.kubectl("scale", "inferentiamodel/m", "-n", namespace, "--replicas=2")
    body = wait_for(
        lambda: (
            (b := get_model(cluster, namespace, "m"))["status"].get("readyReplicas") == 2
            and condition(b, "Ready").get("status") == "True"
            and b
        ),
        60,
        "two ready replicas",
    )
    assert cluster.get("deployment", "m", "-n", namespace)["spec"]["replicas"] == 2
    scale = json.loads(
        cluster.kubectl("get", "--raw", f"/apis/inferentia.dev/v1alpha1/namespaces/{namespace}/inferentiamodels/m/scale").stdout
    )
    assert scale["status"]["replicas"] == 2 and scale["status"]["selector"] == body["status"]["selector"]


def test_deleting_the_model_deletes_its_children(cluster, operator, namespace):
    apply_model(cluster, namespace, "m", **{"compile.image": COMPILE_IMAGE})
    wait_ready(cluster, namespace, "m")
    cluster.kubectl("delete", "inferentiamodel", "m", "-n", namespace)

    def all_gone():
        return all(not items(cluster, kind, namespace, "m") for kind in ("deployments", "services", "configmaps", "jobs"))

    wait_for(all_gone, 60, "the children to be garbage-collected")


def test_a_model_too_large_for_free_capacity_reports_scheduled_false(cluster, operator, namespace):
    if sum(c >= 16 for c in cluster.neuron_capacity("inf1")) >= 2:
        pytest.skip("the cluster has room for two 16-chip replicas")
    apply_model(cluster, namespace, "huge", **{"compute.inf": 16, "replicas": 2})
    body = wait_condition(cluster, namespace, "huge", "Scheduled", "False", "Unschedulable")
    message = condition(body, "Scheduled")["message"]
    assert "cannot be placed" in message and "aws.amazon.com/neuron" in message
    assert condition(body, "Ready")["reason"] == "Unschedulable"
    assert condition(body, "Progressing")["reason"] == "WaitingForCapacity"


def test_a_model_of_neuroncores_is_placed_by_cores_and_reports_when_they_run_out(cluster, operator, namespace):
    """The simulated fleet advertises aws.amazon.com/neuroncore beside aws.amazon.com/neuron, so
    the scheduler's fit and Insufficient decisions hold for core requests: one replica of
    what the largest inf2 node has left is placed, and a second finds no node with that many."""
    cores = cluster.neuron_capacity("inf2", resource="aws.amazon.com/neuroncore")
    if not cores or sum(c >= max(cores) for c in cores) >= 2:
        pytest.skip("the cluster has no inf2 NeuronCores, or room for two replicas of its largest node's cores")
    small = {"compute.inf": DROP, "compute.family": "inf2", "compute.cores": 1}
    apply_model(cluster, namespace, "one-core", **small)
    body = wait_ready(cluster, namespace, "one-core")
    assert body["status"]["plan"]["sharesChip"] is True
    [deployment] = items(cluster, "deployments", namespace, "one-core")
    limits = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["aws.amazon.com/neuroncore"] == "1" and "aws.amazon.com/neuron" not in limits
    apply_model(cluster, namespace, "the-rest", **{**small, "compute.cores": max(cores) - 1, "replicas": 2})
    body = wait_condition(cluster, namespace, "the-rest", "Scheduled", "False", "Unschedulable")
    assert condition(body, "Scheduled")["message"].startswith("1 pod cannot be placed")
    assert "Insufficient aws.amazon.com/neuroncore" in condition(body, "Scheduled")["message"]


def test_ten_models_at_once(cluster, operator, namespace):
    for i in range(10):
        apply_model(cluster, namespace, f"model-{i}", **{"processesPerReplica": 2})
    for i in range(10):
        wait_ready(cluster, namespace, f"model-{i}", timeout=120)
    assert len(cluster.get("deployments", "-n", namespace)["items"]) == 10


def test_steady_state_writes_nothing(cluster, operator, namespace):
    if cluster.local is None:
        pytest.skip("needs the local control plane's audit log")
    # Steady state of the whole cluster: earlier tests' namespaces must be gone first.
    wait_for(
        lambda: not [n for n in cluster.get("namespaces")["items"] if n["status"].get("phase") == "Terminating"],
        120,
        "earlier test namespaces to finish terminating",
    )
    apply_model(cluster, namespace, "m", **{"compile.image": COMPILE_IMAGE, "processesPerReplica": 2})
    wait_ready(cluster, namespace, "m")
    time.sleep(operator.resync_seconds)  # let the last status write land
    seen = len(cluster.local.writes_by(OPERATOR_USER))
    time.sleep(operator.resync_seconds * 4)  # several resyncs of every model
    writes = [
        e for e in cluster.local.writes_by(OPERATOR_USER)[seen:]
        # kopf's peering keep-alive, like a leader-election lease renewal, is not about any model.
        if e["objectRef"]["resource"] not in ("clusterkopfpeerings", "kopfpeerings")
    ]  # fmt: skip
    assert writes == [], collections.Counter((e["verb"], e["objectRef"]["resource"], e["objectRef"].get("name")) for e in writes)


@pytest.mark.faults
def test_a_restart_mid_rollout_converges_without_duplicates(cluster, operator, namespace):
    def peers() -> dict:
        return cluster.get("clusterkopfpeering", operator.peering).get("status") or {}

    operator.stop()
    try:
        earlier = set(peers())
        apply_model(cluster, namespace, "m", **{"compile.image": COMPILE_IMAGE})
        operator.start()
        wait_for(lambda: items(cluster, "jobs", namespace, "m"), 60, "the compile Job")
        wait_for(lambda: set(peers()) - earlier, 30, "the operator's keep-alive in its peering object")
        killed = {peer: entry for peer, entry in peers().items() if peer not in earlier}
        operator.kill()  # kill -9 mid-rollout: the Job exists, the Deployment may not
    finally:
        operator.start()
    wait_ready(cluster, namespace, "m")
    # The killed replica's keep-alive stays live for its lifetime; the new one ranks above it
    # (started later), so kopf never paused it to wait that lifetime out.
    new = {peer: entry for peer, entry in peers().items() if peer not in earlier and peer not in killed}
    assert len(killed) == 1 and len(new) == 1, (killed, new)
    assert next(iter(new.values()))["priority"] > next(iter(killed.values()))["priority"], (killed, new)
    assert len(items(cluster, "jobs", namespace, "m")) == 1
    assert len(cluster.get("deployments", "-n", namespace)["items"]) == 1
    if cluster.local is not None:
        job_writes = [
            e["verb"] for e in cluster.local.writes_by(OPERATOR_USER)
            if e["objectRef"]["resource"] == "jobs" and e["objectRef"].get("namespace") == namespace
        ]  # fmt: skip
        # Created once, by the first run, and given its proof once, from that create's answer.
        assert sorted(job_writes) == ["create", "patch"], job_writes


@pytest.mark.faults
def test_models_carry_no_finalizer_and_delete_while_the_operator_is_down(cluster, operator, namespace):
    apply_model(cluster, namespace, "m")
    body = wait_ready(cluster, namespace, "m")
    assert not body["metadata"].get("finalizers")
    # Nor any of kopf's bookkeeping: the operator names no progress or diff-base storage,
    # and registers no handler that would use one.
    assert not [k for k in body["metadata"].get("annotations") or {} if "kopf" in k], body["metadata"]
    assert "kopf" not in (body.get("status") or {})
    operator.stop()
    try:
        cluster.kubectl("delete", "inferentiamodel", "m", "-n", namespace, "--timeout=30s")
    finally:
        operator.start()


@pytest.mark.faults
def test_a_second_replica_stands_by(cluster, operator, namespace, tmp_path):
    if cluster.local is None:
        pytest.skip("needs the local control plane's audit log and users")
    standby_user = "inferentia-operator-standby"
    bind_user_to_operator_role(cluster, standby_user, "e2e-standby")
    standby = OperatorProcess(cluster.local.user_kubeconfig(standby_user), tmp_path / "standby.log", peering=operator.peering)
    standby.start()
    try:
        wait_for(
            lambda: len(cluster.get("clusterkopfpeering", operator.peering).get("status") or {}) >= 2,
            30,
            "both replicas to register as peers",
        )
        apply_model(cluster, namespace, "m", processesPerReplica=2)
        wait_ready(cluster, namespace, "m")
        apply_model(cluster, namespace, "m", processesPerReplica=4)
        wait_ready(cluster, namespace, "m")
        acted = [
            e for e in cluster.local.writes_by(standby_user)
            if e["objectRef"]["resource"] not in ("clusterkopfpeerings", "kopfpeerings")
        ]  # fmt: skip
        # One of the two is paused: whichever drew the lower priority writes nothing.
        mine = [e for e in cluster.local.writes_by(OPERATOR_USER) if e["objectRef"].get("namespace") == namespace]
        assert (acted == []) != (mine == []), "exactly one replica acted"
        peers = cluster.get("clusterkopfpeering", operator.peering)["status"]
        assert len({p["priority"] for p in peers.values()}) == len(peers), "replicas draw distinct priorities"
    finally:
        standby.stop()


def test_an_operator_restricted_to_namespaces_serves_only_those(cluster, operator, namespace, tmp_path):
    if cluster.local is None:
        pytest.skip("needs per-user certificates")
    other = f"{namespace}-other"
    cluster.kubectl("create", "namespace", other)
    # A user with only what the chart grants for watchNamespaces: Roles, nothing cluster-wide.
    user = f"scoped-{namespace}"
    bind_user_to_namespaced_roles(cluster, user, [namespace])
    operator.stop()  # the cluster-wide operator would serve both
    scoped = OperatorProcess(
        cluster.local.user_kubeconfig(user), tmp_path / "scoped.log", peering="e2e-scoped",
        extra_args=("--namespace", namespace, "--no-node-faults"),  # as the chart runs it: no right to list nodes
    )  # fmt: skip
    try:
        scoped.start()
        apply_model(cluster, namespace, "mine")
        apply_model(cluster, other, "theirs")
        wait_ready(cluster, namespace, "mine")
        # kopf peers per namespace in this mode; the operator created its KopfPeering.
        cluster.get("kopfpeering", "e2e-scoped", "-n", namespace)
        time.sleep(scoped.resync_seconds * 2)
        from inferentia_operator.core.api import PENDING_STATUS

        assert get_model(cluster, other, "theirs")["status"] == PENDING_STATUS  # the CRD's default: never reported on
        assert cluster.kubectl("get", "deployment", "theirs", "-n", other, check=False).returncode != 0
        assert "Forbidden" not in scoped.log() and "(403)" not in scoped.log(), scoped.log()[-2000:]
    finally:
        scoped.stop()
        operator.start()
        cluster.kubectl("delete", "namespace", other, "--wait=false", check=False)


def test_the_operator_logs_in_through_a_kubeconfig_whose_user_is_an_exec_plugin(cluster, operator, namespace, tmp_path):
    """An EKS kubeconfig's user runs aws eks get-token; here the plugin gets a ServiceAccount's
    token from the TokenRequest API (kubectl create token) and prints it as an ExecCredential, as
    aws eks get-token prints its token. The operator, run out of a pod on that kubeconfig, serves a
    model, and the API server's audit log shows its writes made as that ServiceAccount."""
    if cluster.local is None:
        pytest.skip("needs the local control plane's audit log")
    account = "exec-operator"
    cluster.kubectl("create", "serviceaccount", account, "-n", namespace)
    user = f"system:serviceaccount:{namespace}:{account}"
    bind_user_to_operator_role(cluster, user, f"e2e-exec-{namespace}")
    plugin = tmp_path / "get-token.py"
    plugin.write_text(
        "import json, subprocess\n"
        f"token = subprocess.run([{cluster.tool('kubectl')!r}, '--kubeconfig', {str(cluster.kubeconfig)!r}, 'create', 'token',\n"
        f"                        {account!r}, '-n', {namespace!r}, '--duration=10m'], capture_output=True, text=True, check=True).stdout.strip()\n"
        "print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1', 'kind': 'ExecCredential', 'status': {'token': token}}))\n"
    )
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])
    entry = next(c for c in admin["clusters"] if c["name"] == context["context"]["cluster"])
    exec_user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": sys.executable, "args": [str(plugin)],
                          "interactiveMode": "Never"}}  # fmt: skip
    config = tmp_path / "exec-kubeconfig"
    config.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "clusters": [entry], "users": [{"name": "eks", "user": exec_user}],
        "contexts": [{"name": "eks", "context": {"cluster": entry["name"], "user": "eks"}}], "current-context": "eks",
    }))  # fmt: skip
    operator.stop()  # one operator at a time on the cluster's models
    exec_operator = OperatorProcess(config, tmp_path / "exec-operator.log", peering=operator.peering)
    try:
        exec_operator.start()
        apply_model(cluster, namespace, "m")
        wait_ready(cluster, namespace, "m")
        writes = [e for e in cluster.local.writes_by(user) if e["objectRef"].get("namespace") == namespace]
        assert {e["objectRef"]["resource"] for e in writes} >= {"deployments", "inferentiamodels"}, exec_operator.log()[-2000:]
    finally:
        exec_operator.stop()
        operator.start()


FAILING_COMPILER = "fail.invalid/neuron-compile:always"  # the test fleet fails these (cluster/kwok-test-stages.yaml)


def test_a_failed_compile_is_reported_and_the_previous_deployment_keeps_serving(cluster, operator, namespace):
    if cluster.local is None:
        pytest.skip("needs the simulated fleet's failing compiler")
    apply_model(cluster, namespace, "m", **{"compile.image": COMPILE_IMAGE})
    wait_ready(cluster, namespace, "m")
    before = cluster.get("deployment", "m", "-n", namespace)
    apply_model(cluster, namespace, "m", **{"compile.image": FAILING_COMPILER})
    body = wait_condition(cluster, namespace, "m", "Compiled", "False", "CompileFailed", timeout=90)
    assert "failed: BackoffLimitExceeded" in condition(body, "Compiled")["message"]
    # What the compile step said (its termination message) is in the status too.
    assert "compile: simulated compiler failure" in condition(body, "Compiled")["message"]
    assert (condition(body, "Ready")["reason"], condition(body, "Stalled")["status"]) == ("CompileFailed", "True")
    assert condition(body, "Available")["status"] == "True"
    after = cluster.get("deployment", "m", "-n", namespace)
    assert after["spec"] == before["spec"] and after["metadata"]["generation"] == before["metadata"]["generation"]
    warnings = cluster.get("events", "-n", namespace, "--field-selector", "involvedObject.name=m,type=Warning")["items"]
    assert any(e["reason"] == "CompileFailed" for e in warnings)


def test_a_compile_job_whose_pod_cannot_be_created_says_why_within_a_minute(cluster, operator, namespace):
    """Seen here before: a model whose serviceAccountName did not exist said Compiling until the
    Job's six-hour deadline, while the Job controller's event said FailedCreate. The event is
    the one place Kubernetes says it; the model's status now quotes it, and Stalled says so."""
    apply_model(cluster, namespace, "m", serviceAccountName="does-not-exist", **{"compile.image": COMPILE_IMAGE})
    body = wait_condition(cluster, namespace, "m", "Compiled", "False", "FailedCreate", timeout=60)
    message = condition(body, "Compiled")["message"]
    assert "cannot create its pod" in message and 'serviceaccount "does-not-exist" not found' in message, message
    assert (condition(body, "Ready")["reason"], condition(body, "Stalled")["status"]) == ("FailedCreate", "True")
    # Its PodDisruptionBudget is there from the start, over the serving pods.
    [pdb] = items(cluster, "poddisruptionbudgets", namespace, "m")
    assert pdb["spec"]["maxUnavailable"] == 1 and pdb["spec"]["selector"]["matchLabels"]["inferentia.dev/model"] == "m"


def test_a_node_whose_neuron_devices_report_an_error_is_named_in_its_models_status(cluster, operator, namespace):
    """AWS's node problem detector sets NeuronHealth=True on a node whose Neuron driver logged a
    hardware error: the model with a pod there says so (DeviceFault) within seconds, naming the
    pod, the node and the error. While the node takes new pods the pod is left there, out of the
    Service's endpoints since the other replica answers; once the node is cordoned the pod is
    evicted, its replacement runs elsewhere and takes traffic, and the condition goes."""
    apply_model(cluster, namespace, "m", replicas=2)
    wait_ready(cluster, namespace, "m")

    def serving() -> list[dict]:
        return [
            p for p in items(cluster, "pods", namespace, "m") if p["metadata"]["labels"].get("app.kubernetes.io/component") == "serving"
        ]

    def endpoints() -> set[str]:
        slices = cluster.get("endpointslices", "-n", namespace, "-l", "kubernetes.io/service-name=m")["items"]
        return {a for s in slices for e in s.get("endpoints") or [] if (e.get("conditions") or {}).get("ready") for a in e["addresses"]}

    pod, other = serving()
    node = pod["spec"]["nodeName"]
    assert other["spec"]["nodeName"] != node, "the replicas are spread over nodes (the operator's preferred anti-affinity)"
    wait_for(lambda: endpoints() == {pod["status"]["podIP"], other["status"]["podIP"]}, 30, "both replicas in the Service")

    def set_health(status: str, reason: str, message: str) -> None:
        condition = {"type": "NeuronHealth", "status": status, "reason": reason, "message": message}
        patch = json.dumps({"status": {"conditions": [condition]}})  # merged by type, beside the kubelet's own
        cluster.kubectl("patch", "node", node, "--subresource=status", "--type=strategic", "-p", patch)

    try:
        set_health("True", "NeuronHasError_DMA_ERROR", "kernel: NEURON_HW_ERR=DMA_ERROR")
        body = wait_condition(cluster, namespace, "m", "DeviceFault", "True", "NeuronHardwareError", timeout=30)
        message = condition(body, "DeviceFault")["message"]
        assert f"pod {pod['metadata']['name']} on node {node}: NeuronHasError_DMA_ERROR" in message, message
        # The Neuron taint keeps no replacement off (the pods tolerate it): left, with the node named for
        # cordoning, and out of traffic while the other replica answers.
        assert f"Cordon {node} (kubectl cordon)" in message and "out of traffic" in message, message
        wait_for(lambda: endpoints() == {other["status"]["podIP"]}, 30, "the replica on the failing node to leave the Service")
        assert {p["metadata"]["name"] for p in serving()} == {pod["metadata"]["name"], other["metadata"]["name"]}
        # Cordoned: the pod is evicted (another node of its type takes the replacement) and the condition goes.
        cluster.kubectl("cordon", node)
        wait_for(lambda: not condition(get_model(cluster, namespace, "m"), "DeviceFault"), 60, "DeviceFault to go once the pod moved")
        body = wait_ready(cluster, namespace, "m")
        moved = serving()
        assert len(moved) == 2 and all(p["spec"]["nodeName"] != node for p in moved)
        assert pod["metadata"]["name"] not in {p["metadata"]["name"] for p in moved}
        wait_for(lambda: endpoints() == {p["status"]["podIP"] for p in serving()}, 30, "both replicas in the Service again")
    finally:
        cluster.kubectl("uncordon", node)
        set_health("False", "NeuronHasNoError", "Neuron has no error")


@pytest.mark.parametrize("sample", ["llama-inf2-vllm.yaml", "trn2-lnc2.yaml"])
def test_neuron_2x_samples_reach_ready_with_the_planned_command(cluster, operator, namespace, sample):
    """The vLLM preset on inf2, and on trn2 with logical cores, on the simulated fleet."""
    from kit import ROOT

    from samples import on_simulated_fleet, prerequisites

    body = on_simulated_fleet(yaml.safe_load((ROOT / "manifests" / "samples" / sample).read_text()), namespace)
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([*prerequisites(namespace), body]))
    name = body["metadata"]["name"]
    live_model = wait_ready(cluster, namespace, name, timeout=120)
    m = model_of(live_model)
    assert live_model["status"]["plan"]["compiler"] == "neuronx-cc"
    assert live_model["status"]["plan"]["tensorParallelSize"] == m.plan.group_size
    deployment = cluster.get("deployment", name, "-n", namespace)
    assert applied(serving_deployment(m), deployment)
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["/bin/sh", "/etc/inferentia/launch.sh"]
    assert container["args"] == vllm_args(m)
    # One vLLM server per group, tensor parallel over its logical cores: 2 on inf2, 8 on trn2 at LNC 2.
    assert (
        container["args"][container["args"].index("--tensor-parallel-size") + 1]
        == {"llama-inf2-vllm.yaml": "2", "trn2-lnc2.yaml": "8"}[sample]
    )
    assert container["startupProbe"]["httpGet"]["path"] == "/health"
    env = json.loads(cluster.get("configmap", plan_configmap_name(m), "-n", namespace)["data"]["plan.json"])["env"]
    assert {e["NEURON_LOGICAL_NC_CONFIG"] for e in env} == {"1" if m.plan.family == "inf2" else "2"}
    [pod] = cluster.get("pod", "-n", namespace, "-l", selector_string(m))["items"]
    node = cluster.get("node", pod["spec"]["nodeName"])
    assert node["metadata"]["labels"]["node.kubernetes.io/instance-type"] in m.plan.instance_types


def test_a_write_the_api_server_refuses_ends_in_status_and_does_not_hold_back_the_others(cluster, operator, namespace):
    # A quota that allows no Deployment: the API server refuses it (403, exceeded quota),
    # while the plan ConfigMap and the Service still go in.
    quota = {
        "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "no-deployments", "namespace": namespace},
        "spec": {"hard": {"count/deployments.apps": "0"}},
    }  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(quota))
    wait_for(lambda: cluster.get("resourcequota", "no-deployments", "-n", namespace).get("status", {}).get("hard"), 30, "the quota")
    apply_model(cluster, namespace, "refused")
    body = wait_condition(cluster, namespace, "refused", "Ready", "False", "ApplyFailed")
    ready = condition(body, "Ready")
    assert "the API server refused Deployment refused: 403" in ready["message"] and "exceeded quota" in ready["message"]
    assert condition(body, "Stalled")["status"] == "True"  # 4xx: retrying the same write cannot help
    assert cluster.kubectl("get", "service", "refused", "-n", namespace, check=False).returncode == 0
    assert cluster.kubectl("get", "deployment", "refused", "-n", namespace, check=False).returncode != 0
    events = cluster.get("events", "-n", namespace, "--field-selector", "involvedObject.name=refused")["items"]
    assert any(e["type"] == "Warning" and e["reason"] == "ApplyFailed" for e in events)
    # Lifting the quota is a change the operator does not see; its resync (3 s here) retries.
    cluster.kubectl("delete", "resourcequota", "no-deployments", "-n", namespace)
    wait_ready(cluster, namespace, "refused")


def test_an_object_of_someone_else_with_the_childs_name_is_never_taken(cluster, operator, namespace):
    admins = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "taken", "namespace": namespace, "labels": {"team": "admin"}},
        "spec": {"selector": {"app": "admin"}, "ports": [{"name": "http", "port": 80}]},
    }  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(admins))
    before = cluster.get("service", "taken", "-n", namespace)
    apply_model(cluster, namespace, "taken")
    body = wait_condition(cluster, namespace, "taken", "Ready", "False", "NameConflict")
    assert "Service taken already exists and is not managed by this model" in condition(body, "Ready")["message"]
    after = cluster.get("service", "taken", "-n", namespace)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]  # not written at all
    assert not after["metadata"].get("ownerReferences")
    cluster.kubectl("delete", "inferentiamodel", "taken", "-n", namespace)
    time.sleep(2)  # the garbage collector would have removed it by now, were it owned
    assert cluster.get("service", "taken", "-n", namespace)["spec"]["selector"] == {"app": "admin"}


@pytest.mark.faults
def test_a_child_whose_labels_are_removed_is_found_and_repaired(cluster, operator, namespace):
    apply_model(cluster, namespace, "m")
    wait_ready(cluster, namespace, "m")
    # The label-filtered watch now sends DELETED for it; the owner reference still says whose it is.
    cluster.kubectl("label", "deployment", "m", "-n", namespace, "app.kubernetes.io/managed-by-", "inferentia.dev/model-")
    cluster.kubectl("label", "service", "m", "-n", namespace, "app.kubernetes.io/managed-by-")

    def relabelled():
        labels = [cluster.get(k, "m", "-n", namespace)["metadata"].get("labels") or {} for k in ("deployment", "service")]
        return all(x.get("app.kubernetes.io/managed-by") == "inferentia-operator" for x in labels)

    wait_for(relabelled, 60, "the labels to be put back")
    wait_ready(cluster, namespace, "m")


def test_the_operator_serves_prometheus_metrics(cluster, operator, namespace):
    import urllib.request

    apply_model(cluster, namespace, "m")
    wait_ready(cluster, namespace, "m")
    with urllib.request.urlopen(f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=5) as response:
        text = response.read().decode()
    for name in (
        "inferentia_operator_reconcile_duration_seconds_bucket",
        'inferentia_operator_reconciles_total{result="changed"}',
        "inferentia_operator_queue_depth",
        'inferentia_operator_queue_wait_seconds_count{lane="urgent"} ',  # the model's creation
    ):
        assert name in text, [line for line in text.splitlines() if line.startswith(name.split("{")[0])]
    # The Deployment's server-side apply: 201 when it made it, 200 when it changed one.
    applied = r'^inferentia_operator_api_requests_total\{code="20[01]",resource="deployments",verb="patch"\} [1-9]'
    assert re.search(applied, text, re.M), text


def test_models_run_in_a_namespace_that_enforces_restricted_and_root_is_reported(cluster, operator, namespace):
    cluster.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted", "--overwrite")
    apply_model(cluster, namespace, "hardened", **{"compile.image": COMPILE_IMAGE, "processesPerReplica": 2})
    wait_ready(cluster, namespace, "hardened")  # the compile pod and the serving pod were admitted
    # An image that needs root is admitted nowhere restricted: the ReplicaSet's refusal
    # reaches the model's status instead of "Available, 0 of 1".
    apply_model(cluster, namespace, "needs-root", runAsRoot=True)
    body = wait_condition(cluster, namespace, "needs-root", "Ready", "False", "FailedCreate")
    assert "violates PodSecurity" in condition(body, "Ready")["message"]
    assert condition(body, "Available")["status"] == "False" and condition(body, "Stalled")["status"] == "True"


def test_a_hand_edited_service_port_is_repaired_and_never_blocks_the_deployment(cluster, operator, namespace):
    apply_model(cluster, namespace, "m", **{"processesPerReplica": 2})
    wait_ready(cluster, namespace, "m")
    cluster.kubectl(
        "patch", "svc", "m", "-n", namespace, "--type=json", "-p", '[{"op":"replace","path":"/spec/ports/0/port","value":9999}]'
    )

    def ports():
        return sorted((p["name"], p["port"]) for p in cluster.get("service", "m", "-n", namespace)["spec"]["ports"])

    wait_for(lambda: ports() == [("serve-0", 8080), ("serve-1", 8081)], 60, "the planned ports to be put back")
    # A later change of the spec still reaches the Deployment.
    apply_model(cluster, namespace, "m", **{"processesPerReplica": 2, "serving.image": "example.com/serve:2"})
    wait_ready(cluster, namespace, "m")
    [container] = cluster.get("deployment", "m", "-n", namespace)["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "example.com/serve:2"


@pytest.mark.faults
def test_an_api_server_outage_with_etcd_compaction_is_survived_without_a_restart(cluster, operator, namespace):
    if cluster.local is None:
        pytest.skip("stops the API server: only on the built-in control plane")
    import base64

    apply_model(cluster, namespace, "m")
    wait_ready(cluster, namespace, "m")
    local = cluster.local
    local.stop_component("kube-apiserver")
    # While it is down, move etcd on and compact it: every watch the operator resumes is
    # now too old (410 Gone), and it must list again instead of waiting forever.
    for i in range(20):
        local.etcd("kv/put", {"key": base64.b64encode(f"/e2e-fault/{i}".encode()).decode(), "value": "eA=="})
    revision = int(local.etcd("kv/range", {"key": base64.b64encode(b"/e2e-fault/0").decode()})["header"]["revision"])
    local.etcd("kv/compaction", {"revision": str(revision), "physical": True})
    time.sleep(3)  # the operator sees the outage
    local.start_component("kube-apiserver")
    assert operator.proc.poll() is None  # still the same process
    apply_model(cluster, namespace, "m", **{"serving.image": "example.com/serve:after-outage"})
    wait_ready(cluster, namespace, "m", timeout=120)
    [container] = cluster.get("deployment", "m", "-n", namespace)["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "example.com/serve:after-outage"
    cluster.kubectl("delete", "service", "m", "-n", namespace)
    wait_for(lambda: cluster.kubectl("get", "service", "m", "-n", namespace, check=False).returncode == 0, 60, "the Service to come back")


@pytest.mark.faults
@pytest.mark.parametrize(
    "kind,patch",
    [
        ("deployment", '[{"op":"replace","path":"/spec/template/spec/containers/0/env/0/value","value":"tampered"}]'),
        ("deployment", '[{"op":"remove","path":"/spec/template/spec/tolerations"}]'),
        ("deployment", '[{"op":"replace","path":"/spec/template/spec/securityContext/runAsUser","value":0}]'),
        ("deployment", '[{"op":"remove","path":"/metadata/ownerReferences"}]'),
        ("service", '[{"op":"replace","path":"/spec/selector","value":{"app":"elsewhere"}}]'),
        ("configmap", None),  # deleted
    ],
    ids=["env", "tolerations", "run-as-root", "owner-reference", "selector", "plan-deleted"],
)
def test_every_owned_field_edited_or_deleted_is_repaired(cluster, operator, namespace, kind, patch):
    apply_model(cluster, namespace, "m")
    m = model_of(wait_ready(cluster, namespace, "m"))
    desired = {"deployment": serving_deployment(m), "service": service(m), "configmap": plan_configmap(m)}[kind]
    name = desired["metadata"]["name"]
    if patch is None:
        cluster.kubectl("delete", kind, name, "-n", namespace)
    else:
        cluster.kubectl("patch", kind, name, "-n", namespace, "--type=json", "-p", patch)

    def repaired():
        result = cluster.kubectl("get", kind, name, "-n", namespace, "-o", "json", check=False)
        return result.returncode == 0 and applied(desired, json.loads(result.stdout))

    wait_for(repaired, 60, f"the {kind} to be repaired")


@pytest.mark.faults
def test_a_namespace_deleted_while_the_operator_is_down_leaves_nothing_behind(cluster, operator, namespace):
    doomed = f"{namespace}-doomed"
    cluster.kubectl("create", "namespace", doomed)
    apply_model(cluster, doomed, "m")
    wait_ready(cluster, doomed, "m")
    operator.stop()
    try:
        cluster.kubectl("delete", "namespace", doomed, "--timeout=60s")  # no finalizer waits for the operator
    finally:
        seen = len(operator.log())
        operator.start()
    apply_model(cluster, namespace, "after")  # and the operator carries on with the others
    wait_ready(cluster, namespace, "after")
    assert cluster.kubectl("get", "namespace", doomed, check=False).returncode != 0
    assert "Traceback" not in operator.log()[seen:]


def test_a_model_with_batching_gets_the_front_end_its_port_and_its_readiness(cluster, operator, namespace):
    apply_model(cluster, namespace, "batched", **{"processesPerReplica": 2, "serving.batching": {"maxBatchSize": 4, "maxLatencyMs": 50}})
    body = wait_ready(cluster, namespace, "batched")
    m = model_of(body)
    deployment = cluster.get("deployment", "batched", "-n", namespace)
    assert applied(serving_deployment(m), deployment)
    names = [c["name"] for c in deployment["spec"]["template"]["spec"]["containers"]]
    assert names == ["serve", "batcher"]
    batcher = deployment["spec"]["template"]["spec"]["containers"][1]
    assert batcher["readinessProbe"]["httpGet"]["path"] == "/readyz"
    service = cluster.get("service", "batched", "-n", namespace)
    assert [(p["name"], p["port"]) for p in service["spec"]["ports"]][0] == ("batch", 8080)


def test_validate_the_api_server_and_the_operators_status_agree_on_the_corpus(cluster, operator, namespace):
    """Three verdicts on each document: validate's, the API server's, and the status the
    operator writes for what the API server stores."""
    from corpus import DIVERGENCE_CORPUS
    from inferentia_operator.core.findings import errors
    from inferentia_operator.core.parsing import parse_spec
    from specs import make_spec

    operator_only = [
        # Accepted by the API server (CEL cannot see these); refused by validate and the operator.
        make_spec(**{"compile.staticWeights": True, "model.weights": 10**10}),
        make_spec(
            **{
                "compute.family": "trn2",
                "compute.inf": 16,
                "compute.lnc": 1,
                "processesPerReplica": 128,
                "compile.extraArgs": ["--opt=" + "x" * 1000] * 64,
            }
        ),  # fmt: skip
    ]
    specs = [make_spec(**o) for o in DIVERGENCE_CORPUS] + operator_only
    # The verdicts are the point, not the pods: the corpus's valid documents ask for thousands of
    # replicas in all, and their pods, Pending on the fleet, kept the scheduler busy for minutes
    # after this test, while a later test's pod waited its turn (seen: 1,639 Pending pods, and
    # the next test's compile pod scheduled after 97 s). A quota of no pods keeps them unmade.
    no_pods = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-pods", "namespace": namespace},
        "spec": {"hard": {"pods": "0"}},
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(no_pods))
    wait_for(lambda: cluster.get("resourcequota", "no-pods", "-n", namespace).get("status", {}).get("hard"), 30, "the quota's status")
    # One kubectl for the whole corpus (a kubectl a document cost 10 s of the test's 51): it
    # applies each document of a stream on its own, names each one stored on stdout and each
    # refusal on stderr. (A List is checked against the schema by kubectl itself, all or nothing.)
    bodies = {f"corpus-{i}": make_model(f"corpus-{i}", namespace, spec) for i, spec in enumerate(specs)}
    result = cluster.kubectl("apply", "-o", "name", "-f", "-", input=yaml.safe_dump_all(bodies.values()), check=False)
    stored = {line.rsplit("/", 1)[1] for line in result.stdout.split()}
    refused = set(bodies) - stored
    assert all(f'"{name}"' in result.stderr for name in refused), (refused, result.stderr[-2000:])
    expected = {}
    for i, spec in enumerate(specs):
        if f"corpus-{i}" in stored:
            found = [f for f in errors(parse_spec(spec)[1])]
            if i >= len(DIVERGENCE_CORPUS) and not found:  # the plan-size rule is checked with the plan
                found = ["too large"]
            expected[f"corpus-{i}"] = not found
    assert sum(expected.values()) > 20 and False in expected.values() and refused

    def verdicts():
        out = {}
        for m in cluster.get("inferentiamodels", "-n", namespace)["items"]:
            c = condition(m, "Validated")
            if c.get("status") in ("True", "False"):
                out[m["metadata"]["name"]] = c["status"] == "True"
        return out if set(out) >= set(expected) else None

    seen = wait_for(verdicts, 120, "a Validated condition on every stored document")
    assert {k: seen[k] for k in expected} == expected


def test_a_namespace_user_cannot_forge_a_compile_cache_hit(cluster, operator, namespace):
    """Issue 38: a user with the namespace's ordinary rights (the built-in edit role) forges the
    record of a compile and a completed compile Job of the model's artefact, each with the
    operator's labels and a proof copied from nowhere. The model still runs its own compile."""
    user = "mallory"
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": user, "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input=json.dumps(binding))
    as_mallory = (cluster.local or cluster.node).user_kubeconfig(user)
    spec = {"compile.image": COMPILE_IMAGE}
    m = model_of({**make_model("m", namespace, **spec), "metadata": {"name": "m", "namespace": namespace, "uid": "-"}})
    uri = compiled_uri(m)
    labels = {"app.kubernetes.io/managed-by": "inferentia-operator", "app.kubernetes.io/part-of": "inferentia-operator"}
    record = {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {
            "name": compile_record_name(m), "namespace": namespace,
            "labels": {**labels, "app.kubernetes.io/component": "compile-record"},
            "annotations": {"inferentia.dev/proof": "0" * 64},
        },
        "data": {"uri": uri, "key": compile_hash(m), "job": "compile-forged", "model": "m"},
    }  # fmt: skip
    job = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {
            "name": "compile-forged", "namespace": namespace,
            "labels": {**labels, "app.kubernetes.io/component": "compile", "inferentia.dev/model": "m"},
            "annotations": {"inferentia.dev/proof": "0" * 64},
        },
        "spec": {"template": {"spec": {
            "restartPolicy": "Never",
            "initContainers": [{"name": "compile", "image": "example.com/anything:1", "env": [{"name": "INFERENTIA_OUTPUT_URI", "value": uri}]}],
            "containers": [{"name": "upload", "image": "example.com/anything:1"}],
        }}},
    }  # fmt: skip
    for forged in (record, job):
        cluster.kubectl("--kubeconfig", str(as_mallory), "apply", "-f", "-", input=json.dumps(forged))
    try:
        wait_for(
            # Only the scheduler, kwok and the Job controller complete it, no code of the
            # operator's: 5 s alone. (It once waited minutes behind the corpus test's Pending
            # pods in the scheduler's queue; that test makes none now.)
            lambda: condition(cluster.get("job", "compile-forged", "-n", namespace), "Complete").get("status") == "True",
            180,
            "the forged Job",
        )
    except AssertionError as timed_out:
        # Should it still time out, say where the Job stood.
        seen = cluster.kubectl("get", "job,pods,events", "-n", namespace, "-o", "wide", check=False)
        nodes = cluster.kubectl("get", "nodes", "-o", "wide", check=False)
        raise AssertionError(f"{timed_out}\n{seen.stdout}{seen.stderr}\n{nodes.stdout}") from None

    apply_model(cluster, namespace, "m", **spec)
    body = wait_ready(cluster, namespace, "m")
    status = body["status"]
    assert (status["compileCacheHit"], status["compileJob"]) == (False, compile_job_name(m))
    assert condition(body, "Compiled")["reason"] == "Compiled"
    own = cluster.get("job", compile_job_name(m), "-n", namespace)
    assert own["metadata"]["annotations"]["inferentia.dev/proof"] != "0" * 64
    # The operator never writes over the forged record, which holds the record's name.
    assert cluster.get("configmap", compile_record_name(m), "-n", namespace)["data"]["job"] == "compile-forged"


def test_a_child_created_by_a_post_becomes_the_operators_apply_before_its_first_apply(cluster, namespace, monkeypatch):
    """The operator creates a child with a plain POST (which costs the API server less than an
    apply: docs/benchmarks.md), refused (409, nothing written) where the name is taken. The
    POST's fields are the operator's Update's, which an apply does not take: an apply that drops
    one leaves it (the control). So before its first apply the operator makes them its Apply's,
    and an apply that drops a field removes it, on a ConfigMap as on a Service, whose cluster IP
    the API server allocated and stays."""
    from inferentia_operator.core.projection import OWN_UPDATE_ENTRY, project
    from inferentia_operator.shell import act
    from inferentia_operator.shell.kube import ApiError, Kube
    from inferentia_operator.shell.transport import Transport

    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    kube = Kube(Transport())

    def configmap(name: str, data: dict) -> dict:
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace}, "data": data}

    someone = configmap("theirs", {"x": "1"})
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(someone))
    before = cluster.get("configmap", "theirs", "-n", namespace)
    assert kube.create({**someone, "data": {"x": "taken"}}) is None
    assert cluster.get("configmap", "theirs", "-n", namespace)["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]

    control = kube.create(configmap("control", {"a": "1", "b": "2"}))
    assert control is not None
    kube.apply(configmap("control", {"a": "1"}))
    assert cluster.get("configmap", "control", "-n", namespace)["data"] == {"a": "1", "b": "2"}

    created = kube.create(configmap("c", {"a": "1", "b": "2"}))
    assert created is not None
    # A GET says where that entry is as the create's answer does: what the operator reads after
    # a 409 on a child of its own that its caches do not hold yet (shell/act.py).
    assert project(kube.get("ConfigMap", namespace, "c"))[OWN_UPDATE_ENTRY] == project(created)[OWN_UPDATE_ENTRY]
    act.apply(kube, configmap("c", {"a": "1"}), project(created))
    assert cluster.get("configmap", "c", "-n", namespace)["data"] == {"a": "1"}
    # Told of an entry that is no longer there (the caches behind): refused, nothing written.
    version = cluster.get("configmap", "c", "-n", namespace)["metadata"]["resourceVersion"]
    with pytest.raises(ApiError):
        kube.make_own_fields_applied("ConfigMap", namespace, "c", 0, False)
    assert cluster.get("configmap", "c", "-n", namespace)["metadata"]["resourceVersion"] == version

    # Applied once already, as when a create met a child of its own the caches did not hold
    # yet: the Update entry sits beside the Apply entry, and goes.
    kube.create(configmap("d", {"a": "1", "b": "2"}))
    both = kube.apply(configmap("d", {"a": "1", "b": "2"}))
    assert project(both)[OWN_UPDATE_ENTRY]["besideApply"] is True
    act.apply(kube, configmap("d", {"a": "1"}), project(both))
    assert cluster.get("configmap", "d", "-n", namespace)["data"] == {"a": "1"}

    def service(ports: list[dict]) -> dict:
        return {
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": namespace},
            "spec": {"selector": {"app": "s"}, "ports": ports},
        }  # fmt: skip

    two = [{"name": "a", "port": 80, "protocol": "TCP"}, {"name": "b", "port": 81, "protocol": "TCP"}]
    created = kube.create(service(two))
    assert created is not None
    act.apply(kube, service(two[:1]), project(created))
    live = cluster.get("service", "s", "-n", namespace)
    assert [p["name"] for p in live["spec"]["ports"]] == ["a"] and live["spec"]["clusterIP"] == created["spec"]["clusterIP"]
    # Its own fields are now its Apply's alone: a later apply finds nothing to make its own.
    assert OWN_UPDATE_ENTRY in project(created) and OWN_UPDATE_ENTRY not in project(live)
