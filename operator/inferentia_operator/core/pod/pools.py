"""The prefill and decode pools of a disaggregated model (spec.disaggregation): their roles and
names. Here, below the features, because the serving part builds the pools, the clean-up keeps
their plan ConfigMaps and the device faults part knows their pods by their Deployments' names.
Each pool's own Model is ``Model.pools`` (pod/model.py), which imports this module, so this one
imports no Model."""

from __future__ import annotations

from typing import Literal, Protocol

Role = Literal["prefill", "decode"]
ROLES: tuple[Role, ...] = ("prefill", "decode")
# vLLM's kv_role for each pool (vllm/config/kv_transfer.py; the tutorial's Steps 1 and 2).
KV_ROLES: dict[Role, str] = {"prefill": "kv_producer", "decode": "kv_consumer"}


class Named(Protocol):
    @property
    def name(self) -> str: ...


def pool_name(model: Named, role: Role) -> str:
    """The pool's Deployment and Service."""
    return f"{model.name}-{role}"
