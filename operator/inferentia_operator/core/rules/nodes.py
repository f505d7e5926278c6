"""Replicas that span nodes (spec.compute.nodes above 1): where AWS documents it, whole nodes,
one vLLM process a node, and none of what a group of pods cannot have yet.

catalogue.MULTI_NODE_FAMILIES has the sources: vLLM's multi-node launcher for Neuron runs vLLM
on NxD Inference, and of the families where it runs only Trn1's 32xlarge sizes have EFA."""

from __future__ import annotations

import json
import re

from inferentia_operator.core import neuron_images
from inferentia_operator.core.api import InferentiaModelSpec
from inferentia_operator.core.catalogue import EFA_DEVICES, FAMILIES, MULTI_NODE_FAMILIES, Family
from inferentia_operator.core.cel import CEL_FAMILY, CrossFieldRule, literal
from inferentia_operator.core.findings import Finding, format_list

_MULTI = "self.compute.nodes > 1"
_VLLM = "(has(self.serving.runtime) && self.serving.runtime == 'vllm')"
# A whole node's chips, for each family whose replicas may span nodes: what every instance type
# of it with EFA has (trn1.32xlarge and trn1n.32xlarge: 16).
NODE_CHIPS: dict[str, int] = {
    name: max(chips for itype, chips in FAMILIES[name].instance_chips.items() if itype in EFA_DEVICES) for name in MULTI_NODE_FAMILIES
}
_VALID_FAMILIES = format_list(list(MULTI_NODE_FAMILIES))
_NOT_YET = "cannot be used with nodes above 1 yet: "

NODES_FAMILY = CrossFieldRule(
    "spec.compute.nodes",
    "spec",
    "%d needs a family whose replicas can span nodes, and family is %s: vLLM serves across nodes on NxD Inference, "
    f"over EFA, which only Trn1's 32xlarge instances have (trn2 and trn3 serve vLLM on the vLLM Neuron plugin, which "
    f"documents no serving across nodes); valid values: {_VALID_FAMILIES}, or nodes 1",
    f"!({_MULTI}) || {CEL_FAMILY} in {literal(list(MULTI_NODE_FAMILIES))}",
    ("self.compute.nodes", CEL_FAMILY),
)
NODES_WHOLE = CrossFieldRule(
    "spec.compute.inf",
    "spec",
    "%d %s a node: a replica that spans nodes takes whole nodes, every chip of each; valid value on %s: %d",
    f"!({_MULTI}) || !({CEL_FAMILY} in {literal(NODE_CHIPS)}) || "
    f"(has(self.compute.inf) && self.compute.inf == {literal(NODE_CHIPS)}[{CEL_FAMILY}])",
    (
        # No string(): an int's text has no size bound the API server's cost estimate accepts.
        "has(self.compute.inf) ? self.compute.inf : self.compute.cores",
        "has(self.compute.inf) ? 'chips' : 'cores'",
        CEL_FAMILY,
        f"{literal(NODE_CHIPS)}[{CEL_FAMILY}]",
    ),
)
NODES_PROCESSES = CrossFieldRule(
    "spec.processesPerReplica",
    "spec",
    "%d with nodes above 1: vLLM runs one serving process a node, each holding that node's ranks of the one model; valid value: 1",
    f"!({_MULTI}) || self.processesPerReplica == 1",
    ("self.processesPerReplica",),
)
NODES_RUNTIME = CrossFieldRule(
    "spec.serving.runtime",
    "spec",
    "a replica that spans nodes runs vLLM's multi-node serving, whose leader serves and whose workers hold the other "
    "ranks; valid value with nodes above 1: vllm",
    f"!({_MULTI}) || {_VLLM}",
    (),
)
NODES_COMPILE = CrossFieldRule(
    "spec.compile.image",
    "spec",
    f"%s {_NOT_YET}each node compiles its own ranks at start (vLLM's launcher gives every rank its own start_rank_id); "
    "leave compile.image unset",
    f"!({_MULTI}) || !has(self.compile) || !has(self.compile.image)",
    ("self.compile.image",),
)
NODES_DRA = CrossFieldRule(
    "spec.compute.allocation",
    "spec",
    f"dra {_NOT_YET}the pods of a group take their devices from the device plugin; valid value with nodes above 1: devicePlugin",
    f"!({_MULTI}) || !has(self.compute.allocation) || self.compute.allocation == 'devicePlugin'",
    (),
)
NODES_ZERO = CrossFieldRule(
    "spec.autoscaling.minReplicas",
    "spec",
    f"0 {_NOT_YET}the scale-to-zero holder stands in for one pod, not a group; valid values with nodes above 1: at least 1",
    f"!({_MULTI}) || !has(self.autoscaling) || !has(self.autoscaling.minReplicas) || self.autoscaling.minReplicas > 0",
    (),
)

# What serves across nodes is vLLM's V0 Neuron worker (ENABLE_NEURON_MULTI_NODE, NEURON_RANK_ID,
# --override-neuron-config), which vLLM removed (vllm-project/vllm PR #21159, first absent from
# 0.10.2); vllm-neuron, in AWS's vLLM images from 0.11.0, starts a world of one. Among AWS's own
# vLLM images (neuron_images, which says where each image's versions come from) only those with
# V0 serve a group, so another of them is refused naming the ones that can; an image of another
# name is the user's to know.
_VLLM_REPO = f"{neuron_images.REGISTRY}{neuron_images.VLLM_REPOSITORY}:"
_V0_IMAGES = neuron_images.multi_node_images()
NODES_IMAGE = CrossFieldRule(
    "spec.serving.image",
    "spec",
    "%s cannot serve a replica across nodes: its vLLM has no V0 Neuron worker (vLLM removed it in 0.10.2, and "
    "vllm-neuron's worker starts a world of one), which vLLM's multi-node serving on Neuron needs; valid values with "
    f"nodes above 1: {', '.join(_V0_IMAGES)}",
    f"!({_MULTI}) || !has(self.serving.image) || !self.serving.image.startsWith({json.dumps(_VLLM_REPO)}) || "
    f"self.serving.image.contains('@') || self.serving.image in {literal(_V0_IMAGES)}",
    ("self.serving.image",),
)


# A label key: an optional DNS subdomain prefix and "/", then a name of at most 63 characters
# (https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#syntax-and-character-set).
LABEL_KEY_PATTERN = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
NODES_TOPOLOGY_KEY = CrossFieldRule(
    "spec.compute.topologyKey",
    "spec",
    "'%s' is not a label key; valid keys are a name of at most 63 letters, digits, '-', '_' and '.', optionally after a "
    "DNS prefix and '/', such as topology.k8s.aws/network-node-layer-3",
    f"!has(self.compute.topologyKey) || self.compute.topologyKey.matches({json.dumps(LABEL_KEY_PATTERN)})",
    ("self.compute.topologyKey",),
)
NODES_TOPOLOGY_ALONE = CrossFieldRule(
    "spec.compute.topologyKey",
    "spec",
    "keeps the pods of a replica across nodes together, and nodes is 1; set nodes above 1, or leave topologyKey unset",
    f"!has(self.compute.topologyKey) || {_MULTI}",
    (),
)


def _check_topology(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    key = spec.compute.topology_key
    if key is None:
        return []
    found = [] if re.fullmatch(LABEL_KEY_PATTERN, key) else [NODES_TOPOLOGY_KEY.finding(key)]
    if spec.compute.nodes == 1:
        found.append(NODES_TOPOLOGY_ALONE.finding())
    return found


def _check_nodes(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    """Each rule on its own, as the API server runs them: a spec may break several."""
    if spec.compute.nodes == 1:
        return []
    found = []
    if fam.name not in MULTI_NODE_FAMILIES:
        found.append(NODES_FAMILY.finding(spec.compute.nodes, fam.name))
    elif spec.compute.inf != NODE_CHIPS[fam.name]:
        given = (spec.compute.cores, "cores") if spec.compute.inf is None else (spec.compute.inf, "chips")
        found.append(NODES_WHOLE.finding(*given, fam.name, NODE_CHIPS[fam.name]))
    if spec.processes_per_replica != 1:
        found.append(NODES_PROCESSES.finding(spec.processes_per_replica))
    if spec.serving.runtime != "vllm":
        found.append(NODES_RUNTIME.finding())
    if spec.compile.image is not None:
        found.append(NODES_COMPILE.finding(spec.compile.image))
    if spec.compute.allocation == "dra":
        found.append(NODES_DRA.finding())
    if spec.autoscaling is not None and spec.autoscaling.min_replicas == 0:
        found.append(NODES_ZERO.finding())
    image = spec.serving.image
    # A digest names no tag the catalogue knows: the image is the user's to know.
    if image and image.startswith(_VLLM_REPO) and "@" not in image and image not in _V0_IMAGES:
        found.append(NODES_IMAGE.finding(image))
    return found


RULES: list[CrossFieldRule] = [
    NODES_FAMILY, NODES_WHOLE, NODES_PROCESSES, NODES_RUNTIME, NODES_COMPILE, NODES_DRA, NODES_ZERO,
    NODES_TOPOLOGY_KEY, NODES_TOPOLOGY_ALONE, NODES_IMAGE,
]  # fmt: skip
CHECKS = (_check_nodes, _check_topology)
