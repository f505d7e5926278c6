"""`make demo`: the operator's main job on the local control plane, in one command.

Brings the local control plane up (simulated Inferentia fleet and, as root, the real
node), installs the CRDs, starts the operator in the background, applies
manifests/samples/*.yaml and shows the models going from Compiling to Ready; then the GPT-2
sample runs on the real node (cluster/samples.py says what differs there) and answers token
ids through its Service with a real forward pass, beside the same network run directly.
Everything keeps running until `make cluster-down`.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

import localcluster
from samples import on_simulated_fleet, prerequisites, put_model, run_here, store_secret

REPO = localcluster.REPO
STATE = localcluster.DEFAULT_STATE
PID_FILE = STATE / "operator.pid"
LOG_FILE = STATE / "logs" / "operator.log"
PEERING = "inferentia-operator"


def start_operator(kubeconfig: Path, prometheus: str | None = None) -> None:
    """The operator in the background; with the local Prometheus (the real node's engines),
    models with spec.autoscaling get their ScaledObjects."""
    stop_operator()
    LOG_FILE.parent.mkdir(parents=True, exist_ok=True)
    scaling = ["--prometheus-address", prometheus] if prometheus else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "inferentia_operator", "run", "--peering", PEERING, "--liveness", "", *scaling],
        env={**os.environ, "KUBECONFIG": str(kubeconfig)},
        stdout=open(LOG_FILE, "ab"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    PID_FILE.write_text(str(proc.pid))


def stop_operator() -> None:
    try:
        pid = int(PID_FILE.read_text())
    except (OSError, ValueError):
        return
    localcluster.stop_process_groups([pid])
    PID_FILE.unlink(missing_ok=True)


def main() -> int:
    if sys.argv[1:] == ["stop"]:
        stop_operator()
        return 0
    try:
        return demo()
    except (localcluster.ClusterError, subprocess.CalledProcessError) as exc:
        print(f"demo failed: {exc}", file=sys.stderr)
        return 1


def demo() -> int:
    started = time.monotonic()
    cluster = localcluster.LocalCluster(real_node=True)
    kubeconfig = cluster.up(timeout=300)
    bins = localcluster.bin_dir()
    print(f"control plane ready ({time.monotonic() - started:.0f}s); simulated nodes:")
    print(cluster.kubectl("get", "nodes", "-L", "node.kubernetes.io/instance-type", "-L", "aws.amazon.com/neuron"))
    cluster.install_crds()  # the operator creates its peering object itself
    start_operator(kubeconfig, cluster.prometheus())
    print(f"operator started (log: {LOG_FILE.relative_to(REPO)})\n")
    samples = sorted((REPO / "manifests" / "samples").glob("*.yaml"))
    # What docs/install.md has a platform team create first, then the samples as written (less
    # a StorageClass this cluster cannot provision: cluster/samples.py, on_simulated_fleet).
    print(cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(prerequisites("default"))))
    docs = [on_simulated_fleet(yaml.safe_load(s.read_text()), "default") for s in samples]
    print(cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs)))

    last, deadline = "", time.monotonic() + 180
    while time.monotonic() < deadline:
        table = cluster.kubectl("get", "inferentiamodels", "-o", "wide")
        if table != last:
            print(table)
            last = table
        rows = table.strip().splitlines()[1:]
        if rows and all(" Ready " in f" {row} " for row in rows):
            break
        time.sleep(1)
    else:
        print(f"not every model became Ready in time; see {LOG_FILE}", file=sys.stderr)
        return 1
    print(cluster.kubectl("get", "jobs,deployments,pods", "-o", "wide"))
    # The cached tools on a short path inside the checkout (git-ignored with .cluster/).
    short = REPO / ".cluster" / "bin"
    short.mkdir(parents=True, exist_ok=True)
    for tool in ("kubectl", "helm"):
        link = short / tool
        if not link.is_symlink() or link.resolve() != (bins / tool).resolve():
            link.unlink(missing_ok=True)
            link.symlink_to(bins / tool)
    ask = real_node_request(cluster)
    print(
        f"All samples are Ready ({time.monotonic() - started:.0f}s). Everything keeps running; try:\n"
        f"  export KUBECONFIG=$PWD/.cluster/kubeconfig PATH=$PWD/.cluster/bin:$PATH\n"
        "  kubectl get inferentiamodels\n"
        "  kubectl get inferentiamodel resnet50 -o jsonpath='{.status.plan}'\n"
        "  kubectl apply -f manifests/samples/invalid/three-processes-one-chip.yaml   # refused\n"
        "  .venv/bin/inferentia-operator render manifests/samples/llama-inf2-vllm.yaml\n" + ask + "Stop it all with: make cluster-down"
    )
    return 0


def real_node_request(cluster: localcluster.LocalCluster) -> str:
    """The last step: the GPT-2 sample on the real node answers through its Service with a real
    forward pass. Returns the command to ask it yourself ("" when the node could not run here)."""
    if cluster.real_node is None:
        print(f"no real node ({cluster.real_node_skipped}): the models above ran on simulated nodes only")
        return ""
    import boto3

    ns, sample = "real-node-demo", REPO / "manifests" / "samples" / "gpt2-inf2.yaml"
    cluster.kubectl("apply", "-f", str(localcluster.HERE / "demo-real-node.yaml"))
    doc = run_here(yaml.safe_load(sample.read_text()), ns)
    name, uri = doc["metadata"]["name"], doc["spec"]["model"]["uri"]
    # The model the sample names: a small network made here (tests/models/reference.py), nothing downloaded.
    models, reference = STATE / "models", REPO / "tests" / "models" / "reference.py"
    subprocess.run(["/usr/bin/python3", str(reference), "build", str(models)], check=True)
    endpoint = cluster.object_store()
    store = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="local", aws_secret_access_key="local")
    network, dtype, inputs = put_model(store, uri, models)
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(store_secret(ns, endpoint)))
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))
    cluster.kubectl("wait", "-n", ns, f"inferentiamodel/{name}", "--for=condition=Ready", "--timeout=300s")
    ip = cluster.kubectl("get", "-n", ns, "service", name, "-o", "jsonpath={.spec.clusterIP}")
    port = doc["spec"]["serving"].get("port", 8080)
    command = f"curl -s -H 'Content-Type: application/json' -d '{inputs[:1]}' http://{ip}:{port}/"
    answer = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60)
    direct = subprocess.run(
        ["/usr/bin/python3", str(reference), "predict", str(models / network), dtype], input=str(inputs[:1]), capture_output=True, text=True
    )  # fmt: skip
    print(
        f"{name} on the real node (real containers and PyTorch; Neuron stand-ins) answers token ids through its Service:\n"
        f"  $ {command}\n  {answer.stdout}\n  the same network run directly: {direct.stdout}"
    )
    return f"  {command}   # the real node's model\n" + zero_model_request(cluster, store)


def zero_model_request(cluster: localcluster.LocalCluster, store: Any) -> str:
    """A model that sits at zero replicas (cluster/demo-zero.yaml) answers its first request:
    the holder keeps it while KEDA starts a replica. Returns the command to ask it again."""
    if not cluster.prometheus():
        print("no KEDA and Prometheus here: the scale-to-zero model is left out")
        return ""
    doc = yaml.safe_load((localcluster.HERE / "demo-zero.yaml").read_text())
    name, ns = doc["metadata"]["name"], doc["metadata"]["namespace"]
    with contextlib.suppress(store.exceptions.BucketAlreadyOwnedByYou):
        store.create_bucket(Bucket=doc["spec"]["compile"]["outputUri"].split("/")[2])
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))
    cluster.kubectl("wait", "-n", ns, f"inferentiamodel/{name}", "--for=condition=Ready", "--timeout=300s")
    idle = doc["spec"]["autoscaling"]["idleSeconds"]
    print(f"{name} is Ready; after {idle} s without a request it goes to zero replicas ...")
    reason = "jsonpath={.status.conditions[?(@.type=='Ready')].reason}=ScaledToZero"
    cluster.kubectl("wait", "-n", ns, f"inferentiamodel/{name}", f"--for={reason}", "--timeout=300s")
    # At zero once its last replica, which drains after the scale-down, is gone too.
    serving = f"inferentia.dev/model={name},app.kubernetes.io/component=serving"
    deadline = time.monotonic() + 120
    while cluster.kubectl("get", "pods", "-n", ns, "-l", serving, "-o", "name").strip() and time.monotonic() < deadline:
        time.sleep(1)
    ip = cluster.kubectl("get", "-n", ns, "service", name, "-o", "jsonpath={.spec.clusterIP}")
    command = f"curl -s -H 'Content-Type: application/json' -d '{{\"prompt\": \"hello\"}}' http://{ip}:8080/v1/completions"
    started = time.monotonic()
    answer = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=360)
    print(
        f"{name} at zero replicas answers its first request in {time.monotonic() - started:.0f} s (held by its holder while a"
        f" replica starts and fetches the compiled artefact):\n  $ {command}\n  {answer.stdout}"
    )
    return f"  {command}   # the model that scales to zero (again at zero {idle} s after the last request)\n"


if __name__ == "__main__":
    sys.exit(main())
