"""The serving part alone (core/serving/part.py): the plan ConfigMap, the Service and the
Deployment, which is held back until the artefact is compiled."""

from inferentia_operator.core.pod.meta import holder_selector, selector_string
from inferentia_operator.core.pod.model import plan_hash
from inferentia_operator.core.serving.part import serving_part
from inferentia_operator.core.serving.service import serving_network_policy
from test_decide import built, model_body


def test_every_child_is_named_and_the_deployment_waits_for_the_compile():
    m = built(model_body(replicas=2))
    part = serving_part(m, compiled=False, replicas=2, to_holder=False)
    assert [c["kind"] for c in part.children] == ["ConfigMap", "Service", "Deployment", "PodDisruptionBudget"]
    assert [c["kind"] for c in part.to_write()] == ["ConfigMap", "Service", "PodDisruptionBudget"]
    assert [c["kind"] for c in serving_part(m, compiled=True, replicas=2, to_holder=False).to_write()] == [
        "ConfigMap",
        "Service",
        "Deployment",
        "PodDisruptionBudget",
    ]


def test_the_deployment_runs_the_replicas_it_is_given_and_the_facts_name_the_plan():
    m = built(model_body(replicas=2))
    part = serving_part(m, compiled=True, replicas=5, to_holder=False)
    assert part.children[2]["spec"]["replicas"] == 5
    assert (part.facts.replicas, part.facts.plan_hash, part.facts.selector) == (5, plan_hash(m.plan), selector_string(m))


def test_the_service_points_at_the_holder_when_told():
    m = built(model_body())
    service = serving_part(m, compiled=True, replicas=0, to_holder=True).children[1]
    assert service["spec"]["selector"] == holder_selector(m)


def test_a_scheduler_name_sends_device_plugin_pods_to_the_neuron_scheduler():
    """On EKS the Neuron scheduler extension runs only beside a second scheduler, my-scheduler,
    and a pod reaches it by naming it
    (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/containers/tutorials/k8s-multiple-scheduler.html):
    run --scheduler-name names it in every serving pod that takes devices from the device plugin."""
    from inferentia_operator.core.decide import rendered
    from inferentia_operator.core.settings import Settings

    def pod(m, settings):
        [deployment] = [c for c in rendered(m, settings) if c["kind"] == "Deployment"]
        return deployment["spec"]["template"]["spec"]

    m = built(model_body())
    assert "schedulerName" not in pod(m, Settings())
    assert pod(m, Settings(scheduler_name="my-scheduler"))["schedulerName"] == "my-scheduler"
    # A DRA claim is allocated by the default scheduler itself: no extension, no other scheduler.
    dra = built(model_body(**{"compute.family": "trn2", "compute.inf": 4, "compute.allocation": "dra"}))
    assert "schedulerName" not in pod(dra, Settings(scheduler_name="my-scheduler"))


def test_the_front_ends_network_policy_goes_with_the_front_end_and_never_someone_elses():
    """Left behind, it would keep the processes' ports closed once they are the model's doors."""
    from inferentia_operator.core.observed import Observed
    from test_decide import live

    batching = {"serving.batching": {"maxBatchSize": 4}, "processesPerReplica": 2}
    body = model_body(**batching)
    policy = serving_network_policy(built(body))
    assert policy is not None and policy in serving_part(built(body), compiled=True, replicas=1, to_holder=False).children
    plain = model_body(processesPerReplica=2)
    gone = serving_part(built(plain), compiled=True, replicas=1, to_holder=False, observed=Observed.of(plain, live(policy)))
    assert gone.delete == (("NetworkPolicy", policy["metadata"]["name"]),)
    theirs = {**live(policy), "metadata": {"name": policy["metadata"]["name"], "namespace": "ns", "labels": {"team": "a"}}}
    kept = serving_part(built(plain), compiled=True, replicas=1, to_holder=False, observed=Observed.of(plain, theirs))
    assert kept.delete == ()
