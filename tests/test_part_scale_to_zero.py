"""The scale-to-zero part alone (core/parts/scale_to_zero.py): the replicas Service, the
holder (which waits for that Service), and the replicas the Deployment runs."""

from inferentia_operator.core import children
from inferentia_operator.core.parts.scale_to_zero import scale_to_zero_part
from inferentia_operator.core.parts.scaling import ScalingPart
from test_decide import Observed, built, live, model_body

ZERO = {
    "serving.batching": {"maxBatchSize": 4}, "compile.image": "example.com/c:1",
    "autoscaling": {"minReplicas": 0, "maxReplicas": 3},
}  # fmt: skip


def test_a_model_that_does_not_scale_to_zero_adds_nothing():
    body = model_body(replicas=2)
    part = scale_to_zero_part(built(body), Observed(body), ScalingPart(replicas=2))
    assert part.children == () and part.replicas == 2 and not part.to_holder


def test_the_holder_waits_for_the_replicas_service_it_forwards_to():
    body = model_body(**ZERO)
    m = built(body)
    part = scale_to_zero_part(m, Observed(body), ScalingPart(replicas=1, scaled=True))
    assert [(c["kind"], c["metadata"]["name"]) for c in part.children] == [("Service", "m-replicas"), ("Deployment", "m-holder")]
    assert [c["metadata"]["name"] for c in part.to_write()] == ["m-replicas"]
    seen = scale_to_zero_part(m, Observed(body, others=[live(children.replicas_service(m))]), ScalingPart(replicas=1, scaled=True))
    assert [c["metadata"]["name"] for c in seen.to_write()] == ["m-replicas", "m-holder"]


def test_at_zero_without_an_available_holder_a_replica_stays():
    body = model_body(**ZERO)
    m = built(body)
    part = scale_to_zero_part(m, Observed(body), ScalingPart(replicas=0, scaled=True))
    assert part.replicas == 1 and not part.to_holder
