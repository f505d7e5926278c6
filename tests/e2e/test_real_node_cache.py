"""The node-local artefact cache on the real node, as the chart runs it (nodeCache.enabled): the
DaemonSet's pod, reached through its Service's node-local route (internalTrafficPolicy: Local,
kube-proxy on this node), and two artefact fetches in pods of the operator's image. Only the
first reads the store; the second is served by the cache, every file checked against the
artefact's marker. A copy changed on the node's disk is refused and replaced; a second artefact
past the cache's size evicts the first. And a model's own replica, with the operator told of
the cache, starts from it once the store's copy is gone."""

from __future__ import annotations

import hashlib
import json
import re
import urllib.request

import pytest
import yaml
from kit import helm_template, wait_for
from test_real_node import object_store, routed, store_client

import realnode
from inferentia_operator.core.holds import NODE_CACHE_AUDIENCE, NODE_VIEW_DIR, hold_label
from inferentia_operator.core.pod.dirs import COMPILED_DIR
from inferentia_operator.fetch import upload

pytestmark = pytest.mark.usefixtures("real_node")

RESTRICTED = {
    "allowPrivilegeEscalation": False, "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"},
}  # fmt: skip


# Room for a model's compiled artefact on the stand-ins (a few MB).
MODEL_CACHE_BYTES = 64 << 20
# Room for one of the test's artefacts (600,000 bytes each), not two: the second evicts the first.
# (The chart's least, 1 MiB.)
CACHE_BYTES = 1048576


def cache_metric(url: str, name: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as answer:
        found = re.search(rf"^{name} (\S+)$", answer.read().decode(), re.M)
    return float(found.group(1)) if found else 0.0


def fetch_pod(name: str, namespace: str, uri: str, cache: str) -> dict:
    """A pod of the operator's image that fetches ``uri`` through the node cache, showing the
    token a serving pod shows it (core/pod/fetch.py: projected for the cache's audience)."""
    token = {"audience": NODE_CACHE_AUDIENCE, "expirationSeconds": 600, "path": "token"}
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "containers": [{
                "name": "fetch", "image": "inferentia-operator:0.2.0", "args": ["fetch", "--from", uri, "--to", "/tmp/out"],
                "envFrom": [{"secretRef": {"name": "store"}}],
                "env": [{"name": "INFERENTIA_NODE_CACHE", "value": cache}, {"name": "INFERENTIA_NODE_CACHE_TOKEN", "value": "/token/token"}],
                "volumeMounts": [{"name": "token", "mountPath": "/token", "readOnly": True}],
                "securityContext": RESTRICTED,
            }],
            "volumes": [{"name": "token", "projected": {"sources": [{"serviceAccountToken": token}]}}],
        },
    }  # fmt: skip


# An ordinary pod of the node that knows a held file's SHA-256 and asks for it: with no token,
# with its ServiceAccount's token for the API server, and with one projected for the cache (the
# last one answered). It also asks for a listing and offers a body it never sends.
ATTACK = """
import json, socket, sys, time, urllib.error, urllib.request
cache, sha, own = sys.argv[1], sys.argv[2], open("/token/token").read().strip()
api = open("/var/run/secrets/kubernetes.io/serviceaccount/token").read().strip()
def ask(path, bearer=None, method="GET"):
    request = urllib.request.Request(cache + path, method=method, headers={"Authorization": "Bearer " + bearer} if bearer else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code
codes = {"none": ask("/blobs/" + sha), "api": ask("/blobs/" + sha, api), "own": ask("/blobs/" + sha, own),
         "listing": ask("/artefacts", own)}
print(json.dumps(codes))
"""


def attack_pod(name: str, namespace: str, cache: str, sha: str) -> dict:
    pod = fetch_pod(name, namespace, "", cache)
    [container] = pod["spec"]["containers"]
    container.update(command=["python3", "-c", ATTACK, cache, sha], args=[])
    pod["spec"]["automountServiceAccountToken"] = True
    return pod


def start_node_cache(cluster, ns: str, max_bytes: int, request, views: bool = False):
    """The chart's node cache (nodeCache.enabled) in ``ns``, its DaemonSet's pod on the real node:
    a function returning that pod, the pod's own URL, and the Service's node-local URL. With
    ``views``, its node plugin too (nodeCache.views.enabled), for the node's kubelet directory."""
    flags = []
    if views:  # the store and pins beside the kubelet's directory: under the cluster's own state
        kubelet = cluster.node.kubelet_dir()
        flags = ["--set", "nodeCache.views.enabled=true", "--set", f"nodeCache.views.kubeletDir={kubelet}",
                 "--set", f"nodeCache.views.hostDir={kubelet.rstrip('/').rpartition('/')[0]}/node-cache-{ns}"]  # fmt: skip
    docs = helm_template(cluster, "--set", "nodeCache.enabled=true", "--set", f"nodeCache.maxBytes={max_bytes}", *flags, namespace=ns)
    cache_docs = realnode.node_cache_on_real_node(docs)
    policies = [d for d in cache_docs if d["kind"].startswith(("ValidatingAdmissionPolicy", "ClusterRole", "CSIDriver"))]
    request.addfinalizer(lambda: [cluster.kubectl("delete", d["kind"], d["metadata"]["name"], check=False) for d in policies])
    [daemonset] = [d for d in cache_docs if d["kind"] == "DaemonSet"]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(cache_docs))
    selector = ",".join(f"{k}={v}" for k, v in daemonset["spec"]["selector"]["matchLabels"].items())

    def cache_pod() -> dict | None:
        pods = cluster.get("pods", "-n", ns, "-l", selector)["items"]
        ready = [p for p in pods if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))]
        return ready[0] if ready else None

    wait_for(lambda: cache_pod() is not None, 120, "the node cache's pod on the real node")
    pod_url = f"http://{cache_pod()['status']['podIP']}:8080"
    service = cluster.get("service", "inferentia-operator-node-cache", "-n", ns)
    assert service["spec"]["internalTrafficPolicy"] == "Local"
    routed(service["spec"]["clusterIP"], 8080)
    return cache_pod, pod_url, f"http://{service['spec']['clusterIP']}:8080"


def test_only_the_first_fetch_on_the_node_reads_the_store(real_node, real_namespace, tmp_path, request):
    cluster, ns = real_node, real_namespace
    cache_pod, pod_url, cache = start_node_cache(cluster, ns, CACHE_BYTES, request)

    bucket = object_store(cluster, ns)
    source = tmp_path / "compiled"
    source.mkdir()
    (source / "model.pt").write_bytes(b"compiled graph " * 40000)
    uri = f"s3://{bucket}/artefact/"
    upload(source, uri, client=store_client(cluster))

    def run(name: str, artefact: str = uri) -> str:
        cluster.kubectl("apply", "-f", "-", input=json.dumps(fetch_pod(name, ns, artefact, cache)))
        wait_for(lambda: cluster.get("pod", name, "-n", ns)["status"].get("phase") in ("Succeeded", "Failed"), 120, f"{name} to end")
        phase = cluster.get("pod", name, "-n", ns)["status"]["phase"]
        log = cluster.kubectl("logs", "-n", ns, name).stdout
        assert phase == "Succeeded", log
        return log

    run("first")
    # The cache's pod now says it holds the artefact whole, which serving pods' scheduling prefers.
    wait_for(lambda: hold_label(uri) in cache_pod()["metadata"]["labels"], 30, "the cache's pod labelled with the artefact")
    assert cache_metric(pod_url, "inferentia_node_cache_misses_total") == 1
    assert cache_metric(pod_url, "inferentia_node_cache_stored_total") == 1
    # The store's copy goes: the second fetch on this node can only be served by the cache.
    store_client(cluster).delete_object(Bucket=bucket, Key="artefact/model.pt")
    assert "1 files" in run("second")
    assert cache_metric(pod_url, "inferentia_node_cache_hits_total") == 1

    # A held copy changed on the node's disk (from inside the cache's pod: the emptyDir is on the
    # node): the next fetch refuses it by the marker's SHA-256 and reads the store, whose copy is
    # back; its offer replaces the damaged copy, and the cache alone serves the next.
    pod = cache_pod()["metadata"]["name"]
    # The cache keeps its files read-only (a view links to them): made writable, then changed.
    damage = "import pathlib; [f] = pathlib.Path('/cache/blobs').iterdir(); f.chmod(0o644); f.write_bytes(b'x' * f.stat().st_size)"
    cluster.kubectl("exec", "-n", ns, pod, "-c", "node-cache", "--", "python3", "-c", damage)
    upload(source, uri, client=store_client(cluster))
    run("third")
    assert cache_metric(pod_url, "inferentia_node_cache_damaged_total") == 1
    store_client(cluster).delete_object(Bucket=bucket, Key="artefact/model.pt")
    assert "1 files" in run("fourth")
    assert cache_metric(pod_url, "inferentia_node_cache_hits_total") == 3

    # An ordinary pod of the node, knowing the file's SHA-256, is answered only with a token the
    # API server says is a pod's of this node, projected for the cache; nothing lists the files.
    held = hashlib.sha256((source / "model.pt").read_bytes()).hexdigest()
    cluster.kubectl("apply", "-f", "-", input=json.dumps(attack_pod("asks", ns, cache, held)))
    wait_for(lambda: cluster.get("pod", "asks", "-n", ns)["status"].get("phase") in ("Succeeded", "Failed"), 120, "asks to end")
    log = cluster.kubectl("logs", "-n", ns, "asks").stdout
    assert json.loads(log.strip().splitlines()[-1]) == {"none": 401, "api": 401, "own": 200, "listing": 404}, log

    # Eviction: a second artefact does not fit beside the first (CACHE_BYTES), so the least
    # recently used, the first, goes; the cache stays within its size.
    other = tmp_path / "other"
    other.mkdir()
    (other / "model.pt").write_bytes(b"another graph " * 42858)
    other_uri = f"s3://{bucket}/other/"
    upload(other, other_uri, client=store_client(cluster))
    run("fifth", other_uri)
    assert cache_metric(pod_url, "inferentia_node_cache_files") == 1
    assert cache_metric(pod_url, "inferentia_node_cache_bytes") <= CACHE_BYTES
    wait_for(
        lambda: hold_label(uri) not in (labels := cache_pod()["metadata"]["labels"]) and hold_label(other_uri) in labels,
        30, "the evicted artefact's label gone, the new one's there",
    )  # fmt: skip
    upload(source, uri, client=store_client(cluster))
    misses = cache_metric(pod_url, "inferentia_node_cache_misses_total")
    run("sixth")
    assert cache_metric(pod_url, "inferentia_node_cache_misses_total") == misses + 1  # evicted: read from the store

    # Its token may change only its own pod's holds labels (the chart's admission policy): as
    # that pod's ServiceAccount, with the pod name its bound token carries.
    account = f"system:serviceaccount:{ns}:inferentia-operator-node-cache"
    as_cache = ("--as", account, "--as-user-extra", f"authentication.kubernetes.io/pod-name={pod}")
    mine = cluster.kubectl("label", "pod", pod, "-n", ns, f"{hold_label('s3://x/y/')}=true", *as_cache, check=False)
    assert mine.returncode == 0, mine.stderr
    other = cluster.kubectl("label", "pod", pod, "-n", ns, "app.kubernetes.io/name=taken", "--overwrite", *as_cache, check=False)
    assert other.returncode != 0 and "holds.inferentia.dev labels only" in other.stderr
    elsewhere = cluster.kubectl("label", "pod", "first", "-n", ns, f"{hold_label('s3://x/y/')}=true", *as_cache, check=False)
    assert elsewhere.returncode != 0 and "its own pod only" in elsewhere.stderr


def test_a_models_artefact_is_filled_ahead_and_its_first_replica_reads_nothing_from_the_store(
    real_node, real_namespace, operator, tmp_path, request
):
    """The whole path: the operator run with the chart's node cache (--node-cache-url,
    --node-cache-namespace). A model's replica waits for Neuron devices (another pod holds every
    one of the node's); meanwhile, once the model is compiled, the operator's fill Job for the
    node the replica will go to (fill_ahead/part.py), which asks for no device, fills the node's
    cache, which records the artefact and labels its pod (the Deployment prefers that label), and
    the model says FilledAhead. With the store's copy then deleted and the devices freed, the
    replica starts from the node's cache alone (hits, no miss) and the model goes Ready. Before
    that, the cache's pod is replaced (its store, an emptyDir, goes with it): the operator sees the
    new pod hold nothing of the artefact and fills the node again."""
    from kit import OperatorProcess
    from test_real_node import apply, serving_pods, wait_ready
    from test_real_zero import zero_spec

    from inferentia_operator.core.api import InferentiaModelSpec
    from inferentia_operator.core.planner import plan

    cluster, ns = real_node, real_namespace
    cache_pod, pod_url, cache = start_node_cache(cluster, ns, MODEL_CACHE_BYTES, request)
    spec = zero_spec(cluster, ns)
    spec["autoscaling"]["minReplicas"] = 1  # one replica, KEDA or not, and one node to fill
    # Every device of the kind the replica asks for, held by a pod of nothing: the replica waits.
    [(resource, _)] = [
        (k, v) for k, v in plan(InferentiaModelSpec.model_validate(spec)).resources.limits.items() if k.startswith("aws.amazon.com/")
    ]
    allocatable = cluster.get("node", realnode.NODE_NAME)["status"]["allocatable"][resource]
    blocker = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "every-device", "namespace": ns},
        "spec": {"containers": [{"name": "hold", "image": "inferentia-pause:1", "resources": {"limits": {resource: allocatable}},
                                 "securityContext": RESTRICTED}]},
    }  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(blocker))
    request.addfinalizer(lambda: cluster.kubectl("delete", "pod", "every-device", "-n", ns, "--wait=false", check=False))
    wait_for(lambda: cluster.get("pod", "every-device", "-n", ns)["status"].get("phase") == "Running", 60, "the pod holding every device")
    # What the namespace's admission adds to every pod (the real node's selector and taint),
    # written in the model, where the operator sees which nodes its replicas may go to.
    spec["placement"] = {
        "nodeSelector": {realnode.REAL_NODE_LABEL: "true"},
        "tolerations": [{"key": realnode.REAL_NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
    }
    operator.stop()  # this test's operator knows of the cache; the session's, which does not, waits
    cached = OperatorProcess(
        operator.kubeconfig, tmp_path / "operator.log", peering="e2e-node-cache",
        extra_args=("--node-cache-url", cache, "--node-cache-namespace", ns),
    )  # fmt: skip

    def filled() -> dict:
        conditions = cluster.get("inferentiamodel", "cached", "-n", ns).get("status", {}).get("conditions", [])
        return next((c for c in conditions if c["type"] == "FilledAhead"), {})

    try:
        cached.start()
        apply(cluster, ns, "cached", spec)
        wait_for(lambda: filled().get("status") == "True", 300, "the model's artefact filled ahead on the real node")
        assert realnode.NODE_NAME in filled()["message"] and serving_pods(cluster, ns, "cached") == []  # none Running
        [job] = cluster.get("jobs", "-n", ns, "-l", "inferentia.dev/model=cached,app.kubernetes.io/component=fill")["items"]
        [fill_pod] = cluster.get("pods", "-n", ns, "-l", f"job-name={job['metadata']['name']}")["items"]
        assert fill_pod["spec"]["nodeName"] == realnode.NODE_NAME
        uri = cluster.get("inferentiamodel", "cached", "-n", ns)["status"]["compiledUri"]
        assert cache_metric(pod_url, "inferentia_node_cache_stored_total") >= 1
        wait_for(lambda: hold_label(uri) in cache_pod()["metadata"]["labels"], 30, "the cache's pod labelled with the artefact")
        deployment = cluster.get("deployment", "cached", "-n", ns)
        [term] = deployment["spec"]["template"]["spec"]["affinity"]["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        assert term["podAffinityTerm"]["labelSelector"]["matchExpressions"][0]["key"] == hold_label(uri)
        # The cache's pod replaced: its store was its emptyDir, and the new pod starts empty. The
        # operator reads that from the new pod's labels and fills the node again.
        old_cache = cache_pod()["metadata"]["uid"]
        cluster.kubectl("delete", "pod", "-n", ns, cache_pod()["metadata"]["name"])
        wait_for(lambda: (p := cache_pod()) is not None and p["metadata"]["uid"] != old_cache, 120, "a new node cache pod")
        wait_for(lambda: hold_label(uri) in cache_pod()["metadata"]["labels"], 180, "the node's new cache filled again")
        [refill] = cluster.get("jobs", "-n", ns, "-l", "inferentia.dev/model=cached,app.kubernetes.io/component=fill")["items"]
        assert refill["metadata"]["uid"] != job["metadata"]["uid"]
        wait_for(lambda: filled().get("status") == "True", 120, "FilledAhead again")
        pod_url = f"http://{cache_pod()['status']['podIP']}:8080"
        # The store's copy goes; the first replica can only start from the node's cache.
        bucket, prefix = uri.removeprefix("s3://").split("/", 1)
        store = store_client(cluster)
        for key in [o["Key"] for o in store.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]:
            if not key.endswith("_INFERENTIA_COMPLETE"):
                store.delete_object(Bucket=bucket, Key=key)
        hits, misses = (cache_metric(pod_url, f"inferentia_node_cache_{m}_total") for m in ("hits", "misses"))
        # The new cache's fill read the store (its misses), before any replica ran.
        [refilled] = cluster.get("pods", "-n", ns, "-l", f"job-name={refill['metadata']['name']}")["items"]
        assert refilled["status"]["phase"] == "Succeeded" and refilled["spec"]["nodeName"] == realnode.NODE_NAME and misses >= 1
        cluster.kubectl("delete", "pod", "every-device", "-n", ns)
        wait_for(lambda: serving_pods(cluster, ns, "cached"), 120, "the model's first replica")
        wait_ready(cluster, ns, "cached", timeout=180)
        assert cache_metric(pod_url, "inferentia_node_cache_hits_total") > hits
        assert cache_metric(pod_url, "inferentia_node_cache_misses_total") == misses
    finally:
        cached.stop()
        operator.start()


def test_with_the_node_plugin_a_second_replica_links_the_nodes_files_and_copies_nothing(
    real_node, real_namespace, operator, tmp_path, request
):
    """nodeCache.views.enabled and run --node-views: the first replica fills the node's cache,
    which builds the artefact's view; the next replica's fetch, in a namespace that enforces
    the restricted Pod Security level, links to the view the node plugin mounts (a CSI
    ephemeral inline volume the real kubelet asks it for) and reads nothing: not a byte from
    the store (its copy deleted) or the cache, none written to its own volume. It serves."""
    from kit import OperatorProcess
    from test_real_node import apply, real_node_namespace, wait_ready
    from test_real_zero import zero_spec

    cluster = real_node
    cache_pod, pod_url, cache = start_node_cache(cluster, real_namespace, MODEL_CACHE_BYTES, request, views=True)
    ns = real_node_namespace(cluster, f"views-{real_namespace[-6:]}", "pod-security.kubernetes.io/enforce=restricted")
    request.addfinalizer(lambda: cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False))
    spec = zero_spec(cluster, ns)
    del spec["autoscaling"]
    operator.stop()
    viewing = OperatorProcess(
        operator.kubeconfig, tmp_path / "operator.log", peering="e2e-node-views",
        extra_args=("--node-cache-url", cache, "--node-cache-namespace", real_namespace, "--node-views"),
    )  # fmt: skip
    try:
        viewing.start()
        apply(cluster, ns, "viewed", spec)
        wait_ready(cluster, ns, "viewed", timeout=300)
        uri = cluster.get("inferentiamodel", "viewed", "-n", ns)["status"]["compiledUri"]
        wait_for(lambda: hold_label(uri) in cache_pod()["metadata"]["labels"], 30, "the cache's pod labelled with the artefact")
        bucket, prefix = uri.removeprefix("s3://").split("/", 1)
        store = store_client(cluster)
        for key in [o["Key"] for o in store.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]:
            if not key.endswith("_INFERENTIA_COMPLETE"):
                store.delete_object(Bucket=bucket, Key=key)
        read = [cache_metric(pod_url, f"inferentia_node_cache_{m}_total") for m in ("hits", "misses", "stored")]
        [first] = serving_pods_of(cluster, ns, "viewed")
        cluster.kubectl("delete", "pod", "-n", ns, first["metadata"]["name"], "--wait=false")
        wait_for(
            lambda: [p for p in serving_pods_of(cluster, ns, "viewed") if p["metadata"]["uid"] != first["metadata"]["uid"]],
            60,
            "a new replica",
        )

        def second_ready() -> dict | None:
            pods = [p for p in serving_pods_of(cluster, ns, "viewed") if p["metadata"]["uid"] != first["metadata"]["uid"]]
            ready = [p for p in pods if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))]
            return ready[0] if ready else None

        wait_for(lambda: second_ready() is not None, 180, "the new replica Ready")
        second = second_ready()
        assert second is not None
        assert [cache_metric(pod_url, f"inferentia_node_cache_{m}_total") for m in ("hits", "misses", "stored")] == read
        # As the serving container sees its artefact: links into the node's view, read through.
        name, container = second["metadata"]["name"], second["spec"]["containers"][0]["name"]
        listed = cluster.kubectl("exec", "-n", ns, name, "-c", container, "--", "python3", "-c", LIST_LINKS, COMPILED_DIR, check=False)
        statuses = cluster.get("pod", name, "-n", ns)["status"].get("containerStatuses")
        assert listed.returncode == 0, (listed.stderr, statuses)
        seen = json.loads(listed.stdout)
        assert seen and all(f["link"] and f["to"].startswith(NODE_VIEW_DIR + "/") and f["read"] == f["size"] for f in seen), seen
        # The cache's pod replaced (an upgrade, an eviction): its files, on the node's disk, stay
        # where the running replica's links lead.
        old_cache = cache_pod()["metadata"]["uid"]
        cluster.kubectl("delete", "pod", "-n", real_namespace, cache_pod()["metadata"]["name"])
        wait_for(lambda: (p := cache_pod()) is not None and p["metadata"]["uid"] != old_cache, 120, "a new node cache pod")
        again = cluster.kubectl("exec", "-n", ns, name, "-c", container, "--", "python3", "-c", LIST_LINKS, COMPILED_DIR)
        assert json.loads(again.stdout) == seen
        views = [v for v in second["spec"]["volumes"] if "csi" in v]
        assert views and all(v["csi"]["driver"] == "node-store.inferentia.dev" for v in views)
    finally:
        viewing.stop()
        operator.start()


# Each file under a directory: a link or not, where it leads, its size, and the bytes read through it.
LIST_LINKS = """
import json, os, sys
found = []
for root, _, files in os.walk(sys.argv[1]):
    for name in files:
        path = os.path.join(root, name)
        with open(path, "rb") as f:
            read = sum(len(b) for b in iter(lambda: f.read(1 << 20), b""))
        found.append({"link": os.path.islink(path), "to": os.path.realpath(path), "size": os.path.getsize(path), "read": read})
print(json.dumps(found))
"""


def serving_pods_of(cluster, ns: str, model: str) -> list[dict]:
    return [
        p
        for p in cluster.get("pods", "-n", ns, "-l", f"inferentia.dev/model={model},app.kubernetes.io/component=serving")["items"]
        if not p["metadata"].get("deletionTimestamp")
    ]
