"""Models with allocation dra on the real node in DRA mode: its devices come from the Neuron DRA
driver stand-in (cluster/node/draplugin), a kubelet DRA plugin that publishes them as AWS's driver
does and prepares each claim through a CDI spec that containerd applies (the granted
/dev/neuron<N>, NEURON_RT_VISIBLE_CORES at the claim's LNC). No device plugin runs meanwhile: a
node runs one or the other."""

from __future__ import annotations

import pytest
import yaml
from kit import wait_for
from test_dra import DEVICE_CLASS, DRIVER
from test_real_node import (
    apply,
    cluster_ip_request,
    process_envs,
    reshape,
    serving_pods,
    standin_spec,
    standin_state,
    wait_ready,
)

from specs import DROP

pytestmark = pytest.mark.usefixtures("operator")


def node_slices(cluster, node: str) -> list[dict]:
    return [s for s in cluster.get("resourceslices")["items"] if s["spec"].get("nodeName") == node and s["spec"]["driver"] == DRIVER]


def claiming_pods(cluster, node: str) -> list[dict]:
    pods = cluster.get("pods", "-A", "--field-selector", f"spec.nodeName={node}")["items"]
    return [p for p in pods if p["spec"].get("resourceClaims")]


@pytest.fixture
def dra_node(real_node):
    """The real node in DRA mode as a trn2.48xlarge for one test, then an inf2.24xlarge with the
    device plugin again."""
    import realnode

    if real_node.local is None:
        pytest.skip("the DRA driver stand-in runs beside the local cluster's kubelet only (LocalCluster.real_node_dra): not on kind")
    reshape(real_node, "inf2.24xlarge")  # no pod holds a device-plugin device when the plugin stops
    real_node.local.real_node_dra(True)
    real_node.kubectl("apply", "-f", "-", input=yaml.safe_dump(DEVICE_CLASS))
    real_node.kubectl("label", "node", realnode.NODE_NAME, f"node.kubernetes.io/instance-type={realnode.DRA_INSTANCE_TYPE}", "--overwrite")
    wait_for(lambda: sum(len(s["spec"].get("devices", [])) for s in node_slices(real_node, realnode.NODE_NAME)) == 16, 60,
             "the DRA driver stand-in's ResourceSlice", interval=1)  # fmt: skip
    try:
        yield real_node
    finally:
        # The driver unprepares the claims of the pods going away: it stops only once they are gone.
        wait_for(lambda: not claiming_pods(real_node, realnode.NODE_NAME), 120, "the claiming pods to go", interval=1)
        real_node.local.real_node_dra(False, "inf2.24xlarge")
        for s in node_slices(real_node, realnode.NODE_NAME):
            real_node.kubectl("delete", "resourceslice", s["metadata"]["name"], "--ignore-not-found", check=False)
        real_node.kubectl("delete", "deviceclass", DRIVER, "--ignore-not-found", check=False)
        reshape(real_node, "inf2.24xlarge")


def claimed_devices(cluster, namespace: str, pod: dict) -> list[int]:
    """The device ids the pod's claim was allocated, from the ResourceClaim's status."""
    [status] = pod["status"]["resourceClaimStatuses"]
    claim = cluster.get("resourceclaim", status["resourceClaimName"], "-n", namespace)
    results = claim["status"]["allocation"]["devices"]["results"]
    assert {r["driver"] for r in results} == {DRIVER}
    return sorted(int(r["device"].removeprefix("neurondevice")) for r in results)


def expand(cores: str) -> list[int]:
    """A NEURON_RT_VISIBLE_CORES value ("16-31" or "16,17") as a list of cores."""
    out: list[int] = []
    for part in cores.split(","):
        first, _, last = part.partition("-")
        out += range(int(first), int(last or first) + 1)
    return out


def test_dra_models_on_the_real_node_run_on_the_cores_of_their_claims(dra_node, real_namespace):
    """Two models of 4 Trainium2 devices each: each claim gets 4 connected devices (one row of
    the grid), the two get disjoint ones, and each serving process runs on the logical cores of
    its claim's devices at the LNC its claim's NeuronConfig sets (left: 2, so 4 a device;
    right: 1, so 8 a device), as the driver's CDI spec set them."""
    spec = standin_spec(**{"compute.family": "trn2", "compute.inf": 4, "compute.allocation": "dra", "compute.instanceTypes": DROP})
    lnc = {"left": 2, "right": 1}
    for name in ("left", "right"):
        apply(dra_node, real_namespace, name, {**spec, "compute": {**spec["compute"], "lnc": lnc[name]}})
    devices = {}
    for name in ("left", "right"):
        wait_ready(dra_node, real_namespace, name, timeout=150)
        [pod] = serving_pods(dra_node, real_namespace, name)
        assert not any(k.startswith("aws.amazon.com/") for c in pod["spec"]["containers"] for k in c["resources"].get("requests", {}))
        ids = claimed_devices(dra_node, real_namespace, pod)
        assert len(ids) == 4 and len({i // 4 for i in ids}) == 1, ids  # one connected group of 4
        per_device = 8 // lnc[name]
        cores = [i * per_device + k for i in ids for k in range(per_device)]
        [proc] = process_envs(dra_node, real_namespace, pod["metadata"]["name"])
        # The launcher passes the claim's cores on as a range; the plan alone would say 0-15 (0-31 at LNC 1).
        assert expand(proc["NEURON_RT_VISIBLE_CORES"]) == cores, (proc, ids)
        found = standin_state(dra_node, real_namespace, pod)
        assert found["cores"] == cores and found["devices"] == [f"/dev/neuron{i}" for i in ids], found
        answer = cluster_ip_request(dra_node, real_namespace, name, "/v1/completions", {"prompt": "claimed"})
        assert answer["object"] == "text_completion"
        devices[name] = set(ids)
    assert not devices["left"] & devices["right"], devices
