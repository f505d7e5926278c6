"""The planner: a pure function from a valid spec to the Plan the operator applies.

Nothing here talks to Kubernetes. Sources: seed 004 (groups, one model each,
compile for the group size), seeds 000 and 001 (compiler flags, static weights,
NEURON_MAX_NUM_INFERS), seed 003 (bucket bound), and the hardware catalogue.
"""

from __future__ import annotations

from .api import InferentiaModelSpec, Plan, ResourceList
from .catalogue import (
    FAMILIES,
    HUGEPAGES_PER_CHIP_MI,
    HUGEPAGES_RESOURCE,
    NEURON_RESOURCE,
    Family,
)
from .rules import Finding, bytes_per_weight, check_spec, errors


class InvalidSpec(ValueError):
    """The spec breaks at least one rule; ``findings`` says which."""

    def __init__(self, findings: list[Finding]):
        self.findings = findings
        super().__init__("; ".join(str(f) for f in errors(findings)))


def core_range(first: int, count: int) -> str:
    """NEURON_RT_VISIBLE_CORES syntax: "5" for one core, "4-7" for several."""
    return str(first) if count == 1 else f"{first}-{first + count - 1}"


def chips_touched(first_core: int, count: int, cores_per_chip: int) -> int:
    return (first_core + count - 1) // cores_per_chip - first_core // cores_per_chip + 1


def static_weights_on(spec: InferentiaModelSpec, fam: Family, group_size: int) -> bool:
    """true and false mean what they say; auto is on exactly when the weights are known to fit the group's share."""
    choice = spec.compile.static_weights
    if isinstance(choice, bool):
        return choice
    weights = spec.model.weights
    if weights is None:
        return False
    return weights * bytes_per_weight(spec.model.precision) <= group_size * fam.memory_per_core_bytes


def compiler_args(spec: InferentiaModelSpec, group_size: int, static_weights: bool) -> list[str]:
    args = ["--neuroncore-pipeline-cores", str(group_size)]
    b = spec.compile.batch_size
    if spec.model.architecture == "cnn" and b > 1:
        # Seed 000: the CNN batching flags, with the state-buffer size (b + 6) * 10.
        args += ["--batching_en", "--rematerialization_en", "--spill_dis", "--sb_size", str((b + 6) * 10)]
        args += ["--enable-replication", "True"]
    if static_weights:
        args.append("--static-weights")
    if spec.model.precision == "mixed":
        args.append("--fp32-cast=matmult")
    return args + list(spec.compile.extra_args or [])


def plan(spec: InferentiaModelSpec) -> Plan:
    """The plan of a spec; raises InvalidSpec when any rule fails."""
    findings = check_spec(spec)
    if errors(findings):
        raise InvalidSpec(findings)

    fam = FAMILIES[spec.compute.family]
    chips = spec.compute.inf
    total = fam.cores_per_chip * chips
    groups = spec.processes_per_replica
    size = total // groups
    # Contiguous groups from core 0: when a group fits in one chip it never crosses
    # a chip boundary, and multi-chip groups start on a chip boundary.
    firsts = [i * size for i in range(groups)]
    visible = [core_range(first, size) for first in firsts]
    seen = max(chips_touched(first, size, fam.cores_per_chip) for first in firsts) * fam.memory_per_chip_bytes
    static = static_weights_on(spec, fam, size)
    args = compiler_args(spec, size, static)
    max_infers = size + 3  # seed 001: the runtime's default outstanding inferences, cores + 3
    threads = spec.serving.threads_per_process or max_infers

    env = [
        {
            "NEURON_RT_VISIBLE_CORES": cores,
            "NEURON_RT_NUM_CORES": str(size),
            "NEURONCORE_GROUP_SIZES": str(size),  # older runtimes read this instead
            "NEURON_MAX_NUM_INFERS": str(max_infers),
            "NEURON_CC_FLAGS": " ".join(args),
            "INFERENTIA_PROCESS_INDEX": str(index),
            "INFERENTIA_THREADS": str(threads),
        }
        for index, cores in enumerate(visible)
    ]

    hugepages = f"{HUGEPAGES_PER_CHIP_MI * chips}Mi"
    resources = ResourceList(
        requests={
            NEURON_RESOURCE: str(chips),
            HUGEPAGES_RESOURCE: hugepages,
            "cpu": spec.compute.cpu,
            "memory": spec.compute.memory,
        },
        # Extended resources and hugepages must have limits equal to their requests.
        limits={NEURON_RESOURCE: str(chips), HUGEPAGES_RESOURCE: hugepages, "memory": spec.compute.memory},
    )

    wanted = spec.compute.instance_types
    instance_types = [
        name
        for name, count in sorted(fam.instance_chips.items(), key=lambda item: item[1])
        if count >= chips and (wanted is None or name in wanted)
    ]

    return Plan(
        family=fam.name,
        chips=chips,
        cores_per_chip=fam.cores_per_chip,
        total_cores=total,
        group_size=size,
        groups=groups,
        visible_cores=visible,
        device_memory_per_group_bytes=seen,
        device_memory_share_per_group_bytes=size * fam.memory_per_core_bytes,
        static_weights=static,
        batch_size=spec.compile.batch_size,
        dynamic_batch_size=spec.compile.dynamic_batch_size,
        buckets=[list(b) for b in spec.compile.buckets or []],
        compiler_args=args,
        threads_per_process=threads,
        env=env,
        resources=resources,
        instance_types=instance_types,
        warnings=[str(f) for f in findings if f.severity == "warning"],
    )
