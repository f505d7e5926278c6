"""The scale-to-zero part alone (core/scale_to_zero/part.py): the replicas Service, the
holder (which waits for that Service), and the replicas the Deployment runs."""

from inferentia_operator.core.autoscaling import Prometheus
from inferentia_operator.core.pod.meta import holder_selector
from inferentia_operator.core.pod.ports import holder_scaler_port
from inferentia_operator.core.scale_to_zero.holder import holder_deployment, holder_network_policy, replicas_service
from inferentia_operator.core.scale_to_zero.part import scale_to_zero_part
from inferentia_operator.core.scaling.keda import scaled_object
from inferentia_operator.core.scaling.part import ScalingPart
from test_decide import Observed, built, live, model_body

PROMETHEUS = Prometheus(address="http://prometheus.monitoring:9090")

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
    assert [(c["kind"], c["metadata"]["name"]) for c in part.children] == [
        ("Service", "m-replicas"), ("Deployment", "m-holder"), ("Service", "m-holder")]  # fmt: skip
    assert [(c["kind"], c["metadata"]["name"]) for c in part.to_write()] == [("Service", "m-replicas"), ("Service", "m-holder")]
    seen = scale_to_zero_part(m, Observed(body, others=[live(replicas_service(m))]), ScalingPart(replicas=1, scaled=True))
    assert [(c["kind"], c["metadata"]["name"]) for c in seen.to_write()] == [
        ("Service", "m-replicas"), ("Deployment", "m-holder"), ("Service", "m-holder")]  # fmt: skip


def test_at_zero_without_an_available_holder_a_replica_stays():
    body = model_body(**ZERO)
    m = built(body)
    part = scale_to_zero_part(m, Observed(body), ScalingPart(replicas=0, scaled=True))
    assert part.replicas == 1 and not part.to_holder


def test_demand_reaches_keda_through_the_holders_external_scaler_not_only_a_scrape():
    """Issue 41: the holder serves KEDA's external scaler API on its own port, behind the Service
    <model>-holder, and the ScaledObject pushes activation from it (external-push), beside the
    Prometheus trigger that scales between one and the maximum."""
    body = model_body(**ZERO)
    m = built(body)
    part = scale_to_zero_part(m, Observed(body, others=[live(replicas_service(m))]), ScalingPart(replicas=1, scaled=True))
    kinds = [(c["kind"], c["metadata"]["name"]) for c in part.children]
    assert kinds == [("Service", "m-replicas"), ("Deployment", "m-holder"), ("Service", "m-holder")]
    port = holder_scaler_port(m)
    [service] = [c for c in part.children if c["metadata"]["name"] == "m-holder" and c["kind"] == "Service"]
    assert service["spec"]["selector"] == holder_selector(m)
    assert service["spec"]["ports"] == [{"name": "scaler", "port": port, "targetPort": "scaler", "protocol": "TCP"}]
    [holder] = [c for c in part.children if c["kind"] == "Deployment"]
    [container] = holder["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[args.index("--scaler-port") + 1] == str(port) and args[args.index("--target") + 1] == "4"
    assert {"name": "scaler", "containerPort": port, "protocol": "TCP"} in container["ports"]
    # Not one of the ports the holder answers the model's requests on.
    assert port not in [p["containerPort"] for p in container["ports"] if p["name"] != "scaler"]

    scaled = scaled_object(m, PROMETHEUS)
    push = [t for t in scaled["spec"]["triggers"] if t["type"] == "external-push"]
    assert push == [{"type": "external-push", "name": "held-requests", "metricType": "AverageValue",
                     "metadata": {"scalerAddress": f"m-holder.{m.namespace}.svc:{port}"}}]  # fmt: skip
    assert [t["type"] for t in scaled["spec"]["triggers"]] == ["prometheus", "external-push"]


def test_a_model_that_keeps_a_replica_has_no_pushed_activation():
    body = model_body(**{**ZERO, "autoscaling": {"minReplicas": 1, "maxReplicas": 3}})
    assert [t["type"] for t in scaled_object(built(body), PROMETHEUS)["spec"]["triggers"]] == ["prometheus"]


def test_without_pushed_activation_the_scaled_object_reads_prometheus_alone():
    """run --no-push-activation (chart autoscaling.pushActivation: false): for clusters where KEDA
    cannot reach a holder (a NetworkPolicy, say), whose trigger would fail and keep the model from zero."""
    from dataclasses import replace

    from inferentia_operator.core.scaling.part import scaling_part
    from inferentia_operator.core.settings import Settings

    body = model_body(**ZERO)
    m = built(body)
    on = scaling_part(m, Observed(body), Settings(prometheus=PROMETHEUS), has_artefact=True)
    off = scaling_part(m, Observed(body), replace(Settings(prometheus=PROMETHEUS), push_activation=False), has_artefact=True)
    [(on_body,)], [(off_body,)] = [on.children], [off.children]
    assert [t["type"] for t in on_body["spec"]["triggers"]] == ["prometheus", "external-push"]
    assert [t["type"] for t in off_body["spec"]["triggers"]] == ["prometheus"]


def test_a_holder_no_longer_needed_is_parked_whole_at_no_replica():
    """Parked by a server-side apply that still names its selector and template: one of replicas
    alone would remove them from the operator's apply, and the API server refuses a Deployment
    without them (422). So with autoscaling and batching both gone too."""
    zero = model_body(**ZERO)
    holder = live(holder_deployment(built(zero)))
    for plain in (model_body(**{"serving.batching": {"maxBatchSize": 4}}), model_body()):
        part = scale_to_zero_part(built(plain), Observed(plain, others=[holder]), ScalingPart(replicas=1))
        [parked] = part.to_write()
        assert parked["metadata"]["name"] == "m-holder" and parked["spec"]["replicas"] == 0
        assert parked["spec"]["selector"] == holder["spec"]["selector"]  # immutable: the same
        assert parked["spec"]["template"]["spec"]["containers"]


def test_with_kedas_namespace_only_keda_reaches_the_holders_external_scaler():
    """The scaler tells whoever listens when a request is held: with --keda-namespace a
    NetworkPolicy lets that namespace alone reach its port, and anyone the serving ports (the
    model's clients and Prometheus reach the holder there). With --no-push-activation there is
    no external-push trigger, and no policy either."""
    from inferentia_operator.core.decide import placed
    from inferentia_operator.core.settings import Settings

    body = model_body(**ZERO)
    m = placed(built(body), Settings(keda_namespace="keda"))
    part = scale_to_zero_part(m, Observed(body), ScalingPart(replicas=1, scaled=True))
    [policy] = [c for c in part.children if c["kind"] == "NetworkPolicy"]
    holder = next(c for c in part.children if c["kind"] == "Deployment")
    assert policy["metadata"]["name"] == "m-holder"
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= holder["spec"]["template"]["metadata"]["labels"].items()
    serving, scaler = policy["spec"]["ingress"]
    [container] = holder["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert "from" not in serving and {p["port"] for p in serving["ports"]} == {v for k, v in ports.items() if k != "scaler"}
    assert scaler == {
        "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "keda"}}}],
        "ports": [{"port": ports["scaler"], "protocol": "TCP"}],
    }
    for settings in (Settings(), Settings(keda_namespace="keda", push_activation=False)):
        quiet = scale_to_zero_part(placed(built(body), settings), Observed(body), ScalingPart(replicas=1, scaled=True))
        assert "NetworkPolicy" not in {c["kind"] for c in quiet.children}


def test_a_holder_policy_no_longer_wanted_is_deleted_and_only_the_operators():
    """--keda-namespace unset (or push activation off, or the model no longer at zero): the
    policy goes, lest a namespace that is no longer KEDA's keep KEDA out. Not one the model does
    not own."""
    from inferentia_operator.core.decide import placed
    from inferentia_operator.core.settings import Settings

    body = model_body(**ZERO)
    with_policy = placed(built(body), Settings(keda_namespace="keda"))
    policy = holder_network_policy(with_policy)
    assert policy is not None
    observed = Observed(body, others=[live(policy)])
    part = scale_to_zero_part(built(body), observed, ScalingPart(replicas=1, scaled=True))
    assert part.delete == (("NetworkPolicy", "m-holder"),)
    at_one = scale_to_zero_part(
        built(model_body(replicas=1)), Observed(model_body(replicas=1), others=[live(policy)]), ScalingPart(replicas=1)
    )
    assert at_one.delete == (("NetworkPolicy", "m-holder"),)
    kept = scale_to_zero_part(with_policy, observed, ScalingPart(replicas=1, scaled=True))
    assert kept.delete == ()
    foreign = {**policy, "metadata": {"name": "m-holder", "namespace": policy["metadata"]["namespace"]}}  # someone else's
    theirs = scale_to_zero_part(built(body), Observed(body, others=[live(foreign)]), ScalingPart(replicas=1, scaled=True))
    assert theirs.delete == ()
