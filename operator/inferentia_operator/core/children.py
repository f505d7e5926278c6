"""The objects an InferentiaModel owns, built from its spec and plan: pure, no API calls.

Each builder returns the exact body the operator server-side applies, so tests can
check every child field against the plan without a cluster, and the controller
can compare what it would apply with what is live before writing anything.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from inferentia_operator.programs import (
    COMPILE_PROGRAM,
    COMPILE_PROGRAM_VERSION,
    HUB_SNAPSHOT_DIR,
    HUB_SNAPSHOT_MODULE,
    HUB_SNAPSHOT_VERSION,
    NXDI_COMPILE_PROGRAM,
    NXDI_COMPILE_PROGRAM_VERSION,
    SERVE_PROGRAM,
    VLLM_COMPILE_PROGRAM,
    VLLM_WORKER_PROGRAM,
)
from inferentia_operator.programs import source as program_source

from . import api, neuron_images
from .api import InferentiaModelSpec, Plan
from .autoscaling import Prometheus, desired_replicas, scales_to_zero, target_in_flight
from .autoscaling import scaled_object as autoscaling_object
from .catalogue import (
    DRA_CONFIG_API_VERSION,
    DRA_DRIVER,
    DRA_GROUP_ATTRIBUTE,
    FAMILIES,
    GIB,
    INSTANCE_TYPE_LABEL,
    NEURON_TAINT_KEY,
    ROOT_COMM_PORT,
)
from .findings import Finding
from .holds import NODE_CACHE_AUDIENCE, NODE_VIEW_DIR, NODE_VIEW_DRIVER, hold_key, hold_label
from .launcher import LAUNCHER
from .names import (
    COMPILE_HASH_LABEL,
    COMPILE_INPUTS_ANNOTATION,
    COMPILE_RECORD_COMPONENT,
    COMPONENT_LABEL,
    DEFAULT_OPERATOR_IMAGE,
    FIELD_MANAGER,
    GROUP_KEY_LABEL,
    GROUP_SET_LABEL,
    MANAGED_BY_LABEL,
    MODEL_LABEL,
    PLAN_FILE,
    PLAN_HASH_ANNOTATION,
    PLAN_MOUNT,
    TRAFFIC_LABEL,
    TRAFFIC_ON,
    WORKER_INDEX_LABEL,
)
from .objects import Obj
from .placement import pod_placement
from .proof import PROOF_ANNOTATION, Prover
from .sizing import FETCHED_SCHEMES, keeps_hub_snapshot

# The vLLM preset (spec.serving.runtime: vllm), on what AWS supports for the family
# (catalogue.Family.vllm). Its OpenAI-compatible server answers /health once the model is loaded.
VLLM_SERVER = ["python3", "-m", "vllm.entrypoints.openai.api_server"]
# - inf2 and trn1: vLLM on NxD Inference. VLLM_NEURON_FRAMEWORK selects it, and
#   NEURON_COMPILED_ARTIFACTS points it at a pre-compiled model, which it loads instead of
#   compiling at start
#   (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/libraries/nxd-inference/developer_guides/migrate-from-tnx-to-nxdi.html,
#   https://awsdocs-neuron.readthedocs-hosted.com/en/latest/libraries/nxd-inference/developer_guides/vllm-user-guide-v1.html).
#   The compile Job makes that model with the operator's program (nxdi_compile.py), through NxD
#   Inference's own API, for the family's target on an ordinary node.
VLLM_ENV = {"VLLM_NEURON_FRAMEWORK": "neuronx-distributed-inference"}
# - trn2 and trn3: the vLLM Neuron plugin, which "registers itself with vLLM via its entry
#   point" (no VLLM_NEURON_FRAMEWORK, no --device neuron) and compiles at warm-up, one graph per
#   bucket, into its local cache under $VLLM_CACHE_ROOT/neuron/compile_cache/<hash>/
#   (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/getting-started/migration-nxdi-to-vllm-neuron.html,
#   https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/design/compilation/compilation_cache.html).
#   The compile Job fills that cache on an ordinary node: CPU compilation for the family's
#   target (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/design/compilation/cpu_compilation.html).
VLLM_PLUGIN_COMPILE_ENV = {"VLLM_NEURON_CPU_COMPILE": "1"}
# With a compiled artefact, a cache miss must end the server, never start a compile in the
# serving pod: VLLM_NEURON_DISABLE_WARMUP_COMPILE=1 "treats a local cache miss as a fatal
# error" (the Compilation Cache page above).
VLLM_PRECOMPILED_ENV = {"VLLM_NEURON_DISABLE_WARMUP_COMPILE": "1"}
# Where the fetch init container puts the compiled artefact, read-only for the server, and
# where the compile program writes it in the compile Job.
COMPILED_DIR = "/var/lib/inferentia/compiled"
# Where a Hub model's files are kept in the artefact, in the Hub cache's layout: the compile
# Job downloads them there once, and every serving pod reads them offline (programs/hub_snapshot.py).
HUB_CACHE_DIR = f"{COMPILED_DIR}/{HUB_SNAPSHOT_DIR}"
# Where the uncompiled model is fetched to, for the compile program (or the model server
# when there is no compile step).
MODEL_DIR = "/var/lib/inferentia/model"
# How often a starting server is asked whether it is up: often, so that a start (from zero,
# or a scale-up) is seen ready within seconds of the model loading. How long it may take is
# the plan's (sizing.startup_seconds).
STARTUP_PROBE_SECONDS = 2


@dataclass(frozen=True)
class Model:
    """What the builders need to know about the owning InferentiaModel."""

    name: str
    namespace: str
    uid: str
    spec: InferentiaModelSpec
    plan: Plan
    # The operator's own image (--operator-image): the artefact fetch and upload, and the
    # batching front end unless the spec names another.
    operator_image: str = DEFAULT_OPERATOR_IMAGE
    # The scheduler of its serving pods when they take devices from the device plugin (the
    # operator's --scheduler-name); "" the cluster's default scheduler.
    scheduler_name: str = ""
    # The node-local artefact cache the serving pods' fetch asks first (the operator's
    # --node-cache-url); "" none.
    node_cache_url: str = ""
    # Where the node cache's pods run, labelled with what each holds (core/holds.py); "" none.
    node_cache_namespace: str = ""
    # The node plugin mounts the cache's views in serving pods (the operator's --node-views).
    node_views: bool = False
    # KEDA's namespace (the operator's --keda-namespace), the one that may reach a holder's
    # external scaler; "" no NetworkPolicy for it.
    keda_namespace: str = ""

    # The plan ConfigMap's content and name, built once a Model: the Deployment, the compile
    # Job, the ConfigMap itself and the clean-up of superseded plans all name it, and its
    # content carries the operator's programs (tens of kB to serialise and hash each time).
    @functools.cached_property
    def plan_files(self) -> Mapping[str, str]:
        return _plan_files(self)

    @functools.cached_property
    def plan_files_hash(self) -> str:
        return stable_hash(self.plan_files, 8)


def stable_hash(value: Any, length: int = 10) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:length]


def plan_document(plan: Plan) -> dict[str, Any]:
    """The plan as status, plan.json and the CLI show it: camelCase, fields that do not
    apply to the family (lnc and tensorParallelSize on inf1) left out."""
    return plan.model_dump(by_alias=True, mode="json", exclude_none=True)


def plan_hash(plan: Plan) -> str:
    return stable_hash(plan.model_dump(mode="json", exclude_none=True))


def compile_inputs(model: Model) -> dict[str, Any]:
    """Everything that changes the compiled artefact, and nothing else."""
    inputs: dict[str, Any] = {
        "uri": model.spec.model.uri,
        "framework": model.spec.model.framework,
        "family": model.plan.family,
        "compilerArgs": model.plan.compiler_args,
        "batchSize": model.plan.batch_size,
        "dynamicBatchSize": model.plan.dynamic_batch_size,
        "buckets": model.plan.buckets,
        "image": model.spec.compile.image,
    }
    if model.plan.compiler != "neuron-cc":
        # neuron-cc is inf1's only compiler, which "family" already pins; leaving it out
        # keeps every inf1 compile hash as it was, so upgrading the operator recompiles nothing.
        # A neuronx-cc artefact is also bound to its logical-core size and tensor-parallel
        # degree: the runtime refuses to load it under another.
        inputs |= {"compiler": model.plan.compiler, "lnc": model.plan.lnc, "tensorParallelSize": model.plan.tensor_parallel_size}
    if model.spec.compiles_with_program:
        # The operator's compile program made the artefact: its format and the example inputs' dtype.
        inputs |= {"program": COMPILE_PROGRAM_VERSION, "inputDtype": model.spec.input_dtype}
    if vllm_plugin(model):
        # The plugin's cache: one graph per shape the engine warms up, for its engine arguments.
        inputs |= {"vllm": "vllm-neuron-plugin", "engineArgs": vllm_engine_args(model)}
    if vllm_nxd(model):
        # NxD Inference's compiled model for those engine arguments, in the program's layout.
        inputs |= {"vllm": "nxd-inference", "engineArgs": vllm_engine_args(model), "program": NXDI_COMPILE_PROGRAM_VERSION}
    if keeps_hub_snapshot(model.spec):
        inputs["hubSnapshot"] = HUB_SNAPSHOT_VERSION
    return inputs


def vllm_plugin(model: Model) -> bool:
    """The vLLM preset on a family where vLLM runs on the vLLM Neuron plugin (trn2, trn3)."""
    return model.spec.serving.runtime == "vllm" and FAMILIES[model.plan.family].vllm == "vllm-neuron-plugin"


def vllm_nxd(model: Model) -> bool:
    """The vLLM preset on a family where vLLM runs on NxD Inference (inf2, trn1)."""
    return model.spec.serving.runtime == "vllm" and FAMILIES[model.plan.family].vllm == "nxd-inference"


def vllm_engine_args(model: Model) -> dict[str, Any]:
    """vLLM's engine arguments, as the serving pods' flags and the plugin's compile step give
    them: the model, tensor parallel over the group's (logical) cores, the largest bucket's
    last dimension as the sequence length, and serving.batching.maxBatchSize as the sequences."""
    args: dict[str, Any] = {"model": model.spec.model.uri}
    if _remote_model(model):
        # Fetched into the pod first (serving_fetches_model, compile_fetches_model), and served
        # under its URI, which clients name.
        args = {"model": MODEL_DIR, "served_model_name": model.spec.model.uri}
    if not model.plan.nodes:
        # Across nodes the degree is the override config's (multi_node_command), as vLLM's launcher gives it.
        args["tensor_parallel_size"] = model.plan.tensor_parallel_size
    if model.plan.buckets:
        args["max_model_len"] = max(b[-1] for b in model.plan.buckets)
    if model.spec.serving.batching:
        args["max_num_seqs"] = model.spec.serving.batching.max_batch_size
    if vllm_nxd(model):
        # vLLM on NxD Inference, as its guide's known issues ask: "Users are required to provide a
        # num_gpu_blocks_override arg, which should be at least ceil(max_model_len // block_size) *
        # max_num_seqs ... to avoid a potential OOB error"; without prefix caching vllm-neuron's
        # platform makes block_size max_model_len, so that is max_num_seqs
        # (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/libraries/nxd-inference/developer_guides/vllm-user-guide-v1.html;
        # vllm-project/vllm-neuron, vllm_neuron/platform.py). Prefix caching stays off: its KV
        # layout would have to be compiled in, and the guide's known issues say it "generates
        # incorrect outputs" at batch size 1. The compile program builds the same NeuronConfig
        # from these arguments (nxdi_compile.py).
        # Off whatever else is set: on, vllm-neuron's platform asserts "When prefix caching is
        # enabled, block_size must be set". vLLM's V0 worker asserts num_gpu_blocks ==
        # max_num_seqs + 1 (vllm/worker/neuron_worker.py, 0.9.2 to 0.10.1.1), so no override there.
        args["enable_prefix_caching"] = False
        # Across nodes the worker is V0's whatever the image (rules/nodes.py, NODES_IMAGE).
        image = neuron_images.lookup(model.spec.serving.image)
        v0 = bool(model.plan.nodes) or (image is not None and image.vllm_serving == neuron_images.VLLM_V0)
        if "max_num_seqs" in args and "max_model_len" in args and not v0:
            args["num_gpu_blocks_override"] = args["max_num_seqs"]
    return args


def compile_hash(model: Model) -> str:
    return stable_hash(compile_inputs(model))


def compiled_uri(model: Model) -> str:
    base = model.spec.compile.output_uri or model.spec.model.uri.rstrip("/") + "-neuron"
    return f"{base.rstrip('/')}/{compile_hash(model)}/"


def _compile_id(model: Model) -> str:
    """The compile key, and the artefact's place: two models that share the key but write
    their artefacts to different places (compile.outputUri) compile apart."""
    return f"{compile_hash(model)}-{stable_hash(compiled_uri(model), 5)}"


def compile_job_name(model: Model) -> str:
    """Named after the artefact, not the model: two models with the same compile inputs
    create the same Job, and the API server's unique names let only the first one in, so
    they run one compile between them however close together they are reconciled."""
    return f"compile-{_compile_id(model)}"


def compile_record_name(model: Model) -> str:
    return f"compiled-{_compile_id(model)}"


def _env_value(containers: Any, container: str | None, name: str) -> str | None:
    """The value of ``name`` in the env of the first of ``containers`` (named ``container``, when given) that sets it."""
    for c in containers or ():
        if container is None or c.get("name") == container:
            for e in c.get("env") or ():
                if e.get("name") == name:
                    return str(e.get("value"))
    return None


def job_output_uri(job: Mapping[str, Any]) -> str | None:
    """Where a compile Job uploads its artefact: the INFERENTIA_OUTPUT_URI of its compile step."""
    return _env_value(Obj(Obj(job).spec.get("template")).spec.get("initContainers"), "compile", "INFERENTIA_OUTPUT_URI")


def served_uri(deployment: Mapping[str, Any] | None) -> str | None:
    """The artefact a serving Deployment's pods fetch: its INFERENTIA_COMPILED_MODEL_URI."""
    return _env_value(Obj(Obj(deployment).spec.get("template")).spec.get("containers"), None, "INFERENTIA_COMPILED_MODEL_URI")


def compile_record(
    model: Model, job: Mapping[str, Any], prover: Prover, placement: float | None = None, revision: str | None = None
) -> dict[str, Any]:
    """The operator's record that a compile Job completed, and so uploaded the artefact of
    this key with its completion marker last (the Job completes only once the upload step has
    exited 0). A model with the same key, or this one created again, starts from the record
    instead of running the compiler. It has no owner: like the artefact it vouches for, it
    outlives the models that used it. Deleting it makes the next model compile again."""
    job_meta = Obj(job)
    completed = Obj(job).status.get("completionTime")
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": compile_record_name(model),
            "namespace": model.namespace,
            # No model label: the record is nobody's child, and no model's clean-up of its
            # superseded plans may take it for one of its own.
            "labels": {
                COMPONENT_LABEL: COMPILE_RECORD_COMPONENT,
                MANAGED_BY_LABEL: FIELD_MANAGER,
                "app.kubernetes.io/part-of": "inferentia-operator",
                COMPILE_HASH_LABEL: compile_hash(model),
            },
            "annotations": {
                COMPILE_INPUTS_ANNOTATION: json.dumps(compile_inputs(model), sort_keys=True, separators=(",", ":")),
                # Only the operator can make it: a record without it is no cache hit (core/proof.py).
                PROOF_ANNOTATION: prover.record(model.namespace, compile_record_name(model), compiled_uri(model)),
            },
        },
        "immutable": True,
        "data": {
            "uri": compiled_uri(model),
            "key": compile_hash(model),
            "job": job_meta.name or "",
            "model": job_meta.labels.get(MODEL_LABEL, ""),
            **({"completed": str(completed)} if completed else {}),
            # How much of the model runs on Neuron, as its compile reported it: a later cache hit says it too.
            **({"neuronPlacementPercent": str(placement)} if placement is not None else {}),
            # The Hub commit the artefact keeps, which every replica serves: a later cache hit serves it too.
            **({"hubRevision": revision} if revision is not None else {}),
        },
    }


def labels(model: Model, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": model.name,
        "app.kubernetes.io/instance": model.name,
        COMPONENT_LABEL: component,
        MANAGED_BY_LABEL: FIELD_MANAGER,
        "app.kubernetes.io/part-of": "inferentia-operator",
        MODEL_LABEL: model.name,
    }


def selector(model: Model) -> dict[str, str]:
    return {MODEL_LABEL: model.name, COMPONENT_LABEL: "serving"}


def traffic_selector(model: Model) -> dict[str, str]:
    """The serving pods whose traffic is on (names.TRAFFIC_LABEL): what the holder forwards to."""
    return {**selector(model), TRAFFIC_LABEL: TRAFFIC_ON}


def answering_selector(model: Model) -> dict[str, str]:
    """The pods that answer requests, for the Service and the InferencePool: every serving pod
    whose traffic is on, or of a group across nodes its leader alone, whose workers hold ranks
    and serve no API."""
    return {**traffic_selector(model), WORKER_INDEX_LABEL: "0"} if model.plan.nodes else traffic_selector(model)


def selector_string(model: Model) -> str:
    return ",".join(f"{k}={v}" for k, v in selector(model).items())


def child_metadata(model: Model, name: str, component: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": model.namespace,
        "labels": labels(model, component),
        "ownerReferences": [
            {
                "apiVersion": api.API_VERSION,
                "kind": api.KIND,
                "name": model.name,
                "uid": model.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }


def user_env_names(model: Model) -> set[str]:
    return {e.name for e in model.spec.serving.env or []}


def _plan_files(model: Model) -> dict[str, str]:
    data = {"plan.json": json.dumps(plan_document(model.plan), indent=2, sort_keys=True)}
    # The one rule for the environment: what the user sets in serving.env wins over what the
    # operator plans, in every process. The launcher exports env-i over the container's
    # environment, so a planned name the user set must not be in env-i at all.
    mine = user_env_names(model)
    for i, env in enumerate(model.plan.env):
        data[f"env-{i}"] = "".join(f"{k}={v}\n" for k, v in env.items() if k not in mine)
    data["launch.sh"] = LAUNCHER
    # The operator's programs, only where they run: a model that needs neither keeps its
    # ConfigMap (and so its pods) as it was.
    if model.spec.compiles_with_program or model.spec.serves_with_program:
        data[COMPILE_PROGRAM] = program_source(COMPILE_PROGRAM)
    if model.spec.serves_with_program:
        data[SERVE_PROGRAM] = program_source(SERVE_PROGRAM)
    if vllm_plugin(model) and model.spec.compile.image:
        data[VLLM_COMPILE_PROGRAM] = program_source(VLLM_COMPILE_PROGRAM)
    if vllm_nxd(model) and model.spec.compile.image:
        data[NXDI_COMPILE_PROGRAM] = program_source(NXDI_COMPILE_PROGRAM)
    if (vllm_plugin(model) or vllm_nxd(model)) and model.spec.compile.image:
        data[HUB_SNAPSHOT_MODULE] = program_source(HUB_SNAPSHOT_MODULE)
    if model.plan.nodes:
        data[VLLM_WORKER_PROGRAM] = program_source(VLLM_WORKER_PROGRAM)
    return data


# What one object may hold in etcd (the API server's default --max-request-bytes is 1.5 MiB,
# and a ConfigMap's data is capped at 1 MiB): the plan must fit, with room for metadata.
CONFIGMAP_DATA_LIMIT = 1024 * 1024 - 16 * 1024


def plan_size_findings(model: Model) -> list[Finding]:
    """The plan ConfigMap must fit its object; a plan of 128 processes with long compiler
    arguments does not, and the API server would refuse it on every reconcile."""
    size = sum(len(k) + len(v.encode()) for k, v in model.plan_files.items())
    if size <= CONFIGMAP_DATA_LIMIT:
        return []
    return [
        Finding(
            "spec.compile.extraArgs",
            f"the plan of {model.plan.groups} processes with these compiler arguments is {size} bytes, more than the "
            f"{CONFIGMAP_DATA_LIMIT} a ConfigMap can hold; valid plans use fewer processesPerReplica or shorter extraArgs",
        )
    ]


def plan_configmap_name(model: Model) -> str:
    # Named after its whole content, not only the plan: the ConfigMap is immutable, so an
    # operator upgrade that changes the launcher must make a new one, never edit the old.
    return f"{model.name}-plan-{model.plan_files_hash}"


def plan_configmap(model: Model) -> dict[str, Any]:
    """The plan, for the compile and serving pods: plan.json, one env file per process, the launcher.

    Content-addressed and immutable: pods of the previous plan keep reading their own
    while a new plan compiles and rolls out."""
    data = dict(model.plan_files)  # the body's own, which its caller may change
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": child_metadata(model, plan_configmap_name(model), "plan"),
        "immutable": True,
        "data": data,
    }


# The user the serving and compile containers run as, unless spec.runAsRoot: an unprivileged
# uid, as distroless images use. The restricted Pod Security level needs runAsNonRoot,
# no privilege escalation, every capability dropped and the RuntimeDefault seccomp profile.
NON_ROOT_UID = 65532


def pod_security(model: Model) -> dict[str, Any]:
    """The pod-level securityContext: restricted by default, root only when the spec asks."""
    if model.spec.run_as_root:
        return {"runAsNonRoot": False, "runAsUser": 0, "seccompProfile": {"type": "RuntimeDefault"}}
    return non_root_pod_security()


def non_root_pod_security() -> dict[str, Any]:
    """Restricted: user 65532, no root, the runtime's default seccomp profile (a new dict each
    call, so that no two objects share one and YAML never prints an alias)."""
    return {"runAsNonRoot": True, "runAsUser": NON_ROOT_UID, "runAsGroup": NON_ROOT_UID, "seccompProfile": {"type": "RuntimeDefault"}}


CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": True}

# Where a serving or compile process may write: its root file system is read-only, and a
# non-root user has no home in most images. vLLM and Hugging Face download and cache under
# HOME / HF_HOME; everything else writes to TMPDIR.
HOME_DIR = "/home/inferentia"
SCRATCH_PATHS = {"home": HOME_DIR, "tmp": "/tmp"}
SCRATCH_ENV = {
    "HOME": HOME_DIR,
    "HF_HOME": f"{HOME_DIR}/.cache/huggingface",
    "XDG_CACHE_HOME": f"{HOME_DIR}/.cache",
    "TMPDIR": "/tmp",
}


def service_account(model: Model) -> dict[str, Any]:
    return {"serviceAccountName": model.spec.service_account_name} if model.spec.service_account_name else {}


def _storage_env_from(model: Model) -> dict[str, Any]:
    """The object store's credentials and endpoint, from the Secret the spec names."""
    secret = model.spec.compile.storage_secret
    return {"envFrom": [{"secretRef": {"name": secret}}]} if secret else {}


def _remote_model(model: Model) -> bool:
    return model.spec.model.uri.startswith(FETCHED_SCHEMES)


def compile_fetches_model(model: Model) -> bool:
    """The compile program reads a remote model: the compile Job fetches it first. (NxD
    Inference reads a local checkpoint too; a Hugging Face id its program downloads itself.)"""
    return (
        bool(model.spec.compile.image)
        and (model.spec.compiles_with_program or model.spec.serving.runtime == "vllm")
        and _remote_model(model)
    )


def serving_fetches_model(model: Model) -> bool:
    """The serving pod fetches a remote model first: for vLLM always (it reads an object store
    only through the Run:ai streamer, "To load a model from S3, 'load_format' must be
    'runai_streamer'" (vllm/config), which AWS's Neuron images do not carry, and a compiled model
    still needs the checkpoint's configuration and tokenizer); for the operator's server when it
    traces the model at start (no compile step)."""
    if not _remote_model(model):
        return False
    return model.spec.serving.runtime == "vllm" or (model.spec.serves_with_program and not model.spec.compile.image)


def model_path(model: Model) -> str:
    """Where the programs find the uncompiled model: the fetched copy, or a path in the image."""
    return MODEL_DIR if _remote_model(model) else model.spec.model.uri.removeprefix("file://")


def _operator_container(model: Model, name: str, args: list[str], mounts: list[dict[str, Any]]) -> dict[str, Any]:
    """A container of the operator's own image that moves a model or an artefact in or out of the pod."""
    return {
        "name": name,
        "image": model.operator_image,
        "args": args,
        **_storage_env_from(model),
        "env": [{"name": k, "value": v} for k, v in SCRATCH_ENV.items()],
        "resources": BATCHER_RESOURCES,
        "securityContext": CONTAINER_SECURITY,
        "volumeMounts": [*mounts, *_scratch_mounts()],
        # Its last log lines (the store's error) become the termination message, which the
        # model's status quotes when a fetch or an upload fails.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def fetch_container(model: Model) -> dict[str, Any]:
    """The init container that copies the compiled artefact into the pod before the server
    starts (``inferentia-operator fetch``), refusing one whose upload did not complete."""
    container = _operator_container(
        model,
        "fetch-artifacts",
        ["fetch", "--from", compiled_uri(model), "--to", COMPILED_DIR],
        [{"name": "compiled", "mountPath": COMPILED_DIR}],
    )
    if model.node_cache_url:
        # Each file is asked of the node's cache first, by the SHA-256 the marker names, and
        # checked; one read from the store is offered back (fetch.py, batching/node_cache.py).
        _through_node_cache(model, container)
    return container


# The serving pod's token for the node cache (batching/node_cache.py answers only pods of its
# node that show one): projected for the cache's audience alone, so it opens nothing else, and
# mounted only where fetch reads it (the pod mounts no API token).
NODE_CACHE_TOKEN = {"volume": "node-cache-token", "dir": "/var/run/secrets/inferentia.dev/node-cache", "file": "token"}


def _through_node_cache(model: Model, container: dict[str, Any]) -> None:
    container["env"] += [
        {"name": "INFERENTIA_NODE_CACHE", "value": model.node_cache_url},
        {"name": "INFERENTIA_NODE_CACHE_TOKEN", "value": f"{NODE_CACHE_TOKEN['dir']}/{NODE_CACHE_TOKEN['file']}"},
        *([{"name": "INFERENTIA_NODE_VIEW", "value": NODE_VIEW_DIR}] if node_view_volumes(model) else []),
    ]
    container["volumeMounts"] += [
        {"name": NODE_CACHE_TOKEN["volume"], "mountPath": NODE_CACHE_TOKEN["dir"], "readOnly": True},
        *node_view_mounts(model),
    ]


def node_view_mounts(model: Model) -> list[dict[str, Any]]:
    """Where the node cache's views of what the pod fetches are mounted: in fetch, which links
    to them, and in the serving container, which reads through the links (the same paths)."""
    return [
        {"name": v["name"], "mountPath": f"{NODE_VIEW_DIR}/{v['csi']['volumeAttributes']['key']}", "readOnly": True}
        for v in node_view_volumes(model)
    ]


def node_view_volumes(model: Model) -> list[dict[str, Any]]:
    """With the node plugin (--node-views), one CSI ephemeral inline volume per artefact the pod
    fetches: the node cache's views of it for the pod's namespace (batching/node_plugin.py).
    Restricted Pod Security admits csi volumes
    (https://kubernetes.io/docs/concepts/security/pod-security-standards/#restricted)."""
    if not (model.node_cache_url and model.node_views) or vllm_plugin(model):
        # The vLLM Neuron plugin takes file locks in its compiled artefact, even to read it:
        # files behind links into a read-only view would refuse them. It copies, as before.
        return []
    return [
        {"name": f"node-view-{i}", "csi": {"driver": NODE_VIEW_DRIVER, "readOnly": True, "volumeAttributes": {"key": hold_key(uri)}}}
        for i, uri in enumerate(fetched_uris(model))
    ]


def node_cache_token_volumes(model: Model) -> list[dict[str, Any]]:
    """The projected token, where a serving pod's fetch reads through the node cache."""
    if not (model.node_cache_url and fetched_uris(model)):
        return []
    # 600 s is the least a projected token may live; the kubelet renews it before it expires
    # (https://kubernetes.io/docs/concepts/storage/projected-volumes/#serviceaccounttoken).
    token = {"audience": NODE_CACHE_AUDIENCE, "expirationSeconds": 600, "path": NODE_CACHE_TOKEN["file"]}
    return [{"name": NODE_CACHE_TOKEN["volume"], "projected": {"sources": [{"serviceAccountToken": token}]}}]


def fetch_model_container(model: Model) -> dict[str, Any]:
    """The init container that copies the uncompiled model into the pod (``inferentia-operator fetch --model``)."""
    return _operator_container(
        model,
        "fetch-model",
        ["fetch", "--model", "--from", model.spec.model.uri, "--to", MODEL_DIR],
        [{"name": "model", "mountPath": MODEL_DIR}],
    )


def upload_container(model: Model) -> dict[str, Any]:
    """The compile Job's last step: upload the artefact, then its completion marker."""
    return _operator_container(
        model,
        "upload",
        ["upload", "--from", COMPILED_DIR, "--to", compiled_uri(model)],
        [{"name": "compiled", "mountPath": COMPILED_DIR, "readOnly": True}],
    )


def gib_quantity(size_bytes: int) -> str:
    """A volume's size: whole GiB, rounded up."""
    return f"{-(-size_bytes // GIB)}Gi"


def _sized_volume(model: Model, name: str, size_bytes: int) -> dict[str, Any]:
    """An emptyDir of the size the plan gives, or with serving.storageClassName a generic
    ephemeral volume: a claim of that class per pod, made and deleted with the pod
    (https://kubernetes.io/docs/concepts/storage/ephemeral-volumes/#generic-ephemeral-volumes)."""
    size = gib_quantity(size_bytes)
    storage_class = model.spec.serving.storage_class_name
    if storage_class is None:
        return {"name": name, "emptyDir": {"sizeLimit": size}}
    claim = {"accessModes": ["ReadWriteOnce"], "storageClassName": storage_class, "resources": {"requests": {"storage": size}}}
    return {"name": name, "ephemeral": {"volumeClaimTemplate": {"metadata": {"labels": selector(model)}, "spec": claim}}}


def artefact_volume(model: Model) -> dict[str, Any]:
    """Where the compiled artefact is written (compile Job) or fetched to (serving pods)."""
    assert model.plan.sizes.artefact_bytes is not None, "an artefact volume without a compile step"
    return _sized_volume(model, "compiled", model.plan.sizes.artefact_bytes)


def _model_volume(model: Model) -> dict[str, Any]:
    """Where an uncompiled model from a store is fetched to."""
    assert model.plan.sizes.model_bytes is not None, "a model volume for a model in no store"
    return _sized_volume(model, "model", model.plan.sizes.model_bytes)


def _scratch_volumes(model: Model, home_bytes: int) -> list[dict[str, Any]]:
    """HOME (and the caches under it), sized from the model, and /tmp (spec.serving.tmpSize)."""
    return [_sized_volume(model, "home", home_bytes), {"name": "tmp", "emptyDir": {"sizeLimit": model.spec.serving.tmp_size}}]


def _scratch_mounts() -> list[dict[str, Any]]:
    return [{"name": name, "mountPath": path} for name, path in SCRATCH_PATHS.items()]


def _plan_volume(model: Model) -> dict[str, Any]:
    return {"name": "plan", "configMap": {"name": plan_configmap_name(model)}}


def compile_resources(model: Model) -> dict[str, dict[str, str]]:
    """What the compile Job requests, so that it is never BestEffort (the first pod evicted)
    and a node can be chosen for it: the plan's (sizing.compile_cpu, sizing.compile_memory)."""
    sizes = model.plan.sizes
    assert sizes.compile_cpu is not None and sizes.compile_memory is not None, "compile resources without a compile step"
    return {"requests": {"cpu": sizes.compile_cpu, "memory": sizes.compile_memory}, "limits": {"memory": sizes.compile_memory}}


def compile_job(model: Model) -> dict[str, Any] | None:
    """The compile Job of this plan, or None when nothing is compiled ahead.

    Its pod runs three steps in order: the operator's image fetches the model (when it is
    remote), the compile container traces it in compile.image and writes the artefact to a
    shared emptyDir, and the operator's image uploads it, completion marker last. The
    compile step needs nothing of the operator's image and the upload nothing of the user's."""
    if not model.spec.compile.image:
        return None
    env = {
        "INFERENTIA_MODEL_URI": model.spec.model.uri,
        "INFERENTIA_MODEL_PATH": model_path(model),
        "INFERENTIA_COMPILER": model.plan.compiler,
        "INFERENTIA_OUTPUT_URI": compiled_uri(model),
        "INFERENTIA_COMPILED_MODEL_DIR": COMPILED_DIR,
        "NEURON_CC_FLAGS": " ".join(model.plan.compiler_args),
        "INFERENTIA_PLAN_FILE": PLAN_FILE,
    }
    command = ["python3", f"{PLAN_MOUNT}/{COMPILE_PROGRAM}"]
    if model.plan.compiler == "neuronx-cc":
        # No Neuron device in the Job: torch-neuronx traces on the CPU (cpu_backend=True, the
        # program's docstring) for the target set before it is imported, as optimum-neuron does
        # (huggingface/optimum-neuron PR #961); NxD Inference and the plugin read it too.
        env["NEURON_PLATFORM_TARGET_OVERRIDE"] = model.plan.family
    if vllm_nxd(model):
        # vLLM on NxD Inference: its compiled model, through NxD Inference's own API, for the
        # family's target (the Job has no device to detect it from), into the directory the
        # upload step uploads and the serving pods' NEURON_COMPILED_ARTIFACTS names.
        command = ["python3", f"{PLAN_MOUNT}/{NXDI_COMPILE_PROGRAM}"]
        env["INFERENTIA_VLLM_ENGINE_ARGS"] = json.dumps(vllm_engine_args(model), sort_keys=True)
    if vllm_plugin(model):
        # The plugin's own compile at warm-up, on the CPU for the family's target, into the
        # directory the upload step uploads.
        command = ["python3", f"{PLAN_MOUNT}/{VLLM_COMPILE_PROGRAM}"]
        env |= {
            **VLLM_PLUGIN_COMPILE_ENV,
            "NEURON_LOGICAL_NC_CONFIG": str(model.plan.lnc),
            "VLLM_CACHE_ROOT": COMPILED_DIR,
            "INFERENTIA_VLLM_ENGINE_ARGS": json.dumps(vllm_engine_args(model), sort_keys=True),
        }
    if keeps_hub_snapshot(model.spec):
        env["INFERENTIA_HUB_CACHE"] = HUB_CACHE_DIR
    metadata = child_metadata(model, compile_job_name(model), "compile")
    metadata["labels"][COMPILE_HASH_LABEL] = compile_hash(model)
    # What was compiled, so that status can say which part of the key a new compile changed.
    metadata["annotations"] = {COMPILE_INPUTS_ANNOTATION: json.dumps(compile_inputs(model), sort_keys=True, separators=(",", ":"))}
    compile_step: dict[str, Any] = {
        "name": "compile",
        # The user's Neuron framework image: its python3, torch and torch-neuron(x) run the
        # operator's compile program from the plan; for the vLLM preset, its vLLM Neuron plugin
        # (trn2, trn3) or its NxD Inference (inf2, trn1) runs the operator's compile step for it.
        "command": command,
        "image": model.spec.compile.image,
        # The serving container's own variables and sources too (an HF_TOKEN for a gated
        # model, say): the compile reads the same model, and yours win over the planned ones.
        **_user_env_from(model),
        "env": _with_user_env(model, {**SCRATCH_ENV, **env}),
        "resources": compile_resources(model),
        "securityContext": CONTAINER_SECURITY,
        # The program's last words become the container's termination message, which status reports.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [
            {"name": "plan", "mountPath": PLAN_MOUNT, "readOnly": True},
            {"name": "compiled", "mountPath": COMPILED_DIR},
            *([{"name": "model", "mountPath": MODEL_DIR, "readOnly": True}] if compile_fetches_model(model) else []),
            *_scratch_mounts(),
        ],
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {
            # A compile is deterministic: one retry covers a flaky node, more only waste time.
            # Evictions and preemptions do not count against it, so the deadline bounds them:
            # past it the Job fails (DeadlineExceeded) and status says Compiled=False.
            "backoffLimit": 1,
            "activeDeadlineSeconds": model.spec.compile.timeout_seconds,
            "podFailurePolicy": {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]},
            "template": {
                "metadata": {"labels": labels(model, "compile")},
                "spec": {
                    # Compiling needs no Neuron device: it runs on ordinary nodes. Nor
                    # does it need the API: no ServiceAccount token is mounted.
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    **service_account(model),
                    # The model's own placement for compiles alone: no Neuron device, so no
                    # Neuron toleration unless it lists one.
                    **pod_placement(model.spec.compile.placement),
                    "securityContext": pod_security(model),
                    "initContainers": [*([fetch_model_container(model)] if compile_fetches_model(model) else []), compile_step],
                    "containers": [upload_container(model)],
                    "volumes": [
                        _plan_volume(model),
                        artefact_volume(model),
                        *([_model_volume(model)] if compile_fetches_model(model) else []),
                        *_scratch_volumes(model, model.plan.sizes.compile_home_bytes or model.plan.sizes.home_bytes),
                    ],
                },
            },
        },
    }


def _serving_env(model: Model) -> list[dict[str, str]]:
    plan = model.plan
    env = {
        **SCRATCH_ENV,
        "INFERENTIA_MODEL_URI": model.spec.model.uri,
        "INFERENTIA_PLAN_FILE": PLAN_FILE,
        "INFERENTIA_PROCESSES": str(plan.groups),
        "INFERENTIA_GROUP_SIZE": str(plan.group_size),
        "INFERENTIA_BASE_PORT": str(process_base_port(model)),
        "INFERENTIA_THREADS": str(plan.threads_per_process),
        # Frameworks that compile at load time (torch-neuron, tensorflow-neuron) read this.
        "NEURON_CC_FLAGS": " ".join(plan.compiler_args),
    }
    if model.spec.compile.image:
        env["INFERENTIA_COMPILED_MODEL_URI"] = compiled_uri(model)
        env["INFERENTIA_COMPILED_MODEL_DIR"] = COMPILED_DIR
    elif model.spec.serves_with_program:
        # No compile step: the operator's model server traces the model at start.
        env["INFERENTIA_MODEL_PATH"] = model_path(model)
    if plan.groups == 1:
        # One process: the container's own environment is its group's, but never its cores.
        # The device plugin sets NEURON_RT_VISIBLE_CORES to the cores of the devices it
        # granted (a pod granted /dev/neuron1 sees 2,3: the Neuron scheduler extension's flow,
        # https://awsdocs-neuron.readthedocs-hosted.com/en/latest/containers/tutorials/k8s-neuron-scheduler-flow.html),
        # and a literal value in the pod spec would win over it. The launcher falls back to the
        # planned range only where no device plugin set the variable.
        env |= {k: v for k, v in plan.env[0].items() if k != "NEURON_RT_VISIBLE_CORES"}
    if model.spec.serving.batching:
        env["INFERENTIA_MAX_BATCH_SIZE"] = str(model.spec.serving.batching.max_batch_size)
        env["INFERENTIA_MAX_LATENCY_MS"] = str(model.spec.serving.batching.max_latency_ms)
    if vllm_plugin(model):
        if model.spec.compile.image:
            # The plugin's local cache, as the compile Job filled it and the fetch init container copied it.
            env |= {"VLLM_CACHE_ROOT": COMPILED_DIR, **VLLM_PRECOMPILED_ENV}
    elif model.spec.serving.runtime == "vllm":
        env |= VLLM_ENV
        if model.plan.nodes:
            env |= multi_node_env(model)
        if model.spec.compile.image:
            # A local directory, as vLLM's Neuron loader reads it: the fetch init container filled it.
            env |= {"NEURON_COMPILED_ARTIFACTS": COMPILED_DIR, **VLLM_PRECOMPILED_ENV}
    if keeps_hub_snapshot(model.spec):
        # The model id resolves to the commit the compile read, from the artefact's copy; the
        # Hub is never asked ("HF_HUB_OFFLINE", huggingface_hub's environment variables).
        env |= {"HF_HUB_CACHE": HUB_CACHE_DIR, "HF_HUB_OFFLINE": "1"}
    return _with_user_env(model, env)


def _with_user_env(model: Model, planned: dict[str, str]) -> list[dict[str, Any]]:
    """The planned variables, then spec.serving.env as the API takes them (value or
    valueFrom), which wins for the same name. The operator never reads a Secret, so a
    secret's value is never in the model, the plan, a log or an event."""
    user = [e.model_dump(by_alias=True, exclude_none=True) for e in model.spec.serving.env or []]
    return [{"name": k, "value": v} for k, v in planned.items() if k not in user_env_names(model)] + user


def _user_env_from(model: Model) -> dict[str, Any]:
    sources = model.spec.serving.env_from
    return {"envFrom": [s.model_dump(by_alias=True, exclude_none=True) for s in sources]} if sources else {}


def vllm_args(model: Model) -> list[str]:
    """One vLLM server per group, tensor parallel over the group's cores, on the process's PORT.

    vLLM counts --tensor-parallel-size in logical cores, as the plan does. The model is
    spec.model.uri (vLLM reads its configuration and tokenizer there); with a compile Job,
    NEURON_COMPILED_ARTIFACTS (NxD Inference) or VLLM_CACHE_ROOT (the plugin) makes it load
    the compiled model instead of compiling.
    sh -c receives the flags as separate arguments ("$@"), never as text to parse."""
    server = " ".join(VLLM_SERVER)
    return ["/bin/sh", "-c", f'exec {server} --port "$PORT" "$@"', "vllm", *_vllm_flags(model)]


def _vllm_flags(model: Model) -> list[str]:
    """The engine arguments as vLLM's flags, then serving.args: each a separate argument. A
    boolean is vLLM's --x or --no-x (its BooleanOptionalAction flags)."""
    flags = []
    for name, value in vllm_engine_args(model).items():
        flag = f"--{name.replace('_', '-')}"
        flags += ([flag] if value else [f"--no-{flag[2:]}"]) if isinstance(value, bool) else [flag, str(value)]
    return [*flags, *(model.spec.serving.args or [])]


# Across nodes (spec.compute.nodes, catalogue.MULTI_NODE_FAMILIES for the sources): what vLLM's
# multi-node launcher for Neuron sets in every rank's environment, and the EFA settings its
# mpirun passes on.
EFA_ENV = {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_FORK_SAFE": "1"}


def multi_node_env(model: Model) -> dict[str, str]:
    """The same on every pod of a group: the rank and the leader's address are each pod's own
    (LeaderWorkerSet's LWS_WORKER_INDEX and LWS_LEADER_ADDRESS), read by multi_node_command."""
    assert model.plan.nodes is not None
    return {
        "ENABLE_NEURON_MULTI_NODE": "true",
        "WORLD_SIZE": str(model.plan.nodes),  # the launcher's: its processes, one a node
        "NEURON_LOCAL_TP": str(model.plan.group_size),
        **EFA_ENV,
    }


def multi_node_command(model: Model) -> list[str]:
    """What each pod of a group runs, as vLLM's launcher runs each rank: its rank and the root
    communicator from LeaderWorkerSet's environment, the override config with its first rank
    (start_rank_id = rank times the node's ranks); rank 0 serves vLLM's OpenAI-compatible API
    on $PORT, every other rank runs the worker program. The engine flags follow as "$@"."""
    assert model.plan.nodes is not None and model.plan.tensor_parallel_size is not None
    local = model.plan.group_size
    config = json.dumps(
        {"world_size": model.plan.tensor_parallel_size, "tp_degree": local, "local_ranks_size": local}, separators=(",", ":")
    )
    script = (
        'rank="${LWS_WORKER_INDEX:?is set by LeaderWorkerSet on every pod of a group}"\n'
        'export NEURON_RANK_ID="$rank" '
        f'NEURON_RT_ROOT_COMM_ID="${{LWS_LEADER_ADDRESS:?is set by LeaderWorkerSet on every pod of a group}}:{ROOT_COMM_PORT}"\n'
        f"config='{config[:-1]},\"start_rank_id\":'\"$((rank * {local}))\"'}}'\n"
        f'if [ "$rank" = 0 ]; then exec {" ".join(VLLM_SERVER)} --port "$PORT" --override-neuron-config "$config" "$@"; fi\n'
        f'exec python3 "${{INFERENTIA_PLAN_DIR:-{PLAN_MOUNT}}}/{VLLM_WORKER_PROGRAM}" --override-neuron-config "$config" "$@"\n'
    )
    return ["/bin/sh", "-c", script, "vllm", *_vllm_flags(model)]


def _startup_probe(model: Model, check: dict[str, Any]) -> dict[str, Any]:
    """Asked every STARTUP_PROBE_SECONDS, for as long as the plan says a start may take (loading,
    a download, a compile at start): the liveness probe takes over only after it."""
    budget = model.plan.sizes.startup_seconds
    return {**check, "periodSeconds": STARTUP_PROBE_SECONDS, "failureThreshold": -(-budget // STARTUP_PROBE_SECONDS)}


def _probes(model: Model) -> dict[str, Any]:
    if model.spec.serving.runtime == "vllm":
        # vLLM's OpenAI-compatible server answers /health once the model is loaded.
        health: dict[str, Any] = {"httpGet": {"path": "/health", "port": "serve-0"}}
    elif model.spec.serves_with_program:
        # The operator's server answers /healthz once its artefacts are loaded onto the cores
        # (or, without a compile step, traced).
        health = {"httpGet": {"path": "/healthz", "port": "serve-0"}}
    else:
        # A custom server says nothing of its health: it is up once it accepts connections.
        health = {"tcpSocket": {"port": "serve-0"}}
    return {
        "startupProbe": _startup_probe(model, health),
        "readinessProbe": {**health, "periodSeconds": 5},
        "livenessProbe": {**health, "periodSeconds": 10, "failureThreshold": 6},
    }


def batching_front_end(model: Model) -> bool:
    """The plan says whether a batching front end runs beside the model processes."""
    return model.plan.front_end is not None


def process_base_port(model: Model) -> int:
    """Process i listens on this + i: the serving port, or the plan's when the batching
    front end takes the serving port."""
    return model.plan.front_end.process_base_port if model.plan.front_end else model.spec.serving.port


# The front end's own share of the pod: an asyncio process that forwards JSON.
BATCHER_RESOURCES = {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}}


# A pod being deleted is taken out of its Service's endpoints at the same time as its
# containers are told to stop; the endpoints controller and every node's kube-proxy take a
# moment to stop sending it new connections. A preStop sleep keeps each container serving
# for that moment (the Kubernetes docs' "Pod termination" flow; the sleep action is GA
# since Kubernetes 1.34), and only then does SIGTERM start the graceful stop.
DRAIN_SECONDS = 5
# The longest request a process may hold when no batching budget bounds it.
UNBOUNDED_REQUEST_SECONDS = 30


def longest_request_seconds(model: Model) -> int:
    """With the batching front end, a request is answered within maxLatencyMs or refused."""
    front = model.plan.front_end
    return math.ceil(front.max_latency_ms / 1000) + 1 if front else UNBOUNDED_REQUEST_SECONDS


def termination_grace_seconds(model: Model) -> int:
    """The drain, the longest request, and ten seconds for the processes to exit."""
    return DRAIN_SECONDS + longest_request_seconds(model) + 10


def _pre_stop_sleep(seconds: int) -> dict[str, Any]:
    return {"preStop": {"sleep": {"seconds": seconds}}}


def _own_server_probes(port: str) -> dict[str, Any]:
    """The probes of a server of the operator's own (the batching front end, the holder):
    /readyz and /healthz on the named port."""
    http = {"port": port, "scheme": "HTTP"}
    return {
        "readinessProbe": {"httpGet": {"path": "/readyz", **http}, "periodSeconds": 5},
        "livenessProbe": {"httpGet": {"path": "/healthz", **http}, "periodSeconds": 10, "failureThreshold": 6},
    }


def batcher_container(model: Model) -> dict[str, Any]:
    front, batching = model.plan.front_end, model.spec.serving.batching
    assert front is not None and batching is not None
    args = [
        "batch", "--port", str(front.port),
        "--processes", str(model.plan.groups), "--process-base-port", str(front.process_base_port),
        "--max-batch-size", str(front.max_batch_size), "--max-latency-ms", str(front.max_latency_ms),
    ]  # fmt: skip
    if model.plan.buckets:
        args += ["--buckets", json.dumps(model.plan.buckets)]
    return {
        "name": "batcher",
        "image": batching.image or model.operator_image,
        "args": args,
        "ports": [{"name": "batch", "containerPort": front.port, "protocol": "TCP"}],
        "resources": BATCHER_RESOURCES,
        # Ready only when every model process answers: the pod's readiness is the front end's.
        **_own_server_probes("batch"),
        "securityContext": CONTAINER_SECURITY,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        # Serve through the drain; then SIGTERM: stop listening, answer what it holds, exit.
        "lifecycle": _pre_stop_sleep(DRAIN_SECONDS),
    }


def scrape_annotations(model: Model) -> dict[str, str]:
    """Where Prometheus finds the pod's request gauges: the batching front end's
    inferentia_num_requests_waiting and _running on its one port, or vLLM's
    vllm:num_requests_waiting and _running on every process's port (each vLLM process serves
    its own /metrics, and the ScaledObject's target is the whole replica's). The
    prometheus.io annotations, which Prometheus's example Kubernetes configuration relabels
    on, name one port, the first; the metrics-port annotation names them all (SCRAPED_PORTS)."""
    if model.plan.front_end is not None:  # batching_front_end(m)
        return _scraped_at(model.plan.front_end.port, "batch")
    if model.spec.serving.runtime == "vllm":
        return _scraped_at(process_base_port(model), EVERY_PROCESS)
    return {}


# Which container ports serve the pod's /metrics, by name: the batching front end's "batch"
# (the model processes behind it listen on serve-<i> too), the holder's first port, or with
# EVERY_PROCESS each vLLM process's serve-<i>.
METRICS_PORT_ANNOTATION = "inferentia.dev/metrics-port"
EVERY_PROCESS = "serve"
# What Prometheus keeps of a pod's per-port targets (kubernetes_sd's pod role makes one for
# each declared port): "<metrics-port annotation>;<container port name>" must match it, as the
# chart's PodMonitor and docs/autoscaling.md's scrape configuration relabel. RE2 has no
# back-reference, so the pairs are listed: the annotation's single names, and serve for all.
SCRAPED_PORTS = "batch;batch|serve-0;serve-0|serve;serve-[0-9]+"


def scrape_relabelings(meta: str = "__meta_kubernetes_pod_") -> list[dict[str, Any]]:
    """The relabelling that keeps the ports a pod's metrics-port annotation names, as Prometheus's
    relabel_configs (the local cluster's Prometheus and docs/autoscaling.md take it)."""
    return [
        {"source_labels": [f"{meta}annotation_prometheus_io_scrape"], "action": "keep", "regex": "true"},
        {
            "source_labels": [f"{meta}annotation_inferentia_dev_metrics_port", f"{meta}container_port_name"],
            "action": "keep",
            "regex": SCRAPED_PORTS,
        },
        {
            "source_labels": [f"{meta}annotation_prometheus_io_path"],
            "action": "replace",
            "target_label": "__metrics_path__",
            "regex": "(.+)",
        },
    ]


def _scraped_at(port: int, port_name: str) -> dict[str, str]:
    return {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(port),
        "prometheus.io/path": "/metrics",
        METRICS_PORT_ANNOTATION: port_name,
    }


def serving_args(model: Model) -> list[str] | None:
    """What the launcher runs once per process: vLLM's server, the operator's model server, or
    serving.args; None when the image's own entry point runs once (no launcher)."""
    if model.spec.serving.runtime == "vllm":
        return multi_node_command(model) if model.plan.nodes else vllm_args(model)
    if model.spec.serves_with_program:
        return ["python3", f"{PLAN_MOUNT}/{SERVE_PROGRAM}"]
    return model.spec.serving.args


def serving_init_containers(model: Model) -> list[dict[str, Any]]:
    """The compiled artefact, or (no compile step, the operator's server) the model, fetched first."""
    if model.spec.compile.image:
        return [fetch_container(model), *([_serving_fetch_model(model)] if serving_fetches_model(model) else [])]
    return [_serving_fetch_model(model)] if serving_fetches_model(model) else []


def _serving_fetch_model(model: Model) -> dict[str, Any]:
    container = fetch_model_container(model)
    if model.node_cache_url:
        # Only on serving pods, which run where the node cache's DaemonSet does: a compile Job
        # may run on any node. A model with a marker (its weights, its configuration and
        # tokenizer beside a compiled artefact) is read through it, each file checked.
        _through_node_cache(model, container)
    return container


def fetched_uris(model: Model) -> list[str]:
    """What a serving pod fetches from the store (and so what the node cache may hold for it):
    the compiled artefact, and the model itself when the serving pod reads it too."""
    return [*([compiled_uri(model)] if model.spec.compile.image else []), *([model.spec.model.uri] if serving_fetches_model(model) else [])]


# The pod's claim on its Neuron devices, with allocation dra.
CLAIM = "neurons"


def claim_template_name(model: Model) -> str:
    """Named after its content: a ResourceClaimTemplate's spec cannot change, so a new plan
    makes a new one, and the pods of the previous plan keep the claims already made from theirs."""
    return f"{model.name}-neurons-{stable_hash(_claim_spec(model), 6)}"


def _claim_spec(model: Model) -> dict[str, Any]:
    """The claim each replica makes, as AWS's templates for the Neuron DRA driver write it
    (catalogue.DRA_DRIVER): ExactCount of the class's devices, on the plan's instance types,
    from one connected-device group when there are several, with the LNC as NeuronConfig."""
    plan = model.plan
    types = ", ".join(f"'{t}'" for t in plan.instance_types)
    devices: dict[str, Any] = {
        "requests": [
            {
                "name": CLAIM,
                "exactly": {
                    "deviceClassName": DRA_DRIVER,
                    "allocationMode": "ExactCount",
                    "count": plan.chips or 0,
                    "selectors": [{"cel": {"expression": f"device.attributes['{DRA_DRIVER}'].instanceType in [{types}]"}}],
                },
            }
        ]
    }
    if plan.connected_devices:
        devices["constraints"] = [{"requests": [CLAIM], "matchAttribute": DRA_GROUP_ATTRIBUTE.format(plan.connected_devices)}]
    if plan.lnc is not None and len(FAMILIES[plan.family].lnc_values) > 1:
        parameters = {"apiVersion": DRA_CONFIG_API_VERSION, "kind": "NeuronConfig", "logicalNeuronCore": plan.lnc}
        devices["config"] = [{"requests": [CLAIM], "opaque": {"driver": DRA_DRIVER, "parameters": parameters}}]
    return {"devices": devices}


def resource_claim_template(model: Model) -> dict[str, Any] | None:
    """With allocation dra, the template each serving pod's claim is made from; else None."""
    if model.plan.allocation != "dra":
        return None
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": child_metadata(model, claim_template_name(model), "serving"),
        "spec": {"spec": _claim_spec(model)},
    }


def _instance_type_affinity(model: Model) -> dict[str, Any]:
    """Nodes of the planned instance types. With dra, the claim's selector on the devices'
    instanceType says it instead, as AWS's templates do."""
    term = {"matchExpressions": [{"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": model.plan.instance_types}]}
    return {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}


# Below the spread of a model's replicas over nodes (weight 100): a replica goes first where no
# other of its model runs, then, among those, where the artefact is already on the node.
ARTEFACT_AFFINITY_WEIGHT = 50


def _artefact_affinity(model: Model) -> dict[str, Any]:
    """With the node cache, a preference (never a requirement) for nodes whose cache pod is
    labelled as holding what this model's pods fetch (core/holds.py): there the fetch reads
    the node's disk, not the store. Nothing else changes in the template as caches fill and
    empty, so nothing rolls."""
    uris = fetched_uris(model)
    if not (model.node_cache_url and model.node_cache_namespace and uris):
        return {}
    # Split between what it fetches (artefact and weights), so that a node holding all of it
    # weighs what one holding the only one did, and one holding a part weighs less.
    weight = max(1, ARTEFACT_AFFINITY_WEIGHT // len(uris))
    terms = [
        {
            "weight": weight,
            "podAffinityTerm": {
                "topologyKey": "kubernetes.io/hostname",
                "namespaces": [model.node_cache_namespace],
                "labelSelector": {"matchExpressions": [{"key": hold_label(uri), "operator": "Exists"}]},
            },
        }
        for uri in uris
    ]
    return {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": terms}}


def together(name: str, topology_key: str) -> dict[str, Any]:
    """Every pod of a group on nodes that share the value of ``topology_key``: a required pod
    affinity to the pods of its own group, which matchLabelKeys picks by the placed pod's own
    group-key label (Kubernetes 1.33 and later; the group's first pod matches its own term, so
    it may go anywhere: https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/#matchlabelkeys).
    Not LWS's exclusive-topology annotation, which would also keep every other group out of
    the domain: a network node's instances may hold several groups."""
    return {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {
                "labelSelector": {"matchLabels": {GROUP_SET_LABEL: name}},
                "matchLabelKeys": [GROUP_KEY_LABEL],
                "topologyKey": topology_key,
            }
        ]
    }


# Neuron nodes carry this taint (AWS's EKS node groups and Karpenter NodePools for Neuron);
# serving pods tolerate it, whatever else the model's placement says.
NEURON_TOLERATION = {"key": NEURON_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}


def serving_affinity(model: Model, grouped: bool = False) -> dict[str, Any]:
    """The operator's own affinity for serving pods: nodes of the planned instance types (with
    dra, the claim says it), nodes that hold the artefact, and, for a Deployment's replicas,
    a node each. ``grouped``: the pods of a LeaderWorkerSet's groups, which take a node each
    by their chips, and keep a group within its topology domain (core/leaderworkerset.py)."""
    affinity: dict[str, Any] = {
        **({} if model.plan.allocation == "dra" else {"nodeAffinity": _instance_type_affinity(model)}),
        **_artefact_affinity(model),
    }
    if grouped:
        if model.spec.compute.topology_key:
            # Groups are placed whole, one pod a node: each pod takes every chip of its node, so
            # the Deployment's preference to spread replicas over nodes has nothing left to choose.
            affinity["podAffinity"] = {**affinity.get("podAffinity", {}), **together(model.name, model.spec.compute.topology_key)}
        return affinity
    term = {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": selector(model)}}
    affinity["podAntiAffinity"] = {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": term}]}
    return affinity


def serving_deployment(model: Model, replicas: int | None = None, grouped: bool = False) -> dict[str, Any]:
    """The serving Deployment, with ``replicas`` (default: what the spec alone gives, for
    a model that autoscales minReplicas, as before its ScaledObject exists); ``grouped``: its
    template is for a LeaderWorkerSet's groups (core/leaderworkerset.py)."""
    plan, spec = model.plan, model.spec
    dra = plan.allocation == "dra"  # devices from a resource claim, not the device plugin
    base = process_base_port(model)
    ports = [{"name": f"serve-{i}", "containerPort": base + i, "protocol": "TCP"} for i in range(plan.groups)]
    container: dict[str, Any] = {
        "name": "serve",
        "image": spec.serving.image,
        **_user_env_from(model),
        "env": _serving_env(model),
        "ports": ports,
        "resources": {**plan.resources.model_dump(), **({"claims": [{"name": CLAIM}]} if dra else {})},
        **_probes(model),
        "securityContext": {**CONTAINER_SECURITY, "readOnlyRootFilesystem": spec.serving.read_only_root_filesystem},
        # The launcher's last words ("serving process 41 exited with 137; stopping the others")
        # become the termination message, which the model's status quotes.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        # Behind the front end, the processes outlive its drain and the requests it holds;
        # alone, they drain as it would, then the launcher passes SIGTERM on to each.
        "lifecycle": _pre_stop_sleep(DRAIN_SECONDS + (longest_request_seconds(model) if batching_front_end(model) else 0)),
        "volumeMounts": [
            {"name": "plan", "mountPath": PLAN_MOUNT, "readOnly": True},
            *_scratch_mounts(),
            # The plugin takes file locks in its cache, even to read it: writable for it alone.
            # (No readOnly: false: the API server drops a false readOnly, and a field it drops
            # would read as drift on every reconcile.)
            *(
                [{"name": "compiled", "mountPath": COMPILED_DIR, **({} if vllm_plugin(model) else {"readOnly": True})}]
                if spec.compile.image
                else []
            ),
            *([{"name": "model", "mountPath": MODEL_DIR, "readOnly": True}] if serving_fetches_model(model) else []),
            # What fetch linked to instead of copying, at the paths its links name.
            *node_view_mounts(model),
        ],
    }
    args = serving_args(model)
    if args:
        # One process per NeuronCore Group, each started with its group's environment.
        container["command"] = ["/bin/sh", f"{PLAN_MOUNT}/launch.sh"]
        container["args"] = list(args)
    template_labels = {**labels(model, "serving"), TRAFFIC_LABEL: TRAFFIC_ON}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": child_metadata(model, model.name, "serving"),
        "spec": {
            "replicas": desired_replicas(spec, scaled=False) if replicas is None else replicas,
            "selector": {"matchLabels": selector(model)},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": spec.rollout.max_surge, "maxUnavailable": spec.rollout.max_unavailable},
            },
            "template": {
                "metadata": {
                    "labels": template_labels,
                    "annotations": {PLAN_HASH_ANNOTATION: plan_hash(plan), **scrape_annotations(model)},
                },
                "spec": {
                    # A model server has no business with the Kubernetes API.
                    "automountServiceAccountToken": False,
                    # On EKS the Neuron scheduler extension places multi-device requests only
                    # through a second scheduler the pod names
                    # (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/containers/tutorials/k8s-multiple-scheduler.html);
                    # a DRA claim needs no extension.
                    **({"schedulerName": model.scheduler_name} if model.scheduler_name and not dra else {}),
                    "terminationGracePeriodSeconds": termination_grace_seconds(model),
                    **service_account(model),
                    "securityContext": pod_security(model),
                    **({"initContainers": init} if (init := serving_init_containers(model)) else {}),
                    "containers": [container, *([batcher_container(model)] if batching_front_end(model) else [])],
                    "volumes": [
                        _plan_volume(model),
                        *_scratch_volumes(model, plan.sizes.home_bytes),
                        *([artefact_volume(model)] if spec.compile.image else []),
                        *([_model_volume(model)] if serving_fetches_model(model) else []),
                        *node_cache_token_volumes(model),
                        *node_view_volumes(model),
                    ],
                    **({"resourceClaims": [{"name": CLAIM, "resourceClaimTemplateName": claim_template_name(model)}]} if dra else {}),
                    **pod_placement(model.spec.placement, tolerations=(NEURON_TOLERATION,), affinity=serving_affinity(model, grouped)),
                },
            },
        },
    }


def disruption_budget(model: Model, replicas: int | None = None) -> dict[str, Any]:
    """The model's PodDisruptionBudget over its serving pods. Pods that are not ready may always
    be evicted (AlwaysAllow: https://kubernetes.io/docs/tasks/run-application/configure-pdb/#unhealthy-pod-eviction-policy),
    so a model that does not serve never blocks a node's drain.

    The budget counts pods. A replica that spans nodes is a group that LeaderWorkerSet makes
    again whole when one of its pods goes, and its other pods then count as unavailable until
    it is back: so a whole number of replicas is that many pods (each eviction takes its whole
    group), and a percentage is taken of the ``replicas`` groups (default: what the spec alone
    gives) and rounded up, as Kubernetes rounds a maxUnavailable percentage."""
    most = model.spec.disruption_budget.max_unavailable
    if model.plan.nodes and isinstance(most, str):
        groups = desired_replicas(model.spec, scaled=False) if replicas is None else replicas
        most = math.ceil(int(most.rstrip("%")) * groups / 100)
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": child_metadata(model, model.name, "serving"),
        "spec": {
            "maxUnavailable": most,
            "selector": {"matchLabels": selector(model)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def scaled_object(model: Model, prometheus: Prometheus, has_artefact: bool = True, push: bool = True) -> dict[str, Any]:
    """The KEDA ScaledObject of a model with spec.autoscaling (:mod:`autoscaling`); with ``push``,
    a model that scales to zero also has its holder's external scaler as a push trigger."""
    return autoscaling_object(
        model.spec, model.namespace, model.name, child_metadata(model, model.name, "autoscaling"), prometheus, has_artefact,
        push_address=holder_scaler_address(model) if push and scales_to_zero(model.spec) else None,
    )  # fmt: skip


def _service_ports(model: Model) -> list[dict[str, Any]]:
    """The model's doors: the batching front end's port where it runs (its processes' ports are
    for it alone, on the pod's loopback), else each process's."""
    if batching_front_end(model):
        return [{"name": "batch", "port": model.spec.serving.port, "targetPort": "batch", "protocol": "TCP"}]
    base = process_base_port(model)
    return [{"name": f"serve-{i}", "port": base + i, "targetPort": f"serve-{i}", "protocol": "TCP"} for i in range(model.plan.groups)]


def serving_policy_name(model: Model) -> str:
    """Not the model's bare name, which a namespace's own NetworkPolicy may well have."""
    return model.name + "-front-end"


def serving_network_policy(model: Model) -> dict[str, Any] | None:
    """Behind a batching front end, its port alone admits other pods: a NetworkPolicy over the
    serving pods, so that no client skips the front end's limits for a model process's, where
    the cluster enforces NetworkPolicies. The node's own traffic (the kubelet's probes of the
    processes) is always allowed
    (https://kubernetes.io/docs/concepts/services-networking/network-policies/); policies add
    up, so a namespace's own can admit more. None without a front end: the processes are the doors."""
    if not batching_front_end(model):
        return None
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": child_metadata(model, serving_policy_name(model), "serving"),
        "spec": {
            "podSelector": {"matchLabels": selector(model)},
            "policyTypes": ["Ingress"],
            "ingress": [{"ports": [{"port": p["port"], "protocol": "TCP"} for p in _service_ports(model)]}],
        },
    }


def service(model: Model, to_holder: bool = False) -> dict[str, Any]:
    """The model's Service: its serving pods, or, while a model that scales to zero has no
    replica that answers, its holder (the same port names, so clients see no change)."""
    return _service(model, model.name, holder_selector(model) if to_holder else answering_selector(model))


def _service(model: Model, name: str, target: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_metadata(model, name, "serving"),
        "spec": {"selector": target, "ports": _service_ports(model)},
    }


# Scale to zero (autoscaling.minReplicas 0): the holder, and the Service it forwards through.
HOLDER_SUFFIX = "-holder"
REPLICAS_SUFFIX = "-replicas"


def holder_selector(model: Model) -> dict[str, str]:
    return {MODEL_LABEL: model.name, COMPONENT_LABEL: "holder"}


# The holder's port for KEDA's external scaler API (gRPC's customary port), or the first above it
# that none of the model's serving ports takes.
SCALER_PORT = 50051


def holder_scaler_port(model: Model) -> int:
    taken = {p["port"] for p in _service_ports(model)}
    return next(port for port in range(SCALER_PORT, SCALER_PORT + len(taken) + 1) if port not in taken)


def holder_service(model: Model) -> dict[str, Any]:
    """The holder's external scaler API, for the ScaledObject's external-push trigger."""
    port = holder_scaler_port(model)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_metadata(model, model.name + HOLDER_SUFFIX, "holder"),
        "spec": {
            "selector": holder_selector(model),
            "ports": [{"name": "scaler", "port": port, "targetPort": "scaler", "protocol": "TCP"}],
        },
    }


def holder_network_policy(model: Model) -> dict[str, Any] | None:
    """Who may reach the holder's pods: anyone its serving ports (the model's clients, through
    its Service, and Prometheus), and only KEDA, by its namespace, the external scaler port, which
    tells whoever listens when another client's request is held. Where the cluster's network
    enforces NetworkPolicies (https://kubernetes.io/docs/concepts/services-networking/network-policies/);
    elsewhere the scaler's own bounds are what holds (batching/scaler.py). The node's own
    traffic, the kubelet's probes among it, is always allowed."""
    if not model.keda_namespace:
        return None
    keda = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": model.keda_namespace}}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": child_metadata(model, model.name + HOLDER_SUFFIX, "holder"),
        "spec": {
            "podSelector": {"matchLabels": holder_selector(model)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"ports": [{"port": p["port"], "protocol": "TCP"} for p in _service_ports(model)]},
                {"from": [keda], "ports": [{"port": holder_scaler_port(model), "protocol": "TCP"}]},
            ],
        },
    }


def holder_scaler_address(model: Model) -> str:
    """The holder Service's name in the cluster's DNS, from any namespace (``<service>.<namespace>.svc``
    resolves through the search path every pod gets, whatever the cluster domain)."""
    return f"{model.name}{HOLDER_SUFFIX}.{model.namespace}.svc:{holder_scaler_port(model)}"


def replicas_service(model: Model) -> dict[str, Any]:
    """The serving pods alone, whatever the model's Service points at: what the holder forwards to."""
    return _service(model, model.name + REPLICAS_SUFFIX, traffic_selector(model))


def parked_holder(model: Model) -> dict[str, Any]:
    """The holder of a model that no longer scales to zero, at no replica. Whole: a server-side
    apply of replicas alone would remove the selector and template the operator applied before
    (fields its apply no longer names), which a Deployment cannot be without (422). Built from
    the model as it is now; at no replica, a changed template starts no pod."""
    spec = model.spec
    if spec.autoscaling is None or (spec.serving.batching is None and spec.autoscaling.target_in_flight is None):
        spec = spec.model_copy(update={"autoscaling": api.Autoscaling(min_replicas=0, max_replicas=1, target_in_flight=1)})
    body = holder_deployment(replace(model, spec=spec))
    body["spec"]["replicas"] = 0
    return body


def holder_deployment(model: Model) -> dict[str, Any]:
    """The holder of a model that scales to zero (batching/holder.py), on no Neuron device.
    It forwards to the replicas Service, which it finds by name (batching/holder.py,
    ``upstream_host``): no address of a live cluster is in it, so ``render`` prints it as applied."""
    a = model.spec.autoscaling
    assert a is not None
    ports = _service_ports(model)
    listen = ",".join(str(p["port"]) for p in ports)
    container = {
        "name": "hold",
        "image": model.operator_image,
        "args": [
            "hold",
            "--upstream-service",
            model.name + REPLICAS_SUFFIX,
            "--ports",
            listen,
            "--hold-seconds",
            str(a.hold_seconds),
            "--max-held",
            str(a.max_held_requests),
            # KEDA's external scaler API: a held request reaches KEDA at once (issue 41).
            "--scaler-port",
            str(holder_scaler_port(model)),
            "--target",
            str(target_in_flight(model.spec)),
        ],  # fmt: skip
        # The Service's target port names, so that it reaches the holder as it reaches a replica.
        "ports": [
            *({"name": p["targetPort"], "containerPort": p["port"], "protocol": "TCP"} for p in ports),
            {"name": "scaler", "containerPort": holder_scaler_port(model), "protocol": "TCP"},
        ],
        "resources": BATCHER_RESOURCES,
        **_own_server_probes(ports[0]["targetPort"]),
        "securityContext": CONTAINER_SECURITY,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": child_metadata(model, model.name + HOLDER_SUFFIX, "holder"),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": holder_selector(model)},
            "template": {
                "metadata": {
                    "labels": labels(model, "holder"),
                    # Prometheus reads the requests it holds: the model's ScaledObject sums them.
                    "annotations": _scraped_at(ports[0]["port"], ports[0]["targetPort"]),
                },
                "spec": {
                    "automountServiceAccountToken": False,
                    # Held requests are answered, or end at the hold, before the holder exits.
                    "terminationGracePeriodSeconds": a.hold_seconds + 10,
                    # The operator's own image: non-root whatever the model's runAsRoot says.
                    "securityContext": non_root_pod_security(),
                    "containers": [container],
                    **pod_placement(a.holder_placement),
                },
            },
        },
    }
