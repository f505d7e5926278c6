"""The local cluster's autoscaling engines, as users run them: Prometheus scraping the serving
pods, and KEDA (its operator and its external-metrics API server) scaling Deployments on
Prometheus queries through the HorizontalPodAutoscalers it makes.

They run as processes on this machine beside the control plane, with the real node:

- Prometheus on loopback, finding pods through the API server (kubernetes_sd_configs) and
  scraping those annotated ``prometheus.io/scrape: "true"`` at their pod addresses, which the
  cluster's bridge routes; the relabelling is the one in Prometheus's own example
  configuration for Kubernetes (documentation/examples/prometheus-kubernetes.yml).
- KEDA's operator, with the certificates of its gRPC metrics service in a directory (as
  KEDA's chart mounts its kedaorg-certs Secret) and cert rotation off; as root, in a mount
  namespace where Services' cluster DNS names resolve (cluster/service_hosts.py), so that an
  external-push trigger reaches a model's holder by name.
- KEDA's adapter, an aggregated API server for ``external.metrics.k8s.io`` on the bridge's
  address: the API server reaches it through a Service without a selector and an
  EndpointSlice that names that address (--enable-aggregator-routing), as KEDA's chart
  registers its APIService.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

import realnode
from inferentia_operator.core.pod.ports import scrape_relabelings
from ports import free_port

KEDA_NAMESPACE = "keda"
ADAPTER_SERVICE = "keda-metrics-apiserver"
OPERATOR_SERVICE = "keda-operator"
APISERVICE = "v1beta1.external.metrics.k8s.io"


def prometheus_config(kubeconfig: Path) -> dict[str, Any]:
    """Scrape the models' pods at every port their inferentia.dev/metrics-port annotation names
    (pod.ports.scrape_relabelings: each vLLM process's), and every other pod annotated
    prometheus.io/scrape at prometheus.io/port and prometheus.io/path, as Prometheus's example does."""
    meta = "__meta_kubernetes_pod_"
    labels = [
        {"action": "labelmap", "regex": f"{meta}label_(.+)"},
        {"source_labels": ["__meta_kubernetes_namespace"], "action": "replace", "target_label": "namespace"},
        {"source_labels": [f"{meta}name"], "action": "replace", "target_label": "pod"},
    ]
    return {
        # Short, so that a start from zero waits little for the holder's count to be seen.
        "global": {"scrape_interval": f"{SCRAPE_SECONDS}s", "evaluation_interval": f"{SCRAPE_SECONDS}s"},
        "scrape_configs": [
            {
                "job_name": "inferentia-models",
                "kubernetes_sd_configs": [{"role": "pod", "kubeconfig_file": str(kubeconfig)}],
                "relabel_configs": [*scrape_relabelings(meta), *labels],
            },
            {
                "job_name": "kubernetes-pods",
                "kubernetes_sd_configs": [{"role": "pod", "kubeconfig_file": str(kubeconfig)}],
                "relabel_configs": [
                    {"source_labels": [f"{meta}annotation_prometheus_io_scrape"], "action": "keep", "regex": "true"},
                    {"source_labels": [f"{meta}annotationpresent_inferentia_dev_metrics_port"], "action": "drop", "regex": "true"},
                    {
                        "source_labels": [f"{meta}annotation_prometheus_io_path"],
                        "action": "replace",
                        "target_label": "__metrics_path__",
                        "regex": "(.+)",
                    },
                    {
                        "source_labels": ["__address__", f"{meta}annotation_prometheus_io_port"],
                        "action": "replace",
                        "regex": "([^:]+)(?::\\d+)?;(\\d+)",
                        "replacement": "$1:$2",
                        "target_label": "__address__",
                    },
                    *labels,
                ],
            },
        ],
    }


# prometheus_config's scrape interval: short, so that the tests wait little for a scrape.
SCRAPE_SECONDS = 2


def set_scrape_interval(state: Path, prometheus_pid: int, prometheus_url: str, seconds: int) -> None:
    """The running Prometheus scrapes every ``seconds`` from now on: its configuration file
    rewritten and reloaded (SIGHUP, as Prometheus documents), until its API reports it."""
    import signal
    import urllib.request

    path = state / "autoscaling" / "prometheus.yml"
    config = yaml.safe_load(path.read_text())
    config["global"] |= {"scrape_interval": f"{seconds}s", "evaluation_interval": f"{seconds}s"}
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    os.kill(prometheus_pid, signal.SIGHUP)
    deadline = time.monotonic() + 30
    while True:
        with urllib.request.urlopen(f"{prometheus_url}/api/v1/status/config", timeout=5) as answer:
            loaded = yaml.safe_load(json.loads(answer.read())["data"]["yaml"])
        if loaded["global"]["scrape_interval"] in (f"{seconds}s", _prometheus_duration(seconds)):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"Prometheus did not take the new scrape interval: {loaded['global']}")
        time.sleep(0.2)


def _prometheus_duration(seconds: int) -> str:
    """How Prometheus prints a duration: 3600 s as 1h, 90 s as 1m30s."""
    out = ""
    for unit, size in (("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            out += f"{seconds // size}{unit}"
            seconds %= size
    return out or "0s"


def make_keda_certs(pki: Path, sign) -> Path:
    """ca.crt, tls.crt and tls.key, as KEDA's operator and adapter read them from --cert-dir:
    one certificate, for the gRPC metrics service (served and dialled) and the adapter's
    aggregated API, named as the two Services."""
    names = [
        f"DNS:{OPERATOR_SERVICE}.{KEDA_NAMESPACE}.svc", f"DNS:{OPERATOR_SERVICE}.{KEDA_NAMESPACE}.svc.cluster.local",
        f"DNS:{ADAPTER_SERVICE}.{KEDA_NAMESPACE}.svc", f"DNS:{ADAPTER_SERVICE}.{KEDA_NAMESPACE}.svc.cluster.local",
        "DNS:localhost", "IP:127.0.0.1", f"IP:{realnode.GATEWAY}",
    ]  # fmt: skip
    sign(pki, "keda", "/CN=keda", f"subjectAltName={','.join(names)}\nextendedKeyUsage=serverAuth,clientAuth\n")
    certs = pki / "keda-certs"
    certs.mkdir(exist_ok=True)
    (certs / "ca.crt").write_bytes((pki / "ca.crt").read_bytes())
    (certs / "tls.crt").write_bytes((pki / "keda.crt").read_bytes())
    (certs / "tls.key").write_bytes((pki / "keda.key").read_bytes())
    return certs


class Autoscaling:
    """Starts Prometheus and KEDA for a LocalCluster with its real node. ``start_process``,
    ``wait`` and ``save`` are the LocalCluster's: they record each process, so that
    ``make cluster-down`` stops it, wait for a URL to answer, and record the cluster's state."""

    def __init__(self, state: Path, kubeconfig: Path, bins: Path, pki: Path, start_process, wait, save):
        self.state, self.kubeconfig, self.bins, self.pki = state / "autoscaling", kubeconfig, bins, pki
        self._start_process, self._wait, self._save = start_process, wait, save

    def available(self) -> str | None:
        """Why the engines cannot run here, or None."""
        missing = [n for n in ("prometheus", "keda", "keda-adapter") if not (self.bins / n).exists()]
        return f"not built: {missing} (cluster/build.sh builds them)" if missing else None

    def _with_service_names(self, pids: dict[str, int]) -> list[str]:
        """The command prefix that runs KEDA where Services' cluster DNS names resolve, as in a
        cluster: a mount namespace of its own with cluster/service_hosts.py's file over /etc/hosts.
        KEDA's external-push trigger reaches a model's holder by such a name. Needs root (a mount);
        without it, KEDA runs as it is and only that trigger cannot connect."""
        if os.geteuid() != 0 or not shutil.which("unshare"):
            return []
        hosts = self.state / "service-hosts"
        hosts.write_text(Path("/etc/hosts").read_text())
        self._start_process(
            "service-hosts",
            [sys.executable, str(Path(__file__).with_name("service_hosts.py")), "--kubeconfig", str(self.kubeconfig), "--out", str(hosts)],
            pids,
        )
        mount = 'mount --bind "$0" /etc/hosts && exec "$@"'
        return ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", mount, str(hosts)]

    def start(self, pids: dict[str, int], deadline: float, sign) -> None:
        self.state.mkdir(parents=True, exist_ok=True)
        kubeconfig = self.kubeconfig
        kubectl = [str(self.bins / "kubectl"), "--kubeconfig", str(kubeconfig)]
        prometheus = free_port("127.0.0.1")
        (self.state / "prometheus.yml").write_text(yaml.safe_dump(prometheus_config(kubeconfig), sort_keys=False))
        self._start_process(
            "prometheus",
            [
                str(self.bins / "prometheus"), "--config.file", str(self.state / "prometheus.yml"),
                "--storage.tsdb.path", str(self.state / "prometheus-data"),
                "--web.listen-address", f"127.0.0.1:{prometheus}", "--log.level", "warn",
            ],
            pids,
        )  # fmt: skip
        self._wait(f"http://127.0.0.1:{prometheus}/-/ready", deadline, "prometheus", pids)

        subprocess.run([*kubectl, "apply", "--server-side", "-f", str(self.bins / "keda-crds")], check=True, capture_output=True)
        subprocess.run([*kubectl, "create", "namespace", KEDA_NAMESPACE], check=False, capture_output=True)
        certs = make_keda_certs(self.pki, sign)
        grpc, probes, operator_metrics = free_port("127.0.0.1"), free_port("127.0.0.1"), free_port("127.0.0.1")
        env = {"WATCH_NAMESPACE": "", "KEDA_CLUSTER_OBJECT_NAMESPACE": KEDA_NAMESPACE, "KUBECONFIG": str(kubeconfig)}
        self._start_process(
            "keda",
            [
                *self._with_service_names(pids),
                str(self.bins / "keda"), "--cert-dir", str(certs), "--enable-cert-rotation=false",
                "--enable-webhook-patching=false", "--enable-apiservice-patching=false", "--leader-elect=false",
                "--metrics-service-bind-address", f"127.0.0.1:{grpc}", "--health-probe-bind-address", f"127.0.0.1:{probes}",
                "--metrics-bind-address", f"127.0.0.1:{operator_metrics}", "--zap-log-level", "info",
            ],
            pids,
            env,
        )  # fmt: skip
        self._wait(f"http://127.0.0.1:{probes}/readyz", deadline, "keda", pids)

        adapter, adapter_metrics = free_port(realnode.GATEWAY), free_port("127.0.0.1")
        self._start_process(
            "keda-adapter",
            [
                str(self.bins / "keda-adapter"), "--secure-port", str(adapter), "--bind-address", realnode.GATEWAY,
                "--cert-dir", str(certs), "--tls-cert-file", str(certs / "tls.crt"), "--tls-private-key-file", str(certs / "tls.key"),
                "--client-ca-file", str(certs / "ca.crt"),
                "--lister-kubeconfig", str(kubeconfig), "--authentication-kubeconfig", str(kubeconfig),
                "--authorization-kubeconfig", str(kubeconfig), "--port", str(adapter_metrics),
                "--metrics-service-address", f"127.0.0.1:{grpc}",
                "--metrics-service-grpc-authority", f"{OPERATOR_SERVICE}.{KEDA_NAMESPACE}.svc",
            ],
            pids,
            env,
        )  # fmt: skip
        ca = (certs / "ca.crt").read_bytes()
        registration = {
            "apiVersion": "v1",
            "kind": "List",
            "items": [
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": {"name": ADAPTER_SERVICE, "namespace": KEDA_NAMESPACE},
                    "spec": {"ports": [{"name": "https", "port": 443, "targetPort": adapter, "protocol": "TCP"}]},
                },
                {
                    "apiVersion": "discovery.k8s.io/v1",
                    "kind": "EndpointSlice",
                    "metadata": {
                        "name": f"{ADAPTER_SERVICE}-host",
                        "namespace": KEDA_NAMESPACE,
                        "labels": {"kubernetes.io/service-name": ADAPTER_SERVICE},
                    },
                    "addressType": "IPv4",
                    "ports": [{"name": "https", "port": adapter, "protocol": "TCP"}],
                    "endpoints": [{"addresses": [realnode.GATEWAY], "conditions": {"ready": True}}],
                },
                {
                    "apiVersion": "apiregistration.k8s.io/v1",
                    "kind": "APIService",
                    "metadata": {"name": APISERVICE},
                    "spec": {
                        "group": "external.metrics.k8s.io",
                        "version": "v1beta1",
                        "service": {"name": ADAPTER_SERVICE, "namespace": KEDA_NAMESPACE, "port": 443},
                        "caBundle": base64.b64encode(ca).decode(),
                        "groupPriorityMinimum": 100,
                        "versionPriority": 100,
                    },
                },
            ],
        }
        subprocess.run([*kubectl, "apply", "-f", "-"], input=json.dumps(registration), text=True, check=True, capture_output=True)
        while True:
            got = subprocess.run([*kubectl, "get", "apiservice", APISERVICE, "-o", "json"], capture_output=True, text=True)
            conds = json.loads(got.stdout).get("status", {}).get("conditions", []) if got.returncode == 0 else []
            if any(c["type"] == "Available" and c["status"] == "True" for c in conds):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the external metrics API never became available: {conds}; see logs/keda-adapter.log")
            time.sleep(0.5)
        self._save(prometheus=f"http://127.0.0.1:{prometheus}")
