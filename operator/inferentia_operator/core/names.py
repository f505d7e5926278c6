"""The names the operator writes onto objects and that other modules look up: one place for them."""

from __future__ import annotations

from inferentia_operator import __version__

from .api import GROUP

FIELD_MANAGER = "inferentia-operator"
MODEL_LABEL = f"{GROUP}/model"
COMPONENT_LABEL = "app.kubernetes.io/component"
# A replica that spans nodes is a LeaderWorkerSet group (core/serving/groups.py); LWS's pod
# webhook labels each pod of a group with its rank: "0" on the leader.
GROUP_API_VERSION = "leaderworkerset.x-k8s.io/v1"
GROUP_KIND = "LeaderWorkerSet"
WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
# LWS's labels on every pod of a group: the LeaderWorkerSet's name, and a key of the group.
GROUP_SET_LABEL = "leaderworkerset.sigs.k8s.io/name"
GROUP_KEY_LABEL = "leaderworkerset.sigs.k8s.io/group-key"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
# Whether a serving pod receives requests: the model's Service, its InferencePool and its
# holder's forwarding select pods labelled "on"; the Deployment's (and LeaderWorkerSet's)
# selector does not read it, so turning it "off" takes a pod out of traffic without orphaning it
# (core/device_faults/part.py: a pod on a node whose Neuron devices report an error).
TRAFFIC_LABEL = f"{GROUP}/traffic"
TRAFFIC_ON, TRAFFIC_OFF = "on", "off"
PLAN_HASH_ANNOTATION = f"{GROUP}/plan-hash"
COMPILE_HASH_LABEL = f"{GROUP}/compile-hash"
COMPILE_INPUTS_ANNOTATION = f"{GROUP}/compile-inputs"
# The component label of the operator's records of completed compiles (compile/job.py, compile_record).
COMPILE_RECORD_COMPONENT = "compile-record"
# The component label of the fill-ahead part's Jobs (fill_ahead/part.py), which the clean-up leaves to it.
FILL_COMPONENT = "fill"
# The label the Job controller puts on its pods (Kubernetes 1.27 and later).
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"

# The operator's own image, which serving and compile pods use to fetch and upload artefacts
# and to run the batching front end (`inferentia-operator fetch|upload|batch`). Build it from
# the Dockerfile and push it where your nodes pull from; the operator's --operator-image (chart
# value image.repository and image.tag) names it.
DEFAULT_OPERATOR_IMAGE = f"inferentia-operator:{__version__}"

# Where the plan ConfigMap is mounted in the compile and serving pods.
PLAN_MOUNT = "/etc/inferentia"
PLAN_FILE = f"{PLAN_MOUNT}/plan.json"

# spec.compute.allocation, and the operator's default for it (run --allocation, chart value allocation).
DEVICE_PLUGIN = "devicePlugin"
ALLOCATIONS = (DEVICE_PLUGIN, "dra")

# Routing by queue (core/routing/): the Gateway API Inference Extension's pool kind, and the
# endpoint picker's image unless the operator's --endpoint-picker-image names another.
INFERENCE_POOL_KIND = "InferencePool"
DEFAULT_EPP_IMAGE = "registry.k8s.io/gateway-api-inference-extension/epp:v1.1.0"
# Which pool of a disaggregated model (spec.disaggregation) a serving pod is in: prefill or decode.
POOL_LABEL = f"{GROUP}/pool"
