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
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "cluster"))

import localcluster  # noqa: E402

CRD_FILE = ROOT / "crds" / "inferentia.dev_inferentiamodels.yaml"
USE_EXISTING = os.environ.get("INFERENTIA_E2E_USE_EXISTING_CLUSTER") == "1"


def pytest_collection_modifyitems(items):
    for item in items:
        if str(item.fspath).startswith(str(Path(__file__).parent)):
            item.add_marker(pytest.mark.cluster)


@dataclass
class Cluster:
    """A reachable cluster: its kubeconfig and the tools to drive it."""

    kubeconfig: Path
    bin_dir: Path
    local: localcluster.LocalCluster | None

    def tool(self, name: str) -> str:
        override = os.environ.get(f"INFERENTIA_{name.upper()}")
        return override or str(self.bin_dir / name)

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [self.tool("kubectl"), *args], input=input, capture_output=True, text=True, env=self.env, timeout=120
        )
        if check and result.returncode:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr}")
        return result

    def get(self, *args: str) -> dict:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def neuron_capacity(self) -> list[int]:
        nodes = self.get("nodes")["items"]
        return sorted(int(n["status"].get("allocatable", {}).get("aws.amazon.com/neuron", 0)) for n in nodes)


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
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
    cluster.kubectl("wait", "--for=condition=Established", "crd/inferentiamodels.inferentia.dev", "--timeout=60s")
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


def wait_for(predicate, timeout: float, what: str, interval: float = 0.25):
    """Polls predicate until it returns a truthy value, which is returned."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
