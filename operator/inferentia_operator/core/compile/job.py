"""The compile Job of a plan, its pod composed from the contribution of each concern in a fixed order
(compile_pod), with the upload of its artefact; and the record of a completed compile."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from inferentia_operator.core.compile.program import compile_program, cpu_target, hub_snapshot, vllm_compile
from inferentia_operator.core.names import (
    COMPILE_HASH_LABEL,
    COMPILE_INPUTS_ANNOTATION,
    COMPILE_RECORD_COMPONENT,
    COMPONENT_LABEL,
    FIELD_MANAGER,
    MANAGED_BY_LABEL,
    MODEL_LABEL,
)
from inferentia_operator.core.objects import Obj
from inferentia_operator.core.placement import pod_placement
from inferentia_operator.core.pod.artefact import (
    compile_fetches_model,
    compile_hash,
    compile_id,
    compile_inputs,
    compile_job_name,
    compiled_uri,
)
from inferentia_operator.core.pod.containers import CONTAINER_SECURITY, SCRATCH_ENV, pod_security, user_env_from, with_user_env
from inferentia_operator.core.pod.contribution import NOTHING, PodContribution, combined, field_if_nonempty
from inferentia_operator.core.pod.dirs import COMPILED_DIR, MODEL_DIR
from inferentia_operator.core.pod.fetch import fetch_model_container, operator_container
from inferentia_operator.core.pod.meta import child_metadata, labels, service_account
from inferentia_operator.core.pod.model import Model, mounted_plan
from inferentia_operator.core.pod.volumes import artefact_volume, model_volume, scratch
from inferentia_operator.core.proof import PROOF_ANNOTATION, Prover


def compile_record_name(model: Model) -> str:
    return f"compiled-{compile_id(model)}"


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


def upload_container(model: Model) -> dict[str, Any]:
    """The compile Job's last step: upload the artefact, then its completion marker."""
    return operator_container(
        model,
        "upload",
        ["upload", "--from", COMPILED_DIR, "--to", compiled_uri(model)],
        [{"name": "compiled", "mountPath": COMPILED_DIR, "readOnly": True}],
    )


def compile_resources(model: Model) -> dict[str, dict[str, str]]:
    """What the compile Job requests, so that it is never BestEffort (the first pod evicted)
    and a node can be chosen for it: the plan's (sizing.compile_cpu, sizing.compile_memory)."""
    sizes = model.plan.sizes
    assert sizes.compile_cpu is not None and sizes.compile_memory is not None, "compile resources without a compile step"
    return {"requests": {"cpu": sizes.compile_cpu, "memory": sizes.compile_memory}, "limits": {"memory": sizes.compile_memory}}


def written_artefact(model: Model) -> PodContribution:
    """Where the compile step writes the artefact (writable, unlike a serving pod's copy), and
    the upload that follows it."""
    return PodContribution(
        mounts=({"name": "compiled", "mountPath": COMPILED_DIR},),
        volumes=(artefact_volume(model),),
        containers=(upload_container(model),),
    )


def fetched_model(model: Model) -> PodContribution:
    """A remote model the compile step reads (compile_fetches_model), fetched first."""
    if not compile_fetches_model(model):
        return NOTHING
    return PodContribution(
        mounts=({"name": "model", "mountPath": MODEL_DIR, "readOnly": True},),
        volumes=(model_volume(model),),
        init_containers=(fetch_model_container(model),),
    )


def compile_pod(model: Model) -> PodContribution:
    """Each concern's share of the compile Job's pod, combined in this order, as for the serving
    pod (serving/deployment.py): the compile step's environment and mounts, the volumes, the
    init containers before it and the containers after it hold the concerns' items in it."""
    sizes = model.plan.sizes
    return combined(
        (
            mounted_plan(model),  # the plan ConfigMap (pod/model.py)
            compile_program(model),  # what compiles, and what every compile step reads (compile/program.py)
            written_artefact(model),  # written, then uploaded
            fetched_model(model),  # a remote model, fetched first
            scratch(model, sizes.compile_home_bytes or sizes.home_bytes),  # HOME and /tmp (pod/volumes.py)
            cpu_target(model),  # the family a compile without a device targets (compile/program.py)
            vllm_compile(model),  # vLLM's compile step instead of the program (compile/program.py)
            hub_snapshot(model),  # a Hub model's snapshot, kept in the artefact (compile/program.py)
        )
    )


def compile_job(model: Model) -> dict[str, Any] | None:
    """The compile Job of this plan, or None when nothing is compiled ahead.

    Its pod runs three steps in order: the operator's image fetches the model (when it is
    remote), the compile container traces it in compile.image and writes the artefact to a
    shared emptyDir, and the operator's image uploads it, completion marker last. The
    compile step needs nothing of the operator's image and the upload nothing of the user's."""
    if not model.spec.compile.image:
        return None
    pod = compile_pod(model)
    metadata = child_metadata(model, compile_job_name(model), "compile")
    metadata["labels"][COMPILE_HASH_LABEL] = compile_hash(model)
    # What was compiled, so that status can say which part of the key a new compile changed.
    metadata["annotations"] = {COMPILE_INPUTS_ANNOTATION: json.dumps(compile_inputs(model), sort_keys=True, separators=(",", ":"))}
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
                    "initContainers": [*pod.init_containers, _compile_step(model, pod)],
                    "containers": list(pod.containers),
                    "volumes": list(pod.volumes),
                },
            },
        },
    }


def _compile_step(model: Model, pod: PodContribution) -> dict[str, Any]:
    return {
        "name": "compile",
        # The user's Neuron framework image: its python3, torch and torch-neuron(x) run the
        # operator's compile program from the plan; for the vLLM preset, its vLLM Neuron plugin
        # (trn2, trn3) or its NxD Inference (inf2, trn1) runs the operator's compile step for it.
        "command": list(pod.command),
        # Its arguments, where the contribution that gives the command gives any (none does today).
        **field_if_nonempty("args", list(pod.args)),
        "image": model.spec.compile.image,
        # The serving container's own variables and sources too (an HF_TOKEN for a gated
        # model, say): the compile reads the same model, and yours win over the planned ones.
        **user_env_from(model),
        # Scratch's variables first, as in the serving container.
        "env": with_user_env(model, {**SCRATCH_ENV, **pod.env}),
        "resources": compile_resources(model),
        "securityContext": CONTAINER_SECURITY,
        # The program's last words become the container's termination message, which status reports.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": list(pod.mounts),
    }
