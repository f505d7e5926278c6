"""The device-claims part alone (core/device_claims/part.py): the claim template of a model
with allocation dra, and the removal of templates no pod template names any more."""

from inferentia_operator.core.device_claims.part import device_claims_part
from inferentia_operator.core.device_claims.template import resource_claim_template
from inferentia_operator.core.serving.deployment import serving_deployment
from test_decide import Observed, built, live, model_body, rolled_out

DRA = {"compute.family": "trn2", "compute.inf": 4, "compute.allocation": "dra"}


def test_the_device_plugin_needs_no_template():
    body = model_body()
    assert device_claims_part(built(body), Observed(body)).children == ()


def test_a_template_goes_once_the_deployment_names_another():
    before = built(model_body(**DRA))
    old = live(resource_claim_template(before))
    body = model_body(generation=2, **{**DRA, "compute.inf": 1})
    after = built(body)
    serving_old = device_claims_part(after, Observed(body, deployment=rolled_out(serving_deployment(before)), claim_templates=[old]))
    assert serving_old.delete == () and [c["kind"] for c in serving_old.children] == ["ResourceClaimTemplate"]
    rolled = device_claims_part(after, Observed(body, deployment=rolled_out(serving_deployment(after)), claim_templates=[old]))
    assert rolled.delete == (("ResourceClaimTemplate", old["metadata"]["name"]),)
