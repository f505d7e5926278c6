"""What the operator keeps of the objects its watches deliver, and how it finds their model.

Pure functions over plain dicts: the kopf indexes (:mod:`inferentia_operator.shell.wiring`) store these
projections instead of whole objects, which keeps the operator's memory flat as
models grow (managedFields alone are often most of an object), and store them packed.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from typing import Any

from inferentia_operator.core import api
from inferentia_operator.core.catalogue import HOSTS
from inferentia_operator.core.holds import NODE_CACHE_POD_LABEL, held_keys
from inferentia_operator.core.names import COMPILE_RECORD_COMPONENT, COMPONENT_LABEL, FIELD_MANAGER, MODEL_LABEL
from inferentia_operator.core.objects import Obj, as_mapping
from inferentia_operator.core.pod.artefact import job_output_uri

_METADATA_KEPT = (
    "name", "namespace", "uid", "labels", "annotations", "ownerReferences",
    "generation", "resourceVersion", "deletionTimestamp", "creationTimestamp",
)  # fmt: skip
_POD_CONDITIONS = ("PodScheduled", "Initialized", "Ready")

Key = tuple[str, str]  # (namespace, model name)


def _metadata(body: Mapping[str, Any]) -> dict[str, Any]:
    meta = Obj(body).metadata
    return {k: meta[k] for k in _METADATA_KEPT if meta.get(k) is not None}


# Where the operator's own Update entry is in an object's managedFields, when it has one: the
# fields of a child it created with a POST. Before it first applies to that child, the operator
# makes them its apply's (shell/act.py), and needs only this of the managedFields to do it.
OWN_UPDATE_ENTRY = "ownUpdateEntry"


def own_update_entry(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """The index of the operator's Update entry (of the object itself, not a subresource) in its
    managedFields, and whether the operator has an Apply entry beside it; None when it has none."""
    entries = Obj(body).metadata.get("managedFields")
    if not isinstance(entries, list):
        return None
    ours = [(i, e) for i, e in enumerate(entries) if isinstance(e, dict) and e.get("manager") == FIELD_MANAGER and not e.get("subresource")]
    update = next((i for i, e in ours if e.get("operation") == "Update"), None)
    if update is None:
        return None
    return {"index": update, "besideApply": any(e.get("operation") == "Apply" for _, e in ours)}


def project(body: Mapping[str, Any]) -> dict[str, Any]:
    """An object as the decision needs it: its identity, spec and status; of its managedFields
    only where the operator's Update entry is (OWN_UPDATE_ENTRY).

    A ConfigMap's data is left out too: plan ConfigMaps are immutable and named after
    their content, so the name says everything the decision needs."""
    kept = {k: body[k] for k in ("apiVersion", "kind", "spec", "status", "immutable") if k in body}
    if body.get("kind") != "ConfigMap" and "data" in body:
        kept["data"] = body["data"]
    if (entry := own_update_entry(body)) is not None:
        kept[OWN_UPDATE_ENTRY] = entry
    return {**kept, "metadata": _metadata(body)}


# What a pod's placement may hold and still be read (each list's and map's length): one with more
# is taken as one no other node is known to take (device_faults/part.py).
MAX_PLACEMENT_ITEMS = 32


def _list(x: Any) -> list[Any]:
    return x if isinstance(x, list) else []


def _requirement(r: Any) -> dict[str, Any]:
    if not isinstance(r, Mapping):
        return {"key": "", "operator": "In", "values": []}  # matches nothing
    values = _list(r.get("values"))
    return {
        "key": str(r.get("key") or ""),
        "operator": str(r.get("operator") or ""),
        "values": [str(v) for v in values[:MAX_PLACEMENT_ITEMS]],
    }


def _term(term: Mapping[str, Any]) -> dict[str, Any]:
    """A nodeSelectorTerm, its requirements in plain strings."""
    return {k: [_requirement(r) for r in _list(term.get(k))] for k in ("matchExpressions", "matchFields") if term.get(k)}


def project_pod_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """What status reads of a pod's spec: the node it runs on and the plan ConfigMaps it mounts;
    and what decides where its replacement may go (its tolerations, node selector and required
    node affinity, as admission left them), bounded, with ``placementCut`` where that cut any."""
    volumes = [{"configMap": {"name": v["configMap"]["name"]}} for v in spec.get("volumes") or [] if isinstance(v.get("configMap"), dict)]
    tolerations = [t for t in _list(spec.get("tolerations")) if isinstance(t, Mapping)]
    selector = as_mapping(spec.get("nodeSelector"))
    required = as_mapping(
        as_mapping(as_mapping(spec.get("affinity")).get("nodeAffinity")).get("requiredDuringSchedulingIgnoredDuringExecution")
    )
    terms = [t for t in _list(required.get("nodeSelectorTerms")) if isinstance(t, Mapping)]
    cut = any(len(x) > MAX_PLACEMENT_ITEMS for x in (tolerations, selector, terms)) or any(
        len(_list(t.get("matchExpressions"))) + len(_list(t.get("matchFields"))) > MAX_PLACEMENT_ITEMS
        or any(
            len(_list(r.get("values"))) > MAX_PLACEMENT_ITEMS
            for k in ("matchExpressions", "matchFields")
            for r in _list(t.get(k))
            if isinstance(r, Mapping)
        )
        for t in terms
    )
    placement = {
        "tolerations": [{k: str(t[k]) for k in ("key", "operator", "value", "effect") if t.get(k) is not None} for t in tolerations[:MAX_PLACEMENT_ITEMS]],
        "nodeSelector": {str(k): str(v) for k, v in list(selector.items())[:MAX_PLACEMENT_ITEMS]},
        "nodeSelectorTerms": [] if cut else [_term(t) for t in terms],
        "placementCut": cut,
    }  # fmt: skip
    return {"nodeName": spec.get("nodeName"), "volumes": volumes, **{k: v for k, v in placement.items() if v}}


def project_pod(body: Mapping[str, Any]) -> dict[str, Any]:
    """A pod as status needs it: where it runs, whether it is placed and ready, which plan it mounts."""
    spec, status = Obj(body).spec, Obj(body).status
    conds = [
        {k: c[k] for k in ("type", "status", "reason", "message") if k in c}
        for c in status.get("conditions") or []
        if c.get("type") in _POD_CONDITIONS
    ]
    return {
        "metadata": _metadata(body),
        "spec": project_pod_spec(spec),
        "status": {
            "phase": status.get("phase"),
            "conditions": conds,
            "failures": container_failures(status),
            "reports": container_reports(status),
        },
    }


# How much of a message status quotes (a container's termination message, a Job's FailedCreate event, the
# scheduler's reason a pod has no node): its last lines say why.
FAILURE_MESSAGE_CHARS = 400


def container_failures(status: Mapping[str, Any]) -> list[dict[str, str]]:
    """Containers (init containers first) that ended with a non-zero exit, with the end of their
    termination message: a compile step's error, as FallbackToLogsOnError keeps it."""
    failures = []
    for c in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        for state in (c.get("state") or {}, c.get("lastState") or {}):
            ended = state.get("terminated") or {}
            if ended.get("exitCode"):
                message = str(ended.get("message") or ended.get("reason") or "").strip()
                failures.append({"container": str(c.get("name")), "message": message[-FAILURE_MESSAGE_CHARS:]})
                break
    return failures


def container_reports(status: Mapping[str, Any]) -> list[dict[str, str]]:
    """Containers that ended with exit 0 and said something in their termination message
    (which then is only what they wrote to it): the compile program's report of how much of the
    model runs on Neuron. Bounded as failures are."""
    reports = []
    for c in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        ended = (c.get("state") or {}).get("terminated") or {}
        message = str(ended.get("message") or "").strip()
        if ended.get("exitCode") == 0 and message:
            reports.append({"container": str(c.get("name")), "message": message[-FAILURE_MESSAGE_CHARS:]})
    return reports


def pod_signature(pod: Mapping[str, Any]) -> tuple[Any, ...]:
    """What of a pod the model's status reports: its placement, readiness and plan. A pod
    event that changes none of these is not worth a reconcile."""
    p = project_pod(pod)
    meta = p["metadata"]
    conds = tuple(sorted((c.get("type"), c.get("status"), c.get("reason"), c.get("message")) for c in p["status"]["conditions"]))
    failures = tuple((f["container"], f["message"]) for f in p["status"]["failures"])
    reports = tuple((r["container"], r["message"]) for r in p["status"]["reports"])
    volumes = tuple(str(v) for v in p["spec"]["volumes"])
    return (meta.get("deletionTimestamp") is not None, p["spec"]["nodeName"], conds, volumes, failures, reports)


class Packed:
    """A projection as compressed JSON, as the caches keep it.

    At 1,000 models the caches hold about 5,000 projections. Measured with tracemalloc,
    they took 35 to 63 MB as dicts (depending on how the dicts were built) and 5 MB
    packed; a reconcile unpacks only its own model's handful, about 80 microseconds each."""

    __slots__ = ("_data",)

    def __init__(self, value: Mapping[str, Any]) -> None:
        self._data = zlib.compress(json.dumps(value, separators=(",", ":")).encode(), 1)

    def unpack(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(zlib.decompress(self._data))
        return value


def owner_key(body: Mapping[str, Any]) -> Key | None:
    """The model an object belongs to: its controller InferentiaModel, else its model label.

    The owner reference comes first because it survives someone removing the labels;
    pods, owned by ReplicaSets and Jobs, are found by their label."""
    obj = Obj(body)
    if not obj.namespace:
        return None
    ref = obj.controller
    if ref is not None and ref.get("kind") == api.KIND and str(ref.get("apiVersion") or "").startswith(f"{api.GROUP}/"):
        return obj.namespace, ref["name"]
    model = obj.labels.get(MODEL_LABEL)
    return (obj.namespace, model) if model else None


def project_record(body: Mapping[str, Any]) -> dict[str, Any]:
    """A record of a completed compile, as the decision reads it: its data is its content."""
    return {**project(body), "data": dict(body.get("data") or {})}


def compile_uri(body: Mapping[str, Any]) -> str | None:
    """The artefact a compile Job uploads or a compile record vouches for; None for anything else."""
    obj = Obj(body)
    component = obj.labels.get(COMPONENT_LABEL)
    if body.get("kind") == "ConfigMap" and component == COMPILE_RECORD_COMPONENT:
        uri = (body.get("data") or {}).get("uri")
        return str(uri) if uri else None
    if body.get("kind") == "Job" and component == "compile":
        return job_output_uri(body)
    return None


# The Job controller's events a compile Job's status quotes (shell/wiring.py watches these alone).
JOB_EVENT_REASON = "FailedCreate"
JOB_EVENT_SELECTOR = f"involvedObject.kind=Job,reason={JOB_EVENT_REASON}"


def project_job_event(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """A FailedCreate event of a Job as status quotes it: its reason, the end of its message
    and the uid of the Job it is about (a Job of the same name made again is another Job).
    Anyone who may create events in a namespace can write one: it only ever adds words to the
    status of that namespace's models, and its size is bounded here."""
    involved = body.get("involvedObject")
    if not isinstance(involved, Mapping) or involved.get("kind") != "Job" or body.get("reason") != JOB_EVENT_REASON:
        return None
    return {
        "reason": JOB_EVENT_REASON,
        "message": str(body.get("message") or "")[-FAILURE_MESSAGE_CHARS:],
        "uid": str(involved.get("uid") or ""),
    }


# AWS's Neuron node problem detector (its Helm chart's npd-config.yaml, aws-neuron/neuron-helm-charts)
# sets the node condition NeuronHealth to True, with a reason NeuronHasError_<error> (DMA_ERROR,
# HBM_UNCORRECTABLE_ERROR, SRAM_UNCORRECTABLE_ERROR, NC_UNCORRECTABLE_ERROR, HANG_ON_COLLECTIVES),
# when the Neuron driver logs a hardware error; it is False (NeuronHasNoError) otherwise
# (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/containers/tutorials/k8s-neuron-problem-detector-and-recovery.html).
NEURON_HEALTH_CONDITION = "NeuronHealth"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
# A node's NoSchedule and NoExecute taints and its labels, as many as are read.
MAX_NODE_TAINTS = 32
MAX_NODE_LABELS = 128


def project_neuron_node(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """A Neuron node as a model's device faults are judged: its instance type, whether it is
    Ready and takes new pods (cordoned, its NoSchedule and NoExecute taints), and its Neuron
    fault (the condition's reason and the end of its message) if it reports one; None for a node
    of no Neuron instance type. A node's status is written by its kubelet and its detector,
    never by a model's user; its size is bounded here all the same."""
    node = Obj(body)
    itype = node.labels.get(INSTANCE_TYPE_LABEL)
    if itype not in HOSTS:
        return None
    health = node.condition(NEURON_HEALTH_CONDITION)
    fault = None
    if health.get("status") == "True":
        fault = {
            "reason": str(health.get("reason") or "")[:FAILURE_MESSAGE_CHARS],
            "message": str(health.get("message") or "")[-FAILURE_MESSAGE_CHARS:],
        }
    taints = [t for t in node.spec.get("taints") or [] if isinstance(t, Mapping) and t.get("effect") in ("NoSchedule", "NoExecute")]
    labels = list(node.labels.items())
    cut = len(labels) > MAX_NODE_LABELS or len(taints) > MAX_NODE_TAINTS
    return {
        "instanceType": itype,
        "labels": {} if cut else {str(k): str(v) for k, v in labels},  # for node selectors and affinity
        "ready": node.condition_true("Ready"),
        "unschedulable": bool(node.spec.get("unschedulable")),
        "taints": [] if cut else [{k: str(t[k]) for k in ("key", "value", "effect") if t.get(k) is not None} for t in taints],
        # More labels or taints than kept: not read whole, so no pod is judged by it (device_faults/part.py).
        **({"cut": True} if cut else {}),
        "fault": fault,
    }


def project_node_cache_pod(body: Mapping[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """A node cache's pod (core/holds.py, NODE_CACHE_POD_LABEL) as fill-ahead reads it: its
    node, when it was made (a replaced pod whose store was its emptyDir starts empty), and the
    artefacts it says it holds. None for any other pod, one not placed, or one going."""
    pod = Obj(body)
    node = pod.spec.get("nodeName")
    if pod.labels.get(NODE_CACHE_POD_LABEL) != "true" or not isinstance(node, str) or not node or pod.deleting:
        return None
    held = sorted(held_keys(pod.labels))
    return node, {"created": str(pod.metadata.get("creationTimestamp") or ""), "ready": pod.condition_true("Ready"), "held": held}
