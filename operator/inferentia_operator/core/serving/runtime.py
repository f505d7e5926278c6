"""What each serving process runs: vLLM's server (a replica's ranks across nodes too), the
operator's model server, or serving.args; what the launcher and its processes read, how each
is known to be up, and where Prometheus reads vLLM's gauges."""

from __future__ import annotations

import json
from typing import Any

from inferentia_operator.core.catalogue import ROOT_COMM_PORT
from inferentia_operator.core.names import PLAN_FILE, PLAN_MOUNT
from inferentia_operator.core.pod.contribution import NOTHING, PodContribution
from inferentia_operator.core.pod.dirs import COMPILED_DIR
from inferentia_operator.core.pod.model import Model, vllm_plugin
from inferentia_operator.core.pod.ports import EVERY_PROCESS, process_base_port, scraped_at
from inferentia_operator.core.pod.vllm import VLLM_ENV, VLLM_PRECOMPILED_ENV, VLLM_SERVER, vllm_engine_args
from inferentia_operator.programs import SERVE_PROGRAM, VLLM_WORKER_PROGRAM


def processes(model: Model) -> PodContribution:
    """What the launcher and every process read: the model, the plan, how many processes of
    how many cores, the first one's port, their threads and the compiler's flags."""
    plan = model.plan
    return PodContribution(
        env={
            "INFERENTIA_MODEL_URI": model.spec.model.uri,
            "INFERENTIA_PLAN_FILE": PLAN_FILE,
            "INFERENTIA_PROCESSES": str(plan.groups),
            "INFERENTIA_GROUP_SIZE": str(plan.group_size),
            "INFERENTIA_BASE_PORT": str(process_base_port(model)),
            "INFERENTIA_THREADS": str(plan.threads_per_process),
            # Frameworks that compile at load time (torch-neuron, tensorflow-neuron) read this.
            "NEURON_CC_FLAGS": " ".join(plan.compiler_args),
        }
    )


def lone_process(model: Model) -> PodContribution:
    """A container of one process has its group's environment as its own."""
    if model.plan.groups != 1:
        return NOTHING
    # One process: the container's own environment is its group's, but never its cores.
    # The device plugin sets NEURON_RT_VISIBLE_CORES to the cores of the devices it
    # granted (a pod granted /dev/neuron1 sees 2,3: the Neuron scheduler extension's flow,
    # https://awsdocs-neuron.readthedocs-hosted.com/en/latest/containers/tutorials/k8s-neuron-scheduler-flow.html),
    # and a literal value in the pod spec would win over it. The launcher falls back to the
    # planned range only where no device plugin set the variable.
    return PodContribution(env={k: v for k, v in model.plan.env[0].items() if k != "NEURON_RT_VISIBLE_CORES"})


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
    boolean is vLLM's --x or --no-x (its BooleanOptionalAction flags); an object is JSON, as vLLM
    parses its config flags (--speculative-config '{"method": "eagle3", ...}')."""
    flags = []
    for name, value in vllm_engine_args(model).items():
        flag = f"--{name.replace('_', '-')}"
        if isinstance(value, dict):
            flags += [flag, json.dumps(value, separators=(",", ":"))]
            continue
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


def serving_args(model: Model) -> list[str] | None:
    """What the launcher runs once per process: vLLM's server, the operator's model server, or
    serving.args; None when the image's own entry point runs once (no launcher)."""
    if model.spec.serving.runtime == "vllm":
        return multi_node_command(model) if model.plan.nodes else vllm_args(model)
    if model.spec.serves_with_program:
        return ["python3", f"{PLAN_MOUNT}/{SERVE_PROGRAM}"]
    return model.spec.serving.args


def runtime(model: Model) -> PodContribution:
    """What each process runs, started by the launcher, the variables its runtime reads, how it
    is known to be up, and where Prometheus reads vLLM's gauges."""
    args = serving_args(model)
    return PodContribution(
        env=_vllm_env(model),
        annotations=_vllm_scrape_annotations(model),
        probes=_probes(model),
        # One process per NeuronCore Group, each started with its group's environment.
        command=("/bin/sh", f"{PLAN_MOUNT}/launch.sh") if args else (),
        args=tuple(args or ()),
    )


def _vllm_env(model: Model) -> dict[str, str]:
    env: dict[str, str] = {}
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
    return env


# How often a starting server is asked whether it is up: often, so that a start (from zero,
# or a scale-up) is seen ready within seconds of the model loading. How long it may take is
# the plan's (sizing.startup_seconds).
STARTUP_PROBE_SECONDS = 2


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


def _vllm_scrape_annotations(model: Model) -> dict[str, str]:
    """Where Prometheus finds the pod's request gauges with vLLM, where no batching front end
    answers for them (serving/front_end.py): vLLM's vllm:num_requests_waiting and _running on
    every process's port (each vLLM process serves its own /metrics, and the ScaledObject's
    target is the whole replica's)."""
    if model.spec.serving.runtime == "vllm" and model.plan.front_end is None:
        return scraped_at(process_base_port(model), EVERY_PROCESS)
    return {}
