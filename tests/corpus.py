"""Specs that judge the rules: one invalid spec for every CEL rule (CEL_CASES), and the edge
cases of the grammars the children's fields are held to (DIVERGENCE_CORPUS). The API server
judges them in tests/e2e/test_control_plane.py, and a CEL interpreter in tests/test_rules_cel.py;
validate must agree with both."""

from __future__ import annotations

from specs import DROP, make_spec

_VLLM_TRN1 = {"serving.runtime": "vllm", "model.architecture": "transformer", "serving.batching": {"maxBatchSize": 4}}
_TWO_TRN1_NODES = {"compute.family": "trn1", "compute.inf": 16, "compute.nodes": 2, **_VLLM_TRN1}

# One invalid spec for every CEL rule, so each rule is seen refusing input on a real API server.
# A trn2 vLLM model with default prefill and decode pools (spec.disaggregation).
_PD = {"compute.family": "trn2", "serving.runtime": "vllm", "model.architecture": "transformer", "disaggregation": {}}
CEL_CASES = {
    "fits-family": make_spec(**{"compute.inf": 17}),
    "one-request-neither": make_spec(**{"compute.inf": DROP}),
    "one-request-both": make_spec(**{"compute.cores": 1}),
    "cores-lnc": make_spec(**{"compute.inf": DROP, "compute.family": "trn2", "compute.cores": 2}),
    "cores-fit": make_spec(**{"compute.inf": DROP, "compute.family": "inf2", "compute.cores": 25}),
    "cores-shape-trn1": make_spec(**{"compute.inf": DROP, "compute.family": "trn1", "compute.cores": 4}),
    "divisible-cores": make_spec(**{"compute.inf": DROP, "compute.family": "inf2", "compute.cores": 3, "processesPerReplica": 2}),
    "small-types-cores": make_spec(
        **{"compute.inf": DROP, "compute.family": "inf2", "compute.cores": 4, "compute.instanceTypes": ["inf2.xlarge"]}
    ),
    "host-fits-cores": make_spec(
        **{"compute.inf": DROP, "compute.family": "inf2", "compute.cores": 1, "compute.cpu": "4", "compute.instanceTypes": ["inf2.xlarge"]}
    ),
    "trn1-group-of-4-cores": make_spec(**{"compute.inf": DROP, "compute.family": "trn1", "compute.cores": 8, "processesPerReplica": 2}),
    "trn1-chips": make_spec(**{"compute.family": "trn1", "compute.inf": 2}),
    "unknown-type": make_spec(**{"compute.instanceTypes": ["inf2.xlarge"]}),
    "small-types": make_spec(**{"compute.inf": 4, "compute.instanceTypes": ["inf1.xlarge", "inf1.2xlarge"]}),
    "divisible": make_spec(processesPerReplica=3),
    "divisible-plural": make_spec(**{"compute.inf": 3, "processesPerReplica": 8}),
    "fp32-cnn": make_spec(**{"model.architecture": "cnn", "model.precision": "fp32", "compile.batchSize": 2}),
    "dimensions": make_spec(**{"compile.buckets": [[64], [128, 128]]}),
    "duplicate": make_spec(**{"compile.buckets": [[500, 500], [600, 600], [500, 500]]}),
    "bucket-bound": make_spec(**{"model.weights": 500_000_000, "processesPerReplica": 4, "compile.buckets": [[1], [2], [3]]}),
    "lnc-trn1": make_spec(**{"compute.family": "trn1", "compute.lnc": 2}),
    "lnc-trn2": make_spec(**{"compute.family": "trn2", "compute.lnc": 4}),
    "trn2-lnc1-divisible": make_spec(**{"compute.family": "trn2", "compute.lnc": 1, "processesPerReplica": 3}),
    "trn1-group-of-4": make_spec(**{"compute.family": "trn1", "compute.inf": 4, "processesPerReplica": 2}),
    "vllm-inf1": make_spec(**{"serving.runtime": "vllm"}),
    "tensorflow-compile": make_spec(**{"model.framework": "tensorflow", "compile.image": "example.com/neuron:1"}),
    "compile-store-model": make_spec(**{"model.uri": "https://example.com/model.pt", "compile.image": "example.com/neuron:1"}),
    "compile-store-output": make_spec(**{"compile.outputUri": "gs://b/out/", "compile.image": "example.com/neuron:1"}),
    "quantity-cpu": make_spec(**{"compute.cpu": "1.2.3"}),
    "quantity-memory": make_spec(**{"compute.memory": "-1Gi"}),
    "ports": make_spec(**{"serving.port": 65535, "processesPerReplica": 4}),
    "env-name": make_spec(**{"serving.env": [{"name": "A=B", "value": "x"}]}),
    "env-newline": make_spec(**{"serving.env": [{"name": "A", "value": "x\ny"}]}),
    "args-newline": make_spec(**{"serving.args": ["serve", "--x\nLD_PRELOAD=/evil.so"]}),
    "extra-args-nul": make_spec(**{"compile.extraArgs": ["a\x00b"]}),
    "image-space": make_spec(**{"serving.image": "example.com/serve:1 "}),
    "compile-image-space": make_spec(**{"compile.image": "example.com/compile :1"}),
    "surge": make_spec(**{"rollout.maxSurge": -1}),
    "unavailable": make_spec(**{"rollout.maxUnavailable": "150%"}),
    "both-zero": make_spec(**{"rollout.maxSurge": 0, "rollout.maxUnavailable": 0}),
    "host-fits": make_spec(**{"compute.family": "inf2", "compute.cpu": "4", "compute.instanceTypes": ["inf2.xlarge"]}),
    "compile-cpu": make_spec(**{"compile.cpu": "4 cores"}),
    "compile-memory": make_spec(**{"compile.memory": "8GiB"}),
    "home-size": make_spec(**{"serving.homeSize": "lots"}),
    "tmp-size": make_spec(**{"serving.tmpSize": "-1Gi"}),
    "hugepages": make_spec(**{"compute.hugepages": "3Mi"}),
    "storage-secret": make_spec(**{"compile.storageSecret": "S3_Creds"}),
    "service-account": make_spec(serviceAccountName="-models"),
    "env-source": make_spec(**{"serving.env": [{"name": "T", "value": "x", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]}),
    "env-field": make_spec(**{"serving.env": [{"name": "T", "valueFrom": {"resourceFieldRef": {"resource": "limits.gpu"}}}]}),
    "env-key-ref": make_spec(**{"serving.env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "a/b"}}}]}),
    "env-from": make_spec(**{"serving.envFrom": [{"secretRef": {"name": "a"}, "configMapRef": {"name": "b"}}]}),
    "autoscaling-range": make_spec(**{"serving.batching": {"maxBatchSize": 2}, "autoscaling": {"minReplicas": 3, "maxReplicas": 2}}),
    "autoscaling-signal": make_spec(autoscaling={"maxReplicas": 2}),
    "autoscaling-target": make_spec(
        **{"compute.family": "inf2", "serving.runtime": "vllm", "model.architecture": "transformer", "autoscaling": {"maxReplicas": 2}}
    ),
    "autoscaling-zero": make_spec(**{"serving.batching": {"maxBatchSize": 2}, "autoscaling": {"minReplicas": 0, "maxReplicas": 2}}),
    "routing-api": make_spec(**{"serving.batching": {"maxBatchSize": 2}, "routing": {"inferencePool": {}}}),
    "routing-ports": make_spec(
        **{
            "compute.family": "inf2",
            "compute.inf": 6,
            "processesPerReplica": 12,
            "serving.runtime": "vllm",
            "model.architecture": "transformer",
            "routing": {"inferencePool": {}},
        }
    ),  # fmt: skip
    # Prefill and decode pools (spec.disaggregation): the vLLM Neuron plugin's, alone of what they cannot combine with.
    "disaggregation-runtime": make_spec(disaggregation={}),
    "disaggregation-autoscaling": make_spec(**{**_PD, "autoscaling": {"maxReplicas": 2, "targetInFlight": 4}}),
    "disaggregation-routing": make_spec(**{**_PD, "routing": {"inferencePool": {}}}),
    "disaggregation-processes": make_spec(**{**_PD, "processesPerReplica": 2}),
    "disaggregation-cores": make_spec(**{**_PD, "compute.inf": DROP, "compute.cores": 2, "compute.lnc": 1}),
    "disaggregation-nodes": make_spec(**{**_PD, "compute.nodes": 2}),
    "disaggregation-dra": make_spec(**{**_PD, "compute.inf": 1, "compute.allocation": "dra"}),
    "disaggregation-side-channel": make_spec(**{**_PD, "serving.port": 5557}),
    "disaggregation-pool-flag": make_spec(**{**_PD, "serving.args": ["-tp", "8"]}),
    **{f"disaggregation-{role}-empty": make_spec(**{**_PD, "disaggregation": {role: {"replicas": 0}}}) for role in ("prefill", "decode")},
    **{
        f"disaggregation-{role}-{what}": make_spec(**{**_PD, "disaggregation": {role: bad}})
        for role in ("prefill", "decode")
        for what, bad in (("inf", {"inf": 17}), ("dp", {"dataParallelSize": 3}), ("tp", {"inf": 2, "tensorParallelSize": 3}))
    },
    # A pool's autoscaling: no scale to zero, a range that is one, a target it can default.
    **{
        f"disaggregation-{role}-autoscaling-{what}": make_spec(**{**_PD, "disaggregation": {role: {"autoscaling": bad}}})
        for role, target in (("prefill", {"targetWaiting": 1}), ("decode", {"targetRunning": 1}))
        for what, bad in (
            ("zero", {"minReplicas": 0, "maxReplicas": 2, **target}),
            ("range", {"minReplicas": 3, "maxReplicas": 2, **target}),
            ("target", {"maxReplicas": 2}),
        )
    },
    "disaggregation-efa-required": make_spec(**{**_PD, "compute.family": "trn3", "disaggregation": {"efa": "required"}}),
    "disaggregation-compile": make_spec(**{**_PD, "compile.image": "example.com/c:1", "disaggregation": {"decode": {"inf": 2}}}),
    "disaggregation-tp-pair": make_spec(**{**_PD, "disaggregation": {"prefill": {"inf": 2}, "decode": {"inf": 1}}}),
    # Replicas across nodes (spec.compute.nodes): trn1's whole 32xlarge nodes, one vLLM process each.
    "nodes-family": make_spec(**{"compute.family": "inf2", "compute.inf": 12, "compute.nodes": 2, **_VLLM_TRN1}),
    "nodes-whole": make_spec(**{"compute.family": "trn1", "compute.inf": 8, "compute.nodes": 2, **_VLLM_TRN1}),
    "nodes-processes": make_spec(**{**_TWO_TRN1_NODES, "processesPerReplica": 2}),
    "nodes-runtime": make_spec(**{"compute.family": "trn1", "compute.inf": 16, "compute.nodes": 2}),
    "nodes-compile": make_spec(**{**_TWO_TRN1_NODES, "compile.image": "example.com/neuron:1"}),
    "nodes-dra": make_spec(**{**_TWO_TRN1_NODES, "compute.allocation": "dra"}),
    "nodes-memory": make_spec(**{**_TWO_TRN1_NODES, "model.weights": 1_000_000_000_000, "model.precision": "bf16"}),
    "nodes-image": make_spec(
        **{
            **_TWO_TRN1_NODES,
            "serving.image": "public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:0.16.0-neuronx-py312-sdk2.31.0-ubuntu24.04",
        }
    ),  # fmt: skip
    "nodes-zero": make_spec(**{**_TWO_TRN1_NODES, "autoscaling": {"minReplicas": 0, "maxReplicas": 2}}),
    "nodes-topology-key": make_spec(**{**_TWO_TRN1_NODES, "compute.topologyKey": "network node/layer"}),
    "nodes-topology-alone": make_spec(**{"compute.topologyKey": "topology.k8s.aws/network-node-layer-3"}),
    # AWS's Neuron DRA driver: not on inf1, whole devices only, connected ones only on Trainium.
    "dra-inf1": make_spec(**{"compute.allocation": "dra"}),
    "dra-cores": make_spec(
        **{"compute.inf": DROP, "compute.family": "trn2", "compute.lnc": 1, "compute.cores": 2, "compute.allocation": "dra"}
    ),
    # Every DRA rule a spec breaks is reported, not the first only (the API server runs each).
    "dra-inf1-cores": make_spec(**{"compute.inf": DROP, "compute.cores": 1, "compute.allocation": "dra"}),
    # An LNC above a chip's cores (inf2 has 2 a chip): refused by name, never a division by zero.
    "lnc-beyond-the-chip": make_spec(
        **{"compute.inf": DROP, "compute.family": "inf2", "compute.cores": 1, "compute.lnc": 4, "compute.instanceTypes": ["inf2.xlarge"]}
    ),
    "dra-unconnected": make_spec(**{"compute.family": "inf2", "compute.inf": 2, "compute.allocation": "dra"}),
    # 40 GB of bf16 weights: more than one inf2 chip (32 GiB) or one trn3 core at lnc 1 (18 GiB).
    "weights-beyond-the-chip": make_spec(**{"compute.family": "inf2", "model.weights": 20_000_000_000, "model.precision": "bf16"}),
    "weights-beyond-the-cores": make_spec(
        **{
            "compute.inf": DROP,
            "compute.family": "trn3",
            "compute.lnc": 1,
            "compute.cores": 1,
            "model.weights": 20_000_000_000,
            "model.precision": "bf16",
        }
    ),  # fmt: skip
    "fp32-cnn-inf2-ok-but-lnc": make_spec(
        **{"compute.family": "inf2", "compute.lnc": 2, "model.architecture": "cnn", "model.precision": "fp32", "compile.batchSize": 2}
    ),
    "disruption-budget": make_spec(disruptionBudget={"maxUnavailable": "101%"}),
}

# What a pod's placement may not hold (rules/scheduling.py), in each placement a model has.
_BAD_PLACEMENTS = {
    "exists-value": {"tolerations": [{"key": "a", "operator": "Exists", "value": "x"}]},
    "keyless": {"tolerations": [{"operator": "Equal", "value": "x"}]},
    "seconds": {"tolerations": [{"key": "a", "effect": "NoSchedule", "tolerationSeconds": 30}]},
    "requirement": {
        "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 1, "preference": {"matchExpressions": [{"key": "gen", "operator": "Exists", "values": ["x"]}]}}]}}
    },
    "priority": {"priorityClassName": "High"},
}  # fmt: skip
_PLACED = {
    "placement": lambda p: make_spec(placement=p),
    "compile-placement": lambda p: make_spec(**{"compile.image": "example.com/neuron:1", "compile.placement": p}),
    "holder-placement": lambda p: make_spec(
        **{"compile.image": "example.com/neuron:1", "serving.batching": {"maxBatchSize": 2},
           "autoscaling": {"minReplicas": 0, "maxReplicas": 2, "holderPlacement": p}}
    ),
}  # fmt: skip
CEL_CASES |= {f"{where}-{what}": spec(bad) for where, spec in _PLACED.items() for what, bad in _BAD_PLACEMENTS.items()}


def _speculating(**overrides: object) -> dict:
    """vLLM on trn2 with an EAGLE3 draft, and the overrides (each spec its own speculation object)."""
    base = {"compute.family": "trn2", "serving.runtime": "vllm", "serving.speculation.draft.uri": "org/draft-eagle3"}
    return make_spec(**{**base, **overrides})


# The rules of spec.serving.speculation (rules.speculation): where it runs, the draft's source, and
# what serving.args may not set beside it.
CEL_CASES |= {
    "speculation-plugin": _speculating(**{"serving.runtime": "custom", "serving.args": ["serve"]}),
    "speculation-draft": _speculating(**{"serving.speculation.draft.uri": "s3://b/draft/"}),
    "speculation-second-config": _speculating(**{"serving.args": ["--speculative-config", "{}"]}),
    "speculation-async": _speculating(**{"serving.args": ["--async_scheduling"]}),
}

SECRET = {"secretKeyRef": {"name": "hf", "key": "token"}}
ENV_SOURCES = [
    {},
    {"value": ""},
    {"valueFrom": SECRET},
    {"value": "x", "valueFrom": SECRET},
    {"valueFrom": {}},
    {"valueFrom": {**SECRET, "configMapKeyRef": {"name": "c", "key": "k"}}},
    {"valueFrom": {"secretKeyRef": {"name": "Bad_Name", "key": "token"}}},
    {"valueFrom": {"secretKeyRef": {"name": "hf", "key": "a/b"}}},
    {"valueFrom": {"configMapKeyRef": {"name": "c.d", "key": "k.e-y_1", "optional": True}}},
    *[
        {"valueFrom": {"fieldRef": {"fieldPath": f}}}
        for f in (
            "metadata.name",
            "status.podIP",
            "metadata.labels['app']",
            "metadata.annotations['a.b/c']",
            "spec.containers",
            "metadata.labels",
        )
    ],
    *[{"valueFrom": {"resourceFieldRef": {"resource": r}}} for r in ("limits.cpu", "requests.memory", "limits.gpu")],
]
ENV_FROM_SOURCES = [
    {"secretRef": {"name": "hf"}},
    {"configMapRef": {"name": "c", "optional": True}, "prefix": "HF_"},
    {},
    {"secretRef": {"name": "a"}, "configMapRef": {"name": "b"}},
    {"secretRef": {"name": "UPPER"}},
    {"secretRef": {"name": "a"}, "prefix": "1X"},
]

# Edge cases of the grammars the children's fields are held to: validate and the API
# server must give the same verdict on every one (the API server's is the truth).
DIVERGENCE_CORPUS = [
    *[
        {"compute.cpu": q}
        for q in (
            "1",
            "0.5",
            ".5",
            "5.",
            "1e3",
            "1E3",
            "1E",
            "1Ei",
            "500m",
            "1.5Gi",
            "+1",
            "1e-3",
            "1ki",
            "1K",
            "1.2.3",
            "1iM",
            "-1Gi",
            "1kk",
            "",
            " 1",
            "1 ",
            "1e",
            "0x10",
            "1_000",
            "00",
            "1.0e3",
            "1n",
            "1u",
            "1Mi ",
            "١",
            "12345678901234567890",
        )
    ],
    *[{"compute.memory": q} for q in (2, 0, "4Gi", "4gi", "4GiB")],
    *[{"compile.cpu": q} for q in ("4", "500m", "-1", "4 cores")],
    # The replica's CPU and memory against what each instance type leaves to pods.
    *[
        {"compute.family": "inf2", "compute.instanceTypes": ["inf2.xlarge"], **r}
        for r in (
            {"compute.cpu": "4"},
            {"compute.cpu": "3920m"},
            {"compute.cpu": "3921m"},
            {"compute.memory": "15391Mi"},
            {"compute.memory": "16Gi"},
        )
    ],
    *[{"compute.memory": m} for m in ("190Gi", "300Gi")],
    {"compute.family": "trn1", "compute.inf": 16, "compute.instanceTypes": ["trn1n.32xlarge"], "compute.cpu": "127"},
    *[{"compile.memory": q} for q in ("600Gi", "8GiB", 64)],
    *[{"rollout.maxSurge": v} for v in (0, 1, "0%", "25%", "250%", -1, "1.5", "%", "01")],
    *[{"rollout.maxUnavailable": v} for v in ("100%", "101%", 3)],
    *[{"serving.port": p, "processesPerReplica": 4} for p in (65532, 65533)],
    *[{"serving.env": [{"name": n, "value": "v"}]} for n in ("A", "_a1", "a-b", "1a", "A.B", "É")],
    *[{"serving.args": [a]} for a in ("ok", "tab\there", "new\nline", "cr\rx", "nul\x00x")],
    *[{"serving.env": [{"name": "V", **e}]} for e in ENV_SOURCES],
    *[{"serving.envFrom": [f]} for f in ENV_FROM_SOURCES],
    {"serving.image": "example.com/a b:1"},
    {"serving.image": "example.com/ab:1\t"},
    # An EAGLE3 draft's Hub id: Python's $ matches before a last newline, RE2's (CEL's) does not.
    *[
        {"compute.family": "trn2", "serving.runtime": "vllm", "serving.speculation.draft.uri": u}
        for u in ("org/draft", "org/draft\n", "org/draft\n\n", "draft", "/opt/draft", "/")
    ],
    # NeuronCore requests (spec.compute.cores), valid and invalid, on every family.
    *[
        {"compute.inf": DROP, "compute.family": family, "compute.cores": cores, **extra}
        for family, cores, extra in (
            ("inf1", 1, {}),
            ("inf1", 3, {}),
            ("inf1", 3, {"processesPerReplica": 3}),
            ("inf1", 3, {"processesPerReplica": 2}),
            ("inf1", 64, {}),
            ("inf1", 65, {}),
            ("inf2", 1, {}),
            ("inf2", 2, {"processesPerReplica": 2}),
            ("inf2", 24, {"processesPerReplica": 5}),
            ("inf2", 0, {}),
            ("trn1", 1, {}),
            ("trn1", 2, {}),
            ("trn1", 3, {}),
            ("trn1", 8, {"processesPerReplica": 4}),
            ("trn1", 32, {}),
            ("trn2", 1, {}),
            ("trn2", 1, {"compute.lnc": 1}),
            ("trn2", 8, {"compute.lnc": 1, "processesPerReplica": 8}),
            ("trn2", 129, {"compute.lnc": 1}),
        )
    ],
    # Integers: the API server holds int64 only; chips and cores beyond any instance name the family's limit.
    {"model.weights": 99999999999999999999999},
    {"model.weights": 2**63},
    {"compile.buckets": [[99999999999999999999]]},
    {"compute.inf": 99999999999},
    {"compute.inf": DROP, "compute.family": "inf2", "compute.cores": 99999999999999},
    {"replicas": 2**63},
    # Autoscaling: the range, its bounds, the windows, and what the pods must count.
    *[
        {"serving.batching": {"maxBatchSize": 2}, "autoscaling": a}
        for a in (
            {"maxReplicas": 1},
            {"minReplicas": 2, "maxReplicas": 1},
            {"minReplicas": 0, "maxReplicas": 1},
            {"maxReplicas": 2**31 - 1, "minReplicas": 2**31 - 1},
            {"maxReplicas": 2**31},
            {"maxReplicas": 3, "windowSeconds": 3600, "scaleUpStabilizationSeconds": 0},
            {"maxReplicas": 3, "scaleDownStabilizationSeconds": 3601},
            {"maxReplicas": 3, "targetInFlight": 0},
            {"minReplicas": 1},
            {},
            {"minReplicas": 0, "maxReplicas": 1},
            {"minReplicas": 0, "maxReplicas": 1, "idleSeconds": 86400, "holdSeconds": 3600, "maxHeldRequests": 65536},
            {"minReplicas": 0, "maxReplicas": 1, "idleSeconds": 86401},
            {"minReplicas": 0, "maxReplicas": 1, "holdSeconds": 0},
        )
    ],
    {"compile.image": "example.com/c:1", "serving.batching": {"maxBatchSize": 2}, "autoscaling": {"minReplicas": 0, "maxReplicas": 1}},
    {"autoscaling": {"maxReplicas": 2}},
    {"autoscaling": None},
    # Prefill and decode pools: valid shapes, and each pool's parallelism against its cores.
    _PD,
    {**_PD, "disaggregation": {"prefill": {"replicas": 2}, "decode": {"inf": 2, "dataParallelSize": 2}}},
    {**_PD, "serving.batching": {"maxBatchSize": 4}},
    {**_PD, "compute.lnc": 1, "disaggregation": {"decode": {"inf": 4, "tensorParallelSize": 8, "dataParallelSize": 4}}},
    {**_PD, "compute.family": "trn3", "disaggregation": {"decode": {"dataParallelSize": 5}}},
    {**_PD, "compute.lnc": 4, "disaggregation": {"decode": {"dataParallelSize": 3}}},
    {**_PD, "compile.image": "example.com/c:1", "disaggregation": {"prefill": {"inf": 1, "tensorParallelSize": 4}}},
    {**_PD, "disaggregation": {"efa": "required"}, "compute.instanceTypes": ["trn2.3xlarge"]},
    {**_PD, "disaggregation": {"efa": "required"}, "compute.instanceTypes": ["trn2.3xlarge", "trn2u.48xlarge"]},
    {**_PD, "compute.family": "trn3", "disaggregation": {"efa": "off"}},
    {**_PD, "compile.image": "example.com/c:1", "disaggregation": {"prefill": {"dataParallelSize": 2}, "decode": {"inf": 3}}},
    {**_PD, "compute.family": "trn1", "disaggregation": {"decode": {"inf": 99}}},
    # The decode's TP against the prefill's: a multiple, narrower, uneven, given or derived, one pool left out.
    {**_PD, "disaggregation": {"prefill": {"inf": 1}, "decode": {"inf": 3}}},
    {**_PD, "disaggregation": {"prefill": {"inf": 2}, "decode": {"inf": 3}}},
    {**_PD, "disaggregation": {"prefill": {"inf": 4}}},
    {**_PD, "compute.inf": 2, "disaggregation": {"decode": {"inf": 1}}},
    {**_PD, "compute.lnc": 1, "disaggregation": {"prefill": {"tensorParallelSize": 8}, "decode": {"inf": 2, "tensorParallelSize": 16}}},
    {**_PD, "compute.lnc": 1, "disaggregation": {"prefill": {"inf": 2, "dataParallelSize": 2}, "decode": {"inf": 1}}},
    {**_PD, "compute.inf": 2, "compute.allocation": "dra", "disaggregation": {"decode": {"inf": 4}}},
    {**_PD, "serving.args": ["--kv_transfer_config={}"]},
    {**_PD, "serving.args": ["--data-parallel-size-local", "2", "-dp=2"]},
    {**_PD, "serving.args": ["-tpx", "--tensor-parallel", "--max-model-len", "4096"]},
    {**_PD, "serving.port": 5558},
    {**_PD, "replicas": 0, "disaggregation": {"prefill": {"replicas": 0}, "decode": {"replicas": 0}}},
    {**_PD, "replicas": 2, "disaggregation": {"decode": {"replicas": 0}}},
    # Data-parallel pools are refused: each engine holds all the weights (70B bf16 over 16 chips, DP16).
    {**_PD, "model.weights": 70_600_000_000, "compute.inf": 2, "disaggregation": {"decode": {"inf": 16, "dataParallelSize": 16}}},
    # Routing: a pool needs an OpenAI-compatible server (vLLM), and at most 8 ports a pod.
    {"routing": {"inferencePool": {}}},
    {"serving.batching": {"maxBatchSize": 2}, "routing": {"inferencePool": {"failureMode": "FailOpen"}}},
    {"serving.batching": {"maxBatchSize": 2}, "routing": {"inferencePool": {"failureMode": "Sometimes"}}},
    {"routing": {}},
    *[
        {
            "compute.family": "inf2",
            "compute.inf": 6,
            "processesPerReplica": n,
            "serving.runtime": "vllm",
            "model.architecture": "transformer",
            "routing": {"inferencePool": {}},
        }
        for n in (6, 12)
    ],  # fmt: skip
    {
        "compute.family": "inf2",
        "serving.runtime": "vllm",
        "model.architecture": "transformer",
        "autoscaling": {"maxReplicas": 2, "targetInFlight": 4},
    },
    # Hugepages: whole 2 MiB pages only, in any quantity spelling.
    *[{"compute.hugepages": h} for h in ("256Mi", "2Mi", "1Gi", "2097152", "4194304e0", "3Mi", "1.5Mi", "0", "-2Mi", "1", "lots")],
    {"compute.inf": DROP},
    {"compute.cores": 1},
    {"compute.inf": DROP, "compute.family": "inf2", "compute.cores": 1, "compute.instanceTypes": ["inf2.xlarge"], "compute.cpu": "3"},
    {"compute.inf": DROP, "compute.family": "inf2", "compute.cores": 14, "compute.instanceTypes": ["inf2.24xlarge"]},
    {"compute.inf": DROP, "compute.family": "inf2", "compute.cores": 2, "compile.buckets": [[1], [2], [3]], "model.weights": 3_000_000_000},
]
