"""LeaderWorkerSet's controller (kubernetes-sigs/lws) beside the local control plane, as its
release runs it in a cluster: its CRD, its controller, and its webhooks.

A LeaderWorkerSet replica is a group of one leader pod and ``size - 1`` workers, created,
placed, restarted and scaled as one; underneath, a leader StatefulSet and one worker StatefulSet
per group. Its webhooks are part of the contract, not an extra: the pod webhook gives each pod
of a group its labels (``leaderworkerset.sigs.k8s.io/worker-index``, ``group-index``) and the
environment ``LWS_LEADER_ADDRESS``, ``LWS_GROUP_SIZE`` and ``LWS_WORKER_INDEX``
(api/leaderworkerset/v1/leaderworkerset_types.go).

Here the controller is a process on this machine, like KEDA (cluster/autoscaling.py): its
webhook server listens on loopback with a certificate from the cluster's CA, and the webhook
configurations (those of its release's config/webhook, with the release's objectSelector on
pods) name that address by URL instead of the in-cluster Service, with internal certificate
management off (its Configuration's internalCertManagement.enable: false).
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from ports import free_port

LWS_GROUP = "leaderworkerset.x-k8s.io"
POD_SELECTOR = {"matchExpressions": [{"key": "leaderworkerset.sigs.k8s.io/name", "operator": "Exists"}]}
NAMESPACE = "lws-system"


def webhook(name: str, path: str, url: str, ca: bytes, group: str, resource: str, operations: list[str]) -> dict[str, Any]:
    hook: dict[str, Any] = {
        "name": name,
        "admissionReviewVersions": ["v1"],
        "clientConfig": {"url": url + path, "caBundle": base64.b64encode(ca).decode()},
        "failurePolicy": "Fail",
        "sideEffects": "None",
        "rules": [{"apiGroups": [group], "apiVersions": ["v1"], "operations": operations, "resources": [resource]}],
    }
    if resource == "pods":  # only the pods of a LeaderWorkerSet (the release's webhook patches)
        hook["objectSelector"] = POD_SELECTOR
    return hook


def webhook_configurations(url: str, ca: bytes) -> list[dict[str, Any]]:
    """Its release's MutatingWebhookConfiguration and ValidatingWebhookConfiguration (config/webhook)."""
    lws = (LWS_GROUP, "leaderworkersets", ["CREATE", "UPDATE"])
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "lws-mutating-webhook-configuration"},
            "webhooks": [
                webhook("mleaderworkerset.kb.io", "/mutate-leaderworkerset-x-k8s-io-v1-leaderworkerset", url, ca, *lws),
                webhook("mpod.kb.io", "/mutate--v1-pod", url, ca, "", "pods", ["CREATE"]),
            ],
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "lws-validating-webhook-configuration"},
            "webhooks": [
                webhook("vleaderworkerset.kb.io", "/validate-leaderworkerset-x-k8s-io-v1-leaderworkerset", url, ca, *lws),
                webhook("vpod.kb.io", "/validate--v1-pod", url, ca, "", "pods", ["CREATE", "UPDATE"]),
            ],
        },
    ]  # fmt: skip


class LeaderWorkerSets:
    """Starts LWS's controller for a LocalCluster. ``start_process``, ``wait`` and ``save`` are
    the LocalCluster's, so that ``make cluster-down`` stops it like every other component."""

    def __init__(self, state: Path, kubeconfig: Path, bins: Path, pki: Path, start_process, wait, save):
        self.state, self.kubeconfig, self.bins, self.pki = state / "lws", kubeconfig, bins, pki
        self._start_process, self._wait, self._save = start_process, wait, save

    def available(self) -> str | None:
        missing = [n for n in ("lws-controller", "lws-crds") if not (self.bins / n).exists()]
        return f"not built: {missing} (cluster/build.sh builds them)" if missing else None

    def start(self, pids: dict[str, int], deadline: float, sign) -> None:
        self.state.mkdir(parents=True, exist_ok=True)
        kubectl = [str(self.bins / "kubectl"), "--kubeconfig", str(self.kubeconfig)]
        subprocess.run([*kubectl, "apply", "--server-side", "-f", str(self.bins / "lws-crds")], check=True, capture_output=True)
        subprocess.run([*kubectl, "create", "namespace", NAMESPACE], check=False, capture_output=True)
        sign(self.pki, "lws-webhook", "/CN=lws-webhook", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
        certs = self.state / "certs"
        certs.mkdir(exist_ok=True)
        (certs / "tls.crt").write_bytes((self.pki / "lws-webhook.crt").read_bytes())
        (certs / "tls.key").write_bytes((self.pki / "lws-webhook.key").read_bytes())
        port, probes, metrics = free_port("127.0.0.1"), free_port("127.0.0.1"), free_port("127.0.0.1")
        config = {
            "apiVersion": "config.lws.x-k8s.io/v1alpha1",
            "kind": "Configuration",
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "webhook": {"host": "127.0.0.1", "port": port, "certDir": str(certs)},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{probes}"},
            "metrics": {"bindAddress": f"127.0.0.1:{metrics}"},
        }
        (self.state / "config.yaml").write_text(yaml.safe_dump(config))
        env = {"KUBECONFIG": str(self.kubeconfig)}
        self._start_process("lws-controller", [str(self.bins / "lws-controller"), "--config", str(self.state / "config.yaml")], pids, env)
        self._wait(f"http://127.0.0.1:{probes}/readyz", deadline, "lws-controller", pids)
        ca = (self.pki / "ca.crt").read_bytes()
        hooks = {"apiVersion": "v1", "kind": "List", "items": webhook_configurations(f"https://127.0.0.1:{port}", ca)}
        subprocess.run([*kubectl, "apply", "-f", "-"], input=json.dumps(hooks), text=True, check=True, capture_output=True)
        # The webhooks answer once the API server has them: a dry-run create of an empty group goes through them.
        probe = {
            "apiVersion": f"{LWS_GROUP}/v1", "kind": "LeaderWorkerSet", "metadata": {"name": "probe", "namespace": "default"},
            "spec": {"leaderWorkerTemplate": {"size": 1, "workerTemplate": {"spec": {"containers": [{"name": "c", "image": "x"}]}}}},
        }  # fmt: skip
        while True:
            tried = subprocess.run(
                [*kubectl, "create", "--dry-run=server", "-f", "-"], input=json.dumps(probe), text=True, capture_output=True
            )
            if tried.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"LeaderWorkerSet's webhooks never answered: {tried.stderr}; see logs/lws-controller.log")
            time.sleep(0.5)
        self._save(leaderworkerset=True)
