"""Device claims (allocation dra): the ResourceClaimTemplate the serving pods claim from."""

from __future__ import annotations

from inferentia_operator.core.device_claims.template import resource_claim_template
from inferentia_operator.core.objects import Obj
from inferentia_operator.core.observed import Observed
from inferentia_operator.core.pod.model import Model
from inferentia_operator.core.pod.part import Part


def device_claims_part(model: Model, observed: Observed) -> Part:
    template = resource_claim_template(model)
    # A claim template only makes new claims: once the Deployment's pods no longer name it, it
    # can go (the claims already made from it belong to their pods).
    pod_spec = Obj(Obj(observed.own("Deployment")).spec.get("template")).spec
    keep = {c.get("resourceClaimTemplateName") for c in pod_spec.get("resourceClaims") or ()} | {Obj(template).name}
    unused = tuple(
        ("ResourceClaimTemplate", t.name) for t in map(Obj, observed.all("ResourceClaimTemplate")) if t.name and t.name not in keep
    )
    return Part((template,) if template is not None else (), delete=unused)
