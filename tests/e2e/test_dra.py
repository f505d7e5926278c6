"""Models on nodes run by AWS's Neuron DRA driver, on the real scheduler's DRA allocator.

The fleet gains two kwok trn2.48xlarge nodes that run no device plugin: their Neuron devices
are published the way the Neuron DRA driver publishes them, as ResourceSlices of the driver
``neuron.aws.com`` with its attribute names (instanceType, deviceId, neuronDriverVersion,
resourceType, and the connected-device groups resource.aws.com/devicegroup{1,4,8,16}_id:
https://awsdocs-neuron.readthedocs-hosted.com/en/latest/containers/neuron-dra.html), under
AWS's DeviceClass ``neuron.aws.com``. The scheduler allocates each model's claims from them;
kwok then runs the pods. What a kubelet DRA plugin does on the node (preparing the devices)
is not simulated here.
"""

from __future__ import annotations

import json

import pytest
import yaml
from kit import condition, wait_for

from specs import DROP, make_model

DRIVER = "neuron.aws.com"
DRA_NODES = ("dra-trn2-0", "dra-trn2-1")
DEVICES = 16  # a trn2.48xlarge: 16 Trainium2 devices in a 4x4 grid, a row of 4 connected


def node(name: str) -> dict:
    shape = {"cpu": "192", "memory": "2048Gi", "pods": "737"}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {"kubernetes.io/hostname": name, "node.kubernetes.io/instance-type": "trn2.48xlarge", "type": "kwok"},
        },
        "spec": {"taints": [{"key": "aws.amazon.com/neuron", "value": "true", "effect": "NoSchedule"}]},
        "status": {"capacity": shape, "allocatable": shape},
    }  # fmt: skip


def slice_of(name: str) -> dict:
    """The node's devices as the Neuron DRA driver publishes them."""
    devices = [
        {
            "name": f"neurondevice{i}",
            "attributes": {
                "deviceId": {"int": i},
                "instanceType": {"string": "trn2.48xlarge"},
                "neuronDriverVersion": {"string": "2.25.4.0"},
                "resourceType": {"string": "neuron_device"},
                "resource.aws.com/devicegroup1_id": {"int": i},
                "resource.aws.com/devicegroup4_id": {"int": i // 4},
                "resource.aws.com/devicegroup8_id": {"int": i // 8},
                "resource.aws.com/devicegroup16_id": {"int": 0},
            },
        }  # fmt: skip
        for i in range(DEVICES)
    ]
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": f"{name}-{DRIVER}"},
        "spec": {"driver": DRIVER, "nodeName": name, "pool": {"name": name, "generation": 1, "resourceSliceCount": 1}, "devices": devices},
    }  # fmt: skip


DEVICE_CLASS = {
    "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": DRIVER},
    "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
}  # fmt: skip


@pytest.fixture(scope="module")
def dra_nodes(cluster):
    objects = [DEVICE_CLASS, *(node(n) for n in DRA_NODES), *(slice_of(n) for n in DRA_NODES)]
    cluster.kubectl("apply", "-f", "-", input="\n---\n".join(yaml.safe_dump(o) for o in objects))
    for name in DRA_NODES:
        cluster.kubectl("wait", "--for=condition=Ready", f"node/{name}", "--timeout=60s")
    yield DRA_NODES
    for name in DRA_NODES:
        cluster.kubectl("delete", "resourceslice", f"{name}-{DRIVER}", "--ignore-not-found", check=False)
        cluster.kubectl("delete", "node", name, "--ignore-not-found", check=False)
    cluster.kubectl("delete", "deviceclass", DRIVER, "--ignore-not-found", check=False)


def dra_model(cluster, namespace: str, name: str, inf: int) -> None:
    body = make_model(
        name, namespace,
        **{"compute.family": "trn2", "compute.inf": inf, "compute.allocation": "dra", "compute.cpu": "1", "compute.memory": "4Gi",
           "processesPerReplica": 1, "compute.instanceTypes": DROP},
    )  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(body))


def allocated_devices(cluster, namespace: str, name: str) -> list[tuple[str, str]]:
    """(node, device) of every device the model's pods' claims were allocated, from the claims' status."""
    out = []
    for claim in cluster.get("resourceclaims", "-n", namespace)["items"]:
        owners = claim["metadata"].get("ownerReferences") or []
        pods = [cluster.get("pod", o["name"], "-n", namespace) for o in owners if o["kind"] == "Pod"]
        if not any(p["metadata"]["labels"].get("inferentia.dev/model") == name for p in pods):
            continue
        for result in claim.get("status", {}).get("allocation", {}).get("devices", {}).get("results", []):
            assert result["driver"] == DRIVER
            out.append((result["pool"], result["device"]))
    return sorted(out)


def test_a_dra_model_gets_connected_devices_from_the_driver_and_no_device_plugin_resource(cluster, operator, namespace, dra_nodes):
    dra_model(cluster, namespace, "four", 4)
    cluster.kubectl("wait", "--for=condition=Ready", "inferentiamodel/four", "-n", namespace, "--timeout=90s")
    [pod] = cluster.get("pods", "-n", namespace, "-l", "inferentia.dev/model=four")["items"]
    [container] = pod["spec"]["containers"]
    resources = json.dumps(container.get("resources", {}))
    assert "aws.amazon.com/neuron" not in resources, resources
    assert container["resources"]["claims"] == [{"name": "neurons"}]
    assert pod["spec"]["nodeName"] in dra_nodes
    # AWS's claim template shape: ExactCount from the class, one instance type, a connected group, the LNC.
    [template] = cluster.get("resourceclaimtemplates", "-n", namespace)["items"]
    assert template["metadata"]["ownerReferences"][0]["name"] == "four"
    [request] = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == DRIVER and request["exactly"]["count"] == 4
    assert template["spec"]["spec"]["devices"]["constraints"] == [
        {"requests": ["neurons"], "matchAttribute": "resource.aws.com/devicegroup4_id"}
    ]
    [config] = template["spec"]["spec"]["devices"]["config"]
    assert config["opaque"]["parameters"] == {"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": 2}
    devices = allocated_devices(cluster, namespace, "four")
    assert len(devices) == 4 and len({pool for pool, _ in devices}) == 1
    # All four from one connected group of four (a row of the grid).
    assert len({int(device.removeprefix("neurondevice")) // 4 for _, device in devices}) == 1, devices


def test_two_dra_models_get_disjoint_devices(cluster, operator, namespace, dra_nodes):
    for name in ("left", "right"):
        dra_model(cluster, namespace, name, 8)
    for name in ("left", "right"):
        cluster.kubectl("wait", "--for=condition=Ready", f"inferentiamodel/{name}", "-n", namespace, "--timeout=90s")
    left, right = allocated_devices(cluster, namespace, "left"), allocated_devices(cluster, namespace, "right")
    assert len(left) == len(right) == 8 and not set(left) & set(right), (left, right)


def test_a_dra_model_no_slice_can_satisfy_reports_the_schedulers_message(cluster, operator, namespace, dra_nodes):
    """Three replicas of 16 devices: the two DRA nodes hold 32, so one replica at least is never placed."""
    body = make_model(
        "crowded", namespace,
        **{"compute.family": "trn2", "compute.inf": 16, "compute.allocation": "dra", "compute.cpu": "1", "compute.memory": "4Gi",
           "compute.instanceTypes": DROP, "replicas": 3},
    )  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(body))

    def unschedulable() -> dict | None:
        c = condition(cluster.get("inferentiamodel", "crowded", "-n", namespace), "Scheduled")
        return c if c.get("reason") == "Unschedulable" else None

    found = wait_for(unschedulable, 90, "Scheduled=False, Unschedulable")
    assert "cannot allocate all claims" in found["message"], found
