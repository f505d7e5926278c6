"""Warnings only: allowed, but probably not what the user wants."""

from __future__ import annotations

from inferentia_operator.core.api import InferentiaModelSpec
from inferentia_operator.core.catalogue import Family
from inferentia_operator.core.cores import (
    divisors,
    group_size_of,
    lnc_of,
    replica_cores,
)
from inferentia_operator.core.findings import Finding, format_list


# Warnings only: allowed, but probably not what the user wants.
def _check_advice(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    p, group = spec.processes_per_replica, group_size_of(spec, fam)
    if group is None:
        return []
    cores, per_chip = replica_cores(spec, fam), fam.cores_per_chip(lnc_of(spec, fam))
    found = []
    if group < per_chip and per_chip % group or group > per_chip and group % per_chip:
        found.append(
            Finding(
                "spec.processesPerReplica",
                f"groups of {group} NeuronCores straddle chip boundaries ({per_chip} cores per chip); "
                f"values giving whole-chip or in-chip groups: "
                f"{format_list([d for d in divisors(cores) if (cores // d) % per_chip == 0 or per_chip % (cores // d) == 0])}",
                "warning",
            )
        )
    threads = spec.serving.threads_per_process
    if threads is not None and threads <= group:
        found.append(
            Finding(
                "spec.serving.threadsPerProcess",
                f"{threads} threads cannot keep a group of {group} NeuronCores busy; use more than {group}",
                "warning",
            )
        )
    batching = spec.serving.batching
    # vLLM batches sequences itself (--max-num-seqs); the compiled batch size is not its limit.
    if (
        batching
        and spec.serving.runtime != "vllm"
        and batching.max_batch_size > spec.compile.batch_size
        and not spec.compile.dynamic_batch_size
    ):
        found.append(
            Finding(
                "spec.serving.batching.maxBatchSize",
                f"{batching.max_batch_size} is larger than the compiled batch size {spec.compile.batch_size}; "
                "set spec.compile.dynamicBatchSize: true so the model accepts larger batches",
                "warning",
            )
        )
    if fam.neuronx and spec.serves_with_program and group > 1:
        # torch_neuronx.trace compiles a model for one NeuronCore; the operator's compile program
        # and model server trace with it, so a process's other cores would sit idle
        # (a traced model spans several cores only through torch_neuronx.DataParallel,
        # https://awsdocs-neuron.readthedocs-hosted.com/en/latest/frameworks/torch/torch-neuronx/api-reference-guide/inference/api-torch-neuronx-data-parallel.html).
        found.append(
            Finding(
                "spec.processesPerReplica",
                f"the operator's model server runs a model traced with torch_neuronx.trace, which compiles for one NeuronCore, "
                f"so each process uses 1 of its group's {group}; use processesPerReplica: {cores} to use every core, or the "
                "vLLM runtime or your own server (serving.args) for a model sharded over its group",
                "warning",
            )
        )
    if spec.compile.optimize_for == "throughput" and group > 1:
        found.append(
            Finding(
                "spec.processesPerReplica",
                f"throughput is usually best with one NeuronCore per group (processesPerReplica: {cores}); {p} gives groups of {group}",
                "warning",
            )
        )
    if spec.compile.optimize_for == "latency" and group == 1 and cores > 1:
        how = "tensor parallel" if fam.neuronx else "NeuronCore pipeline"
        found.append(
            Finding(
                "spec.processesPerReplica",
                f"latency usually improves with larger groups ({how}); {p} gives groups of 1 core",
                "warning",
            )
        )
    return found


RULES = ()  # warnings only: nothing for the CRD to refuse
CHECKS = (_check_advice,)
