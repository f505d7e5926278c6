"""What every container and pod of a model shares: the restricted security contexts, the
writable scratch directories' environment, the user's environment, the resources and probes
of the operator's own servers."""

from __future__ import annotations

from typing import Any

from inferentia_operator.core.pod.model import Model, user_env_names

# The user the serving and compile containers run as, unless spec.runAsRoot: an unprivileged
# uid, as distroless images use. The restricted Pod Security level needs runAsNonRoot,
# no privilege escalation, every capability dropped and the RuntimeDefault seccomp profile.
NON_ROOT_UID = 65532


def pod_security(model: Model) -> dict[str, Any]:
    """The pod-level securityContext: restricted by default, root only when the spec asks."""
    if model.spec.run_as_root:
        return {"runAsNonRoot": False, "runAsUser": 0, "seccompProfile": {"type": "RuntimeDefault"}}
    return non_root_pod_security()


def non_root_pod_security() -> dict[str, Any]:
    """Restricted: user 65532, no root, the runtime's default seccomp profile (a new dict each
    call, so that no two objects share one and YAML never prints an alias)."""
    return {"runAsNonRoot": True, "runAsUser": NON_ROOT_UID, "runAsGroup": NON_ROOT_UID, "seccompProfile": {"type": "RuntimeDefault"}}


CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": True}

# Where a serving or compile process may write: its root file system is read-only, and a
# non-root user has no home in most images. vLLM and Hugging Face download and cache under
# HOME / HF_HOME; everything else writes to TMPDIR.
HOME_DIR = "/home/inferentia"
SCRATCH_PATHS = {"home": HOME_DIR, "tmp": "/tmp"}
SCRATCH_ENV = {
    "HOME": HOME_DIR,
    "HF_HOME": f"{HOME_DIR}/.cache/huggingface",
    "XDG_CACHE_HOME": f"{HOME_DIR}/.cache",
    "TMPDIR": "/tmp",
}


def with_user_env(model: Model, planned: dict[str, str]) -> list[dict[str, Any]]:
    """The planned variables, then spec.serving.env as the API takes them (value or
    valueFrom), which wins for the same name. The operator never reads a Secret, so a
    secret's value is never in the model, the plan, a log or an event."""
    user = [e.model_dump(by_alias=True, exclude_none=True) for e in model.spec.serving.env or []]
    return [{"name": k, "value": v} for k, v in planned.items() if k not in user_env_names(model)] + user


def user_env_from(model: Model) -> dict[str, Any]:
    sources = model.spec.serving.env_from
    return {"envFrom": [s.model_dump(by_alias=True, exclude_none=True) for s in sources]} if sources else {}


# The front end's own share of the pod: an asyncio process that forwards JSON.
BATCHER_RESOURCES = {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}}


def own_server_probes(port: str) -> dict[str, Any]:
    """The probes of a server of the operator's own (the batching front end, the holder):
    /readyz and /healthz on the named port."""
    http = {"port": port, "scheme": "HTTP"}
    return {
        "readinessProbe": {"httpGet": {"path": "/readyz", **http}, "periodSeconds": 5},
        "livenessProbe": {"httpGet": {"path": "/healthz", **http}, "periodSeconds": 10, "failureThreshold": 6},
    }
