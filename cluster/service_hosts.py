"""Cluster DNS names of Services, for the local cluster's processes that run on this machine.

In a cluster, CoreDNS answers ``<service>.<namespace>.svc`` (and ``.svc.cluster.local``) with
the Service's ClusterIP (Kubernetes, "DNS for Services and Pods",
https://kubernetes.io/docs/concepts/services-networking/dns-pod-service/#services). The local
cluster's CoreDNS answers the real node's pods on the bridge's address. KEDA runs here as
a process, whose look-ups follow this machine's own resolver, and an ``external-push`` trigger names its scaler by such a name, so this program
keeps a hosts file of those names, from a watch of every Service, and KEDA runs in a mount
namespace of its own with that file over /etc/hosts (cluster/autoscaling.py). The file is
rewritten in place (same inode), since a bind mount follows the inode, not the path.

    python cluster/service_hosts.py --kubeconfig K --out FILE
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from kubernetes import client, config, watch

HEADER = "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n"


def text(services: dict[tuple[str, str], str]) -> str:
    lines = [
        f"{ip} {name}.{ns}.svc {name}.{ns}.svc.cluster.local"
        for (ns, name), ip in sorted(services.items())
        if ip and ip != "None"  # headless Services have no address of their own
    ]
    return HEADER + "".join(line + "\n" for line in lines)


def write(out: Path, content: str) -> None:
    with open(out, "r+" if out.exists() else "w") as f:
        f.seek(0)
        f.write(content)
        f.truncate()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    config.load_kube_config(args.kubeconfig)
    api = client.CoreV1Api()
    while True:
        try:
            listed = api.list_service_for_all_namespaces()
            services = {(s.metadata.namespace, s.metadata.name): s.spec.cluster_ip for s in listed.items}
            write(args.out, text(services))
            for event in watch.Watch().stream(
                api.list_service_for_all_namespaces, resource_version=listed.metadata.resource_version, timeout_seconds=300
            ):
                s = event["object"]
                key = (s.metadata.namespace, s.metadata.name)
                if event["type"] == "DELETED":
                    services.pop(key, None)
                else:
                    services[key] = s.spec.cluster_ip
                write(args.out, text(services))
        except Exception as exc:  # noqa: BLE001 - the API server restarting (the fault tests): list again
            print(f"service_hosts: {type(exc).__name__}: {exc}; listing again", flush=True)
            time.sleep(1)


if __name__ == "__main__":
    main()
