"""End-to-end fixtures: one real Kubernetes API server for the whole session.

By default the suite starts the project's local control plane (cluster/) in a
temporary directory, so it never collides with `make cluster-up`. To run the same
suite against a cluster of your own (kind, EKS):

    INFERENTIA_E2E_USE_EXISTING_CLUSTER=1 KUBECONFIG=~/.kube/config make test

Tests that need simulated Neuron capacity skip themselves on clusters without it.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest
from kit import (
    CRD_FILE,
    KEY_NAMESPACE,
    KIND_STATE,
    USE_EXISTING,
    Cluster,
    OperatorProcess,
    bind_user_to_operator_role,
    localcluster,
    wait_for,
)

REAL_NODE_STATE: dict[str, str | None] = {"skipped": None, "rollout": None}
# The real_node fixture's skip reasons.
NO_REAL_NODE = ("real-node tests need", "the real node did not start")


def pytest_terminal_summary(terminalreporter):
    """Real-node tests never skip silently: the summary's last words say that they did not run, and why."""
    if REAL_NODE_STATE["rollout"]:
        terminalreporter.write_line(f"real node: {REAL_NODE_STATE['rollout']}")
    # Those skipped for want of a real node; not those with a reason of their own (on kind,
    # say, the tests of the local cluster's bridge or of its DRA stand-in).
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if any(why in str(r.longrepr) for why in NO_REAL_NODE)]
    if skipped:
        reason = REAL_NODE_STATE["skipped"] or "see the skip reasons above"
        terminalreporter.write_line(f"REAL-NODE TESTS DID NOT RUN ({len(skipped)} skipped): {reason}", red=True, bold=True)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if str(item.fspath).startswith(str(Path(__file__).parent)):
            item.add_marker(pytest.mark.cluster)
            if "real_node" in item.fixturenames:
                item.add_marker(pytest.mark.real_node)
    # The real-node fault suite (about 6 minutes) runs in `make test-faults`, which sets
    # INFERENTIA_REAL_FAULTS=1, or when its file is named; `make test` leaves it out to stay
    # inside CI's time (docs/faults.md).
    named = any("test_real_faults" in str(a) for a in config.args)
    if not (os.environ.get("INFERENTIA_REAL_FAULTS") == "1" or named):
        left_out = [i for i in items if i.fspath.basename == "test_real_faults.py"]
        if left_out:
            config.hook.pytest_deselected(items=left_out)
            items[:] = [i for i in items if i.fspath.basename != "test_real_faults.py"]


@pytest.fixture(scope="session")
def cluster(request, tmp_path_factory) -> Cluster:
    bins = localcluster.bin_dir()
    if KIND_STATE:
        # make test-kind: the kind cluster cluster/kindcluster.py set up, whose node is the real node.
        import kindcluster

        kind = kindcluster.KindCluster(Path(KIND_STATE), bins)
        assert kind.recorded().get("object_store"), f"no kind cluster set up in {KIND_STATE}: run make test-kind"
        yield Cluster(kind.kubeconfig, bins, None, node=kind)
        return
    if USE_EXISTING:
        kubeconfig = Path(os.environ.get("KUBECONFIG", Path.home() / ".kube" / "config"))
        c = Cluster(kubeconfig, bins, None)
        yield c
        return
    # die_with_parent: if pytest is killed outright, the kernel stops the control plane too.
    # The real node runs where it can (root), when a test of the run needs it (it and the
    # autoscaling engines beside it are most of the cluster's start); the summary says when
    # and why it did not.
    wanted = any(item.get_closest_marker("real_node") for item in request.session.items)
    local = localcluster.LocalCluster(tmp_path_factory.mktemp("cluster"), die_with_parent=True, real_node=wanted)
    try:
        local.up(timeout=300)
        REAL_NODE_STATE["skipped"] = local.real_node_skipped
        yield Cluster(local.kubeconfig, bins, local, node=local if local.real_node is not None else None)
    finally:
        had_real_node = local.real_node is not None
        local.down()
    if had_real_node:
        # Stopping the cluster removes every process, mount, cgroup, link, route and rule the
        # real node made: checked here, where the whole suite has used it.
        import realnode

        left = realnode.leftovers(local.state, bins)
        assert not left, f"the real node left these behind: {left}"


@pytest.fixture(scope="session")
def crd_installed(cluster: Cluster) -> Cluster:
    # Everything in crds/: the InferentiaModel CRD and kopf's peering CRDs, as users install them.
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE.parent))
    localcluster.wait_established(
        cluster.kubectl, "inferentiamodels.inferentia.dev", "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"
    )
    # Discovery and the published OpenAPI lag the Established condition by a moment.
    wait_for(lambda: cluster.kubectl("explain", "inferentiamodel.spec", check=False).returncode == 0, 30, "kubectl explain")
    # The operators the tests start keep their proof key there, as one installed by the chart would.
    manifest = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KEY_NAMESPACE}}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    return cluster


def _namespace(cluster: Cluster):
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    # Pods are refused until the namespace's default ServiceAccount exists.
    wait_for(lambda: cluster.kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0, 30, "default SA")
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def namespace(cluster: Cluster):
    yield from _namespace(cluster)


@pytest.fixture(scope="module")
def refusals_namespace(cluster: Cluster):
    """One namespace for a module's tests that leave nothing in it (a server-side dry run, or
    an object the API server refuses): its creation and deletion took a third of such a
    test's time when each had its own."""
    yield from _namespace(cluster)


PEERING = "inferentia-operator"
OPERATOR_USER = "inferentia-operator"


@pytest.fixture(scope="module")
def operator(crd_installed: Cluster, tmp_path_factory):
    """The operator, watching every namespace, running as its own user where the cluster allows it."""
    c = crd_installed  # the operator creates its ClusterKopfPeering at start
    issuer = c.local or c.node  # the local cluster, or kind, whose CA signs a user of our own
    if issuer is not None:
        # Exactly the chart's ClusterRole: every operator test also proves the RBAC is enough.
        kubeconfig = issuer.user_kubeconfig(OPERATOR_USER)
        bind_user_to_operator_role(c, OPERATOR_USER, "e2e-operator")
    else:
        kubeconfig = c.kubeconfig
    # Autoscaled models' ScaledObjects read the local cluster's Prometheus, when it runs one.
    prometheus = issuer.prometheus() if issuer is not None else None
    extra = ("--prometheus-address", prometheus) if prometheus else ()
    # As the chart runs it: each holder gets its NetworkPolicy (KEDA's namespace alone reaches
    # its scaler), which the API server and the chart's role must take. Not on kind, whose
    # network enforces it against the KEDA this suite runs on the host, outside any namespace.
    extra += ("--keda-namespace", "keda") if c.local is not None else ()
    op = OperatorProcess(kubeconfig, tmp_path_factory.mktemp("operator") / "operator.log", peering=PEERING, extra_args=extra)
    op.start()
    yield op
    op.stop()


@pytest.fixture(scope="session")
def real_node(crd_installed: Cluster) -> Cluster:
    """The cluster, with its real node: pods in a ``real_namespace`` run as real containers."""
    if crd_installed.node is not None:
        return crd_installed
    if USE_EXISTING:
        pytest.skip("real-node tests need the local cluster's real node, or make test-kind's (stand-in images and device plugin)")
    pytest.skip(f"the real node did not start: {crd_installed.local.real_node_skipped if crd_installed.local else 'no local cluster'}")


@pytest.fixture
def autoscaling_engines(real_node: Cluster) -> str:
    """Prometheus's URL, where Prometheus and KEDA run for the real node (cluster/autoscaling.py)."""
    prometheus = real_node.node.prometheus()
    if prometheus is None:
        if real_node.local is None:
            pytest.skip("Prometheus and KEDA run beside the local cluster only (cluster/autoscaling.py): not on this cluster")
        pytest.fail(f"the local cluster started no Prometheus: {real_node.local.recorded().get('autoscaling_skipped')}")
    return prometheus


@pytest.fixture
def real_namespace(real_node: Cluster):
    """A namespace whose pods go to the real node (its admission annotations), deleted after."""
    import realnode

    name = f"real-{uuid.uuid4().hex[:8]}"
    manifest = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "annotations": realnode.REAL_NODE_NAMESPACE_ANNOTATIONS},
    }
    real_node.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    wait_for(lambda: real_node.kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0, 30, "default SA")
    yield name
    real_node.kubectl("delete", "namespace", name, "--wait=false", check=False)
    # The test is over: its pods need not drain (the serving pods' preStop sleep) while they
    # hold the real node's devices the next test asks for. After the namespace's delete, so
    # that no ReplicaSet can replace them (a namespace being deleted takes no new object).
    real_node.kubectl("delete", "pods", "--all", "-n", name, "--grace-period=1", "--wait=false", check=False)
