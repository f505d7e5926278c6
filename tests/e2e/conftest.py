"""End-to-end fixtures: one real Kubernetes API server for the whole session.

By default the suite starts the project's local control plane (cluster/) in a
temporary directory, so it never collides with `make cluster-up`. To run the same
suite against a cluster of your own (kind, EKS):

    INFERENTIA_E2E_USE_EXISTING_CLUSTER=1 KUBECONFIG=~/.kube/config make test

Tests that need simulated Neuron capacity skip themselves on clusters without it.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from kit import CRD_FILE, USE_EXISTING, Cluster, OperatorProcess, bind_user_to_operator_role, localcluster, wait_for


def pytest_collection_modifyitems(items):
    for item in items:
        if str(item.fspath).startswith(str(Path(__file__).parent)):
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory) -> Cluster:
    bins = localcluster.bin_dir()
    if USE_EXISTING:
        kubeconfig = Path(os.environ.get("KUBECONFIG", Path.home() / ".kube" / "config"))
        c = Cluster(kubeconfig, bins, None)
        yield c
        return
    # die_with_parent: if pytest is killed outright, the kernel stops the control plane too.
    local = localcluster.LocalCluster(tmp_path_factory.mktemp("cluster"), die_with_parent=True)
    try:
        local.up()
        yield Cluster(local.kubeconfig, bins, local)
    finally:
        local.down()


@pytest.fixture(scope="session")
def crd_installed(cluster: Cluster) -> Cluster:
    # Everything in crds/: the InferentiaModel CRD and kopf's peering CRDs, as users install them.
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE.parent))
    for name in ("inferentiamodels.inferentia.dev", "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"):
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")
    # Discovery and the published OpenAPI lag the Established condition by a moment.
    wait_for(lambda: cluster.kubectl("explain", "inferentiamodel.spec", check=False).returncode == 0, 30, "kubectl explain")
    return cluster


@pytest.fixture
def namespace(cluster: Cluster):
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    # Pods are refused until the namespace's default ServiceAccount exists.
    wait_for(lambda: cluster.kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0, 30, "default SA")
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


PEERING = "inferentia-operator"
OPERATOR_USER = "inferentia-operator"


@pytest.fixture(scope="module")
def operator(crd_installed: Cluster, tmp_path_factory):
    """The operator, watching every namespace, running as its own user where the cluster allows it."""
    c = crd_installed  # the operator creates its ClusterKopfPeering at start
    if c.local is not None:
        # Exactly the chart's ClusterRole: every operator test also proves the RBAC is enough.
        kubeconfig = c.local.user_kubeconfig(OPERATOR_USER)
        bind_user_to_operator_role(c, OPERATOR_USER, "e2e-operator")
    else:
        kubeconfig = c.kubeconfig
    op = OperatorProcess(kubeconfig, tmp_path_factory.mktemp("operator") / "operator.log", peering=PEERING)
    op.start()
    yield op
    op.stop()
