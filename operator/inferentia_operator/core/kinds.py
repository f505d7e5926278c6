"""The kinds of object a model owns: one table, from which the shell's API paths, watches and
caches and the decision's lookups all come.

Adding a child kind is one entry here and the part of the decision that builds it
(docs/design.md, "Adding a child kind", has the ScaledObject as the worked example).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .autoscaling import SCALED_OBJECT_KIND
from .names import GROUP_KIND, INFERENCE_POOL_KIND
from .projection import project, project_pod


@dataclass(frozen=True)
class ChildKind:
    kind: str
    group: str  # "" for the core group
    version: str
    plural: str
    # Named after its content and never written again (a ConfigMap is immutable, a Job's
    # template too): created, never applied over, so no field of it is ever left owned by a
    # create that a later apply would have to remove.
    written_once: bool = False
    # What the cache keeps of each object (core/projection.py): as little as the decision reads.
    projection: Callable[[Mapping[str, Any]], dict[str, Any]] = project

    @property
    def path_prefix(self) -> str:
        """Where the API server serves the kind: /api/v1 or /apis/<group>/<version>."""
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    @property
    def index(self) -> str:
        """The name of the kopf index that caches the kind, by the model that owns each object."""
        return f"{self.kind.lower()}_index"


CHILD_KINDS: tuple[ChildKind, ...] = (
    ChildKind("ConfigMap", "", "v1", "configmaps", written_once=True),
    ChildKind("Service", "", "v1", "services"),
    ChildKind("Job", "batch", "v1", "jobs", written_once=True),
    ChildKind("Deployment", "apps", "v1", "deployments"),
    # The claims of models with allocation dra (Kubernetes 1.34 and later serve resource.k8s.io/v1).
    ChildKind("ResourceClaimTemplate", "resource.k8s.io", "v1", "resourceclaimtemplates", written_once=True),
    # KEDA's: watched once its CRD is served (kopf notices a CRD installed later, where the
    # operator may list CRDs); until then the operator runs autoscaled models at minReplicas.
    ChildKind(SCALED_OBJECT_KIND, "keda.sh", "v1alpha1", "scaledobjects"),
    # The Gateway API Inference Extension's, for spec.routing.inferencePool: like KEDA's, watched
    # once its CRD is served; until then the model serves through its Service alone.
    ChildKind(INFERENCE_POOL_KIND, "inference.networking.k8s.io", "v1", "inferencepools"),
    # LeaderWorkerSet's, for replicas that span nodes (core/serving/groups.py): like KEDA's,
    # watched once its CRD is served.
    ChildKind(GROUP_KIND, "leaderworkerset.x-k8s.io", "v1", "leaderworkersets"),
    # The serving pods' disruption budget (serving.service.disruption_budget).
    ChildKind("PodDisruptionBudget", "policy", "v1", "poddisruptionbudgets"),
    # Who may reach a holder's external scaler: KEDA alone (scale_to_zero.holder.holder_network_policy).
    ChildKind("NetworkPolicy", "networking.k8s.io", "v1", "networkpolicies"),
    # The endpoint picker's identity and its one grant (core/routing/pool.py): neither ever changes.
    ChildKind("ServiceAccount", "", "v1", "serviceaccounts", written_once=True),
    ChildKind("RoleBinding", "rbac.authorization.k8s.io", "v1", "rolebindings", written_once=True),
    # Not a child the operator writes: the pods of its Jobs and Deployments, which status reads.
    PODS := ChildKind("Pod", "", "v1", "pods", projection=project_pod),
)
WRITTEN_ONCE = frozenset(k.kind for k in CHILD_KINDS if k.written_once)
