"""The prefill and decode pools of a disaggregated model (spec.disaggregation), each as the
:class:`Model` of one vLLM server a replica: the serving pod's builders then make a pool's pod as
they make any vLLM model's. Here, below the features, because the serving part builds the pools,
the clean-up keeps their plan ConfigMaps and the device faults part knows their pods by their
Deployments' names."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Literal

from inferentia_operator.core.planner import plan

if TYPE_CHECKING:  # pod/model.py imports this module: Model.pools is pool_models'
    from inferentia_operator.core.pod.model import Model

Role = Literal["prefill", "decode"]
ROLES: tuple[Role, ...] = ("prefill", "decode")
# vLLM's kv_role for each pool (vllm/config/kv_transfer.py; the tutorial's Steps 1 and 2).
KV_ROLES: dict[Role, str] = {"prefill": "kv_producer", "decode": "kv_consumer"}


def pool_name(model: Model, role: Role) -> str:
    """The pool's Deployment and Service."""
    return f"{model.name}-{role}"


def pool_model(model: Model, role: Role) -> Model:
    """The pool's model, planned for its chips. Its spec passed the model's rules
    (rules/disaggregation.py), so it is planned without checking them again."""
    spec = model.spec.pool_spec(role)
    return replace(model, spec=spec, plan=plan(spec, checked=[]))


def pool_models(model: Model) -> tuple[Model, ...]:
    """Each pool's model: read them as ``model.pools``, planned once a Model."""
    return tuple(pool_model(model, role) for role in ROLES) if model.spec.disaggregation else ()
