"""The autoscaling part alone (core/scaling/part.py): the ScaledObject, the replicas it
leaves the Deployment, and its removal when autoscaling is turned off."""

from inferentia_operator.core.autoscaling import Prometheus
from inferentia_operator.core.scaling.keda import scaled_object
from inferentia_operator.core.scaling.part import scaling_part
from inferentia_operator.core.settings import Settings
from test_decide import SETTINGS, Observed, built, live, model_body

PROMETHEUS = Settings(prometheus=Prometheus("http://prometheus:9090"))
SCALED = {"serving.batching": {"maxBatchSize": 4}, "autoscaling": {"minReplicas": 2, "maxReplicas": 5}}


def test_without_autoscaling_the_deployment_runs_spec_replicas_and_nothing_is_written():
    body = model_body(replicas=3)
    part = scaling_part(built(body), Observed(body), SETTINGS, has_artefact=True)
    assert (part.children, part.delete, part.replicas, part.facts) == ((), (), 3, None)


def test_without_prometheus_no_scaled_object_and_the_minimum_runs():
    body = model_body(replicas=4, **SCALED)
    part = scaling_part(built(body), Observed(body), SETTINGS, has_artefact=True)
    assert part.children == () and part.replicas == 2 and part.facts.configured is False


def test_the_scaled_object_is_written_held_while_keda_is_not_served_and_followed_once_it_exists():
    body = model_body(replicas=4, **SCALED)
    m = built(body)
    part = scaling_part(m, Observed(body), PROMETHEUS, has_artefact=True)
    assert [c["kind"] for c in part.to_write()] == ["ScaledObject"] and part.replicas == 2
    held = scaling_part(m, Observed(body, scaled_objects_served=False), PROMETHEUS, has_artefact=True)
    assert held.to_write() == [] and [c["kind"] for c in held.children] == ["ScaledObject"]
    scaled = live(scaled_object(m, PROMETHEUS.prometheus))
    assert scaling_part(m, Observed(body, scaled_object=scaled), PROMETHEUS, has_artefact=True).replicas == 4


def test_autoscaling_turned_off_deletes_the_models_scaled_object():
    scaled_body = model_body(**SCALED)
    scaled = live(scaled_object(built(scaled_body), PROMETHEUS.prometheus))
    body = model_body()
    assert scaling_part(built(body), Observed(body, scaled_object=scaled), PROMETHEUS, has_artefact=True).delete == (("ScaledObject", "m"),)
