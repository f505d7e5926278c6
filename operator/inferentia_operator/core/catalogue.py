"""The Neuron hardware catalogue: what each family's chips and instances hold.

Sources (public AWS Neuron documentation):
- chips, cores and memory: the architecture pages for Inferentia
  (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/arch/neuron-hardware/inferentia.html),
  Inferentia2 (.../inferentia2.html), Trainium (.../trainium.html), Trainium2 (.../trainium2.html)
  and Trainium3 (.../trainium3.html: eight NeuronCore-v4 and 144 GiB of device memory a chip);
- trn3 hosts: AWS's Trn3 page (.../about-neuron/arch/neuron-hardware/trn3-arch.html) gives
  them only as UltraServers. A Gen1 UltraServer is four servers of 16 Trainium3 chips with
  768 vCPUs and 8,192 GiB of host memory in all, so 192 vCPUs and 2,048 GiB a server; the
  Neuron driver's platform table names that server trn3.48xlarge
  (https://github.com/aws-neuron/aws-neuron-driver/blob/master/v4/neuron_dhal_v4.c). A Gen2
  UltraServer is 36 servers of 4 chips with 2,304 vCPUs and 27,648 GiB in all, so 64 vCPUs and
  768 GiB a server, which the same table and AWS's Neuron Helm chart (aws-neuron/neuron-helm-charts,
  values.yaml) name trn3e.24xlarge;
- trn2.3xlarge's host (12 vCPUs, 128 GiB) is EC2's DescribeInstanceTypes as another project
  quotes it, not an AWS page: the Trn2 architecture page lists trn2.48xlarge and trn2u.48xlarge
  only; EKS's VPC CNI gives it 30 pods (aws/amazon-vpc-cni-k8s, misc/eni-max-pods.txt);
- compilers: ``neuron-cc`` is the Inf1 compiler
  (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/compiler/neuron-cc/command-line-reference.html),
  ``neuronx-cc`` the compiler of Inf2, Trn1, Trn2 and Trn3
  (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/compiler/neuronx-cc/api-reference-guide/neuron-compiler-cli-reference-guide.html;
  the CLI page's list of --target values still ends at trn2, and the compiler's release
  notes name trn3 among them, Neuron 2.31: "the default for trn2 and trn3 targets",
  https://awsdocs-neuron.readthedocs-hosted.com/en/latest/release-notes/components/compiler.html);
- logical NeuronCores (LNC): only Trainium2 and Trainium3 group physical cores, 1 or 2 to
  a logical core, 2 by default ("LNC applies only to Trn2 and Trn3 instances"); Trn1 (and
  Inf2) support only LNC=1, compiler error NCC_EARG001
  (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-features/logical-neuroncore-config.html,
  https://awsdocs-neuron.readthedocs-hosted.com/en/latest/compiler/error-codes/EARG001.html);
- trn1 containers may use 1, 4, 8 or 16 devices (the Neuron scheduler extension,
  https://awsdocs-neuron.readthedocs-hosted.com/en/latest/containers/tutorials/k8s-neuron-scheduler.html);
- trn1's runtime loads collectives only on 1, 2, 8, 16 or a multiple of 32 cores
  ("Unsupported topology", huggingface/optimum-neuron#619);
- vLLM: on Trn2 and Trn3, the vLLM Neuron plugin (Neuron 2.31 and later), since NxD Inference's
  support there ends with Neuron 2.34; on Inf2 and Trn1, NxD Inference stays, in maintenance at
  Neuron 2.31 (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/announcements/neuron2.x/announce-eos-nxdi-nxd-core-inference.html,
  https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/getting-started/setup-guide.html).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

GIB = 1024**3

# Kubernetes names the device plugin and the Neuron node groups use
# (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/containers/kubernetes-getting-started.html).
NEURON_RESOURCE = "aws.amazon.com/neuron"
NEURONCORE_RESOURCE = "aws.amazon.com/neuroncore"
# 2 MiB hugepages are requested only when a model asks for them (spec.compute.hugepages).
# The Neuron Runtime 1.x daemon (neuron-rtd) expected 128 of them per Inferentia chip
# (https://github.com/aws-neuron/aws-neuron-sdk/blob/003f4defb572455a7e18605a9fe3da29bacbeec6/docs/neuron-container-tools/tutorial-k8s.md).
# Runtime 2.x (libnrt.so, since Neuron 1.16.0) replaced the daemon, and AWS's Kubernetes
# examples for it request none: Inf1 in
# https://awsdocs-neuron.readthedocs-hosted.com/en/latest/containers/tutorials/inference/k8s_rn50_demo.html
# and Trn1 in https://awsdocs-neuron.readthedocs-hosted.com/en/latest/containers/tutorials/training/k8s_mlp_train_demo.html.
HUGEPAGES_RESOURCE = "hugepages-2Mi"
HUGEPAGE_BYTES = 2 * 1024**2
NEURON_TAINT_KEY = "aws.amazon.com/neuron"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"

Compiler = Literal["neuron-cc", "neuronx-cc"]

# AWS's Neuron DRA driver (Dynamic Resource Allocation, Kubernetes 1.34 and later): it publishes
# each Neuron device in ResourceSlices under the DeviceClass neuron.aws.com, with attributes
# instanceType, deviceId, neuronDriverVersion and resourceType in its own domain, and, for the
# grid topology of Trainium instances, the connected-device groups of 1, 4, 8 and 16 devices
# resource.aws.com/devicegroup{1,4,8,16}_id; a claim's opaque NeuronConfig parameters set its
# logicalNeuronCore. It hands out whole devices; a node runs it or the device plugin, never both.
# Sources: the Neuron DRA page and its claim templates
# (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/containers/neuron-dra.html: 1x4-connected-devices.yaml,
# lnc-setting-trn2.yaml, specific-driver-version.yaml) and EKS's "Manage Neuron devices"
# (https://docs.aws.amazon.com/eks/latest/userguide/device-management-neuron.html: Trainium
# and Inferentia2 nodes).
DRA_DRIVER = "neuron.aws.com"
DRA_CONFIG_API_VERSION = "neuron.aws.com/v1"
DRA_GROUP_ATTRIBUTE = "resource.aws.com/devicegroup{}_id"
DRA_TRAINIUM_GROUPS = (1, 4, 8, 16)
# What vLLM runs on, per family (see the module's sources).
VllmBackend = Literal["nxd-inference", "vllm-neuron-plugin"]


@dataclass(frozen=True)
class Family:
    name: str
    physical_cores_per_chip: int
    memory_per_chip_bytes: int
    instance_chips: dict[str, int]  # instance type -> chips, smallest first
    compiler: Compiler
    # Physical cores per logical core the family supports; the first is the default.
    lnc_values: tuple[int, ...] = (1,)
    # Device counts a single container may ask for, where the platform restricts them.
    allowed_chip_counts: tuple[int, ...] | None = None
    # Core counts a tensor-parallel group may have, where the runtime restricts them
    # (besides these, any multiple of tensor_parallel_multiple).
    tensor_parallel_sizes: tuple[int, ...] | None = None
    tensor_parallel_multiple: int | None = None
    vllm: VllmBackend | None = None  # None: vLLM does not run on the family (inf1)
    # With AWS's Neuron DRA driver: the connected-device groups a claim can be held to (see
    # DRA_DRIVER); () where the driver runs but publishes none; None where it does not run.
    dra_groups: tuple[int, ...] | None = None
    # Whether a replica may span nodes (spec.compute.nodes above 1): see MULTI_NODE below.
    multi_node: bool = False

    @property
    def default_lnc(self) -> int:
        return self.lnc_values[0]

    @property
    def neuronx(self) -> bool:
        """Neuron 2.x families: neuronx-cc, logical cores, tensor-parallel groups."""
        return self.compiler == "neuronx-cc"

    def cores_per_chip(self, lnc: int) -> int:
        """Logical NeuronCores one chip shows at this LNC (physical cores on inf1, inf2, trn1)."""
        return self.physical_cores_per_chip // lnc

    def memory_per_core_bytes(self, lnc: int) -> int:
        return self.memory_per_chip_bytes // self.cores_per_chip(lnc)

    def tensor_parallel_ok(self, cores: int) -> bool:
        if self.tensor_parallel_sizes is None:
            return True
        multiple = self.tensor_parallel_multiple
        return cores in self.tensor_parallel_sizes or bool(multiple and cores % multiple == 0)

    @property
    def largest_instance(self) -> tuple[str, int]:
        return max(self.instance_chips.items(), key=lambda item: item[1])

    @property
    def max_chips(self) -> int:
        return self.largest_instance[1]

    def dra_group(self, devices: int) -> int | None:
        """The smallest connected-device group of the DRA driver that holds ``devices``, if any."""
        return next((g for g in self.dra_groups or () if g >= devices), None)


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            "inf1",
            physical_cores_per_chip=4,
            memory_per_chip_bytes=8 * GIB,
            instance_chips={"inf1.xlarge": 1, "inf1.2xlarge": 1, "inf1.6xlarge": 4, "inf1.24xlarge": 16},
            compiler="neuron-cc",
        ),
        Family(
            "inf2",
            physical_cores_per_chip=2,
            memory_per_chip_bytes=32 * GIB,
            vllm="nxd-inference",
            dra_groups=(),  # no grid: the driver publishes no connected-device groups here
            instance_chips={"inf2.xlarge": 1, "inf2.8xlarge": 1, "inf2.24xlarge": 6, "inf2.48xlarge": 12},
            compiler="neuronx-cc",
        ),
        Family(
            "trn1",
            physical_cores_per_chip=2,
            memory_per_chip_bytes=32 * GIB,
            vllm="nxd-inference",
            dra_groups=DRA_TRAINIUM_GROUPS,
            # trn1n.32xlarge: trn1.32xlarge with twice the network bandwidth (the Trn1/Trn1n
            # architecture page's table).
            instance_chips={"trn1.2xlarge": 1, "trn1.32xlarge": 16, "trn1n.32xlarge": 16},
            compiler="neuronx-cc",
            allowed_chip_counts=(1, 4, 8, 16),
            tensor_parallel_sizes=(1, 2, 8, 16),
            tensor_parallel_multiple=32,
            multi_node=True,
        ),
        Family(
            "trn2",
            physical_cores_per_chip=8,
            memory_per_chip_bytes=96 * GIB,
            vllm="vllm-neuron-plugin",
            dra_groups=DRA_TRAINIUM_GROUPS,
            # trn2.3xlarge (one chip) and the UltraServer's trn2u.48xlarge (16, as trn2.48xlarge): the
            # Trn2 architecture page (trn2u.48xlarge beside trn2.48xlarge in its instance table) and
            # AWS's Neuron Helm chart, whose device plugin and DRA driver name trn2.3xlarge,
            # trn2.48xlarge and trn2u.48xlarge (aws-neuron/neuron-helm-charts, values.yaml). The
            # first listed of the largest is the one messages name.
            instance_chips={"trn2.3xlarge": 1, "trn2.48xlarge": 16, "trn2u.48xlarge": 16},
            compiler="neuronx-cc",
            lnc_values=(2, 1),  # LNC=2 is Trainium2's default
        ),
        Family(
            "trn3",
            physical_cores_per_chip=8,
            memory_per_chip_bytes=144 * GIB,
            vllm="vllm-neuron-plugin",
            dra_groups=DRA_TRAINIUM_GROUPS,
            # trn3e.24xlarge: a Gen2 UltraServer's server of 4 chips, as the Neuron driver's platform
            # table and AWS's Neuron Helm chart name it (the module's docstring).
            instance_chips={"trn3e.24xlarge": 4, "trn3.48xlarge": 16},
            compiler="neuronx-cc",
            lnc_values=(2, 1),  # as on Trainium2 (the Trainium3 architecture page)
        ),
    )
}

FAMILY_NAMES: tuple[str, ...] = tuple(FAMILIES)

# Replicas that span nodes (spec.compute.nodes above 1): one pod a node, the ranks of one
# tensor-parallel model split evenly between them, talking over EFA.
# - What runs: vLLM on NxD Inference, as vLLM's multi-node launcher for Neuron starts it
#   (vllm-project/vllm, examples/neuron/multi_node/launch_script.py and worker.py): rank 0
#   serves the API, every other rank runs the engine's worker loop; each gets
#   ENABLE_NEURON_MULTI_NODE, WORLD_SIZE (its processes), NEURON_RT_ROOT_COMM_ID (rank 0's
#   address, port 63423), NEURON_LOCAL_TP and NEURON_RANK_ID, and
#   --override-neuron-config {world_size, tp_degree and local_ranks_size (the node's ranks),
#   start_rank_id (rank times the node's ranks)}, as NxD Inference's own multi-node example
#   numbers them (aws-neuron/neuronx-distributed-inference, examples/multi_node.md: "ensure
#   --start_rank_id is multiple of --local_ranks_size"). Its EFA environment is the launcher
#   script's (multi_node_launcher.sh: FI_PROVIDER=efa, FI_EFA_USE_DEVICE_RDMA=1, FI_EFA_FORK_SAFE=1).
# - Where: NxD Inference runs vLLM on inf2 and trn1 (Family.vllm); of those, only Trn1's
#   32xlarge sizes have EFA: "EFA is currently not available on the smaller instances sizes
#   and they cannot be used for running multi-node jobs"; trn1.32xlarge has 8 EFA devices,
#   trn1n.32xlarge 16 (https://awsdocs-neuron.readthedocs-hosted.com/en/v2.29.1/frameworks/torch/torch-neuronx/setup-trn1-multi-node-execution.html).
#   On trn2 and trn3 vLLM runs on the vLLM Neuron plugin, whose documentation describes no
#   serving across nodes (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/index.html),
#   and inf1 runs no vLLM: refused there until AWS documents it.
# EFA devices come from AWS's EFA device plugin as vpc.amazonaws.com/efa
# (https://docs.aws.amazon.com/eks/latest/userguide/device-management-efa.html), one a network card.
# - trn1.32xlarge 8, trn1n.32xlarge 16: the multi-node setup page above.
# - trn2.48xlarge and trn2u.48xlarge 16: the node groups of AWS's EKS prerequisites for Trainium
#   (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/deploy/eks/prerequisites.html, Step 1)
#   launch them from AWS's template, which gives each an EFA interface on each of network cards 0
#   to 15 (aws-neuron/aws-neuron-eks-samples, dp_bert_hf_pretrain/cfn/eks_trn2_ng_stack_al2023.yaml);
#   its Trn1 twin (eks_trn1_ng_stack.yaml) gives trn1.32xlarge 8 and trn1n.32xlarge 16, as above.
# trn2.3xlarge, trn3.48xlarge and trn3e.24xlarge are left out: how many EFA interfaces each has is
# not published where we looked. The Trn2 architecture page
# (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-hardware/trn2-arch.html)
# lists trn2.48xlarge and trn2u.48xlarge only; the Trn3 one
# (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/arch/neuron-hardware/trn3-arch.html)
# gives chips, vCPUs and memory by UltraServer but no EFA count; EC2's page on instances with several
# network cards (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html) takes
# its examples from P5 and P5e; EKS's EFA pages name no count and send the reader to EC2's network
# cards per type, one EFA a card at most (https://docs.aws.amazon.com/eks/latest/userguide/node-efa.html,
# https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/using-eni.html#network-cards), whose rows for
# these types we could not read.
EFA_RESOURCE = "vpc.amazonaws.com/efa"
EFA_DEVICES: dict[str, int] = {"trn1.32xlarge": 8, "trn1n.32xlarge": 16, "trn2.48xlarge": 16, "trn2u.48xlarge": 16}


def efa_share(instance_type: str, chips: int) -> int | None:
    """The EFA devices a pod of ``chips`` chips takes on an ``instance_type``: its chips' share of
    the instance's, rounded up; None where the catalogue has no count (EFA_DEVICES). A share, not
    the instance's all: AWS's EFA device plugin gives each device to one pod alone ("Each EFA
    device is dedicated to one Pod", device-management-efa above), so a pod of part of an
    instance that took them all would keep every other pod that wants one off the instance, and
    on the EKS-optimized AL2023 AMIs it picks the devices near the pod's Neuron devices (the same
    page: "Neuron-EFA affinity"). Where an instance has fewer EFA devices than chips, rounding up
    gives each pod at least one, and fewer such pods fit it than its chips would allow."""
    devices = EFA_DEVICES.get(instance_type)
    if devices is None:
        return None
    instance_chips = next(f.instance_chips[instance_type] for f in FAMILIES.values() if instance_type in f.instance_chips)
    return -(-devices * chips // instance_chips)


MULTI_NODE_FAMILIES: tuple[str, ...] = tuple(f.name for f in FAMILIES.values() if f.multi_node)
# Rank 0's root communicator port, as vLLM's launcher sets it (NEURON_RT_ROOT_COMM_ID_PORT).
ROOT_COMM_PORT = 63423
LNC_CHOICES: tuple[int, ...] = tuple(sorted({v for f in FAMILIES.values() for v in f.lnc_values}))

# The bucketing application note bounds bucketed models per NeuronCore by
# round(10^9 / weights) on inf1, whose cores hold 2 GiB each
# (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/appnotes/torch-neuron/bucketing-app-note.html).
# Other families' cores hold more; the bound scales with the memory of one (logical)
# core so that inf1 keeps exactly the note's formula.
BUCKET_BUDGET_PER_INF1_CORE = 10**9


def bucket_budget_per_core(family: Family, lnc: int) -> int:
    """The numerator N of round(N / weights): bucketed models one core holds."""
    inf1 = FAMILIES["inf1"]
    return BUCKET_BUDGET_PER_INF1_CORE * family.memory_per_core_bytes(lnc) // inf1.memory_per_core_bytes(1)


@dataclass(frozen=True)
class Host:
    """An instance type's CPUs, memory and pods, and what the kubelet leaves to pods."""

    vcpus: int
    memory_gib: int
    max_pods: int

    @property
    def allocatable_millicpu(self) -> int:
        """vCPUs less the EKS AMI's kube-reserved CPU: 6% of the first core, 1% of the
        second, 0.5% of the third and fourth, 0.25% of every further one (amazon-eks-ami's
        bootstrap, reproduced by eksctl, https://github.com/eksctl-io/eksctl/pull/2443)."""
        steps = ((1000, 0.06), (2000, 0.01), (4000, 0.005), (10**12, 0.0025))
        total, lower, reserved = self.vcpus * 1000, 0, 0.0
        for upper, fraction in steps:
            reserved += (min(total, upper) - lower) * fraction
            if total <= upper:
                break
            lower = upper
        return total - int(reserved)

    @property
    def allocatable_memory_mib(self) -> int:
        """Memory less the EKS AMI's kube-reserved memory (11 MiB a pod plus 255 MiB, the same
        sources) and the kubelet's default eviction threshold (memory.available 100Mi)."""
        return self.memory_gib * 1024 - (11 * self.max_pods + 255) - 100


# vCPUs and memory as AWS publishes them (the Neuron architecture pages' instance tables:
# https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-hardware/inf1-arch.html,
# .../inf2-arch.html, .../trn1-arch.html, .../trn2-arch.html); max pods: the EKS VPC-CNI
# maximum for each type.
HOSTS: dict[str, Host] = {
    "inf1.xlarge": Host(4, 8, 38),
    "inf1.2xlarge": Host(8, 16, 38),
    "inf1.6xlarge": Host(24, 48, 234),
    "inf1.24xlarge": Host(96, 192, 437),
    "inf2.xlarge": Host(4, 16, 58),
    "inf2.8xlarge": Host(32, 128, 234),
    "inf2.24xlarge": Host(96, 384, 737),
    "inf2.48xlarge": Host(192, 768, 737),
    "trn1.2xlarge": Host(8, 32, 58),
    "trn1.32xlarge": Host(128, 512, 247),
    "trn1n.32xlarge": Host(128, 512, 247),
    "trn2.48xlarge": Host(192, 2048, 737),
    "trn2u.48xlarge": Host(192, 2048, 737),  # the same server in an UltraServer (the Trn2 architecture page)
    "trn2.3xlarge": Host(12, 128, 30),
    # The Gen1 UltraServer's server (see the module's docstring). EKS publishes no max pods
    # for trn3 yet: trn2.48xlarge's 737, the largest, reserves the most memory.
    "trn3.48xlarge": Host(192, 2048, 737),
    "trn3e.24xlarge": Host(64, 768, 737),  # a Gen2 UltraServer's server, as trn3.48xlarge's max pods
}


def host_fits(itype: str, millicpu: float, memory_bytes: float) -> bool:
    """Whether one replica's CPU and memory fit what an instance type leaves to pods."""
    h = HOSTS[itype]
    return millicpu <= h.allocatable_millicpu and memory_bytes <= h.allocatable_memory_mib * 2**20
