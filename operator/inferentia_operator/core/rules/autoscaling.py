"""Autoscaling (spec.autoscaling): a range, a signal to scale on, and what scale to zero needs."""

from __future__ import annotations

from inferentia_operator.core.api import InferentiaModelSpec
from inferentia_operator.core.catalogue import Family
from inferentia_operator.core.cel import (
    CrossFieldRule,
)
from inferentia_operator.core.findings import Finding

# Autoscaling (spec.autoscaling): a range that is one, and a signal to scale on.
AUTOSCALING_RANGE = CrossFieldRule(
    "spec.autoscaling.minReplicas",
    "spec.autoscaling",
    "%d is larger than maxReplicas %d; valid values are at most maxReplicas",
    "!has(self.minReplicas) || self.minReplicas <= self.maxReplicas",
    ("self.minReplicas", "self.maxReplicas"),
)
_VLLM = "(has(self.serving.runtime) && self.serving.runtime == 'vllm')"
AUTOSCALING_SIGNAL = CrossFieldRule(
    "spec.autoscaling",
    "spec",
    "needs each replica's count of in-flight requests, which only the batching front end and vLLM export; "
    "valid specs also set spec.serving.batching, or spec.serving.runtime: vllm",
    f"!has(self.autoscaling) || has(self.serving.batching) || {_VLLM}",
    (),
)
AUTOSCALING_TARGET = CrossFieldRule(
    "spec.autoscaling.targetInFlight",
    "spec",
    "is required for vLLM without spec.serving.batching, whose sequence limit is vLLM's own default; "
    "set it, or set spec.serving.batching.maxBatchSize (vLLM's --max-num-seqs), from which it defaults",
    f"!has(self.autoscaling) || has(self.autoscaling.targetInFlight) || has(self.serving.batching) || !{_VLLM}",
    (),
)
AUTOSCALING_ZERO = CrossFieldRule(
    "spec.autoscaling.minReplicas",
    "spec",
    "0 needs spec.compile.image: a replica that starts from zero must fetch its compiled artefact, not compile the model "
    "as it starts (tens of minutes for a large model, aws-neuron-sdk#1368); valid values without it are at least 1",
    "!has(self.autoscaling) || !has(self.autoscaling.minReplicas) || self.autoscaling.minReplicas > 0"
    " || (has(self.compile) && has(self.compile.image))",
    (),
)


def _check_autoscaling(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    a = spec.autoscaling
    if a is None:
        return []
    found = []
    if a.min_replicas > a.max_replicas:
        found.append(AUTOSCALING_RANGE.finding(a.min_replicas, a.max_replicas))
    vllm = spec.serving.runtime == "vllm"
    if spec.serving.batching is None and not vllm:
        found.append(AUTOSCALING_SIGNAL.finding())
    if vllm and spec.serving.batching is None and a.target_in_flight is None:
        found.append(AUTOSCALING_TARGET.finding())
    if a.min_replicas == 0 and spec.compile.image is None:
        found.append(AUTOSCALING_ZERO.finding())
    elif spec.compile.image is None:
        found.append(
            Finding(
                "spec.autoscaling",
                "without spec.compile.image every new replica compiles the model as it starts (for a large model, tens of "
                "minutes: aws-neuron-sdk#1368), so a scale-up comes late; set spec.compile.image to compile once, "
                "and new replicas only fetch the artefact",
                "warning",
            )
        )
    return found


RULES: list[CrossFieldRule] = [
    AUTOSCALING_RANGE,
    AUTOSCALING_SIGNAL,
    AUTOSCALING_TARGET,
    AUTOSCALING_ZERO,
]
CHECKS = (_check_autoscaling,)
