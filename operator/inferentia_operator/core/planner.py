"""The planner: a pure function from a valid spec to the Plan the operator applies.

Each concern plans its own piece of the Plan: a ``plan_*`` function returns a TypedDict of the
Plan fields it decides, and :func:`plan` lists the concerns in a fixed order and joins their
pieces. What every piece reads of the replica (family, logical cores, groups, host CPU and
memory) is :class:`Replica`; the compilers' flags are built in compiler_flags.py. A new field
that changes the plan goes in its concern's piece (or a new piece that plan() lists): mypy holds
each piece's keys and types to Plan's fields, and a field two pieces both plan fails the call.

Nothing here talks to Kubernetes. Sources (public documentation):
- groups, one model each, compiled for the group size: Cortex's "Using Inferentia"
  (https://github.com/cortexlabs/cortex/blob/master/docs/deployments/inferentia.md) and the Neuron
  runtime's NeuronCore allocation
  (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/neuron-runtime/guides/configuration-guide.html);
- NEURON_MAX_NUM_INFERS: the Neuron performance-tuning application note
  (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/appnotes/perf/neuron-cc/performance-tuning.html);
- the neuron-cc and neuronx-cc flags and static weights: compiler_flags.py, with its sources;
- logical cores: https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-features/logical-neuroncore-config.html
"""

from __future__ import annotations

from typing import Literal, NamedTuple, TypedDict

from .api import DisaggregationPlan, FrontEnd, InferentiaModelSpec, Plan, Pool, PoolPlan, ResourceList
from .catalogue import (
    EFA_DEVICES,
    EFA_RESOURCE,
    FAMILIES,
    HOSTS,
    HUGEPAGES_RESOURCE,
    NEURON_RESOURCE,
    NEURONCORE_RESOURCE,
    Compiler,
    Family,
    efa_share,
    host_fits,
)
from .compiler_flags import compiler_args, static_weights_on
from .cores import chips_needed, kv_cache, lnc_of, pool_cores, pool_tensor_parallel, replica_cores
from .drift import quantity
from .findings import Finding, errors
from .rules import check_spec
from .sizing import size as pod_sizes


class InvalidSpec(ValueError):
    """The spec breaks at least one rule; ``findings`` says which."""

    def __init__(self, findings: list[Finding]):
        self.findings = findings
        super().__init__("; ".join(str(f) for f in errors(findings)))


def plan(spec: InferentiaModelSpec, checked: list[Finding] | None = None, pool_efa: EfaChoice | None = None) -> Plan:
    """The plan of a spec; raises InvalidSpec when any rule fails. ``checked``: the spec's
    findings, when the caller has already run :func:`rules.check_spec` on it. ``pool_efa``: with
    a pool's spec (InferentiaModelSpec.pool_spec), its model's spec.disaggregation.efa."""
    findings = check_spec(spec) if checked is None else checked
    if errors(findings):
        raise InvalidSpec(findings)
    # The pieces that others read come first: the groups' cores and the compiler's flags (each
    # process's environment), the instance types (the nodes' EFA devices, the shared chip's
    # replicas an instance), and the EFA devices (the resources).
    replica = replica_of(spec)
    cores = plan_cores(replica)
    compiled = plan_compiler(spec, replica)
    placed = plan_instance_types(spec, replica)
    pool = plan_pool_efa(pool_efa, replica.chips, placed["instance_types"]) if pool_efa else None
    if pool:
        placed = {"instance_types": pool["instance_types"]}
    across = plan_across_nodes(spec, replica, placed["instance_types"])
    if pool:
        across["efa_devices"] = pool["efa_devices"]
    return Plan(
        **cores,
        **compiled,
        **plan_processes(spec, replica, cores["visible_cores"], compiled["compiler_args"]),
        **placed,
        **across,
        **plan_resources(spec, replica, across["efa_devices"]),
        **plan_front_end(spec),
        **plan_shared_chip(replica, placed["instance_types"]),
        **plan_disaggregation(spec, replica),
        sizes=pod_sizes(spec, replica.family, replica.groups),
        kv_cache=kv_cache(spec, replica.family, replica.group_size),
        warnings=[str(f) for f in findings if f.severity == "warning"],
    )


class Replica(NamedTuple):
    """What the pieces of the plan read of one replica: its family and logical cores, how
    they split into groups, and the CPU and memory it asks of a host."""

    family: Family
    lnc: int
    cores_per_chip: int  # logical cores on one chip at lnc
    # A cores request shares its chip: the replica's cores are its whole world, and it
    # sees only their share of the chip's device memory.
    shares_chip: bool
    chips: int  # chips an instance needs for the replica: its inf, or as many as its cores fill
    total_cores: int  # logical cores
    groups: int  # one a serving process
    group_size: int
    millicpu: float
    memory_bytes: float


def replica_of(spec: InferentiaModelSpec) -> Replica:
    fam = FAMILIES[spec.compute.family]
    lnc = lnc_of(spec, fam)
    total = replica_cores(spec, fam)
    groups = spec.processes_per_replica
    return Replica(
        family=fam,
        lnc=lnc,
        cores_per_chip=fam.cores_per_chip(lnc),
        shares_chip=spec.compute.cores is not None,
        chips=chips_needed(spec, fam),
        total_cores=total,
        groups=groups,
        group_size=total // groups,
        millicpu=float(quantity(spec.compute.cpu) or 0) * 1000,
        memory_bytes=float(quantity(spec.compute.memory) or 0),
    )


def core_range(first: int, count: int) -> str:
    """NEURON_RT_VISIBLE_CORES syntax: "5" for one core, "4-7" for several."""
    return str(first) if count == 1 else f"{first}-{first + count - 1}"


def chips_touched(first_core: int, count: int, cores_per_chip: int) -> int:
    return (first_core + count - 1) // cores_per_chip - first_core // cores_per_chip + 1


class CoresPiece(TypedDict):
    family: str
    lnc: int | None
    chips: int | None
    cores_per_chip: int
    total_cores: int
    group_size: int
    groups: int
    visible_cores: list[str]
    device_memory_per_group_bytes: int
    device_memory_share_per_group_bytes: int


def plan_cores(replica: Replica) -> CoresPiece:
    """The replica's cores and groups, the cores each group sees, and the device memory it addresses."""
    fam, size = replica.family, replica.group_size
    # Contiguous groups from core 0: when a group fits in one chip it never crosses
    # a chip boundary, and multi-chip groups start on a chip boundary.
    firsts = [i * size for i in range(replica.groups)]
    if replica.shares_chip:
        seen = size * fam.memory_per_core_bytes(replica.lnc)
    else:
        seen = max(chips_touched(first, size, replica.cores_per_chip) for first in firsts) * fam.memory_per_chip_bytes
    return {
        "family": fam.name,
        "lnc": replica.lnc if fam.neuronx else None,
        "chips": None if replica.shares_chip else replica.chips,
        "cores_per_chip": replica.cores_per_chip,
        "total_cores": replica.total_cores,
        "group_size": size,
        "groups": replica.groups,
        "visible_cores": [core_range(first, size) for first in firsts],
        "device_memory_per_group_bytes": seen,
        "device_memory_share_per_group_bytes": size * fam.memory_per_core_bytes(replica.lnc),
    }


class CompilerPiece(TypedDict):
    compiler: Compiler
    static_weights: bool
    compiler_args: list[str]
    batch_size: int
    dynamic_batch_size: bool
    buckets: list[list[int]]
    input_dtype: str | None


def plan_compiler(spec: InferentiaModelSpec, replica: Replica) -> CompilerPiece:
    """The family's compiler and its flags for one group, and the shapes the model is compiled for."""
    static = static_weights_on(spec, replica.family, replica.group_size)
    return {
        "compiler": replica.family.compiler,
        "static_weights": static,
        "compiler_args": compiler_args(spec, replica.family, replica.lnc, replica.group_size, static),
        "batch_size": spec.compile.batch_size,
        "dynamic_batch_size": spec.compile.dynamic_batch_size,
        "buckets": [list(b) for b in spec.compile.buckets or []],
        "input_dtype": spec.input_dtype if spec.compiles_with_program or spec.serves_with_program else None,
    }


def process_env(fam: Family, lnc: int, cores: str, size: int, args: list[str], index: int, threads: int) -> dict[str, str]:
    """The runtime environment of one serving process."""
    if not fam.neuronx:
        return {
            "NEURON_RT_VISIBLE_CORES": cores,
            "NEURON_RT_NUM_CORES": str(size),
            "NEURONCORE_GROUP_SIZES": str(size),  # Inf1's older runtimes read this instead
            "NEURON_MAX_NUM_INFERS": str(size + 3),  # the tuning note: the default outstanding inferences, cores + 3
            "NEURON_CC_FLAGS": " ".join(args),
            "INFERENTIA_PROCESS_INDEX": str(index),
            "INFERENTIA_THREADS": str(threads),
        }
    return {
        "NEURON_RT_VISIBLE_CORES": cores,  # logical core indices
        "NEURON_RT_NUM_CORES": str(size),
        "NEURON_LOGICAL_NC_CONFIG": str(lnc),
        "NEURON_CC_FLAGS": " ".join(args),
        "INFERENTIA_TENSOR_PARALLEL_SIZE": str(size),
        "INFERENTIA_PROCESS_INDEX": str(index),
        "INFERENTIA_THREADS": str(threads),
    }


class ProcessesPiece(TypedDict):
    threads_per_process: int
    env: list[dict[str, str]]


def plan_processes(spec: InferentiaModelSpec, replica: Replica, visible: list[str], args: list[str]) -> ProcessesPiece:
    """Each serving process's threads and runtime environment, in group order."""
    size = replica.group_size
    threads = spec.serving.threads_per_process or size + 3  # every outstanding inference gets a thread
    return {
        "threads_per_process": threads,
        "env": [process_env(replica.family, replica.lnc, cores, size, args, index, threads) for index, cores in enumerate(visible)],
    }


class InstanceTypesPiece(TypedDict):
    instance_types: list[str]


def plan_instance_types(spec: InferentiaModelSpec, replica: Replica) -> InstanceTypesPiece:
    """The instance types that can hold one replica, smallest first."""
    wanted = spec.compute.instance_types
    # Types with the chips, and the CPU and memory a replica asks for after the kubelet's
    # reservations (a 4-CPU replica does not fit an inf2.xlarge, which has 4 vCPUs in all).
    return {
        "instance_types": [
            name
            for name, count in sorted(replica.family.instance_chips.items(), key=lambda item: item[1])
            if count >= replica.chips and (wanted is None or name in wanted) and host_fits(name, replica.millicpu, replica.memory_bytes)
        ]
    }


class AcrossNodesPiece(TypedDict):
    nodes: int | None
    efa_devices: int | None
    tensor_parallel_size: int | None


def plan_across_nodes(spec: InferentiaModelSpec, replica: Replica, instance_types: list[str]) -> AcrossNodesPiece:
    """A replica's nodes, the EFA devices each of its pods requests, and the tensor-parallel
    size of the model its groups shard (a group of ranks on each node)."""
    # A replica across nodes: one pod a node, each with the EFA devices every allowed type has
    # (catalogue.EFA_DEVICES), so that the pod fits whichever of them it lands on.
    nodes = spec.compute.nodes if spec.compute.nodes > 1 else None
    return {
        "nodes": nodes,
        "efa_devices": min((EFA_DEVICES.get(t, 0) for t in instance_types), default=0) if nodes else None,
        "tensor_parallel_size": replica.group_size * (nodes or 1) if replica.family.neuronx else None,
    }


EfaChoice = Literal["auto", "required", "off"]


class PoolEfaPiece(TypedDict):
    instance_types: list[str]
    efa_devices: int | None


def plan_pool_efa(choice: EfaChoice, chips: int, instance_types: list[str]) -> PoolEfaPiece:
    """A pool's instance types and the EFA devices each of its pods requests
    (spec.disaggregation.efa): unless off, the types whose EFA count the catalogue knows, where
    there are any, and the fewest any of them shares out to a pod of ``chips`` chips
    (catalogue.efa_share), so that the pod fits whichever it lands on. Where there are none,
    every type and no EFA device: the rules refuse that with required and warn with auto."""
    shares = {t: share for t in instance_types if (share := efa_share(t, chips)) is not None}
    if choice == "off" or not shares:
        return {"instance_types": instance_types, "efa_devices": None}
    return {"instance_types": list(shares), "efa_devices": min(shares.values())}


class ResourcesPiece(TypedDict):
    allocation: Literal["dra"] | None
    connected_devices: int | None
    resources: ResourceList


def plan_resources(spec: InferentiaModelSpec, replica: Replica, efa: int | None) -> ResourcesPiece:
    """The serving container's requests and limits: its Neuron devices (or a DRA claim's
    instead), hugepages, CPU, memory, and the EFA devices of a replica across nodes."""
    # Hugepages only when the model asks for them: AWS's examples for the Neuron Runtime 2.x
    # request none, and a request no node reserves leaves the pod unschedulable (sources
    # at catalogue.HUGEPAGES_RESOURCE).
    hugepages = {HUGEPAGES_RESOURCE: spec.compute.hugepages} if spec.compute.hugepages is not None else {}
    # Whole chips from the device plugin's aws.amazon.com/neuron, single cores from its
    # aws.amazon.com/neuroncore (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/containers/tutorials/k8s-neuron-device-plugin.html).
    # With the Neuron DRA driver, the devices come from the pod's resource claim instead
    # (device_claims.template.resource_claim_template), and no extended resource is requested.
    dra = spec.compute.allocation == "dra"
    neuron: dict[str, str] = {}
    if not dra:
        neuron = {NEURONCORE_RESOURCE: str(replica.total_cores)} if replica.shares_chip else {NEURON_RESOURCE: str(replica.chips)}
    # The EFA devices plan_across_nodes found: an extended resource, so its limit equals its
    # request; last, where they have always been, so that the plan's JSON and hash keep their order.
    efa_devices = {EFA_RESOURCE: str(efa)} if efa else {}
    return {
        "allocation": "dra" if dra else None,
        "connected_devices": replica.family.dra_group(replica.chips) if dra and replica.chips > 1 else None,
        "resources": ResourceList(
            requests={**neuron, **hugepages, "cpu": spec.compute.cpu, "memory": spec.compute.memory, **efa_devices},
            # Extended resources and hugepages must have limits equal to their requests.
            limits={**neuron, **hugepages, "memory": spec.compute.memory, **efa_devices},
        ),
    }


class FrontEndPiece(TypedDict):
    front_end: FrontEnd | None


def plan_front_end(spec: InferentiaModelSpec) -> FrontEndPiece:
    """The batching front end beside the model processes, when there is one."""
    # A batching front end takes the serving port and the processes move up one; vLLM
    # batches sequences itself and gets none.
    batching = spec.serving.batching
    if batching is None or not spec.has_batching_front_end:
        return {"front_end": None}
    return {
        "front_end": FrontEnd(
            port=spec.serving.port,
            process_base_port=spec.serving.port + 1,
            max_batch_size=batching.max_batch_size,
            max_latency_ms=batching.max_latency_ms,
        )
    }


class SharedChipPiece(TypedDict):
    shares_chip: bool | None
    chip_memory_share_bytes: int | None
    replicas_per_instance: dict[str, int] | None


def plan_shared_chip(replica: Replica, instance_types: list[str]) -> SharedChipPiece:
    """When the replica requests NeuronCores, not chips: its share of the chip's memory, and how
    many such replicas an instance of each allowed type holds."""
    if not replica.shares_chip:
        return {"shares_chip": None, "chip_memory_share_bytes": None, "replicas_per_instance": None}
    return {
        "shares_chip": True,
        "chip_memory_share_bytes": replica.total_cores * replica.family.memory_per_core_bytes(replica.lnc),
        "replicas_per_instance": {t: replicas_per_instance(replica, t) for t in instance_types},
    }


def replicas_per_instance(replica: Replica, itype: str) -> int:
    """How many replicas like this one an instance of ``itype`` holds: by its NeuronCores (a
    request within one chip never spans two, so each chip holds cores_per_chip // total_cores),
    and by the CPU and memory it leaves to pods."""
    per_chip, cores, millicpu, memory_bytes = replica.cores_per_chip, replica.total_cores, replica.millicpu, replica.memory_bytes
    chips = replica.family.instance_chips[itype]
    by_cores = chips * (per_chip // cores) if cores <= per_chip else chips * per_chip // cores
    host = HOSTS[itype]
    by_cpu = int(host.allocatable_millicpu // millicpu) if millicpu > 0 else by_cores
    by_memory = int(host.allocatable_memory_mib * 2**20 // memory_bytes) if memory_bytes > 0 else by_cores
    return min(by_cores, by_cpu, by_memory)


class DisaggregationPiece(TypedDict):
    disaggregation: DisaggregationPlan | None


def pool_plan(spec: InferentiaModelSpec, pool: Pool, replica: Replica) -> PoolPlan:
    """A pool's replica: its chips (the pool's inf, else the model's), their logical cores, and
    vLLM's parallelism over them (tensor parallel over what data parallelism leaves: the rules
    hold dataParallelSize to a divisor of the cores)."""
    chips, cores = pool_cores(spec, replica.family, pool)
    tp = pool_tensor_parallel(spec, replica.family, pool)
    assert spec.disaggregation is not None
    types = plan_instance_types(spec, replica._replace(chips=chips))["instance_types"]
    efa = plan_pool_efa(spec.disaggregation.efa, chips, types)["efa_devices"]
    return PoolPlan(chips=chips, cores=cores, tensor_parallel_size=tp, data_parallel_size=pool.data_parallel_size, efa_devices=efa)


def plan_disaggregation(spec: InferentiaModelSpec, replica: Replica) -> DisaggregationPiece:
    """spec.disaggregation: each pool's replica (rules/disaggregation.py holds their parallelism
    to their cores). Not the pools' replicas: a scaled pool must not change the plan, which every
    pod carries, and so roll the other pool."""
    d = spec.disaggregation
    if d is None:
        return {"disaggregation": None}
    return {"disaggregation": DisaggregationPlan(prefill=pool_plan(spec, d.prefill, replica), decode=pool_plan(spec, d.decode, replica))}
