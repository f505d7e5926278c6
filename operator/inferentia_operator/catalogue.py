"""The Neuron hardware catalogue: what each family's chips and instances hold.

Every number here traces to ``shared/inferentia-facts.md`` (seeds 003 and 004 for
inf1, the AWS Neuron architecture pages for the other families).
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3

# Kubernetes names the device plugin and the Neuron node groups use.
NEURON_RESOURCE = "aws.amazon.com/neuron"
HUGEPAGES_RESOURCE = "hugepages-2Mi"
HUGEPAGES_PER_CHIP_MI = 256  # 128 pages of 2 MiB per chip (Cortex)
NEURON_TAINT_KEY = "aws.amazon.com/neuron"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"


@dataclass(frozen=True)
class Family:
    name: str
    cores_per_chip: int
    memory_per_chip_bytes: int
    instance_chips: dict[str, int]  # instance type -> chips, smallest first
    # Device counts a single container may ask for, where the platform restricts them.
    allowed_chip_counts: tuple[int, ...] | None = None

    @property
    def memory_per_core_bytes(self) -> int:
        return self.memory_per_chip_bytes // self.cores_per_chip

    @property
    def largest_instance(self) -> tuple[str, int]:
        return max(self.instance_chips.items(), key=lambda item: item[1])

    @property
    def max_chips(self) -> int:
        return self.largest_instance[1]


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            "inf1",
            cores_per_chip=4,
            memory_per_chip_bytes=8 * GIB,
            instance_chips={"inf1.xlarge": 1, "inf1.2xlarge": 1, "inf1.6xlarge": 4, "inf1.24xlarge": 16},
        ),
        Family(
            "inf2",
            cores_per_chip=2,
            memory_per_chip_bytes=32 * GIB,
            instance_chips={"inf2.xlarge": 1, "inf2.8xlarge": 1, "inf2.24xlarge": 6, "inf2.48xlarge": 12},
        ),
        Family(
            "trn1",
            cores_per_chip=2,
            memory_per_chip_bytes=32 * GIB,
            instance_chips={"trn1.2xlarge": 1, "trn1.32xlarge": 16},
            allowed_chip_counts=(1, 4, 8, 16),
        ),
        Family(
            "trn2",
            cores_per_chip=8,
            memory_per_chip_bytes=96 * GIB,
            instance_chips={"trn2.48xlarge": 16},
        ),
    )
}

FAMILY_NAMES: tuple[str, ...] = tuple(FAMILIES)

# Seed 003 bounds bucketed models per NeuronCore by round(10^9 / weights) on inf1,
# whose cores hold 2 GiB each. Other families' cores hold more; the bound scales
# with per-core memory so that inf1 keeps exactly the seed's formula.
BUCKET_BUDGET_PER_INF1_CORE = 10**9


def bucket_budget_per_core(family: Family) -> int:
    """The numerator N of round(N / weights): bucketed models one core holds."""
    return BUCKET_BUDGET_PER_INF1_CORE * family.memory_per_core_bytes // FAMILIES["inf1"].memory_per_core_bytes
