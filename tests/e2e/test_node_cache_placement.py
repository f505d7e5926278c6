"""The real scheduler and the node cache's labels (core/holds.py): a replica of a model whose
artefact a node's cache holds goes to that node, on the kwok fleet. The "cache pods" here are
pods bound to their nodes and labelled by the test, as the node cache labels its own pod
(the real-node test checks that it does)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from kit import wait_for
from test_operator import COMPILE_IMAGE, model_of

from inferentia_operator.core.holds import hold_label
from inferentia_operator.core.pod.artefact import compiled_uri
from inferentia_operator.core.serving.deployment import serving_deployment
from specs import make_model


def cache_pod(name: str, namespace: str, node: str, labels: dict[str, str]) -> dict:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/name": "test-node-cache", **labels}},
        "spec": {"nodeName": node, "containers": [{"name": "cache", "image": "example.com/cache:1"}]},
    }  # fmt: skip


@pytest.mark.parametrize("holder_index", [0, -1])
def test_a_replica_goes_to_the_node_whose_cache_holds_its_artefact(cluster, namespace, holder_index):
    body = make_model("warm", namespace, **{"compile.image": COMPILE_IMAGE})
    body["metadata"]["uid"] = "00000000-0000-0000-0000-000000000001"  # a model never applied
    model = replace(model_of(body), node_cache_url="http://cache:8080", node_cache_namespace=namespace)
    candidates = sorted(
        n["metadata"]["name"]
        for n in cluster.get("nodes")["items"]
        if n["metadata"]["labels"].get("node.kubernetes.io/instance-type") in model.plan.instance_types
        and "inferentia.dev/real-node" not in n["metadata"]["labels"]
    )
    assert len(candidates) >= 3, candidates  # else the choice below proves little
    holder = candidates[holder_index]
    label = hold_label(compiled_uri(model))
    for i, node in enumerate(candidates):
        pod = cache_pod(f"cache-{i}", namespace, node, {label: "true"} if node == holder else {})
        cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))
    deployment = serving_deployment(model, replicas=1)
    deployment["metadata"]["namespace"] = namespace
    # No model object stands behind it here: without this, the garbage collector would delete
    # the Deployment of an owner that does not exist.
    deployment["metadata"].pop("ownerReferences", None)
    cluster.kubectl("apply", "-f", "-", input=json.dumps(deployment))

    def placed() -> str | None:
        pods = cluster.get("pods", "-n", namespace, "-l", "inferentia.dev/model=warm")["items"]
        return next((p["spec"].get("nodeName") for p in pods if p["spec"].get("nodeName")), None)

    assert wait_for(placed, 60, "the replica scheduled") == holder
