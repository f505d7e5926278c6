"""The local control plane is a real one: it schedules on Neuron capacity, refuses what does
not fit, collects garbage, and serves the CRD with its documentation and CEL rules."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import yaml
from kit import ROOT, listeners_of, wait_for

from corpus import CEL_CASES, DIVERGENCE_CORPUS
from inferentia_operator.core.findings import errors
from inferentia_operator.core.parsing import parse_spec
from inferentia_operator.core.rules import CEL_RULES, NAME, check_name
from specs import make_model, make_spec
from test_cli import run_cli

TOLERATE_NEURON = [{"key": "aws.amazon.com/neuron", "operator": "Exists", "effect": "NoSchedule"}]


def neuron_deployment(name: str, chips: int) -> dict:
    resources = {"aws.amazon.com/neuron": str(chips), "memory": "1Gi"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "tolerations": TOLERATE_NEURON,
                    "containers": [
                        {"name": "serve", "image": "example.com/serve:1", "resources": {"requests": resources, "limits": resources}}
                    ],
                },
            },
        },
    }


def pods_of(cluster, namespace, app):
    return cluster.get("pods", "-n", namespace, "-l", f"app={app}")["items"]


def test_a_four_chip_pod_lands_on_a_node_with_four_free_chips(cluster, namespace):
    if not any(c >= 4 for c in cluster.neuron_capacity()):
        pytest.skip("no node offers 4 aws.amazon.com/neuron")
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(neuron_deployment("four", 4)))
    cluster.kubectl("rollout", "status", "deployment/four", "-n", namespace, "--timeout=60s")
    [pod] = pods_of(cluster, namespace, "four")
    node = cluster.get("node", pod["spec"]["nodeName"])
    assert int(node["status"]["allocatable"]["aws.amazon.com/neuron"]) >= 4
    ready = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    assert ready["Ready"] == "True"


def test_a_pod_asking_for_more_chips_than_any_node_stays_pending(cluster, namespace):
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(neuron_deployment("huge", 17)))

    def failed_scheduling():
        events = cluster.get("events", "-n", namespace, "--field-selector", "reason=FailedScheduling")["items"]
        return [e for e in events if e["involvedObject"]["name"].startswith("huge-")]

    [event, *_] = wait_for(failed_scheduling, 60, "a FailedScheduling event")
    assert "aws.amazon.com/neuron" in event["message"]
    [pod] = pods_of(cluster, namespace, "huge")
    assert pod["status"]["phase"] == "Pending" and not pod["spec"].get("nodeName")


def test_deleting_an_owner_removes_what_it_owns(cluster, namespace):
    cluster.kubectl("create", "configmap", "owner", "-n", namespace)
    owner = cluster.get("configmap", "owner", "-n", namespace)
    child = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "child",
            "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}],
        },
    }
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(child))
    cluster.kubectl("delete", "configmap", "owner", "-n", namespace)
    wait_for(
        lambda: cluster.kubectl("get", "configmap", "child", "-n", namespace, check=False).returncode != 0,
        60,
        "the garbage collector to delete the child",
    )


def test_a_job_pod_completes(cluster, namespace):
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "once"},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "example.com/c:1"}]}}},
    }
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(job))
    cluster.kubectl("wait", "--for=condition=Complete", "job/once", "-n", namespace, "--timeout=60s")


def test_kubectl_explain_documents_the_fields(crd_installed):
    def explain(field):  # kubectl wraps descriptions: compare with whitespace folded
        return " ".join(crd_installed.kubectl("explain", f"inferentiamodel.{field}").stdout.split())

    assert "Whole Neuron chips per replica" in explain("spec.compute.inf")
    assert "Must divide the replica's NeuronCores (coresPerChip * inf)" in explain("spec.processesPerReplica")


def _rendered_by(template: str, message: str) -> bool:
    """Whether ``message`` is ``template`` with its %d and %s filled in."""
    pattern = re.escape(template).replace("%d", r"-?\d+").replace("%s", ".*")
    return re.fullmatch(pattern, message) is not None


def test_every_cel_rule_has_a_case():
    rules = [r for r in CEL_RULES if r is not NAME]  # NAME: its own test below
    findings = [f for spec in CEL_CASES.values() for f in parse_spec(spec)[1]]
    uncovered = [r.template for r in rules if not any(f.path == r.path and _rendered_by(r.template, f.message) for f in findings)]
    assert uncovered == []


@pytest.fixture(scope="module")
def refusals(crd_installed, refusals_namespace) -> dict[str, str]:
    """What the API server said of each case, all sent in one kubectl apply (which goes on past
    each refusal and names the object in each error): one call instead of one a case, about a
    minute of the suite, with the same verdicts."""
    documents = [make_model(f"bad-{case}", refusals_namespace, spec) for case, spec in sorted(CEL_CASES.items())]
    result = crd_installed.kubectl("apply", "-n", refusals_namespace, "-f", "-", input=yaml.safe_dump_all(documents), check=False)
    assert result.returncode != 0 and "created" not in result.stdout, result.stdout
    said: dict[str, str] = {}
    for chunk in re.split(r"(?m)^(?=Error from server|The InferentiaModel )", result.stderr):
        named = re.search(r'"bad-([a-z0-9-]+)"', chunk)
        if named:
            said[named.group(1)] = said.get(named.group(1), "") + chunk
    return said


@pytest.mark.parametrize("case", sorted(CEL_CASES))
def test_the_api_server_refuses_with_the_python_message(refusals, case):
    spec = CEL_CASES[case]
    expected = [f for f in errors(parse_spec(spec)[1])]
    assert expected, "the case must be invalid"
    said = refusals.get(case, "")
    for finding in expected:
        assert f"{finding.path}: Invalid value: {finding.message}" in said, said
    # Nothing more: no rule validate does not run, and no rule that failed to evaluate.
    assert said.count(": Invalid value: ") == len(expected), said
    assert "evaluation error" not in said, said


@pytest.mark.parametrize("name", ["a" * 46, "dotted.name"])
def test_the_api_server_refuses_names_the_children_cannot_carry(crd_installed, refusals_namespace, name):
    [finding] = check_name(name)
    result = crd_installed.kubectl("apply", "-f", "-", input=yaml.safe_dump(make_model(name, refusals_namespace)), check=False)
    assert result.returncode != 0
    assert f"{finding.path}: Invalid value: {finding.message}" in result.stderr, result.stderr


def test_the_api_server_accepts_the_samples_and_applies_defaults(crd_installed, namespace):
    for sample in sorted((ROOT / "manifests" / "samples").glob("*.yaml")):
        body = yaml.safe_load(sample.read_text())
        body["metadata"]["namespace"] = namespace
        crd_installed.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(body))
    crd_installed.kubectl("apply", "-f", "-", input=yaml.safe_dump(make_model("defaults", namespace)))
    stored = crd_installed.get("inferentiamodel", "defaults", "-n", namespace)["spec"]
    assert stored["processesPerReplica"] == 1
    assert stored["compute"]["family"] == "inf1"
    assert stored["compile"]["staticWeights"] == "auto"
    assert stored["rollout"] == {"maxSurge": 0, "maxUnavailable": 1}


def test_a_model_no_operator_has_reported_on_is_in_progress_for_kstatus_argo_and_kubectl(crd_installed, namespace):
    """The CRD's default status: before the operator writes any (and while it holds a
    rollout's progress back), Flux's kstatus sees Reconciling=True, Argo CD's health
    check sees generation 0 observed, and kubectl shows why nothing is ready."""
    from inferentia_operator.core.api import PENDING_STATUS

    crd_installed.kubectl("apply", "-f", "-", input=yaml.safe_dump(make_model("unreported", namespace)))
    model = crd_installed.get("inferentiamodel", "unreported", "-n", namespace)
    assert model["status"] == PENDING_STATUS
    assert model["metadata"]["generation"] != model["status"]["observedGeneration"]
    reconciling = next(c for c in model["status"]["conditions"] if c["type"] == "Reconciling")
    assert reconciling["status"] == "True"
    shown = crd_installed.kubectl("get", "inferentiamodel", "unreported", "-n", namespace).stdout
    assert "Pending" in shown, shown


def test_cluster_down_leaves_no_process_or_port(cluster, tmp_path, monkeypatch):
    if cluster.local is None:
        pytest.skip("only for the built-in control plane")
    import socket

    import localcluster

    # Another program takes the API server's port between its pick and its bind (the
    # race of a port picked free and bound later): the start goes again on new ports.
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    picks = iter([None, None, taken.getsockname()[1]])  # etcd, etcd-peer, then the API server's
    fresh = localcluster.free_port
    monkeypatch.setattr(localcluster, "free_port", lambda *a: next(picks, None) or fresh(*a))

    # A second cluster next to the session's one: free ports are picked per start.
    second = localcluster.LocalCluster(tmp_path / "second", die_with_parent=True)
    try:
        second.up()
        ports = second.ports()
        pids = second.recorded()["pids"]
        assert set(ports.values()).isdisjoint(cluster.local.ports().values())
        assert ports["apiserver"] != taken.getsockname()[1]
        assert "address already in use" in (tmp_path / "second" / "logs" / "kube-apiserver.log").read_text()
        assert set(ports.values()) <= set(listeners_of(tmp_path / "second"))  # the check below can see them
    finally:
        second.down()
        taken.close()
    assert not any(localcluster.alive(pid) for pid in pids.values())
    still = listeners_of(tmp_path / "second")
    assert not still, f"still listening (port: pid): {still}"
    assert second.running() is False


CRASHING_RUNNER = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
import localcluster
from pathlib import Path
cluster = localcluster.LocalCluster(Path(sys.argv[2]), die_with_parent=True)
cluster.up()
print(json.dumps({"pids": cluster.recorded()["pids"], "ports": cluster.ports()}), flush=True)
time.sleep(600)
"""


def test_a_killed_test_run_takes_its_control_plane_with_it(cluster, tmp_path):
    if cluster.local is None:
        pytest.skip("only for the built-in control plane")
    import json
    import signal

    from kit import ROOT

    import localcluster

    runner = subprocess.Popen(
        [sys.executable, "-c", CRASHING_RUNNER, str(ROOT / "cluster"), str(tmp_path / "crashing")],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    started = json.loads(runner.stdout.readline())
    assert set(started["ports"].values()) <= set(listeners_of(tmp_path / "crashing"))  # the check below can see them
    runner.send_signal(signal.SIGKILL)  # no finalizer, no atexit: only the kernel can clean up
    runner.wait()
    wait_for(lambda: not any(localcluster.alive(p) for p in started["pids"].values()), 30, "the components to die")
    still = listeners_of(tmp_path / "crashing")
    assert not still, f"still listening (port: pid): {still}"


@pytest.mark.parametrize("overrides", DIVERGENCE_CORPUS, ids=lambda o: repr(o)[:50])
def test_validate_and_the_api_server_agree(crd_installed, refusals_namespace, overrides):
    spec = make_spec(**overrides)
    refused_by_validate = bool(errors(parse_spec(spec)[1]))
    body = make_model("corpus", refusals_namespace, spec)
    result = crd_installed.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(body), check=False)
    assert (result.returncode != 0) == refused_by_validate, (overrides, result.stderr, parse_spec(spec)[1])


# YAML text the users write, placed as written where an integer belongs: the scalar forms of
# YAML 1.1 (which PyYAML reads) and YAML 1.2, empty tagged scalars, and numbers past int64.
# `validate -` and `kubectl apply --dry-run=server` (which reads YAML with sigs.k8s.io/yaml)
# must refuse the same ones.
YAML_SCALARS = [
    "2",
    '"2"',
    "2.0",
    "2.5",
    "0x2",
    "0o2",
    "02",
    "1_0",
    "+2",
    "-0",
    "2e0",
    "true",
    "~",
    "null",
    "''",
    '!!int ""',
    '!!int "2"',
    "!!float 2",
    "!!str 2",
    ".inf",
    ".nan",
    "9223372036854775807",
    "9223372036854775808",
    "99999999999999999999999",
    "[2]",
    "{a: 2}",
    "!!binary MjI=",
]
YAML_FIELDS = {"compute.inf": ("compute", "inf"), "replicas": ("replicas",), "processesPerReplica": ("processesPerReplica",)}


@pytest.mark.parametrize("field", list(YAML_FIELDS))
@pytest.mark.parametrize("scalar", YAML_SCALARS)
def test_validate_and_the_api_server_agree_on_yaml_as_written(crd_installed, refusals_namespace, field, scalar):
    model = make_model("yaml-corpus", refusals_namespace)
    node = model["spec"]
    *parents, leaf = YAML_FIELDS[field]
    for key in parents:
        node = node[key]
    node[leaf] = "PLACEHOLDER"
    text = yaml.safe_dump(model, sort_keys=False).replace("PLACEHOLDER", scalar)
    code, out, err = run_cli("validate", "-", stdin=text)  # in this process: 81 cases
    assert code in (0, 1, 2) and "Traceback" not in err, err
    applied = crd_installed.kubectl("apply", "--dry-run=server", "-f", "-", input=text, check=False)
    assert (applied.returncode != 0) == (code != 0), (text, applied.stderr, out, err)
