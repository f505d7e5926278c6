"""The InferentiaModel API (group inferentia.dev, version v1alpha1).

These pydantic models are the single source of truth: the CRD in ``crds/`` is
generated from them (``inferentia-operator crd``), and each attribute's docstring
becomes its description, so ``kubectl explain`` shows what is written here.
Cross-field rules live in :mod:`inferentia_operator.core.rules`, which also emits the
matching CEL for the CRD.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, StrictBool, StrictInt

from .apimodel import ApiModel
from .catalogue import FAMILY_NAMES
from .placement import Placement

GROUP = "inferentia.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferentiaModel"
PLURAL = "inferentiamodels"
SINGULAR = "inferentiamodel"
SHORT_NAMES = ["infm"]

# Bounds that keep CEL rules within the API server's cost budget.
MAX_BUCKETS = 64
MAX_BUCKET_DIMENSIONS = 8
MAX_ARGS = 64
MAX_STRING = 1024

INT32_MAX = 2**31 - 1  # Deployment replicas and ports are int32 in every child
MAX_WEIGHTS = 10**15  # a thousand times the largest models: keeps the memory arithmetic in CEL's int64
MAX_SHAPE = 2**20
MAX_QUANTITY = 64
# The most nodes one replica spans (512 NeuronCores of trn1.32xlarge): vLLM's launcher takes
# any count; a bound keeps every field finite for CEL's cost estimate.
MAX_NODES = 16
# The most vLLM engines or tensor-parallel ranks of one pool replica: trn2.48xlarge's 128 physical cores.
MAX_PARALLEL = 128


def _quantity(value: Any) -> Any:
    """cpu and memory are strings or numbers; their grammar is a rule (rules.child_values.QUANTITY), so
    that `kubectl apply` refuses a bad one with the same message as validate."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError("a Kubernetes quantity such as 2, 500m or 4Gi is needed")
    return str(value)


def _auto_or_bool(value: Any) -> Any:
    """staticWeights is true, false or "auto" (YAML gives the first two as booleans)."""
    if isinstance(value, bool) or value == "auto":
        return value
    raise ValueError("valid values are auto, true, false")


def _replace_schema(schema: dict[str, Any], replacement: dict[str, Any]) -> None:
    """Swap a field's type for one pydantic cannot express, keeping its description and default."""
    kept = {k: v for k, v in schema.items() if k in ("description", "default")}
    schema.clear()
    schema.update(replacement, **kept)


def _int_or_string(max_length: int) -> Any:
    """An int-or-string field; its values are judged by CEL rules (the rules package), not by a
    pattern, so that the API server and validate refuse them with the same message."""
    # The one anyOf a structural schema allows; maxLength beside it applies to strings.
    schema: dict[str, Any] = {
        "x-kubernetes-int-or-string": True,
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "maxLength": max_length,
    }
    return lambda s: _replace_schema(s, schema)


def _int_or_text(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError("a whole number or a percentage such as 25% is needed")
    # "2" passes the CRD's pattern, but a Deployment's or a PodDisruptionBudget's int-or-string
    # takes a string only as a percentage: the children get the number. Only a count as the
    # pattern spells it is read as one: "01" stays text, for the rule to refuse as CEL does.
    return int(value) if isinstance(value, str) and re.fullmatch(r"0|[1-9][0-9]{0,8}", value) else value


Quantity = Annotated[
    str,
    BeforeValidator(_quantity),
    Field(json_schema_extra=_int_or_string(MAX_QUANTITY)),
]
IntOrPercent = Annotated[
    int | str,
    BeforeValidator(_int_or_text),
    Field(json_schema_extra=_int_or_string(16)),
]
Arg = Annotated[str, Field(max_length=MAX_STRING)]


class ModelSource(ApiModel):
    """The model to serve: where its uncompiled form lives and what it is."""

    uri: Annotated[str, Field(min_length=1, max_length=MAX_STRING)]
    """Where the uncompiled model lives (for example s3://bucket/resnet50/ or a path the compile image can read)."""
    framework: Literal["tensorflow", "pytorch"]
    """The framework the model was saved with: tensorflow or pytorch."""
    architecture: Literal["cnn", "transformer", "other"] = "other"
    """The network's architecture. On inf1, cnn enables the neuron-cc batching flags for batch sizes above 1 and the CNN batch limits; on inf2, trn1, trn2 and trn3, transformer compiles with --model-type transformer."""
    precision: Literal["fp32", "fp16", "bf16", "mixed"] = "fp16"
    """Numeric precision on the NeuronCores. inf1 (neuron-cc): mixed casts only matmul and convolution inputs (--fp32-cast=matmult). inf2, trn1, trn2, trn3 (neuronx-cc): fp32 keeps fp32 (--auto-cast none), fp16 and bf16 cast everything to that type, mixed casts only matrix multiplications."""
    weights: Annotated[StrictInt | None, Field(ge=1, le=MAX_WEIGHTS)] = None
    """Number of parameters, when known. Enables the device-memory check (the weights, at the precision's bytes, must fit the cores of each process), the bucket-count bound and the static-weights check."""
    layers: Annotated[StrictInt | None, Field(ge=1, le=MAX_SHAPE)] = None
    """Transformer layers (num_hidden_layers in a Hugging Face config). With kvHeads and headDim, the device-memory check counts the KV cache too."""
    kv_heads: Annotated[StrictInt | None, Field(ge=1, le=MAX_SHAPE)] = None
    """Key-value attention heads (num_key_value_heads; num_attention_heads without grouped-query attention)."""
    head_dim: Annotated[StrictInt | None, Field(ge=1, le=MAX_SHAPE)] = None
    """Dimension of one attention head (head_dim, or hidden_size / num_attention_heads)."""


class Compute(ApiModel):
    """The hardware one replica gets."""

    # No int32 bound: the family rule (FITS_FAMILY) refuses what no instance holds, naming the family's largest.
    inf: Annotated[StrictInt | None, Field(ge=1)] = None
    """Whole Neuron chips per replica (aws.amazon.com/neuron; one chip is 4 NeuronCores on inf1, 2 on inf2 and trn1, 8 physical on trn2 and trn3: 4 logical at lnc 2). Fractional chips are not allowed. Set exactly one of inf and cores."""
    cores: Annotated[StrictInt | None, Field(ge=1)] = None
    """NeuronCores per replica (aws.amazon.com/neuroncore), for a model smaller than a chip: the replica shares its chip with other pods and sees only its cores' share of the chip's device memory. Requests of more than one core need the Neuron scheduler extension. Set exactly one of inf and cores."""
    family: Literal[FAMILY_NAMES] = "inf1"  # type: ignore[valid-type]
    """The Neuron instance family: inf1, inf2, trn1, trn2 or trn3."""
    instance_types: Annotated[list[Annotated[str, Field(max_length=64)]] | None, Field(max_length=16)] = None
    """Restricts scheduling to these instance types of the family (node.kubernetes.io/instance-type). Default: every type of the family with at least inf chips."""
    lnc: Annotated[StrictInt | None, Field(ge=1)] = None
    """Logical NeuronCore configuration: physical cores per logical core. trn2 and trn3: 1 or 2 (default 2, so a chip shows 4 logical cores); every other family: 1. Cores are counted in logical cores everywhere else."""
    cpu: Quantity = "1"
    """CPU requested by each replica (a Kubernetes quantity)."""
    memory: Quantity = "2Gi"
    """Host memory requested by each replica (a Kubernetes quantity)."""
    hugepages: Quantity | None = None
    """2 MiB hugepages (hugepages-2Mi) requested by each replica, a whole number of pages such as 256Mi. Default: none, as in AWS's Kubernetes examples for the Neuron Runtime 2.x; set it only for a runtime that does (the Neuron Runtime 1.x daemon wanted 256Mi per Inferentia chip). Nodes must reserve them, or the pods cannot be placed."""
    nodes: Annotated[StrictInt, Field(ge=1, le=MAX_NODES)] = 1
    """Nodes one replica spans, each taking inf chips (whole nodes): above 1, a replica is a LeaderWorkerSet group of one pod a node, running one tensor-parallel model over EFA (vLLM on NxD Inference, trn1 only). Default 1: one pod."""
    topology_key: Annotated[str | None, Field(max_length=317)] = None
    """With nodes above 1: a node label whose value names a part of the network, such as EKS's topology.k8s.aws/network-node-layer-3; every pod of a group is placed on nodes that share its value (groups may share one). Default: none, anywhere."""
    allocation: Literal["devicePlugin", "dra"] | None = None
    """How a replica gets its Neuron devices: devicePlugin (aws.amazon.com/neuron or neuroncore from the Neuron device plugin) or dra (a ResourceClaimTemplate for AWS's Neuron DRA driver, DeviceClass neuron.aws.com: whole devices, connected ones on trn, the LNC set per claim). A node runs one or the other. Default: the operator's --allocation (devicePlugin unless set)."""

    @property
    def one_request(self) -> bool:
        """Exactly one of inf and cores is set (the CRD's CEL rule restates this)."""
        return (self.inf is None) != (self.cores is None)


class Batching(ApiModel):
    """Server-side adaptive batching: requests are grouped until either bound is reached."""

    max_batch_size: Annotated[StrictInt, Field(ge=1, le=INT32_MAX)] = 1
    """Largest batch the server forms from concurrent requests."""
    max_latency_ms: Annotated[StrictInt, Field(ge=1, le=INT32_MAX)] = 100
    """Latency budget in milliseconds; requests that cannot meet it are answered 503."""
    image: Annotated[str | None, Field(max_length=MAX_STRING)] = None
    """Image of the batching front end the serving pod runs beside the model processes. Default: the operator's own image (its batch command), the operator's --operator-image."""


class CompileOptions(ApiModel):
    """How the model is compiled for the NeuronCore Group (compiler flags follow from these and the plan)."""

    batch_size: Annotated[StrictInt, Field(ge=1, le=INT32_MAX)] = 1
    """The batch size the model is compiled for."""
    dynamic_batch_size: StrictBool = False
    """Let clients send any multiple of the compiled batch size (compile option dynamic_batch_size=True)."""
    optimize_for: Literal["throughput", "latency"] | None = None
    """What the deployment favours. throughput: small groups, many processes; latency: larger groups (NeuronCore pipeline)."""
    static_weights: Annotated[
        Literal["auto"] | bool,
        BeforeValidator(_auto_or_bool),
        Field(json_schema_extra=lambda s: _replace_schema(s, {"x-kubernetes-preserve-unknown-fields": True})),
    ] = "auto"
    """Cache all weights on the NeuronCores (--static-weights): true, false, or auto (on exactly when the weights are known to fit the group's memory)."""
    buckets: Annotated[
        list[Annotated[list[Annotated[StrictInt, Field(ge=1)]], Field(min_length=1, max_length=MAX_BUCKET_DIMENSIONS)]] | None,
        Field(max_length=MAX_BUCKETS),
    ] = None
    """Input-shape buckets, one compiled model each, for example [[500,500],[600,600]] or [[64],[128]]. Inputs are padded to the smallest bucket that holds them."""
    extra_args: Annotated[list[Arg] | None, Field(max_length=MAX_ARGS)] = None
    """Further compiler arguments, appended after the planned ones."""
    image: Annotated[str | None, Field(max_length=MAX_STRING)] = None
    """The Neuron framework image the compile Job runs in, usually the serving image (AWS's Neuron Deep Learning Containers ship the framework and its compiler). When set, a compile Job traces the model for the plan with the operator's compile program, one artefact per bucket, before serving (with the vLLM preset: the operator's compile step for vLLM's Neuron backend). When unset, nothing is compiled ahead: the operator's model server traces the model at start."""
    input_dtype: Literal["float32", "float16", "bfloat16", "int64", "int32"] | None = None
    """The dtype of the model's input tensor, for the example inputs the compile program traces with and the inputs the operator's model server builds from JSON. Default: int64 (token ids) for architecture transformer, float32 otherwise."""
    output_uri: Annotated[str | None, Field(max_length=MAX_STRING)] = None
    """Where compiled artefacts are written. Default: next to the model, under a directory named after the compile inputs' hash."""
    cpu: Quantity | None = None
    """CPU the compile Job requests. Default: 4 for neuronx-cc, 2 for neuron-cc."""
    memory: Quantity | None = None
    """Memory the compile Job requests and is limited to. Default: twice the weights' size when spec.model.weights is known (at least 8Gi), else 16Gi for neuronx-cc and 8Gi for neuron-cc."""
    timeout_seconds: Annotated[StrictInt, Field(ge=60, le=7 * 24 * 3600)] = 6 * 3600
    """How long a compile may run, retries included, before it fails with Compiled=False (the Job's activeDeadlineSeconds)."""
    storage_secret: Annotated[str | None, Field(max_length=253)] = None
    """A Secret in the model's namespace whose keys become the environment of the compile Job and of the serving pods' artefact fetch: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, and AWS_ENDPOINT_URL for an S3-compatible store. Without it, credentials come from serviceAccountName (IRSA, EKS Pod Identity)."""
    placement: Placement | None = None
    """Where the compile Job runs: the PodSpec's nodeSelector, tolerations, affinity, topologySpreadConstraints and priorityClassName. It needs no Neuron device, so a CPU node group with the host memory the plan asks for (status.plan.sizes.compileMemory) can compile. The Neuron taint is not tolerated unless listed here."""


class KeySelector(ApiModel):
    """One key of a Secret or ConfigMap in the model's namespace."""

    name: Annotated[str, Field(min_length=1, max_length=253)]
    """The Secret's or ConfigMap's name."""
    key: Annotated[str, Field(min_length=1, max_length=253)]
    """The key whose value the variable takes."""
    optional: StrictBool | None = None
    """Start the pod even when the Secret, ConfigMap or key does not exist."""


class FieldSelector(ApiModel):
    """A field of the pod (the downward API)."""

    field_path: Annotated[str, Field(min_length=1, max_length=256)]
    """metadata.name, metadata.namespace, metadata.uid, metadata.labels['<key>'], metadata.annotations['<key>'], spec.nodeName, spec.serviceAccountName, status.hostIP, status.hostIPs, status.podIP or status.podIPs."""


class ResourceFieldSelector(ApiModel):
    """A resource request or limit of the serving container."""

    resource: Annotated[str, Field(min_length=1, max_length=64)]
    """limits.cpu, limits.memory, limits.ephemeral-storage, requests.cpu, requests.memory or requests.ephemeral-storage."""


class EnvVarSource(ApiModel):
    """Where a variable's value comes from; exactly one of these."""

    secret_key_ref: KeySelector | None = None
    """A key of a Secret, for credentials such as HF_TOKEN: the value never appears in the model."""
    config_map_key_ref: KeySelector | None = None
    """A key of a ConfigMap."""
    field_ref: FieldSelector | None = None
    """A field of the pod."""
    resource_field_ref: ResourceFieldSelector | None = None
    """A resource of the serving container."""


class EnvVar(ApiModel):
    """An environment variable for every serving process: a value, or valueFrom."""

    name: Annotated[str, Field(min_length=1, max_length=256)]
    """Variable name."""
    value: Annotated[str | None, Field(max_length=MAX_STRING)] = None
    """Variable value (empty when neither value nor valueFrom is set)."""
    value_from: EnvVarSource | None = None
    """Take the value from a Secret, a ConfigMap, the pod or the container's resources instead."""


class SourceRef(ApiModel):
    """A Secret or ConfigMap in the model's namespace."""

    name: Annotated[str, Field(min_length=1, max_length=253)]
    """Its name."""
    optional: StrictBool | None = None
    """Start the pod even when it does not exist."""


class EnvFromSource(ApiModel):
    """Every key of a Secret or ConfigMap as a variable; exactly one of secretRef and configMapRef."""

    prefix: Annotated[str | None, Field(max_length=64)] = None
    """Prepended to every key."""
    secret_ref: SourceRef | None = None
    """A Secret."""
    config_map_ref: SourceRef | None = None
    """A ConfigMap."""


class Draft(ApiModel):
    """The EAGLE3 draft model: a checkpoint trained against the target (spec.model), such as RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3 for meta-llama/Llama-3.1-8B-Instruct."""

    uri: Annotated[str, Field(min_length=1, max_length=MAX_STRING)]
    """A Hugging Face model id (org/name), as vLLM takes it, or an absolute path in the serving image. With compile.image and a target named by a Hugging Face id, the compile Job downloads a Hub draft once and keeps it in the artefact beside the target, and the serving pods read both from there, offline; otherwise vLLM downloads the draft in each serving pod at start (and in the compile Job). Not fetched from s3:// or https://."""
    weights: Annotated[StrictInt | None, Field(ge=1, le=MAX_WEIGHTS)] = None
    """Number of the draft's parameters, at the target's precision (vLLM loads the draft at the target's dtype). With the target's weights and shape, the plan sizes the vLLM Neuron plugin's KV cache with the draft's weights and its decoder layer counted; without it, the plugin sizes the cache itself."""


class Speculation(ApiModel):
    """EAGLE3 speculative decoding with the vLLM Neuron plugin: a draft model and how many tokens it proposes a step."""

    draft: Draft
    """The draft model."""
    num_speculative_tokens: Annotated[StrictInt, Field(ge=1, le=MAX_SHAPE)] = 3
    """Draft tokens proposed a step (vLLM's num_speculative_tokens, above 0; at or above vLLM's max_model_len, the largest bucket's last dimension, a warning: the plugin never speculates). Default 3, where the plugin's guidance starts: raise it when acceptance is high, lower it when acceptance is low."""


class Serving(ApiModel):
    """The serving container of each replica."""

    image: Annotated[str, Field(min_length=1, max_length=MAX_STRING)]
    """Serving image. Each process receives its NeuronCore Group through NEURON_RT_VISIBLE_CORES."""
    port: Annotated[StrictInt, Field(ge=1, le=65535)] = 8080
    """Port the first serving process listens on; process i listens on port + i."""
    args: Annotated[list[Arg] | None, Field(max_length=MAX_ARGS)] = None
    """Arguments for the serving container."""
    env: Annotated[list[EnvVar] | None, Field(max_length=MAX_ARGS)] = None
    """Extra environment for every serving process. A name set here wins over the value the operator plans for it, in every process."""
    env_from: Annotated[list[EnvFromSource] | None, Field(max_length=16)] = None
    """Secrets and ConfigMaps whose keys become variables of the serving container. As in Kubernetes, env (yours and the planned values) wins over envFrom for the same name."""
    threads_per_process: Annotated[StrictInt | None, Field(ge=1, le=INT32_MAX)] = None
    """Request threads per process. Default: the group's NeuronCores + 3, so that every outstanding inference has a thread."""
    batching: Batching | None = None
    """Server-side adaptive batching; off when unset."""
    home_size: Quantity | None = None
    """Size of the writable volume at HOME (/home/inferentia), where HF_HOME and the other caches live. Default: sized from the model (status.plan.sizes.homeBytes): a model vLLM downloads from the Hugging Face Hub, and the graphs a compile at start writes, with a quarter and 1 GiB of room; 20Gi at least, and when spec.model.weights is unknown."""
    tmp_size: Quantity = "1Gi"
    """Size limit of the writable emptyDir at /tmp (TMPDIR)."""
    storage_class_name: Annotated[str | None, Field(min_length=1, max_length=253)] = None
    """Put HOME and the artefact and model volumes of the serving pods and the compile Job on a generic ephemeral volume of this StorageClass (a PersistentVolumeClaim per pod, created and deleted with the pod; for example an EBS gp3 class), at the plan's sizes, instead of an emptyDir on the node's disk. For models whose weights do not fit a node's root volume."""
    startup_seconds: Annotated[StrictInt | None, Field(ge=10, le=7 * 24 * 3600)] = None
    """How long a serving pod may take to start (its startup probe's budget) before it is restarted. Default: sized from the model (status.plan.sizes.startupSeconds): 30 minutes to load, the Hub download at 100 MiB/s, and compile.timeoutSeconds when the pod compiles at start."""
    read_only_root_filesystem: StrictBool = True
    """Mount the serving container's root file system read-only (it writes to HOME and /tmp). false for images that write elsewhere."""
    runtime: Literal["custom", "vllm"] = "custom"
    """custom: your image runs args (one process per NeuronCore Group). vllm (inf2, trn1, trn2, trn3): the operator runs vLLM's OpenAI-compatible server in each process, tensor parallel over its group; args are appended to vLLM's own."""
    speculation: Speculation | None = None
    """EAGLE3 speculative decoding, with runtime vllm on trn2 and trn3 (the vLLM Neuron plugin): the draft proposes numSpeculativeTokens tokens a step and the target verifies them in one forward pass. Rendered as vLLM's --speculative-config {"method":"eagle3","model":<draft.uri>,"num_speculative_tokens":<n>} and --no-async-scheduling, in every serving process's flags and in the compile step's engine alike. Off when unset."""


class Rollout(ApiModel):
    """How a new plan replaces running replicas. Accelerators are scarce, so by default no replica is added above spec.replicas."""

    max_surge: IntOrPercent = 0
    """Replicas that may exist above spec.replicas during a rollout (a number or a percentage)."""
    max_unavailable: IntOrPercent = 1
    """Replicas that may be unavailable during a rollout (a number or a percentage)."""


class DisruptionBudget(ApiModel):
    """The model's PodDisruptionBudget: how many replicas voluntary disruptions (a node drained
    for an upgrade, Karpenter's consolidation) may take at once. Pods that are not ready may
    always be evicted (unhealthyPodEvictionPolicy AlwaysAllow), so a broken model never blocks a drain."""

    max_unavailable: IntOrPercent = 1
    """Replicas that may be unavailable at once (a number or a percentage); 0 lets no drain take a replica. A replica that spans nodes counts once, with all its pods."""


# The HorizontalPodAutoscaler's bound on a stabilization window (autoscaling/v2
# HPAScalingRules.stabilizationWindowSeconds: "must be greater than or equal to zero and
# less than or equal to 3600 (one hour)").
MAX_WINDOW_SECONDS = 3600
MAX_IDLE_SECONDS = 86400  # a day
MAX_HELD = 65536


class Autoscaling(ApiModel):
    """Scale the model on the requests its replicas hold, through KEDA and Prometheus: desired
    replicas = in-flight requests across the replicas / targetInFlight, as Cortex computed it."""

    min_replicas: Annotated[StrictInt, Field(ge=0, le=INT32_MAX)] = 1
    """The fewest replicas (Cortex: min_replicas). The model runs this many (at least 1) while nothing scales it: KEDA not installed, or no Prometheus configured. 0 scales the model to zero after idleSeconds without a request; it needs compile.image, so that a replica that starts from zero fetches its artefact and never compiles, and a holder answers the model's Service meanwhile."""
    max_replicas: Annotated[StrictInt, Field(ge=1, le=INT32_MAX)]
    """The most replicas (Cortex: max_replicas)."""
    target_in_flight: Annotated[StrictInt | None, Field(ge=1, le=INT32_MAX)] = None
    """In-flight requests (queued plus being served) one replica should carry (Cortex: target_replica_concurrency). Default: the replica's parallelism, processesPerReplica * serving.batching.maxBatchSize (each process runs one batch, or with vLLM up to maxBatchSize sequences, at a time)."""
    window_seconds: Annotated[StrictInt, Field(ge=0, le=MAX_WINDOW_SECONDS)] = 60
    """The in-flight count is averaged over this many seconds (Cortex: window); 0 takes each reading as it is."""
    scale_up_stabilization_seconds: Annotated[StrictInt, Field(ge=0, le=MAX_WINDOW_SECONDS)] = 60
    """A scale-up follows the lowest recommendation of this many seconds, so a short burst is queued rather than met with a replica that takes minutes to load (Cortex: upscale_stabilization_period)."""
    scale_down_stabilization_seconds: Annotated[StrictInt, Field(ge=0, le=MAX_WINDOW_SECONDS)] = 300
    """A scale-down follows the highest recommendation of this many seconds (Cortex: downscale_stabilization_period)."""
    idle_seconds: Annotated[StrictInt, Field(ge=0, le=MAX_IDLE_SECONDS)] = 300
    """With minReplicas 0: the model goes to zero after this many seconds without a request in flight (KEDA's cooldownPeriod)."""
    hold_seconds: Annotated[StrictInt, Field(ge=1, le=MAX_WINDOW_SECONDS)] = 300
    """With minReplicas 0: how long the holder keeps a request that arrives at zero replicas waiting for one to start, before it answers 503 with Retry-After."""
    max_held_requests: Annotated[StrictInt, Field(ge=1, le=MAX_HELD)] = 1024
    """With minReplicas 0: requests the holder keeps at once; more are answered 503 with Retry-After."""
    holder_placement: Placement | None = None
    """With minReplicas 0: where the holder runs (it needs no Neuron device: a CPU node group keeps no Neuron node up while the model is at zero). The PodSpec's nodeSelector, tolerations, affinity, topologySpreadConstraints and priorityClassName."""


class InferencePoolOptions(ApiModel):
    """The model's InferencePool (Gateway API Inference Extension, inference.networking.k8s.io/v1) and its endpoint picker."""

    failure_mode: Literal["FailOpen", "FailClose"] = "FailClose"
    """What a gateway does when the endpoint picker does not answer: FailClose drops the request, FailOpen sends it to an endpoint of the gateway's own choosing (the pool's endpointPickerRef.failureMode)."""


class Routing(ApiModel):
    """How requests reach the model's replicas, besides its Service."""

    inference_pool: InferencePoolOptions | None = None
    """Write an InferencePool that selects the model's serving pods, and the endpoint picker it names, which routes each request to the vLLM process with the shortest queue by its own metrics. A gateway's HTTPRoute then names the pool. Needs the Extension's CRDs (status says when they are missing) and the vLLM runtime: the picker routes OpenAI completions and chat completions only."""


class Pool(ApiModel):
    """One pool of vLLM servers of a disaggregated model: every replica one server, on its own chips."""

    inf: Annotated[StrictInt | None, Field(ge=1)] = None
    """Whole Neuron chips per replica of the pool. Default: spec.compute.inf."""
    tensor_parallel_size: Annotated[StrictInt | None, Field(ge=1, le=MAX_PARALLEL)] = None
    """vLLM's --tensor-parallel-size, in logical NeuronCores. tensorParallelSize times dataParallelSize must be the replica's NeuronCores (inf times the chip's logical cores). Default: those cores / dataParallelSize."""
    data_parallel_size: Annotated[StrictInt, Field(ge=1, le=MAX_PARALLEL)] = 1
    """vLLM's --data-parallel-size: engines in the replica's one server, each tensor parallel over tensorParallelSize cores (AWS's tutorial runs its decode server DP4 x TP8). Only 1 is accepted for now: each engine holds all the weights and its own KV cache blocks, which the memory check does not plan per engine yet."""
    replicas: Annotated[StrictInt, Field(ge=0, le=INT32_MAX)] = 1
    """Replicas (pods) of the pool; with the pool's autoscaling, not read: the pool runs between its minReplicas and maxReplicas."""


class PoolAutoscaling(ApiModel):
    """Scale one pool of a disaggregated model on its own servers' vLLM metrics, through a KEDA ScaledObject that targets the pool's Deployment."""

    min_replicas: Annotated[StrictInt, Field(ge=0, le=INT32_MAX)] = 1
    """The fewest replicas of the pool; it runs this many while nothing scales it (KEDA not installed, or no Prometheus configured). At least 1: a pool does not scale to zero, since the proxy would send every request to a pool with no server."""
    max_replicas: Annotated[StrictInt, Field(ge=1, le=INT32_MAX)]
    """The most replicas of the pool."""
    window_seconds: Annotated[StrictInt, Field(ge=0, le=MAX_WINDOW_SECONDS)] = 60
    """Each signal is averaged over this many seconds; 0 takes each reading as it is."""
    scale_up_stabilization_seconds: Annotated[StrictInt, Field(ge=0, le=MAX_WINDOW_SECONDS)] = 60
    """A scale-up follows the lowest recommendation of this many seconds."""
    scale_down_stabilization_seconds: Annotated[StrictInt, Field(ge=0, le=MAX_WINDOW_SECONDS)] = 300
    """A scale-down follows the highest recommendation of this many seconds."""


class PrefillAutoscaling(PoolAutoscaling):
    """The prefill pool scales on its prompt queue (what time to first token waits on): the requests its servers hold waiting to be scheduled."""

    target_waiting: Annotated[StrictInt | None, Field(ge=1, le=INT32_MAX)] = None
    """Requests waiting (vLLM's vllm:num_requests_waiting) one prefill replica should carry. Default: serving.batching.maxBatchSize (vLLM's --max-num-seqs), a batch's worth queued per replica; required without serving.batching."""


class DecodeAutoscaling(PoolAutoscaling):
    """The decode pool scales on what time per output token grows with: the sequences its servers run and the share of their KV cache in use, whichever asks for more replicas."""

    target_running: Annotated[StrictInt | None, Field(ge=1, le=INT32_MAX)] = None
    """Sequences running (vLLM's vllm:num_requests_running) one decode replica should carry. Default: serving.batching.maxBatchSize (vLLM's --max-num-seqs), a full batch; required without serving.batching."""
    target_kv_cache_percent: Annotated[StrictInt, Field(ge=1, le=100)] = 80
    """Percent of its KV cache (vLLM's vllm:kv_cache_usage_perc) one decode replica should use."""


class PrefillPool(Pool):
    """A pool of prefill servers, which may scale on its prompt queue."""

    autoscaling: PrefillAutoscaling | None = None
    """Scale the pool between minReplicas and maxReplicas on its prompt queue, through a KEDA ScaledObject on the pool's Deployment; the pool's replicas is then not read."""


class DecodePool(Pool):
    """A pool of decode servers, which may scale on its running sequences and KV-cache use."""

    autoscaling: DecodeAutoscaling | None = None
    """Scale the pool between minReplicas and maxReplicas on its running sequences and KV-cache use, through a KEDA ScaledObject on the pool's Deployment; the pool's replicas is then not read."""


class Disaggregation(ApiModel):
    """Disaggregated prefill and decode (the vLLM Neuron plugin, trn2 and trn3): prompts are processed by the prefill pool, tokens generated by the decode pool, which reads each request's KV cache from the prefill server that made it (NIXL). The model's Service answers through a proxy that sends each request to a prefill server, then to a decode server."""

    prefill: PrefillPool = PrefillPool()
    """The prefill servers (vLLM's kv_role kv_producer)."""
    decode: DecodePool = DecodePool()
    """The decode servers (vLLM's kv_role kv_consumer)."""
    efa: Literal["auto", "required", "off"] = "auto"
    """EFA devices (vpc.amazonaws.com/efa, from AWS's EFA device plugin) for the pools' pods, over which NIXL moves the KV cache between instances. Where some instance type a pool may use has an EFA count the operator knows (trn2.48xlarge and trn2u.48xlarge: 16), the pool is held to those types and each pod requests its chips' share of its instance's devices (one a chip there). auto: so, and where the pools may use no such type (trn3), no EFA device is requested and a warning says so; required: so, and a spec whose pools may use no such type is refused; off: no EFA device is requested, and every allowed instance type is used."""

    def pool(self, role: Literal["prefill", "decode"]) -> PrefillPool | DecodePool:
        return self.prefill if role == "prefill" else self.decode


class InferentiaModelSpec(ApiModel):
    """What to serve and on how much Neuron hardware."""

    model: ModelSource
    """The model to serve."""
    compute: Compute
    """Neuron chips, CPU and memory of each replica."""
    processes_per_replica: Annotated[StrictInt, Field(ge=1, le=INT32_MAX)] = 1
    """Serving processes per replica, one NeuronCore Group each. Must divide the replica's NeuronCores (coresPerChip * inf)."""
    replicas: Annotated[StrictInt, Field(ge=0, le=INT32_MAX)] = 1
    """Number of replicas (pods). kubectl scale and a HorizontalPodAutoscaler change this through the scale subresource. With autoscaling, the count the autoscaler last set: leave it out of manifests, or every apply resets it."""
    autoscaling: Autoscaling | None = None
    """Scale between minReplicas and maxReplicas on in-flight requests, through a KEDA ScaledObject the operator writes (needs KEDA, and the operator's Prometheus address). Needs serving.batching or the vLLM runtime, whose pods count their requests. Not with spec.disaggregation, whose pools each scale on their own signal (disaggregation.prefill.autoscaling, disaggregation.decode.autoscaling)."""
    compile: CompileOptions = CompileOptions()
    """Compilation options."""
    serving: Serving
    """The serving container."""
    rollout: Rollout = Rollout()
    """Rolling-update bounds of the serving Deployment."""
    placement: Placement | None = None
    """Where the serving pods run: the PodSpec's nodeSelector, tolerations, affinity, topologySpreadConstraints and priorityClassName, combined with what Neuron needs (the operator tolerates the aws.amazon.com/neuron taint and requires the planned instance types): your tolerations are added, each of your required node terms holds together with the instance types, and your other terms and preferences are added to the operator's."""
    disruption_budget: DisruptionBudget = DisruptionBudget()
    """The model's PodDisruptionBudget, over its serving pods (the groups' pods too, when a replica spans nodes)."""
    routing: Routing | None = None
    """Routing by queue through the Gateway API Inference Extension (an InferencePool and its endpoint picker)."""
    disaggregation: Disaggregation | None = None
    """Serve with separate prefill and decode pools behind a proxy instead of the serving Deployment (vLLM runtime, trn2 and trn3)."""
    service_account_name: Annotated[str | None, Field(max_length=253)] = None
    """The ServiceAccount of the compile Job and the serving pods, for cloud credentials (IRSA, EKS Pod Identity) to the model and artefact store. Default: the namespace's default ServiceAccount."""
    run_as_root: StrictBool = False
    """Run the serving and compile containers as root, for images that need it. By default they run as user 65532 with no capabilities and no privilege escalation, which passes the restricted Pod Security level; as root they pass baseline only."""

    @property
    def compiles_with_program(self) -> bool:
        """A compile Job runs the operator's compile program (neuron_compile.py) in compile.image:
        every compile step but the vLLM preset's, which runs the operator's vLLM compile step
        (vllm_compile.py on the plugin, nxdi_compile.py on NxD Inference)."""
        return self.compile.image is not None and self.serving.runtime != "vllm"

    @property
    def serves_with_program(self) -> bool:
        """Each serving process runs the operator's model server (neuron_serve.py): a PyTorch
        model with neither serving.args nor the vLLM preset."""
        return self.serving.runtime == "custom" and not self.serving.args and self.model.framework == "pytorch"

    @property
    def input_dtype(self) -> str:
        """The input tensor's dtype: compile.inputDtype, else int64 token ids for transformers, float32 otherwise."""
        return self.compile.input_dtype or ("int64" if self.model.architecture == "transformer" else "float32")

    @property
    def has_batching_front_end(self) -> bool:
        """Whether each pod gets the batching front end on the serving port. vLLM batches
        sequences itself and gets none (the CRD's CEL port rule restates this)."""
        return self.serving.batching is not None and self.serving.runtime != "vllm"

    def pool_chips(self, pool: Pool | None) -> int:
        """Whole chips per replica of a pool of spec.disaggregation (None: of the model's own
        shape): its inf, else spec.compute.inf; 1 where neither is set, as the CRD's rules read
        it (a spec with pools must set compute.inf: exactly one of inf and cores, and no cores)."""
        return pool.inf if pool is not None and pool.inf is not None else (self.compute.inf or 1)

    def pool_spec(self, role: Literal["prefill", "decode"]) -> InferentiaModelSpec:
        """With spec.disaggregation: the spec of one replica of the pool, the model's on the
        pool's chips, with its replicas and no pools of its own (what the pool's pods are built
        from, and what the rules check the pool's chips with)."""
        assert self.disaggregation is not None
        pool = self.disaggregation.pool(role)
        compute = self.compute.model_copy(update={"inf": self.pool_chips(pool)})
        return self.model_copy(update={"compute": compute, "replicas": pool.replicas, "disaggregation": None})


class FrontEnd(ApiModel):
    """The batching front end of each serving pod (spec.serving.batching, not with vLLM)."""

    port: int
    """Port it listens on: the model's serving port (the Service's batch port)."""
    process_base_port: int
    """Model process i listens on this + i, behind the front end."""
    max_batch_size: int
    """Largest batch it sends to one process."""
    max_latency_ms: int
    """Latency budget; requests that cannot meet it are answered 503."""


class KvCache(ApiModel):
    """The KV cache blocks the vLLM Neuron plugin is given (trn2, trn3), its size in blocks, set whether prefix caching is on or off (--no-enable-prefix-caching)."""

    blocks: int
    """--num-gpu-blocks-override: serving.args' own, else the most that fit the plugin's KV budget (docs/api.md, "The KV cache on trn2 and trn3")."""
    block_size: int
    """--block-size: tokens a block holds (serving.args' own, else 32, the plugin's default)."""


class ResourceList(ApiModel):
    """Requests and limits of the serving container, in Kubernetes ResourceRequirements shape."""

    requests: dict[str, str]
    """Resources the scheduler reserves: Neuron chips, hugepages, cpu and memory."""
    limits: dict[str, str]
    """Limits; extended resources and hugepages must equal their requests."""


class Sizes(ApiModel):
    """What the model's pods need, computed from spec.model.weights and precision (the fixed sizes when they are unknown)."""

    home_bytes: int
    """The serving pods' HOME volume (spec.serving.homeSize, else computed)."""
    artefact_bytes: int | None = None
    """With a compile Job: the volume of the compiled artefact, in the compile Job and in each serving pod (the weights once per bucket, with room)."""
    model_bytes: int | None = None
    """With a model in a store: the volume the uncompiled model is fetched into (four bytes a weight, with room)."""
    compile_home_bytes: int | None = None
    """With a compile Job: its HOME volume (the Hub download, when the compile reads the model from the Hub)."""
    compiles_in_pod: bool
    """True when each serving process compiles at start (no compile.image): the pod needs a compile's memory and time."""
    memory_bytes: int | None = None
    """Host memory one replica needs, when the weights are known: each process's compile, or its copy of the weights."""
    compile_cpu: str | None = None
    """With a compile Job: the CPU it requests (compile.cpu, else 4 for neuronx-cc, 2 for neuron-cc)."""
    compile_memory: str | None = None
    """With a compile Job: the memory it requests and is limited to (compile.memory, else twice the weights, at least 8Gi)."""
    startup_seconds: int
    """The serving pods' start-up budget (spec.serving.startupSeconds, else computed)."""


class PoolPlan(ApiModel):
    """One pool's replica: its chips, cores and vLLM parallelism."""

    chips: int
    """Neuron chips per replica of the pool."""
    cores: int
    """Logical NeuronCores per replica of the pool."""
    tensor_parallel_size: int
    """vLLM's --tensor-parallel-size."""
    data_parallel_size: int
    """vLLM's --data-parallel-size."""
    efa_devices: int | None = None
    """The EFA devices (vpc.amazonaws.com/efa) each pod of the pool requests (spec.disaggregation.efa); absent: none."""


class DisaggregationPlan(ApiModel):
    """The prefill and decode pools of spec.disaggregation."""

    prefill: PoolPlan
    """The prefill pool's replica."""
    decode: PoolPlan
    """The decode pool's replica."""


class Plan(ApiModel):
    """How a spec maps onto NeuronCores: computed by the planner, never written by users."""

    family: str
    """Neuron instance family."""
    chips: int | None = None
    """Neuron chips per replica (spec.compute.inf); absent when the replica requests NeuronCores."""
    compiler: Literal["neuron-cc", "neuronx-cc"]
    """The Neuron compiler of the family: neuron-cc on inf1, neuronx-cc on inf2, trn1, trn2 and trn3."""
    lnc: int | None = None
    """Physical NeuronCores per logical core (inf2, trn1, trn2, trn3); every core count of the plan is in logical cores."""
    allocation: Literal["dra"] | None = None
    """dra when the replica's devices come from a ResourceClaimTemplate for the Neuron DRA driver (absent: the device plugin)."""
    connected_devices: int | None = None
    """With dra: the connected-device group (1, 4, 8 or 16 devices) every replica's devices come from."""
    cores_per_chip: int
    """NeuronCores on one chip of the family (logical cores at the plan's lnc)."""
    total_cores: int
    """NeuronCores per replica (coresPerChip * chips, or spec.compute.cores)."""
    group_size: int
    """NeuronCores in each NeuronCore Group (totalCores / groups); the model is compiled for this many cores."""
    groups: int
    """NeuronCore Groups per replica, one per serving process."""
    tensor_parallel_size: int | None = None
    """inf2, trn1, trn2, trn3: the group's cores run one model sharded across them, this many ways (= groupSize, times nodes when a replica spans nodes)."""
    nodes: int | None = None
    """When a replica spans nodes: how many, one pod (and one group of groupSize ranks) on each."""
    efa_devices: int | None = None
    """When a replica spans nodes: the EFA devices (vpc.amazonaws.com/efa) each of its pods requests, the fewest any allowed instance type has; in a pool's plan (spec.disaggregation), what each of its pods requests."""
    visible_cores: list[str]
    """Each group's cores as NEURON_RT_VISIBLE_CORES takes them ("0-1", or "5" for one core): contiguous, disjoint, in order."""
    device_memory_per_group_bytes: int
    """Device memory the group's cores can address: the memory of every chip it touches, shared with any other group on those chips."""
    device_memory_share_per_group_bytes: int
    """The group's own share of device memory (its cores times the memory per core), which its weights must fit."""
    static_weights: bool
    """Whether the model is compiled with --static-weights."""
    batch_size: int
    """Compiled batch size."""
    dynamic_batch_size: bool
    """Whether clients may send any multiple of the compiled batch size."""
    buckets: list[list[int]]
    """Input-shape buckets, one compiled model each (empty: one model)."""
    input_dtype: str | None = None
    """When the operator's compile program or model server runs: the input tensor's dtype."""
    compiler_args: list[str]
    """Arguments of the plan's compiler (planned flags, then compile.extraArgs), also given to serving processes in NEURON_CC_FLAGS."""
    threads_per_process: int
    """Request threads per serving process."""
    env: list[dict[str, str]]
    """The Neuron runtime environment of each serving process, in group order."""
    resources: ResourceList
    """The serving container's resource requests and limits."""
    instance_types: list[str]
    """Instance types that can hold one replica, smallest first."""
    shares_chip: bool | None = None
    """True when the replica requests NeuronCores (spec.compute.cores) rather than whole chips: it shares its chip with other pods."""
    chip_memory_share_bytes: int | None = None
    """When the replica shares a chip: the device memory of its cores (its cores times the memory per core), all of the chip's memory it sees."""
    replicas_per_instance: dict[str, int] | None = None
    """When the replica shares a chip: how many such replicas one instance of each allowed type holds, by NeuronCores, CPU and memory."""
    front_end: FrontEnd | None = None
    """The batching front end beside the model processes, when there is one."""
    kv_cache: KvCache | None = None
    """vLLM on trn2 and trn3: the KV cache's size in blocks, which its serving flags and compile step give the plugin (with prefix caching on or off), where the model's shape or serving.args say."""
    disaggregation: DisaggregationPlan | None = None
    """With spec.disaggregation: each pool's replica."""
    sizes: Sizes
    """What the pods need, sized from the model."""
    warnings: list[str]
    """Things that are allowed but may not work as hoped."""


class Condition(ApiModel):
    """A standard Kubernetes condition (metav1.Condition)."""

    type: str
    """Condition type: Validated, Compiled, Scheduled, Progressing, Available, Ready, Reconciling or Stalled."""
    status: Literal["True", "False", "Unknown"]
    """True, False or Unknown."""
    reason: str
    """A CamelCase word for the last transition."""
    message: str = ""
    """A human-readable explanation."""
    last_transition_time: str | None = Field(default=None, json_schema_extra={"format": "date-time"})
    """When the status last changed."""
    observed_generation: int | None = None
    """The metadata.generation this condition was computed for."""


class PodCounts(ApiModel):
    """The serving pods by where they stand on their way to serving."""

    pending: int = 0
    """Waiting for a node (not scheduled yet)."""
    fetching: int = 0
    """On a node, their init containers fetching the compiled artefact or the model."""
    loading: int = 0
    """Their containers started, not ready yet: the model loading onto its NeuronCores."""
    ready: int = 0
    """Ready: serving."""


class AutoscalingStatus(ApiModel):
    """How the model is scaled."""

    min_replicas: int
    """spec.autoscaling.minReplicas."""
    max_replicas: int
    """spec.autoscaling.maxReplicas."""
    target_in_flight: int
    """In-flight requests per replica the autoscaler aims at (spec.autoscaling.targetInFlight or its default)."""
    desired_replicas: int
    """Replicas the serving Deployment runs: spec.replicas within [minReplicas, maxReplicas] while the ScaledObject exists, else minReplicas."""
    scaled_object: str | None = None
    """The KEDA ScaledObject that scales the model, once it exists."""
    query: str | None = None
    """The Prometheus query of the model's in-flight requests that the ScaledObject's trigger runs."""


class PoolAutoscalingStatus(ApiModel):
    """How one pool is scaled."""

    min_replicas: int
    """The pool's autoscaling.minReplicas."""
    max_replicas: int
    """The pool's autoscaling.maxReplicas."""
    scaled_object: str | None = None
    """The KEDA ScaledObject that scales the pool's Deployment, once it exists."""
    queries: list[str] | None = None
    """The Prometheus queries of the pool's signals that the ScaledObject's triggers run: prefill's prompt queue; decode's running sequences, then its KV-cache use in percent."""


class PoolStatus(ApiModel):
    """One pool's pods."""

    replicas: int = 0
    """Pods of the pool that exist."""
    ready_replicas: int = 0
    """Pods of the pool that are ready."""
    desired_replicas: int | None = None
    """Replicas the pool's Deployment runs: its replicas, or with its autoscaling the count KEDA last set (or the pool's before it autoscaled), within [minReplicas, maxReplicas] while its ScaledObject exists or is being written, else minReplicas."""
    autoscaling: PoolAutoscalingStatus | None = None
    """With the pool's autoscaling: its range, its ScaledObject and its queries."""


class PoolsStatus(ApiModel):
    """The prefill and decode pools of spec.disaggregation."""

    prefill: PoolStatus
    """The prefill pool."""
    decode: PoolStatus
    """The decode pool."""


class InferentiaModelStatus(ApiModel):
    """What the operator last observed and did."""

    observed_generation: int | None = None
    """The metadata.generation the status describes."""
    conditions: list[Condition] | None = None
    """Validated, Compiled, Scheduled, Progressing, Available and Ready; Reconciling and Stalled restate them for Flux's kstatus. Beside them: Autoscaling, Routing, DeviceFault while a serving pod's node reports a Neuron hardware error, and FilledAhead while the model fills the node cache ahead of its replicas."""
    plan: Plan | None = None
    """The plan being applied: the observed generation's, or the last valid one's while the spec is invalid."""
    replicas: int | None = None
    """Serving pods that exist."""
    ready_replicas: int | None = None
    """Serving pods that are ready."""
    updated_replicas: int | None = None
    """Serving pods running the current plan."""
    pools: PoolsStatus | None = None
    """With spec.disaggregation: each pool's replicas and ready replicas. replicas, readyReplicas, updatedReplicas and selector are then the proxy's, which spec.replicas and the scale subresource scale."""
    autoscaling: AutoscalingStatus | None = None
    """With spec.autoscaling: the range, the target and the replicas the Deployment runs now."""
    pods: PodCounts | None = None
    """The serving pods by where they stand: pending, fetching, loading, ready. A scale-up that fetches its artefact shows here, never compiling."""
    selector: str | None = None
    """Label selector of the serving pods, for the scale subresource."""
    compile_job: str | None = None
    """Name of the compile Job of the current plan."""
    compiled_uri: str | None = None
    """Where the compiled model of the current plan is."""
    compile_key: str | None = None
    """The hash of the compile inputs (model URI, framework, family, compiler and flags, batch size, buckets, compile image, ...): models with the same key and compile.outputUri share one artefact and one compile."""
    compile_cache_hit: bool | None = None
    """True when the artefact of the key was already compiled (by another model, or by an earlier one of this name) and no compile Job ran for this model."""
    changed_compile_inputs: list[str] | None = None
    """The compile inputs that differ from those of the model's previous compile."""
    neuron_placement_percent: float | None = None
    """Once compiled ahead: the share of the model's operators that runs on Neuron, as the compile program reported it (torch-neuron's partitioner on inf1; 100 for torch_neuronx.trace, which compiles the whole graph or fails). Below 100 the Compiled condition says so: operators left on the CPU limit throughput."""
    hub_revision: str | None = None
    """For a model named by a Hugging Face id and compiled ahead: the Hub commit its compile downloaded, which the artefact keeps and every replica serves, offline (the Hub is read once per compile, never once per replica)."""
    kopf: Annotated[
        dict[str, Any] | None,
        Field(json_schema_extra=lambda s: _replace_schema(s, {"type": "object", "x-kubernetes-preserve-unknown-fields": True})),
    ] = None
    """The operator framework's own bookkeeping (handler progress, last handled spec)."""


# The status of a model the operator has not reported on yet: the CRD's default for
# status, which the API server fills in when it reads a model without one. Reconciling=True
# makes Flux's kstatus see the model as in progress from its creation (without a status it
# would count it as Current), Argo CD's health check sees generation 0 as not yet observed,
# and `kubectl get` shows why nothing is ready yet.
PENDING_STATUS: dict[str, Any] = {
    "observedGeneration": 0,
    "conditions": [
        {"type": "Ready", "status": "Unknown", "reason": "Pending", "message": "waiting for the operator to report on this model"},
        {"type": "Reconciling", "status": "True", "reason": "Pending", "message": "waiting for the operator to report on this model"},
    ],
}
