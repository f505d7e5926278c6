{{- define "inferentia-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "inferentia-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "inferentia-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "inferentia-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- /* The node cache's pods: a name of their own, so that the operator's selector never matches them. */ -}}
{{- define "inferentia-operator.nodeCacheLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}-node-cache
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "inferentia-operator.labels" -}}
{{ include "inferentia-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/*
The rules the operator needs on the namespaced resources it reads and writes: exactly
the calls in operator/inferentia_operator/kube.py and kopf's watches, nothing more.
Server-side apply updates through "patch", and needs "create" as well when the object
does not exist yet; "get" is the check before creating a child the caches do not hold.
Superseded plan ConfigMaps and compile Jobs are deleted.
*/}}
{{- define "inferentia-operator.namespacedRules" -}}
- apiGroups: [inferentia.dev]
  resources: [inferentiamodels]
  verbs: [get, list, watch]
- apiGroups: [inferentia.dev]
  resources: [inferentiamodels/status]
  verbs: [patch]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, create, patch, delete]
# delete: a prefill or decode pool's Service once the model has no pools (serving/part.py).
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, watch, create, patch, delete]
# patch: a serving pod's inferentia.dev/traffic label, "off" while its node's Neuron devices
# report an error and another replica answers (core/device_faults/part.py).
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch, patch]
# A serving pod on a node whose Neuron devices report an error, once that node takes no new pods:
# evicted, so that the model's PodDisruptionBudget paces it (core/device_faults/part.py).
- apiGroups: [""]
  resources: [pods/eviction]
  verbs: [create]
# Events: the models' own are posted; the Job controller's FailedCreate events, the one place
# Kubernetes says a compile Job's pod cannot be made, are watched (filtered on the server).
- apiGroups: [""]
  resources: [events]
  verbs: [create, list, watch]
# The ScaledObjects of models with spec.autoscaling and of autoscaled prefill and decode pools;
# deleted when autoscaling is turned off.
- apiGroups: [keda.sh]
  resources: [scaledobjects]
  verbs: [get, list, watch, create, patch, delete]
# The claim templates of models with allocation dra: created once (named after their content),
# re-applied over a template of the model's whose name a create found taken (patch), deleted
# when superseded. Nothing else of resource.k8s.io: the scheduler makes and allocates the
# claims, and the DRA driver publishes the devices.
- apiGroups: [resource.k8s.io]
  resources: [resourceclaimtemplates]
  verbs: [get, list, watch, create, patch, delete]
# Each model's PodDisruptionBudget over its serving pods, applied and deleted with the model.
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, watch, create, patch, delete]
# Each scaled-to-zero model's holder NetworkPolicy (autoscaling.kedaNamespace): applied with it,
# deleted once it is no longer wanted (the setting unset, push activation off, no holder).
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, watch, create, patch, delete]
# The LeaderWorkerSets of models whose replicas span nodes (spec.compute.nodes), deleted when a
# model's replicas go back to one node (its Deployment is then deleted the other way round).
- apiGroups: [leaderworkerset.x-k8s.io]
  resources: [leaderworkersets]
  verbs: [get, list, watch, create, patch, delete]
# The InferencePools of models with spec.routing.inferencePool (the Gateway API Inference
# Extension's), deleted when routing is turned off; and each endpoint picker's ServiceAccount
# and RoleBinding, created once, never deleted (they go with the model).
- apiGroups: [inference.networking.k8s.io]
  resources: [inferencepools]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [serviceaccounts]
  verbs: [get, list, watch, create, patch]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [rolebindings]
  verbs: [get, list, watch, create, patch]
# A RoleBinding may grant only what its maker holds, or a role it may bind: the operator may
# bind the endpoint picker's ClusterRole, and no other
# (https://kubernetes.io/docs/reference/access-authn-authz/rbac/#restrictions-on-role-binding-creation-or-update).
- apiGroups: [rbac.authorization.k8s.io]
  resources: [clusterroles]
  resourceNames: ['{{ include "inferentia-operator.fullname" . }}-endpoint-picker']
  verbs: [bind]
{{- end -}}

{{/*
The operator's image, which its models' pods run too. No registry serves it: the repository
is required, so that an install that forgets it fails here with a message.
*/}}
{{- define "inferentia-operator.image" -}}
{{- $repository := required "image.repository is required: build the operator's image from the repository's Dockerfile, push it where your nodes pull from, and set image.repository to it (docs/install.md, The image)" .Values.image.repository -}}
{{ $repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}
