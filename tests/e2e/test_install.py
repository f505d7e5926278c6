"""Installing the operator as platform teams do: the Helm chart and the plain manifests.

The chart's operator pod cannot run for real on kwok's simulated nodes, so the tests
run the operator as a process with the chart's ServiceAccount token: the sample
reaching Ready proves the RBAC is enough, and the refusals prove it is not too much.
"""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest
import yaml
from kit import CHART, LOCAL_IMAGE, ROOT, OperatorProcess, helm_template, service_account_kubeconfig, wait_for

from inferentia_operator.core.names import DEFAULT_OPERATOR_IMAGE
from specs import make_model

RESTRICTED = "pod-security.kubernetes.io/enforce=restricted"


def helm(cluster, *args, check=True):
    result = subprocess.run([cluster.tool("helm"), *args], capture_output=True, text=True, env=cluster.env, timeout=180)
    if check and result.returncode:
        raise AssertionError(f"helm {' '.join(args)}: {result.stderr}")
    return result


def kinds(docs):
    return sorted(f"{d['kind']}/{d['metadata'].get('namespace', '')}/{d['metadata']['name']}" for d in docs)


def test_helm_lint_with_default_and_other_values(cluster):
    helm(cluster, "lint", str(CHART), *LOCAL_IMAGE)
    helm(cluster, "lint", str(CHART), *LOCAL_IMAGE, "--set", "standby=true", "--set", "watchNamespaces={a,b}", "--set", "verbose=true")


def test_default_render_is_cluster_wide_with_one_replica_that_passes_restricted(cluster):
    docs = helm_template(cluster)
    assert kinds(docs) == [
        "ClusterKopfPeering//inferentia-operator",
        "ClusterRole//inferentia-operator",
        "ClusterRole//inferentia-operator-edit",
        # What each model's endpoint picker reads, granted only where the operator binds it.
        "ClusterRole//inferentia-operator-endpoint-picker",
        "ClusterRole//inferentia-operator-view",
        "ClusterRoleBinding//inferentia-operator",
        "Deployment/inferentia-system/inferentia-operator",
        # The proof key Secret of the compile cache, in the operator's own namespace.
        "Role/inferentia-system/inferentia-operator-proof-key",
        "RoleBinding/inferentia-system/inferentia-operator-proof-key",
        "Service/inferentia-system/inferentia-operator-metrics",
        "ServiceAccount/inferentia-system/inferentia-operator",
    ]
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == 1
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    [container] = pod["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
        "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]},
    }  # fmt: skip
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert "--metrics-port=8081" in container["args"] and "--workers=16" in container["args"]
    assert f"--operator-image={DEFAULT_OPERATOR_IMAGE}" in container["args"]  # fetch, upload and the front end run it
    [service] = [d for d in docs if d["kind"] == "Service"]
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 8081, "targetPort": "metrics", "protocol": "TCP"}]


def test_the_node_cache_only_when_asked_unprivileged_and_reached_on_the_pods_own_node(cluster):
    assert "DaemonSet" not in [d["kind"] for d in helm_template(cluster)]
    docs = helm_template(cluster, "--set", "nodeCache.enabled=true", "--set", "nodeCache.maxBytes=10737418240")
    [daemonset] = [d for d in docs if d["kind"] == "DaemonSet"]
    pod = daemonset["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["args"][:2] == ["node-cache", "--dir=/cache"] and "--max-bytes=10737418240" in container["args"]
    # No hostPath, no privilege: its own emptyDir, a little larger than what it keeps.
    assert pod["volumes"] == [{"name": "cache", "emptyDir": {"sizeLimit": "11264Mi"}}]
    assert pod["securityContext"]["runAsNonRoot"] is True
    # Its token may do one thing: label its own pod with what it holds. Its own ServiceAccount,
    # a Role of get and patch on pods here, and a policy narrowing that to its own pod's
    # holds.inferentia.dev labels.
    assert pod["automountServiceAccountToken"] is True and pod["serviceAccountName"] == "inferentia-operator-node-cache"
    [role] = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "inferentia-operator-node-cache"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]}]
    # And one cluster-wide right: to ask the API server whose a caller's token is (callers must
    # be pods of its node: NODE_NAME, from the pod's own spec.nodeName).
    [reviewer] = [d for d in docs if d["kind"] == "ClusterRole" and "node-cache" in d["metadata"]["name"]]
    assert reviewer["rules"] == [{"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]}]
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in container["env"]
    [policy] = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    assert policy["spec"]["matchConditions"][0]["expression"].endswith(
        '"system:serviceaccount:inferentia-system:inferentia-operator-node-cache"'
    )
    assert [v["message"] for v in policy["spec"]["validations"]] == [
        "the node cache may change its own pod only", "the node cache may change its pod's holds.inferentia.dev labels only",
    ]  # fmt: skip
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert {"key": "aws.amazon.com/neuron", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    [service] = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"].endswith("-node-cache")]
    assert service["spec"]["internalTrafficPolicy"] == "Local"
    assert service["spec"]["selector"] == daemonset["spec"]["selector"]["matchLabels"]
    # The operator's own selector never matches the cache's pods.
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    operator_selector = deployment["spec"]["selector"]["matchLabels"].items()
    assert not operator_selector <= daemonset["spec"]["template"]["metadata"]["labels"].items()
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--node-cache-url=http://inferentia-operator-node-cache.inferentia-system.svc:8080" in args
    assert "--node-cache-namespace=inferentia-system" in args


def test_an_install_without_the_image_stops_with_a_message(cluster):
    """No registry serves the operator's image: an install that forgets image.repository
    fails at once, saying what to set, instead of leaving the operator in ImagePullBackOff."""
    result = helm(cluster, "template", "x", str(CHART), check=False)
    assert result.returncode != 0
    assert "image.repository is required: build the operator's image from the repository's Dockerfile" in result.stderr


def test_a_service_monitor_only_when_asked(cluster):
    assert "ServiceMonitor" not in [d["kind"] for d in helm_template(cluster)]
    docs = helm_template(cluster, "--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.serviceMonitor.labels.release=prom")
    [monitor] = [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert monitor["spec"]["endpoints"] == [{"port": "metrics", "interval": "30s"}]
    assert monitor["metadata"]["labels"]["release"] == "prom"


def test_a_pod_monitor_only_when_asked_keeping_the_ports_that_serve_the_gauges(cluster):
    """kube-prometheus-stack ignores the prometheus.io/* annotations: with podMonitor.enabled
    the chart renders a PodMonitor whose relabelings keep, of every container port of the
    operator's pods, exactly the one each pod's scrape annotation names. The relabelings are
    run here as Prometheus runs a keep rule (the regex anchored at both ends) on the targets
    Kubernetes service discovery gives the pods the operator builds."""
    import re

    from inferentia_operator.core.pod.ports import SCRAPED_PORTS
    from inferentia_operator.core.serving.deployment import serving_deployment
    from test_children import THROUGHPUT, VLLM, model

    assert "PodMonitor" not in [d["kind"] for d in helm_template(cluster)]
    docs = helm_template(cluster, "--set", "podMonitor.enabled=true", "--set", "podMonitor.labels.release=kps")
    [monitor] = [d for d in docs if d["kind"] == "PodMonitor"]
    assert monitor["metadata"]["labels"]["release"] == "kps"
    assert monitor["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/managed-by": "inferentia-operator"}
    assert monitor["spec"]["namespaceSelector"] == {"any": True}

    def scraped(pod_template: dict) -> set[str]:
        """The ports kept: service discovery's pod role makes a target of each declared port."""
        annotations = pod_template["metadata"].get("annotations", {})
        meta = {f"__meta_kubernetes_pod_annotation_{re.sub('[^a-zA-Z0-9_]', '_', k)}": v for k, v in annotations.items()}
        names = {p["name"] for c in pod_template["spec"]["containers"] for p in c.get("ports", [])}
        kept = set()
        for endpoint in monitor["spec"]["podMetricsEndpoints"]:
            for name in names:
                if endpoint.get("port") not in (None, name):
                    continue
                labels = {**meta, "__meta_kubernetes_pod_container_port_name": name}
                keep = [r for r in endpoint["relabelings"] if r.get("action") == "keep"]
                sep = lambda r: r.get("separator", ";")  # noqa: E731 - Prometheus's default
                if all(re.fullmatch(r["regex"], sep(r).join(labels.get(label, "") for label in r["sourceLabels"])) for r in keep):
                    kept.add(name)
        return kept

    batched = serving_deployment(model(**{**THROUGHPUT, "serving.batching": {"maxBatchSize": 4}}))
    vllm = serving_deployment(model(**VLLM))
    plain = serving_deployment(model(**THROUGHPUT))
    for deployment in (batched, vllm):
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert scraped(batched["spec"]["template"]) == {"batch"}  # not the model processes behind it
    # Every vLLM process of the pod (three here): each serves its own /metrics, and the target is the replica's.
    assert scraped(vllm["spec"]["template"]) == {"serve-0", "serve-1", "serve-2"}
    relabeled = next(r for r in monitor["spec"]["podMetricsEndpoints"][0]["relabelings"] if r.get("action") == "keep")
    assert relabeled["regex"] == SCRAPED_PORTS  # the chart's and the code's, one rule
    assert scraped(plain["spec"]["template"]) == set()  # the model server exports no gauges
    # The labels the ScaledObjects' queries read.
    relabel = {r["targetLabel"]: r["sourceLabels"] for r in monitor["spec"]["podMetricsEndpoints"][0]["relabelings"] if "targetLabel" in r}
    assert relabel == {
        "namespace": ["__meta_kubernetes_namespace"],
        "inferentia_dev_model": ["__meta_kubernetes_pod_label_inferentia_dev_model"],
        "inferentia_dev_pool": ["__meta_kubernetes_pod_label_inferentia_dev_pool"],
    }
    scoped = helm_template(cluster, "--set", "podMonitor.enabled=true", "--set", "watchNamespaces={a,b}")
    [monitor] = [d for d in scoped if d["kind"] == "PodMonitor"]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["a", "b"]}


def test_the_prometheus_settings_reach_the_operator(cluster):
    def args(*sets: str) -> list[str]:
        [deployment] = [d for d in helm_template(cluster, *sets) if d["kind"] == "Deployment"]
        return deployment["spec"]["template"]["spec"]["containers"][0]["args"]

    assert not [a for a in args() if a.startswith("--prometheus-address")]
    assert "--prometheus-model-label=inferentia_dev_model" in args()
    assert "--prometheus-pool-label=inferentia_dev_pool" in args()
    assert "--prometheus-pool-label=pool" in args("--set", "autoscaling.prometheus.poolLabel=pool")
    shown = args(
        "--set",
        "autoscaling.prometheus.address=http://prometheus-server.monitoring:9090",
        "--set",
        "autoscaling.prometheus.namespaceLabel=kubernetes_namespace",
    )
    assert "--prometheus-address=http://prometheus-server.monitoring:9090" in shown
    assert "--prometheus-namespace-label=kubernetes_namespace" in shown
    assert not [a for a in shown if a.startswith(("--prometheus-authentication", "--prometheus-aws-region"))]
    # Amazon Managed Prometheus, as docs/install.md sets it up.
    amp = args(
        "--set", "autoscaling.prometheus.address=https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-1",
        "--set", "autoscaling.prometheus.authentication.name=keda-aws",
        "--set", "autoscaling.prometheus.authentication.kind=ClusterTriggerAuthentication",
        "--set", "autoscaling.prometheus.awsRegion=us-east-1",
    )  # fmt: skip
    assert [a for a in amp if a.startswith(("--prometheus-authentication", "--prometheus-aws-region"))] == [
        "--prometheus-authentication=keda-aws",
        "--prometheus-authentication-kind=ClusterTriggerAuthentication",
        "--prometheus-aws-region=us-east-1",
    ]
    assert "--scheduler-name=my-scheduler" in args("--set", "schedulerName=my-scheduler")
    assert not [a for a in args() if a.startswith("--scheduler-name")]
    # The operator's own parser takes them as the chart gives them.
    from inferentia_operator.cli import parser, settings_from

    prometheus = settings_from(parser().parse_args(amp)).prometheus
    assert (prometheus.authentication, prometheus.aws_region) == ("keda-aws", "us-east-1")


def test_watch_namespaces_gives_roles_only_and_standby_a_second_replica(cluster):
    docs = helm_template(cluster, "--set", "watchNamespaces={team-a,team-b}", "--set", "standby=true")
    # Nothing cluster-wide is granted: the endpoint picker's ClusterRole grants nothing until the
    # operator binds it, by a RoleBinding, in a namespace it watches.
    cluster_wide = [
        f"{d['kind']}/{d['metadata']['name']}" for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding", "ClusterKopfPeering")
    ]
    assert cluster_wide == ["ClusterRole/inferentia-operator-endpoint-picker"]
    assert sorted(f"{d['kind']}/{d['metadata']['namespace']}" for d in docs if d["kind"] in ("Role", "RoleBinding", "KopfPeering")) == [
        "KopfPeering/team-a", "KopfPeering/team-b", "Role/inferentia-system", "Role/team-a", "Role/team-b",
        "RoleBinding/inferentia-system", "RoleBinding/team-a", "RoleBinding/team-b",
    ]  # fmt: skip
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    assert deployment["spec"]["replicas"] == 2
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args
    # No right to list nodes, so none is watched: a pod's Neuron fault goes unreported there.
    assert "--no-node-faults" in args
    cluster_args = next(d for d in helm_template(cluster) if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--no-node-faults" not in cluster_args


@pytest.mark.parametrize(
    "setting,complaint",
    [
        ("standby=yes", "got string, want boolean"),
        ("resyncSeconds=1", "minimum"),
        ("image.pullPolicy=Sometimes", "value must be one of"),
        ("watchNamespaces={Not_A_Namespace}", "does not match pattern"),
        ("replicaCount=3", "additional properties 'replicaCount' not allowed"),
        ("autoscaling.prometheus.address=prometheus:9090", "does not match pattern"),
        ("autoscaling.prometheus.modelLabel=inferentia.dev/model", "does not match pattern"),
    ],
)
def test_the_values_schema_refuses_wrong_values(cluster, setting, complaint):
    result = helm(cluster, "template", "x", str(CHART), *LOCAL_IMAGE, "--set", setting, check=False)
    assert result.returncode != 0
    assert complaint in result.stderr, result.stderr


def test_manifests_equal_the_charts_default_render(cluster):
    result = subprocess.run(
        [sys.executable, str(ROOT / "charts" / "render_manifests.py"), cluster.tool("helm"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def cluster_scoped(cluster) -> set[str]:
    names = set()
    for kind in ("clusterroles", "clusterrolebindings", "clusterkopfpeerings", "customresourcedefinitions"):
        names |= {f"{kind}/{o['metadata']['name']}" for o in cluster.get(kind)["items"]}
    return names


def prove_rbac(cluster, namespace, service_account, peering, tmp_path, model_namespace):
    """The operator, with only the ServiceAccount's rights, takes a sample to Ready; and nothing more is granted."""
    kubeconfig = service_account_kubeconfig(cluster, namespace, service_account, tmp_path / "sa-kubeconfig")
    op = OperatorProcess(kubeconfig, tmp_path / "operator.log", peering=peering, key_namespace=namespace)
    op.start()
    try:
        body = make_model("rbac", model_namespace, processesPerReplica=2, **{"compile.image": "example.com/compile:1"})
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(body))
        cluster.kubectl("wait", "--for=condition=Ready", "inferentiamodel/rbac", "-n", model_namespace, "--timeout=90s")
        assert "Forbidden" not in op.log() and "(403)" not in op.log(), op.log()[-2000:]
    finally:
        op.stop()
    who = f"--as=system:serviceaccount:{namespace}:{service_account}"
    for verb, resource in [("get", "secrets"), ("list", "secrets"), ("patch", "nodes"), ("create", "pods"),
                           ("delete", "persistentvolumeclaims"), ("create", "clusterrolebindings"), ("delete", "inferentiamodels")]:  # fmt: skip
        # (It may delete Services now: a prefill or decode pool's own, once the model has none.
        # A claim holds a user's data, and the operator makes none.)
        answer = cluster.kubectl("auth", "can-i", verb, resource, "-A", who, check=False).stdout.strip()
        assert answer == "no", f"the operator may {verb} {resource}"


def test_helm_install_reconciles_with_its_own_rbac_and_uninstalls_cleanly(crd_installed, namespace, tmp_path):
    cluster = crd_installed
    if cluster.local is None:
        pytest.skip("installs cluster-wide RBAC: only on the built-in control plane")
    release_ns = f"e2e-helm-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", release_ns)
    cluster.kubectl("label", "namespace", release_ns, RESTRICTED)  # the API server enforces the standard
    before = cluster_scoped(cluster)
    peering = f"e2e-{release_ns}"
    helm(cluster, "install", "inferentia-operator", str(CHART), "-n", release_ns, *LOCAL_IMAGE, "--set", f"peeringName={peering}",
         "--wait", "--timeout", "90s")  # fmt: skip
    try:
        notes = helm(cluster, "get", "notes", "inferentia-operator", "-n", release_ns).stdout
        assert "kubectl wait --for=condition=Ready inferentiamodel/<name>" in notes
        prove_rbac(cluster, release_ns, "inferentia-operator", peering, tmp_path, namespace)
    finally:
        helm(cluster, "uninstall", "inferentia-operator", "-n", release_ns, "--wait")
        cluster.kubectl("delete", "namespace", release_ns, "--wait=false", check=False)
    # Helm keeps the CRDs of crds/ (they were already there) and removes everything else it made.
    assert cluster_scoped(cluster) == before


def test_kubectl_apply_of_the_plain_manifests(crd_installed, namespace, tmp_path):
    cluster = crd_installed
    if cluster.local is None:
        pytest.skip("installs cluster-wide RBAC: only on the built-in control plane")
    cluster.kubectl("apply", "-f", str(ROOT / "manifests"))
    try:
        cluster.kubectl("label", "namespace", "inferentia-system", RESTRICTED, "--overwrite")
        cluster.kubectl("rollout", "status", "deployment/inferentia-operator", "-n", "inferentia-system", "--timeout=90s")
        prove_rbac(cluster, "inferentia-system", "inferentia-operator", "inferentia-operator", tmp_path, namespace)
    finally:
        # The CRDs stay: other tests use them. Everything else the manifests made goes.
        cluster.kubectl("delete", "-f", str(ROOT / "manifests" / "10-operator.yaml"), "--wait=false", check=False)
        wait_for(lambda: cluster.kubectl("get", "clusterrole", "inferentia-operator", check=False).returncode != 0, 60, "cleanup")


def test_namespace_editors_and_viewers_get_models_through_the_aggregated_roles(crd_installed, namespace):
    cluster = crd_installed
    if cluster.local is None:
        pytest.skip("installs cluster-wide roles: only on the built-in control plane")
    roles = [d for d in helm_template(cluster) if d["kind"] == "ClusterRole" and d["metadata"]["name"] != "inferentia-operator"]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(roles))
    try:
        for who, role in (("alice", "edit"), ("bob", "view")):
            cluster.kubectl("create", "rolebinding", f"{who}-{role}", f"--clusterrole={role}", f"--user={who}", "-n", namespace)

        def can(who, verb, subresource=""):
            extra = [f"--subresource={subresource}"] if subresource else []
            result = cluster.kubectl("auth", "can-i", verb, "inferentiamodels", *extra, "-n", namespace, "--as", who, check=False)
            return result.stdout.strip() == "yes"

        # The built-in roles pick the rules up through their aggregation labels.
        wait_for(lambda: can("alice", "create"), 30, "edit to include inferentiamodels")
        assert can("alice", "delete") and can("alice", "patch", "scale")
        assert can("bob", "get") and can("bob", "watch") and not can("bob", "create")
        assert not can("bob", "patch", "status") and not can("alice", "patch", "status")  # status is the operator's
    finally:
        cluster.kubectl("delete", "clusterrole", *[r["metadata"]["name"] for r in roles], check=False)


def test_an_image_outside_the_allow_list_is_refused_at_apply(crd_installed, namespace):
    cluster = crd_installed
    if cluster.local is None:
        pytest.skip("installs a cluster-wide admission policy: only on the built-in control plane")
    docs = helm_template(cluster, "--set", "imageAllowList={registry.example.com/neuron/,host.example.com}")
    policy = [d for d in docs if d["kind"].startswith("ValidatingAdmissionPolicy")]
    assert sorted(d["kind"] for d in policy) == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    assert "ValidatingAdmissionPolicy" not in [d["kind"] for d in helm_template(cluster)]  # off by default
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(policy))
    try:
        allowed = make_model("allowed", namespace, **{"serving.image": "registry.example.com/neuron/serve:1"})

        def admitted():  # the policy takes a moment to reach the admission plugin
            probe = make_model("probe", namespace, **{"serving.image": "docker.io/evil/serve:1"})
            return cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(probe), check=False).returncode != 0

        wait_for(admitted, 30, "the policy to be enforced")
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(allowed))
        bad_compile = make_model("bad", namespace, **{"serving.image": "registry.example.com/neuron/serve:1",
                                                      "compile.image": "docker.io/evil/compile:1"})  # fmt: skip
        result = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(bad_compile), check=False)
        assert result.returncode != 0
        assert (
            "image docker.io/evil/compile:1 is not from an allowed registry; allowed registries and repositories: "
            "registry.example.com/neuron, host.example.com" in result.stderr
        )
        # Entries match at whole boundaries: a sibling repository or a host that merely begins
        # with the allowed one is refused; below either, by tag or by digest, is admitted.
        for image, admitted_too in [
            ("registry.example.com/neuron-evil/serve:1", False),
            ("host.example.com.attacker.tld/serve:1", False),
            ("host.example.comx/serve:1", False),
            ("host.example.com/any/path/serve:1", True),
            ("registry.example.com/neuron/sub/serve@sha256:" + "a" * 64, True),
        ]:
            probe = make_model("boundary", namespace, **{"serving.image": image})
            result = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(probe), check=False)
            assert (result.returncode == 0) == admitted_too, (image, result.stderr)
        # The batching front end's image goes into every pod too.
        bad_front_end = make_model("bad", namespace, **{"serving.image": "registry.example.com/neuron/serve:1",
                                                        "serving.batching": {"image": "docker.io/attacker/anything:latest"}})  # fmt: skip
        result = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(bad_front_end), check=False)
        assert result.returncode != 0 and "image docker.io/attacker/anything:latest is not from an allowed registry" in result.stderr
    finally:
        cluster.kubectl("delete", "-f", "-", input=yaml.safe_dump_all(policy), check=False)
        # The admission plugin drops the policy a moment after its deletion, as it picked
        # it up a moment after its creation: the next test must not meet it.
        wait_for(lambda: not admitted(), 30, "the policy to stop being enforced")
