"""The serving contract, on the real node: pods the operator renders run as real containers
(containerd and runc), get their Neuron devices from the device-plugin stand-in through the
kubelet's device-plugin API, and start the Neuron stand-ins, which check what a real Neuron
node and vLLM check (cluster/node/standins/neuron_standin.py)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from kit import LOCAL_IMAGE, ready_now, wait_for

from images import standin_image
from specs import DROP, make_model, make_spec

pytestmark = pytest.mark.usefixtures("operator")

STANDIN = "neuron-standin:0.1.0"
# The stand-in of AWS's vLLM image for each family (cluster/images.py): the vLLM stand-in is
# the vLLM its image's package versions say (in an image without them, STANDIN, none at all).
# On inf2 and trn1, vLLM's V1 engine through the vllm-neuron plugin on NxD Inference; on trn2
# and trn3, the vLLM Neuron plugin.
VLLM_NXDI_IMAGE = standin_image("public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:0.16.0-neuronx-py312-sdk2.31.0-ubuntu24.04")
VLLM_PLUGIN_IMAGE = standin_image("public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:0.24.0.1.1.0-neuronx-py313-sdk2.32.0-ubuntu24.04")
VLLM_IMAGES = {"inf2": VLLM_NXDI_IMAGE, "trn1": VLLM_NXDI_IMAGE, "trn2": VLLM_PLUGIN_IMAGE, "trn3": VLLM_PLUGIN_IMAGE}


STANDIN_SPEC = {
    "model": {"uri": "s3://models/llama/", "framework": "pytorch"},
    "compute": {"family": "inf2", "inf": 1, "instanceTypes": ["inf2.24xlarge"], "cpu": "100m", "memory": "256Mi"},
    "serving": {"image": STANDIN, "args": ["neuron-serve"]},
}


def standin_spec(**overrides) -> dict:
    """A model of the Neuron stand-in image on the real node's instance type."""
    return make_spec(STANDIN_SPEC, **overrides)


def apply(cluster, namespace: str, name: str, spec: dict) -> None:
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(make_model(name, namespace, spec=spec)))


def why_not_ready(cluster, namespace: str, name: str) -> str:
    """What a failing test should show: the model's conditions, the pods' states and logs."""
    model = cluster.kubectl("get", "inferentiamodel", name, "-n", namespace, "-o", "json", check=False)
    out = [json.dumps(json.loads(model.stdout).get("status", {}).get("conditions"), indent=1) if model.returncode == 0 else model.stderr]
    for pod in cluster.get("pods", "-n", namespace)["items"]:
        out.append(f"pod {pod['metadata']['name']}: {json.dumps(pod['status'].get('containerStatuses'))[:1500]}")
        for c in pod["spec"]["containers"]:
            log = cluster.kubectl("logs", "-n", namespace, pod["metadata"]["name"], "-c", c["name"], "--tail=20", check=False)
            prev = cluster.kubectl(
                "logs", "-n", namespace, pod["metadata"]["name"], "-c", c["name"], "--previous", "--tail=20", check=False
            )
            out.append(f"--- logs {c['name']}: {log.stdout[-1500:]}{log.stderr[-300:]} | previous: {prev.stdout[-1500:]}")
    events = cluster.kubectl("get", "events", "-n", namespace, "--sort-by=.lastTimestamp", check=False).stdout
    out.append(events[-3000:])
    return "\n".join(out)


def wait_ready(cluster, namespace: str, name: str, timeout: float = 150) -> None:
    try:
        wait_for(lambda: ready_now(cluster.get("inferentiamodel", name, "-n", namespace)), timeout, f"{name} Ready", interval=1)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{why_not_ready(cluster, namespace, name)}") from None


def serving_pods(cluster, namespace: str, name: str) -> list[dict]:
    pods = cluster.get("pods", "-n", namespace, "-l", f"inferentia.dev/model={name},app.kubernetes.io/component=serving")["items"]
    return [p for p in pods if p["metadata"].get("deletionTimestamp") is None and p["status"].get("phase") == "Running"]


def granted_cores(cluster, pod: dict) -> list[int]:
    """The cores the device plugin granted the pod, from the kubelet's own checkpoint of its
    allocations (the record the kubelet keeps of what each device plugin gave each container)."""
    import realnode

    checkpoint = json.loads(cluster.node.read_node_file(realnode.DEVICE_PLUGIN_DIR / "kubelet_internal_checkpoint"))
    node = cluster.get("node", realnode.NODE_NAME)
    per_chip = realnode.SHAPES[node["metadata"]["labels"]["node.kubernetes.io/instance-type"]][1]
    cores: list[int] = []
    for entry in checkpoint["Data"]["PodDeviceEntries"]:
        if entry["PodUID"] != pod["metadata"]["uid"]:
            continue
        for ids in entry["DeviceIDs"].values():
            if entry["ResourceName"] == "aws.amazon.com/neuron":  # a chip: all its cores
                cores += [int(i) * per_chip + k for i in ids for k in range(per_chip)]
            elif entry["ResourceName"] == "aws.amazon.com/neuroncore":  # a core, numbered node-wide
                cores += [int(i) for i in ids]
    return sorted(cores)


PROCESS_ENV = """
import json, os
out = []
for pid in sorted(p for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid()):
    try:
        cmd = open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\\0')
        env = dict(kv.split('=', 1) for kv in open(f'/proc/{pid}/environ', 'rb').read().decode().split('\\0') if '=' in kv)
    except OSError:
        continue
    if any(b'neuron-serve' in c or b'vllm' in c or c.endswith(b'neuron_serve.py') for c in cmd) and b'/bin/sh' not in cmd[0]:
        out.append({k: env.get(k) for k in ('NEURON_RT_VISIBLE_CORES', 'NEURON_CC_FLAGS', 'PORT', 'HOME', 'HF_HOME', 'NEURON_COMPILED_ARTIFACTS', 'VLLM_NEURON_DISABLE_WARMUP_COMPILE', 'VLLM_CACHE_ROOT', 'VLLM_NEURON_FRAMEWORK', 'HF_HUB_OFFLINE')})
print(json.dumps(out))
"""


def serve_get(cluster, namespace: str, pod: dict, path: str) -> str:
    """A GET of ``path`` on the pod's serving port, from inside its serve container (no policy or
    route of this machine's in the way)."""
    [serve] = [c for c in pod["spec"]["containers"] if c["name"] == "serve"]
    port = serve["ports"][0]["containerPort"]
    return cluster.kubectl(
        "exec", "-n", namespace, pod["metadata"]["name"], "-c", "serve", "--",
        "python3", "-c", f"import urllib.request as u; print(u.urlopen('http://127.0.0.1:{port}{path}').read().decode())",
    ).stdout  # fmt: skip


def standin_state(cluster, namespace: str, pod: dict) -> dict:
    """What the runtime stand-in found when its server started (its /standin page, on the serving port)."""
    return json.loads(serve_get(cluster, namespace, pod, "/standin"))


def process_envs(cluster, namespace: str, pod: str) -> list[dict]:
    """Each serving process's environment, read through kubectl exec from /proc."""
    out = cluster.kubectl("exec", "-n", namespace, pod, "-c", "serve", "--", "python3", "-c", PROCESS_ENV).stdout
    return json.loads(out)


def routed(ip: str, port: int, timeout: float = 30) -> None:
    """Waits until kube-proxy routes ``ip:port``: a model is Ready when its pods are, and the
    node's rules for its Service follow a moment later (a run once sent its first requests
    into that moment and got no answer at all)."""
    import socket

    def connects() -> bool:
        try:
            socket.create_connection((ip, port), timeout=1).close()
            return True
        except OSError:
            return False

    wait_for(connects, timeout, f"kube-proxy to route {ip}:{port}")


def cluster_ip_request(cluster, namespace: str, service: str, path: str, body: dict) -> dict:
    """A request to the model's Service, from this machine through kube-proxy's rules."""
    svc = cluster.get("service", service, "-n", namespace)
    ip, port = svc["spec"]["clusterIP"], svc["spec"]["ports"][0]["port"]
    url = f"http://{ip}:{port}{path}"
    deadline = time.monotonic() + 30
    while True:
        code, text = post(url, body)
        if code == 200:
            return json.loads(text)
        if time.monotonic() > deadline:
            raise AssertionError(f"{url}: {code} {text}")
        time.sleep(1)


def test_a_single_process_model_serves_on_the_cores_it_was_granted(real_node, real_namespace):
    """Defect: the pod spec pinned NEURON_RT_VISIBLE_CORES=0-1 over the device plugin's grant;
    granted /dev/neuron5 (cores 10,11), the runtime refuses cores 0-1."""
    apply(real_node, real_namespace, "single", standin_spec())
    wait_ready(real_node, real_namespace, "single")
    [pod] = serving_pods(real_node, real_namespace, "single")
    granted = granted_cores(real_node, pod)
    assert granted and granted != [0, 1], f"the stand-in plugin grants the last free chip first, got {granted}"
    [proc] = process_envs(real_node, real_namespace, pod["metadata"]["name"])
    assert [int(c) for c in proc["NEURON_RT_VISIBLE_CORES"].replace("-", ",").split(",")] == granted or proc[
        "NEURON_RT_VISIBLE_CORES"
    ] == f"{granted[0]}-{granted[-1]}"
    answer = cluster_ip_request(real_node, real_namespace, "single", "/v1/completions", {"prompt": "hello"})
    assert answer["choices"][0]["text"].endswith("hello")
    assert str(granted) in answer["choices"][0]["text"]


def test_each_process_gets_its_share_of_the_grant_and_the_users_env_wins(real_node, real_namespace):
    """Two processes split the granted chip's two cores; the user's NEURON_CC_FLAGS reaches
    every process (defect: the launcher exported the planned env-i on top of it)."""
    spec = standin_spec(processesPerReplica=2, **{"serving.env": [{"name": "NEURON_CC_FLAGS", "value": "--users-own-flag"}]})
    apply(real_node, real_namespace, "split", spec)
    wait_ready(real_node, real_namespace, "split")
    [pod] = serving_pods(real_node, real_namespace, "split")
    granted = granted_cores(real_node, pod)
    procs = sorted(process_envs(real_node, real_namespace, pod["metadata"]["name"]), key=lambda p: int(p["PORT"]))
    assert [p["NEURON_RT_VISIBLE_CORES"] for p in procs] == [str(c) for c in granted]
    assert [p["NEURON_CC_FLAGS"] for p in procs] == ["--users-own-flag"] * 2


def test_a_vllm_model_runs_as_non_root_with_somewhere_to_write(real_node, real_namespace):
    """Defects: the vLLM preset pinned cores, and gave a non-root process no writable HOME or
    HF_HOME, so vLLM's downloads and caches fail."""
    # A Hub id: vLLM reads no object store without the Run:ai streamer, and a store model would be fetched first.
    spec = standin_spec(**{"serving.image": VLLM_IMAGES["inf2"], "serving.runtime": "vllm", "serving.args": None,
                           "model.uri": "TinyLlama/TinyLlama-1.1B-Chat-v1.0"})  # fmt: skip
    spec["serving"].pop("args")
    apply(real_node, real_namespace, "vllm", spec)
    wait_ready(real_node, real_namespace, "vllm")
    [pod] = serving_pods(real_node, real_namespace, "vllm")
    [proc] = process_envs(real_node, real_namespace, pod["metadata"]["name"])
    assert proc["HOME"] and proc["HF_HOME"]
    security = pod["spec"]["containers"][0]["securityContext"]
    assert security.get("readOnlyRootFilesystem") is True
    answer = cluster_ip_request(real_node, real_namespace, "vllm", "/v1/completions", {"prompt": "hi"})
    assert answer["object"] == "text_completion"


def test_pod_and_service_ranges_route_to_the_clusters_bridge_only(real_node):
    """No packet to a pod or Service address can take the default route, even before kube-proxy
    has programmed its rules; and nothing from the bridge is forwarded to another interface."""
    import realnode

    if real_node.local is None:
        pytest.skip("the local cluster's bridge and rules: the kind node's own are checked by the test after this one")
    for address in ("10.85.0.200", "10.96.255.254"):
        route = subprocess.run(["ip", "route", "get", address], capture_output=True, text=True, check=True).stdout
        assert f"dev {realnode.BRIDGE}" in route, route
    rules = subprocess.run(["iptables", "-S", realnode.FORWARD_CHAIN], capture_output=True, text=True, check=True).stdout
    assert f"-A {realnode.FORWARD_CHAIN} -i {realnode.BRIDGE} -j DROP" in rules
    forward = subprocess.run(["iptables", "-S", "FORWARD"], capture_output=True, text=True, check=True).stdout.splitlines()
    assert f"-A FORWARD -j {realnode.FORWARD_CHAIN}" in forward, forward


RESOLVE = """
import json, socket, sys
found = {}
for name in sys.argv[1:]:
    try:
        found[name] = socket.gethostbyname(name)
    except OSError as exc:
        found[name] = type(exc).__name__
print(json.dumps(found))
"""


def test_a_pod_finds_a_service_and_a_headless_services_pod_by_name_and_nothing_outside(real_node, real_namespace):
    """The cluster DNS (CoreDNS's kubernetes plugin): a Service's name gives its ClusterIP, and
    <hostname>.<subdomain>.<namespace> a pod's address under its headless Service, as a
    LeaderWorkerSet's workers reach their leader (LWS_LEADER_ADDRESS) and a disaggregated
    model's proxy its pools; a name outside the cluster resolves to nothing, as no look-up leaves
    the machine. The local cluster's CoreDNS runs beside its API server, the kind cluster's in
    kube-system behind kube-dns (kindcluster.cluster_dns): the same binary, built here."""
    ns = real_namespace
    sleeper = {"name": "main", "image": STANDIN, "command": ["python3", "-c", "import time; time.sleep(600)"]}
    manifests = [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "peers", "namespace": ns},
         "spec": {"clusterIP": "None", "selector": {"app": "peer"}, "publishNotReadyAddresses": True}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "leader", "namespace": ns, "labels": {"app": "peer"}},
         "spec": {"hostname": "leader", "subdomain": "peers", "containers": [sleeper], "terminationGracePeriodSeconds": 1}},
    ]  # fmt: skip
    real_node.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests}))
    wait_for(lambda: real_node.get("pod", "leader", "-n", ns)["status"].get("podIP"), 90, "the leader pod's address")
    leader_ip = real_node.get("pod", "leader", "-n", ns)["status"]["podIP"]
    names = ["leader.peers." + ns, "kubernetes.default", "example.com"]
    asker = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "asker", "namespace": ns},
             "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": STANDIN,
                      "command": ["python3", "-c", RESOLVE, *names]}]}}  # fmt: skip
    real_node.kubectl("apply", "-f", "-", input=json.dumps(asker))

    def answered() -> dict | None:
        if real_node.get("pod", "asker", "-n", ns)["status"].get("phase") not in ("Succeeded", "Failed"):
            return None
        return json.loads(real_node.kubectl("logs", "asker", "-n", ns).stdout)

    found = wait_for(answered, 90, "the look-ups")
    service_ip = real_node.get("service", "kubernetes", "-n", "default")["spec"]["clusterIP"]
    assert found == {names[0]: leader_ip, names[1]: service_ip, names[2]: "gaierror"}, found


def test_the_kind_node_has_no_route_off_the_machine(real_node):
    """On kind, the node's network is internal: the node has no default route, so neither it nor
    a pod (whose CNI masquerades nothing) can reach past this machine; and this machine reaches
    the pod and Service ranges through the node's address alone."""
    import kindcluster

    kind = real_node.node
    if not isinstance(kind, kindcluster.KindCluster):
        pytest.skip("kind's network: the local cluster's is checked by the test before this one")
    routes = kind.node_exec("ip", "route", "show").stdout
    assert routes.strip() and not any(line.startswith("default") for line in routes.splitlines()), routes
    node_ip = kind.recorded()["node_ip"]
    for address in ("10.244.0.200", "10.97.255.254"):
        route = subprocess.run(["ip", "route", "get", address], capture_output=True, text=True, check=True).stdout
        assert f"via {node_ip}" in route, route
    network = json.loads(subprocess.run([kind.engine, "network", "inspect", kindcluster.NETWORK], env=kind.env,
                                        capture_output=True, text=True, check=True).stdout)  # fmt: skip
    network = network[0] if isinstance(network, list) else network
    assert network.get("internal") is True or network.get("Internal") is True, network


def store_client(cluster):
    import boto3

    return boto3.client(
        "s3", endpoint_url=cluster.node.object_store(), region_name="us-east-1",
        aws_access_key_id="local", aws_secret_access_key="local",
    )  # fmt: skip


def object_store(cluster, namespace: str) -> str:
    """A bucket of the local object store for this namespace, and the Secret ``store`` that
    gives pods its credentials and endpoint; returns the bucket's name."""
    from samples import store_secret

    bucket = f"models-{namespace}"
    store_client(cluster).create_bucket(Bucket=bucket)
    cluster.kubectl("apply", "-f", "-", input=json.dumps(store_secret(namespace, cluster.node.object_store())))
    return bucket


def compiled_vllm_spec(bucket: str, **overrides) -> dict:
    """The vLLM preset on the stand-ins, compiled by its compile Job into ``bucket``: on inf2 the
    operator's NxD Inference program, in the stand-in of AWS's vLLM image for the family,
    reading the model from the stand-in Hub."""
    image = VLLM_IMAGES[overrides.get("compute.family", "inf2")]
    spec = standin_spec(
        **{
            "model.uri": "TinyLlama/TinyLlama-1.1B-Chat-v1.0",
            "compile.image": image,
            "compile.outputUri": f"s3://{bucket}/compiled/",
            "compile.storageSecret": "store",
            "compile.buckets": [[256]],  # vLLM's --max-model-len
            # The stand-in compiler is tiny, and the real node has 2 CPUs.
            "compile.cpu": "200m",
            "compile.memory": "512Mi",
            "serving.image": image,
            "serving.runtime": "vllm",
            "serving.batching": {"maxBatchSize": 4},  # vLLM's --max-num-seqs
            **overrides,
        }
    )
    spec["serving"].pop("args")
    return spec


def test_a_compile_job_writes_the_artefact_the_serving_pods_fetch_and_load(real_node, real_namespace):
    """Defect: NEURON_COMPILED_ARTIFACTS was the s3:// URI, which vLLM's loader reads as a
    local directory, and nothing downloaded it. Now the compile Job (the operator's NxD
    Inference program) uploads to the object store, an init container fetches it, and the
    server loads it, on as many cores as the artefact's tensor-parallel degree."""
    bucket = object_store(real_node, real_namespace)
    apply(real_node, real_namespace, "compiled", compiled_vllm_spec(bucket))
    wait_ready(real_node, real_namespace, "compiled", timeout=200)
    status = real_node.get("inferentiamodel", "compiled", "-n", real_namespace)["status"]
    prefix = status["compiledUri"].removeprefix(f"s3://{bucket}/")
    keys = [o["Key"] for o in store_client(real_node).list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]
    # The operator's NxD Inference program compiled it, weights sharded per rank; its upload wrote
    # the marker last. Beside it, the Hub model's configuration and tokenizer at the commit the
    # compile read (status pins it), in the Hub cache's layout, without the checkpoint's weights.
    commit = status["hubRevision"]
    hub = "hf-hub/models--TinyLlama--TinyLlama-1.1B-Chat-v1.0"
    assert sorted(keys) == sorted(prefix + name for name in (
        "_INFERENTIA_COMPLETE", "model.pt", "neuron_config.json", "weights/tp0_sharded_checkpoint.safetensors",
        "weights/tp1_sharded_checkpoint.safetensors", f"{hub}/refs/main", f"{hub}/snapshots/{commit}/config.json",
        f"{hub}/snapshots/{commit}/tokenizer.json")), keys  # fmt: skip
    [pod] = serving_pods(real_node, real_namespace, "compiled")
    found = standin_state(real_node, real_namespace, pod)
    # The replica read the model id from the artefact's copy, offline: the Hub was read once, by the compile.
    assert found["checkpoint"] == f"/var/lib/inferentia/compiled/{hub}/snapshots/{commit}", found
    # vLLM's loader loaded the compiled model from NEURON_COMPILED_ARTIFACTS, and compiled nothing.
    assert found["loaded"] == "compiled" and found["runtime"] == "neuronx-distributed-inference", found
    assert found["artefact"]["compiler"] == "neuronx-cc" and found["artefact"]["target"] == "inf2"
    assert found["artefact"]["tp_degree"] == 2 == len(found["cores"])
    [proc] = process_envs(real_node, real_namespace, pod["metadata"]["name"])
    assert proc["NEURON_RT_VISIBLE_CORES"]
    assert "Compiled" == next(c for c in status["conditions"] if c["type"] == "Compiled")["reason"]


def test_a_model_runs_on_a_node_tainted_for_it_and_compiles_where_its_selector_says(real_node, real_namespace):
    """A Neuron node group with a taint of its own (dedicated=llm:NoSchedule, as Karpenter
    NodePools carry) runs a model that tolerates it, and the compile Job goes where its own
    node selector says: while no node carries the label, the model says within a minute that
    its compile pod has no node, and compiles once one does."""
    import realnode

    node, pool = realnode.NODE_NAME, "inferentia.dev/test-compile-pool"
    dedicated = {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}
    bucket = object_store(real_node, real_namespace)
    real_node.kubectl("taint", "node", node, "dedicated=llm:NoSchedule", "--overwrite")
    try:
        spec = compiled_vllm_spec(bucket, placement={"tolerations": [dedicated]})
        spec["compile"]["placement"] = {"nodeSelector": {pool: "cpu"}, "tolerations": [dedicated]}
        apply(real_node, real_namespace, "placed", spec)

        def compiled_reason() -> str:
            found = (real_node.get("inferentiamodel", "placed", "-n", real_namespace).get("status") or {}).get("conditions") or []
            return next((c["reason"] for c in found if c["type"] == "Compiled"), "")

        wait_for(lambda: compiled_reason() == "Unschedulable", 60, "the compile pod's want of a node in the model's status")
        assert "has a pod no node can take" in compiled_status(real_node, real_namespace, "placed")[1]["message"]
        real_node.kubectl("label", "node", node, f"{pool}=cpu", "--overwrite")
        wait_ready(real_node, real_namespace, "placed", timeout=200)
        [compile_pod] = real_node.get("pods", "-n", real_namespace, "-l", "app.kubernetes.io/component=compile")["items"]
        assert compile_pod["spec"]["nodeSelector"][pool] == "cpu" and compile_pod["spec"]["nodeName"] == node
        [pod] = serving_pods(real_node, real_namespace, "placed")
        # On the tainted node, which it tolerates beside the Neuron taint.
        assert pod["spec"]["nodeName"] == node and dedicated in pod["spec"]["tolerations"]
        taints = real_node.get("node", node)["spec"]["taints"]
        assert {"key": "dedicated", "value": "llm", "effect": "NoSchedule"} in taints
    finally:
        real_node.kubectl("taint", "node", node, "dedicated=llm:NoSchedule-", check=False)
        real_node.kubectl("label", "node", node, f"{pool}-", check=False)


def compile_jobs(cluster, namespace: str) -> list[str]:
    return sorted(j["metadata"]["name"] for j in cluster.get("jobs", "-n", namespace, "-l", "app.kubernetes.io/component=compile")["items"])


def compiled_status(cluster, namespace: str, name: str) -> tuple[dict, dict]:
    status = cluster.get("inferentiamodel", name, "-n", namespace)["status"]
    return status, next(c for c in status["conditions"] if c["type"] == "Compiled")


def test_one_compile_per_key_serves_a_second_model_and_a_recreated_one_without_a_compile_job(real_node, real_namespace):
    """Two models with the same compile inputs, applied together, run one compile between
    them; a model deleted and created again starts from the artefact that compile left. The
    operator knows it from its record of the Job that uploaded the artefact, never by
    reading the store itself."""
    bucket = object_store(real_node, real_namespace)
    spec = compiled_vllm_spec(bucket)
    apply(real_node, real_namespace, "first", spec)
    apply(real_node, real_namespace, "second", spec)
    wait_ready(real_node, real_namespace, "first", timeout=240)
    wait_ready(real_node, real_namespace, "second", timeout=240)
    [job] = compile_jobs(real_node, real_namespace)
    statuses = {name: compiled_status(real_node, real_namespace, name) for name in ("first", "second")}
    [key] = {s["compileKey"] for s, _ in statuses.values()}
    assert statuses["first"][0]["compiledUri"] == statuses["second"][0]["compiledUri"]
    assert key in statuses["first"][0]["compiledUri"]
    # One of them ran the Job; the other waited for it and then started from its artefact.
    assert sorted(s.get("compileCacheHit", False) for s, _ in statuses.values()) == [False, True]
    [(hit_status, hit)] = [sc for sc in statuses.values() if sc[0].get("compileCacheHit")]
    assert hit["status"] == "True" and hit["reason"] == "CacheHit", hit
    assert key in hit["message"] and job in hit["message"], hit
    # Deleted and created again: Ready from the cache, and no compile Job is made.
    owner = real_node.get("job", job, "-n", real_namespace)["metadata"]["ownerReferences"][0]["name"]
    real_node.kubectl("delete", "inferentiamodel", owner, "-n", real_namespace, "--wait=true")
    wait_for(lambda: compile_jobs(real_node, real_namespace) == [], 60, "the deleted model's compile Job to go", interval=1)
    apply(real_node, real_namespace, owner, spec)
    wait_ready(real_node, real_namespace, owner, timeout=150)
    assert compile_jobs(real_node, real_namespace) == []
    status, compiled = compiled_status(real_node, real_namespace, owner)
    assert (compiled["reason"], status["compileKey"], status["compileCacheHit"]) == ("CacheHit", key, True)
    [pod] = serving_pods(real_node, real_namespace, owner)
    found = standin_state(real_node, real_namespace, pod)
    assert found["loaded"] == "compiled"


CHART = Path(__file__).resolve().parents[2] / "charts" / "inferentia-operator"


def real_node_namespace(cluster, name: str, *labels: str) -> str:
    import realnode

    manifest = {
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "annotations": realnode.REAL_NODE_NAMESPACE_ANNOTATIONS, "labels": dict(lb.split("=") for lb in labels)},
    }  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    wait_for(lambda: cluster.kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0, 30, "default SA")
    return name


@pytest.mark.parametrize("helm_binary", ["helm", "helm4"])
def test_helm_install_wait_runs_the_operator_image_as_a_real_pod(real_node, real_namespace, helm_binary):
    """`helm install --wait` (Helm 3, and Helm 4 whose --wait reads kstatus) runs the operator
    from its image, in a namespace that enforces the restricted Pod Security level, with the
    chart's own RBAC (namespace mode: it watches the model's namespace only). Its model goes
    Ready; deleting the operator's pod resumes without creating anything twice."""
    cluster = real_node
    release_ns = real_node_namespace(cluster, f"op-{helm_binary}-{real_namespace[-6:]}", "pod-security.kubernetes.io/enforce=restricted")
    helm = [cluster.tool(helm_binary), "-n", release_ns]
    # Helm 4 applies the chart's CRDs server-side: over a CRD that kubectl applied first (as
    # this suite does), it must take the fields over (docs/install.md says so).
    takeover = ["--force-conflicts"] if helm_binary == "helm4" else []
    install = subprocess.run(
        [*helm, "install", "op", str(CHART), *LOCAL_IMAGE, "--set", f"watchNamespaces={{{real_namespace}}}", "--set", f"peeringName=op-{release_ns}",
         "--wait", "--timeout", "180s", *takeover],
        capture_output=True, text=True, env=cluster.env, timeout=240,
    )  # fmt: skip
    try:
        assert install.returncode == 0, f"{install.stderr}\n{why_not_ready(cluster, release_ns, 'op')}"
        [op_pod] = cluster.get("pods", "-n", release_ns, "-l", "app.kubernetes.io/name=inferentia-operator")["items"]
        assert op_pod["spec"]["nodeName"] == "real-inf2"
        assert op_pod["status"]["containerStatuses"][0]["ready"] is True
        logs = cluster.kubectl("logs", "-n", release_ns, op_pod["metadata"]["name"]).stdout
        assert "Traceback" not in logs

        apply(cluster, real_namespace, "by-helm", standin_spec())
        wait_ready(cluster, real_namespace, "by-helm")
        children = {kind: names(cluster, kind, real_namespace) for kind in ("deployments", "services", "configmaps", "replicasets")}

        cluster.kubectl("delete", "pod", "-n", release_ns, op_pod["metadata"]["name"], "--wait=true")
        wait_for(lambda: len(ready_pods(cluster, release_ns)) == 1, 120, "a new operator pod Ready")
        time.sleep(10)  # the new replica's first reconcile of every model, and then some
        assert {kind: names(cluster, kind, real_namespace) for kind in children} == children
        wait_ready(cluster, real_namespace, "by-helm", timeout=30)
    finally:
        subprocess.run([*helm, "uninstall", "op", "--wait", "--timeout", "60s"], capture_output=True, env=cluster.env, timeout=90)
        cluster.kubectl("delete", "namespace", release_ns, "--wait=false", check=False)


def names(cluster, kind: str, namespace: str) -> list[str]:
    return sorted(o["metadata"]["name"] for o in cluster.get(kind, "-n", namespace)["items"])


def ready_pods(cluster, namespace: str) -> list[dict]:
    pods = cluster.get("pods", "-n", namespace)["items"]
    return [
        p for p in pods
        if p["metadata"].get("deletionTimestamp") is None and any(c.get("ready") for c in p["status"].get("containerStatuses") or [])
    ]  # fmt: skip


def post(url: str, body, timeout: float = 5.0) -> tuple[int, str]:
    """One request with curl (loopback and pod or Service addresses only); (HTTP status, body)."""
    # The body on stdin: an image is larger than a command line may be.
    result = subprocess.run(
        ["curl", "-sS", "-o", "-", "-w", "\\n%{http_code}", "--max-time", str(timeout), "-H", "Content-Type: application/json",
         "--data-binary", "@-", url],
        input=json.dumps(body), capture_output=True, text=True,
    )  # fmt: skip
    text, _, code = result.stdout.rpartition("\n")
    return (int(code) if code.isdigit() else 0), text


def test_a_request_through_the_service_goes_through_the_batching_sidecar(real_node, real_namespace):
    """The batching front end (the operator's own image) answers on the serving port and
    batches into the model processes, which each run on their share of the grant."""
    spec = standin_spec(processesPerReplica=2, **{"serving.batching": {"maxBatchSize": 4, "maxLatencyMs": 50}})
    apply(real_node, real_namespace, "batched", spec)
    wait_ready(real_node, real_namespace, "batched")
    [pod] = serving_pods(real_node, real_namespace, "batched")
    assert [c["name"] for c in pod["spec"]["containers"]] == ["serve", "batcher"]
    svc = real_node.get("service", "batched", "-n", real_namespace)
    batch_port = next(p["port"] for p in svc["spec"]["ports"] if p["name"] == "batch")
    granted = granted_cores(real_node, pod)
    routed(svc["spec"]["clusterIP"], batch_port)
    answers = [post(f"http://{svc['spec']['clusterIP']}:{batch_port}/predict", [i, i + 1]) for i in range(6)]
    assert [code for code, _ in answers] == [200] * 6, answers
    outputs = [json.loads(text) for _, text in answers]
    assert [o["input"] for o in outputs] == [[i, i + 1] for i in range(6)]
    # Each answer came from a model process on one of the pod's granted cores.
    assert {c for o in outputs for c in o["cores"]} <= set(granted)


def test_a_rolling_update_replaces_the_real_pods_under_traffic(real_node, real_namespace):
    """Two replicas, a new plan, requests all along: the rollout replaces both pods, and the
    figure of requests that failed meanwhile is recorded (the session summary prints it)."""
    from conftest import REAL_NODE_STATE

    apply(real_node, real_namespace, "rolling", standin_spec(replicas=2))
    wait_ready(real_node, real_namespace, "rolling")
    before = {p["metadata"]["name"] for p in serving_pods(real_node, real_namespace, "rolling")}
    svc = real_node.get("service", "rolling", "-n", real_namespace)
    routed(svc["spec"]["clusterIP"], svc["spec"]["ports"][0]["port"])
    url = f"http://{svc['spec']['clusterIP']}:{svc['spec']['ports'][0]['port']}/v1/completions"
    assert post(url, {"prompt": "warm"})[0] == 200

    # A new plan: a user's variable, which changes every process's environment.
    apply(real_node, real_namespace, "rolling", standin_spec(replicas=2, **{"serving.env": [{"name": "GENERATION", "value": "2"}]}))
    codes: list[int] = []
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        codes.append(post(url, {"prompt": "x"}, timeout=2)[0])
        current = serving_pods(real_node, real_namespace, "rolling")
        names_now = {p["metadata"]["name"] for p in current}
        if (
            len(current) == 2
            and not names_now & before
            and all(all(c.get("ready") for c in p["status"].get("containerStatuses") or []) for p in current)
        ):
            break
    else:
        raise AssertionError(f"the rollout did not finish\n{why_not_ready(real_node, real_namespace, 'rolling')}")
    for _ in range(20):  # and after it, every request answers
        codes.append(post(url, {"prompt": "after"})[0])
    failed = sum(1 for c in codes if c != 200)
    REAL_NODE_STATE["rollout"] = f"{failed} of {len(codes)} requests failed during a rolling update of 2 real replicas"
    assert codes[-20:] == [200] * 20
    assert failed < len(codes) / 2, codes  # maxUnavailable 1 of 2: one replica serves throughout


def test_a_secret_reaches_every_serving_process_and_never_the_model(real_node, real_namespace):
    """HF_TOKEN from a Secret (valueFrom) and a ConfigMap's keys (envFrom) reach both
    processes; the model and its children carry only the references."""
    for manifest in (
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "hf", "namespace": real_namespace},
            "stringData": {"token": "s3cr3t-value"},
        },
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "tuning", "namespace": real_namespace}, "data": {"MODE": "fast"}},
    ):
        real_node.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    spec = standin_spec(
        processesPerReplica=2,
        **{
            "serving.env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}],
            "serving.envFrom": [{"configMapRef": {"name": "tuning"}, "prefix": "APP_"}],
        },
    )
    apply(real_node, real_namespace, "secretive", spec)
    wait_ready(real_node, real_namespace, "secretive")
    [pod] = serving_pods(real_node, real_namespace, "secretive")
    script = PROCESS_ENV.replace("('NEURON_RT_VISIBLE_CORES',", "('HF_TOKEN', 'APP_MODE', 'NEURON_RT_VISIBLE_CORES',")
    out = real_node.kubectl("exec", "-n", real_namespace, pod["metadata"]["name"], "-c", "serve", "--", "python3", "-c", script).stdout
    procs = json.loads(out)
    assert [(p["HF_TOKEN"], p["APP_MODE"]) for p in procs] == [("s3cr3t-value", "fast")] * 2
    for kind in ("inferentiamodel", "deployment", "configmaps"):
        assert "s3cr3t-value" not in real_node.kubectl("get", kind, "-n", real_namespace, "-o", "yaml").stdout


def test_a_compile_the_compiler_refuses_ends_in_compiled_false_with_the_reason(real_node, real_namespace, tmp_path):
    """neuronx-cc refuses --lnc 2 for inf2 (NCC_EARG001); the torch-neuronx stand-in's trace
    does too. The Job retries once (backoffLimit 1), fails, and the model says Compiled=False
    with why, while nothing is served from a plan that never compiled."""
    bucket = upload_reference_models(real_node, real_namespace, tmp_path)
    spec = torch_spec(bucket, "conv.pt", **{"compile.extraArgs": ["--lnc", "2"]})
    apply(real_node, real_namespace, "refused", spec)

    def compiled() -> dict:
        conditions = real_node.get("inferentiamodel", "refused", "-n", real_namespace).get("status", {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == "Compiled"), {})

    wait_for(lambda: compiled().get("reason") == "CompileFailed", 150, "Compiled=False, CompileFailed", interval=1)
    assert compiled()["status"] == "False" and "BackoffLimitExceeded" in compiled()["message"]
    # The status says why, in the compiler's words.
    wait_for(lambda: "NCC_EARG001" in compiled()["message"], 30, "the compiler's refusal in the status", interval=1)
    [job] = real_node.get("jobs", "-n", real_namespace)["items"]
    assert job["status"].get("failed") == 2
    # The compile program's last words are its container's termination message (FallbackToLogsOnError).
    pods = real_node.get("pods", "-n", real_namespace, "-l", "app.kubernetes.io/component=compile")["items"]
    messages = [s["state"].get("terminated", {}).get("message", "") for p in pods for s in p["status"].get("initContainerStatuses", [])]
    assert any("neuronx-cc failed: ERROR [NCC_EARG001] --lnc 2 is not supported for target inf2" in m for m in messages), messages
    assert real_node.get("deployments", "-n", real_namespace)["items"] == []
    # A failed compile is never recorded as an artefact that exists.
    assert real_node.get("configmaps", "-n", real_namespace, "-l", "app.kubernetes.io/component=compile-record")["items"] == []


def test_two_models_of_one_core_each_share_one_chip_each_on_its_own_core(real_node, real_namespace):
    """spec.compute.cores: each replica asks the device plugin for one aws.amazon.com/neuroncore,
    so two models run on one inf2 chip at once, each process seeing only the core it was
    granted, and each plan saying it shares the chip and how much of its memory it sees."""
    spec = standin_spec(**{"compute.inf": DROP, "compute.cores": 1})
    for name in ("small-a", "small-b"):
        apply(real_node, real_namespace, name, spec)
    for name in ("small-a", "small-b"):
        wait_ready(real_node, real_namespace, name)
    granted = {}
    for name in ("small-a", "small-b"):
        [pod] = serving_pods(real_node, real_namespace, name)
        resources = pod["spec"]["containers"][0]["resources"]
        assert resources["limits"]["aws.amazon.com/neuroncore"] == "1" and "aws.amazon.com/neuron" not in resources["limits"]
        granted[name] = granted_cores(real_node, pod)
        [proc] = process_envs(real_node, real_namespace, pod["metadata"]["name"])
        assert [proc["NEURON_RT_VISIBLE_CORES"]] == [str(c) for c in granted[name]], (name, proc, granted[name])
        plan = real_node.get("inferentiamodel", name, "-n", real_namespace)["status"]["plan"]
        assert plan["sharesChip"] is True and plan["chipMemoryShareBytes"] == 16 * 2**30 and "chips" not in plan
        answer = cluster_ip_request(real_node, real_namespace, name, "/v1/completions", {"prompt": "hi"})
        assert str(granted[name]) in answer["choices"][0]["text"]
    [a], [b] = granted["small-a"], granted["small-b"]
    assert a != b, granted
    assert a // 2 == b // 2, f"the two cores are on one chip (2 cores per inf2 chip): {granted}"


def test_a_model_runs_on_a_node_that_reserves_no_hugepages(real_node, real_namespace):
    """Defect: every family requested hugepages-2Mi (256Mi a chip, what the Neuron Runtime 1.x
    daemon needed), so on a node that reserves none, as this one does, the serving pod stayed
    Pending with "Insufficient hugepages-2Mi". AWS's examples for the Neuron Runtime 2.x request none."""
    import realnode

    node = real_node.get("node", realnode.NODE_NAME)
    assert node["status"]["allocatable"].get("hugepages-2Mi", "0") == "0", "the real node must reserve no hugepages"
    apply(real_node, real_namespace, "nohuge", standin_spec())
    wait_ready(real_node, real_namespace, "nohuge")
    [pod] = serving_pods(real_node, real_namespace, "nohuge")
    for container in pod["spec"]["containers"] + pod["spec"].get("initContainers", []):
        resources = container.get("resources", {})
        assert "hugepages-2Mi" not in {**resources.get("requests", {}), **resources.get("limits", {})}, container["name"]


def test_hugepages_a_model_asks_for_and_no_node_has_end_in_its_status(real_node, real_namespace):
    """spec.compute.hugepages is the opt-in for a runtime that does need them; on a node with
    none the pod cannot be placed, and the model's status says why in the scheduler's words."""
    apply(real_node, real_namespace, "wanthuge", standin_spec(**{"compute.hugepages": "256Mi"}))

    def unschedulable() -> dict | None:
        conditions = real_node.get("inferentiamodel", "wanthuge", "-n", real_namespace).get("status", {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == "Scheduled" and c["reason"] == "Unschedulable"), None)

    condition = wait_for(unschedulable, 90, "Scheduled=False Unschedulable", interval=1)
    assert "hugepages-2Mi" in condition["message"], condition
    [deployment] = real_node.get("deployments", "-n", real_namespace)["items"]
    resources = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources["requests"]["hugepages-2Mi"] == resources["limits"]["hugepages-2Mi"] == "256Mi"


# -- a real PyTorch model, end to end ------------------------------------------------------------

# Debian's CPU-only PyTorch with the torch-neuronx and torch-neuron stand-ins, standing in for
# AWS's pytorch-inference-neuronx and pytorch-inference-neuron images, for each family
# (cluster/images.py): each carries its image's package versions, which the stand-ins read.
TORCH_NEURONX_IMAGE = standin_image("public.ecr.aws/neuron/pytorch-inference-neuronx:2.9.0-neuronx-py312-sdk2.31.1-ubuntu24.04")
TORCH_IMAGES = {
    "inf1": standin_image("public.ecr.aws/neuron/pytorch-inference-neuron:1.13.1-neuron-py310-sdk2.18.2-ubuntu20.04"),
    "inf2": TORCH_NEURONX_IMAGE,
    "trn1": TORCH_NEURONX_IMAGE,
    "trn2": TORCH_NEURONX_IMAGE,
}
REFERENCE = Path(__file__).resolve().parents[1] / "models" / "reference.py"
TORCH_PYTHON = "/usr/bin/python3"  # Debian's python3 with python3-torch (cluster/node-deps.sh)


def upload_reference_models(cluster, namespace: str, tmp_path: Path) -> str:
    """The test's networks (tests/models/reference.py, made here, nothing downloaded), in the
    namespace's bucket as <name>/model.pt; returns the bucket."""
    bucket = object_store(cluster, namespace)
    subprocess.run([TORCH_PYTHON, str(REFERENCE), "build", str(tmp_path / "models")], check=True)
    for name in ("conv.pt", "mlp.pt"):
        store_client(cluster).upload_file(str(tmp_path / "models" / name), bucket, f"{name.removesuffix('.pt')}/model.pt")
    return bucket


def torch_spec(bucket: str, model: str, **overrides) -> dict:
    """An inf2 model of one chip and two processes, compiled and served in the stand-in of AWS's
    torch image for the family."""
    image = TORCH_IMAGES[overrides.get("compute.family", "inf2")]
    base = {
        "model": {"uri": f"s3://{bucket}/{model.removesuffix('.pt')}/model.pt", "framework": "pytorch"},
        "compute": {"family": "inf2", "inf": 1, "instanceTypes": ["inf2.24xlarge"], "cpu": "300m", "memory": "1536Mi"},
        "processesPerReplica": 2,
        "compile": {"image": image, "storageSecret": "store", "buckets": [[8], [16]], "batchSize": 4, "cpu": "300m", "memory": "1Gi"},
        "serving": {"image": image, "batching": {"maxBatchSize": 4, "maxLatencyMs": 10000}},
    }
    return make_spec(base, **overrides)


def expected_answers(tmp_path: Path, model: str, inputs: list) -> list:
    out = subprocess.run(
        [TORCH_PYTHON, str(REFERENCE), "predict", str(tmp_path / "models" / model)],
        input=json.dumps(inputs), capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(out.stdout)


def close(a, b) -> bool:
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(close(x, y) for x, y in zip(a, b, strict=True))
    return abs(a - b) <= 1e-5 * max(1.0, abs(b))


def ask_concurrently(url: str, inputs: list) -> list[tuple[int, str]]:
    """One request per input, all at once, so the front end has something to batch."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(inputs)) as pool:
        return list(pool.map(lambda x: post(url, x, timeout=60), inputs))


def test_a_pytorch_model_is_compiled_fetched_loaded_in_every_process_and_answers_as_the_network_does(real_node, real_namespace, tmp_path):
    """Issue 24: the whole path with a real network. The compile Job traces it per bucket with
    the operator's compile program in the torch image (the torch-neuronx stand-in checks the
    planned neuronx-cc flags), uploads it with its marker; each serving pod fetches it (the
    operator's image, built from the Dockerfile's instructions) and runs the operator's model
    server in both processes on their granted cores; requests through the Service are batched
    and padded by the front end, and every answer equals the network's own."""
    bucket = upload_reference_models(real_node, real_namespace, tmp_path)
    apply(real_node, real_namespace, "conv", torch_spec(bucket, "conv.pt"))
    wait_ready(real_node, real_namespace, "conv", timeout=400)

    status = real_node.get("inferentiamodel", "conv", "-n", real_namespace)["status"]
    prefix = status["compiledUri"].removeprefix(f"s3://{bucket}/")
    keys = sorted(o["Key"].removeprefix(prefix) for o in store_client(real_node).list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"])
    assert keys == ["_INFERENTIA_COMPLETE", "bucket-0.pt", "bucket-1.pt", "manifest.json"], keys
    manifest = json.loads(store_client(real_node).get_object(Bucket=bucket, Key=prefix + "manifest.json")["Body"].read())
    assert manifest["framework"] == "torch_neuronx" and manifest["compilerArgs"] == status["plan"]["compilerArgs"]

    [pod] = serving_pods(real_node, real_namespace, "conv")
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["fetch-artifacts"]
    granted = granted_cores(real_node, pod)
    servers = sorted(process_envs(real_node, real_namespace, pod["metadata"]["name"]), key=lambda p: int(p["PORT"]))
    assert [s["NEURON_RT_VISIBLE_CORES"] for s in servers] == [str(c) for c in granted], (servers, granted)

    svc = real_node.get("service", "conv", "-n", real_namespace)
    routed(svc["spec"]["clusterIP"], svc["spec"]["ports"][0]["port"])
    url = f"http://{svc['spec']['clusterIP']}:{svc['spec']['ports'][0]['port']}/"
    inputs = [[float((i * 7 + j) % 5) - 2.0 for j in range(n)] for i, n in enumerate([3, 8, 12, 5, 16, 1, 9, 7, 14, 2, 10, 4])]
    answers = ask_concurrently(url, inputs)
    assert [code for code, _ in answers] == [200] * len(inputs), answers
    got = [json.loads(text) for _, text in answers]
    assert close(got, expected_answers(tmp_path, "conv.pt", inputs)), got
    code, text = post(url, [1.0] * 17)
    assert code == 413, text  # larger than every bucket
    metrics = subprocess.run(["curl", "-sS", "--max-time", "5", url + "metrics"], capture_output=True, text=True).stdout
    sizes = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines() if line.startswith("inferentia_batch_size_")}
    assert sizes["inferentia_batch_size_count"] < len(inputs) + 1, "the front end sent some inputs together"


def holds_neuron_devices(pod: dict) -> bool:
    if pod["status"].get("phase") in ("Succeeded", "Failed"):
        return False
    requests = [c.get("resources", {}).get("requests", {}) for c in pod["spec"]["containers"]]
    return any(k.startswith("aws.amazon.com/neuron") for r in requests for k in r)


def reshape(cluster, instance_type: str) -> None:
    """The real node becomes ``instance_type``: its device plugin stand-in registers the family's
    chips and cores again, and the node is relabelled, once no pod holds a Neuron device."""
    import realnode

    def holding() -> list[dict]:
        pods = cluster.get("pods", "-A", "--field-selector", f"spec.nodeName={realnode.NODE_NAME}")["items"]
        return [p for p in pods if holds_neuron_devices(p)]

    # The pods of tests that are done drain for their grace period (the preStop sleep) while
    # their namespace goes: shortened to a second, the API server's and kubelet's own way of
    # ending them sooner, so the next test does not wait half a minute for devices.
    shortened: set[str] = set()

    def released() -> bool:
        pods = holding()
        for pod in pods:
            meta = pod["metadata"]
            if meta["uid"] in shortened:
                continue
            namespace = cluster.kubectl("get", "namespace", meta["namespace"], "-o", "json", check=False)
            going = (
                meta.get("deletionTimestamp")
                or namespace.returncode != 0
                or json.loads(namespace.stdout)["metadata"].get("deletionTimestamp")
            )
            if going:
                cluster.kubectl("delete", "pod", meta["name"], "-n", meta["namespace"], "--grace-period=1", "--wait=false", check=False)
                shortened.add(meta["uid"])
        return not pods

    wait_for(released, 180, "no pod on the real node holds a Neuron device", interval=1)
    cluster.node.reshape_real_node(instance_type)
    cluster.kubectl("label", "node", realnode.NODE_NAME, f"node.kubernetes.io/instance-type={instance_type}", "--overwrite")
    chips, per_chip = realnode.SHAPES[instance_type]

    def advertised() -> bool:
        allocatable = cluster.get("node", realnode.NODE_NAME)["status"].get("allocatable", {})
        return allocatable.get("aws.amazon.com/neuron") == str(chips) and allocatable.get("aws.amazon.com/neuroncore") == str(
            chips * per_chip
        )

    wait_for(advertised, 60, f"the real node advertises {instance_type}'s devices", interval=1)


@pytest.fixture
def inf1_node(real_node):
    """The real node as an inf1.6xlarge (4 Inferentia chips of 4 NeuronCores) for one test, then
    an inf2.24xlarge again."""
    reshape(real_node, "inf1.6xlarge")
    try:
        yield real_node
    finally:
        reshape(real_node, "inf2.24xlarge")


@pytest.fixture
def trn2_node(real_node):
    """The real node as a trn2.48xlarge (16 Trainium2 chips of 4 logical cores at LNC 2) for one
    test, then an inf2.24xlarge again."""
    reshape(real_node, "trn2.48xlarge")
    try:
        yield real_node
    finally:
        reshape(real_node, "inf2.24xlarge")


def test_a_trn2_vllm_model_runs_on_the_vllm_neuron_plugin_from_the_cache_its_compile_filled(trn2_node, real_namespace):
    """On trn2 and trn3, vLLM runs on the vLLM Neuron plugin (NxD Inference's support ends there
    with Neuron 2.34). The compile Job fills the plugin's compile cache for the model's bucket on
    an ordinary node (CPU compilation); the serving pod fetches it into VLLM_CACHE_ROOT and starts
    with VLLM_NEURON_DISABLE_WARMUP_COMPILE=1, under which the plugin treats a cache miss as fatal:
    it starts from the cache and never compiles."""
    bucket = object_store(trn2_node, real_namespace)
    spec = compiled_vllm_spec(bucket, **{"compute.family": "trn2", "compute.instanceTypes": ["trn2.48xlarge"], "compile.buckets": [[256]]})
    apply(trn2_node, real_namespace, "plugin", spec)
    wait_ready(trn2_node, real_namespace, "plugin", timeout=240)
    status = trn2_node.get("inferentiamodel", "plugin", "-n", real_namespace)["status"]
    prefix = status["compiledUri"].removeprefix(f"s3://{bucket}/")
    keys = [o["Key"].removeprefix(prefix) for o in store_client(trn2_node).list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]]
    # The plugin's local cache layout, $VLLM_CACHE_ROOT/neuron/compile_cache/<hash>/, then the marker.
    entries = sorted({k.split("/")[2] for k in keys if k.startswith("neuron/compile_cache/")})
    assert entries and "_INFERENTIA_COMPLETE" in keys, keys
    # The Hub model the compile read, weights too (the plugin loads them), kept once in the artefact.
    hub = f"hf-hub/models--TinyLlama--TinyLlama-1.1B-Chat-v1.0/snapshots/{status['hubRevision']}"
    assert f"{hub}/model.safetensors" in keys, keys
    [pod] = serving_pods(trn2_node, real_namespace, "plugin")
    found = standin_state(trn2_node, real_namespace, pod)
    assert found["checkpoint"] == f"/var/lib/inferentia/compiled/{hub}", found
    assert (found["runtime"], found["loaded"], found["compiledAtStart"]) == ("vllm-neuron-plugin", "compile-cache", False), found
    # Every graph its warm-up needs was in the cache the compile Job filled.
    assert found["cacheKeys"] == entries and found["target"] == "trn2" and len(found["cores"]) == 4, found
    [proc] = process_envs(trn2_node, real_namespace, pod["metadata"]["name"])
    assert proc["VLLM_NEURON_FRAMEWORK"] is None and proc["NEURON_COMPILED_ARTIFACTS"] is None, proc
    assert (proc["VLLM_CACHE_ROOT"], proc["VLLM_NEURON_DISABLE_WARMUP_COMPILE"]) == ("/var/lib/inferentia/compiled", "1"), proc
    assert proc["HF_HUB_OFFLINE"] == "1", proc
    answer = cluster_ip_request(trn2_node, real_namespace, "plugin", "/v1/completions", {"prompt": "Trainium"})
    assert answer["object"] == "text_completion"


def test_an_inf1_model_of_four_processes_is_traced_with_torch_neuron_and_answers_as_the_network_does(inf1_node, real_namespace, tmp_path):
    """Issue 24, inf1: a module saved with torch.save, traced with torch_neuron.trace and
    --neuroncore-pipeline-cores 2 (checked by the stand-in as neuron-cc would), and served by four
    processes on two chips, each on its own two of the eight granted cores."""
    bucket = upload_reference_models(inf1_node, real_namespace, tmp_path)
    spec = torch_spec(
        bucket, "mlp.pt",
        **{"compute.family": "inf1", "compute.inf": 2, "compute.instanceTypes": ["inf1.6xlarge"], "compute.memory": "2Gi",
           "processesPerReplica": 4, "compile.buckets": [[16]], "compile.dynamicBatchSize": True},
    )  # fmt: skip
    apply(inf1_node, real_namespace, "mlp", spec)
    wait_ready(inf1_node, real_namespace, "mlp", timeout=400)
    status = inf1_node.get("inferentiamodel", "mlp", "-n", real_namespace)["status"]
    assert status["plan"]["compilerArgs"][:2] == ["--neuroncore-pipeline-cores", "2"]
    manifest = json.loads(
        store_client(inf1_node)
        .get_object(Bucket=bucket, Key=status["compiledUri"].removeprefix(f"s3://{bucket}/") + "manifest.json")["Body"]
        .read()
    )
    assert manifest["framework"] == "torch_neuron"

    [pod] = serving_pods(inf1_node, real_namespace, "mlp")
    granted = granted_cores(inf1_node, pod)
    assert len(granted) == 8
    servers = sorted(process_envs(inf1_node, real_namespace, pod["metadata"]["name"]), key=lambda p: int(p["PORT"]))
    assert [s["NEURON_RT_VISIBLE_CORES"] for s in servers] == [f"{granted[i]}-{granted[i + 1]}" for i in range(0, 8, 2)], (servers, granted)

    svc = inf1_node.get("service", "mlp", "-n", real_namespace)
    routed(svc["spec"]["clusterIP"], svc["spec"]["ports"][0]["port"])
    url = f"http://{svc['spec']['clusterIP']}:{svc['spec']['ports'][0]['port']}/"
    inputs = [[float((i + j) % 7) / 3 - 1 for j in range(16)] for i in range(10)]
    answers = ask_concurrently(url, inputs)
    assert [code for code, _ in answers] == [200] * len(inputs), answers
    assert close([json.loads(text) for _, text in answers], expected_answers(tmp_path, "mlp.pt", inputs))
