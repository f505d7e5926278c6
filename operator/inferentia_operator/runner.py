"""`inferentia-operator run`: kopf, configured for this operator."""

from __future__ import annotations

import argparse
import functools
import logging
import random

import kopf

from . import controller
from .kube import Kube, load_client

FINALIZER = "inferentia.dev/finalizer"


def configure(settings: kopf.OperatorSettings, args: argparse.Namespace) -> None:
    # Our own names, not kopf's defaults. No handler needs a finalizer (children are
    # owned, so the garbage collector deletes them), but if one ever does, it is ours.
    settings.persistence.finalizer = FINALIZER
    # Handler progress and the last-handled spec live in status.kopf, not in
    # annotations on the user's object (which GitOps tools would show as drift).
    settings.persistence.progress_storage = kopf.StatusProgressStorage(field="status.kopf.progress")
    settings.persistence.diffbase_storage = kopf.StatusDiffBaseStorage(field="status.kopf.lastHandledConfiguration")
    settings.peering.name = args.peering
    settings.peering.priority = args.priority
    settings.peering.stealth = True  # keep-alives every minute would drown the log
    settings.posting.level = logging.WARNING  # kopf's own progress events; ours are posted explicitly
    settings.watching.server_timeout = 300
    # No watching of CRDs or listing of namespaces: the operator needs no cluster-wide
    # read access beyond its own resources. (A CRD installed after the operator started
    # is noticed on its next restart; the chart installs CRDs first.)
    settings.scanning.disabled = True
    settings.networking.error_backoffs = [1, 2, 5, 10, 30]


def peering_objects(name: str, namespaces: list[str]) -> list[dict]:
    """kopf peers through a ClusterKopfPeering when watching all namespaces, else a KopfPeering in each."""
    if not namespaces:
        return [{"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": name}}]
    return [
        {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": name, "namespace": ns}}
        for ns in namespaces
    ]


def run(args: argparse.Namespace) -> int:
    if args.priority is None:
        # kopf pauses every replica when two share a priority; distinct ones make the
        # highest live replica the active one and the others warm standbys.
        args.priority = random.SystemRandom().randint(1, 2**31 - 1)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    registry = kopf.OperatorRegistry()
    kube = functools.cache(lambda: Kube(load_client()))  # one API client for the whole operator
    controller.register(registry, kube, args.resync_seconds)

    @kopf.on.startup(registry=registry)
    def startup(settings: kopf.OperatorSettings, logger, **_):
        configure(settings, args)
        if not args.standalone:
            # Without its peering object kopf only logs "not found" at debug level and every
            # replica acts: make sure it exists (the chart and manifests also create it).
            for body in peering_objects(args.peering, args.namespace):
                if kube().create_if_missing(body):
                    logger.info("created %s %s", body["kind"], body["metadata"])

    @kopf.on.login(registry=registry)
    def login(**kwargs):
        # In a pod: the ServiceAccount token; elsewhere: the kubeconfig, as kubectl would.
        return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)

    kopf.run(
        registry=registry,
        standalone=args.standalone,
        peering_name=None if args.standalone else args.peering,
        priority=args.priority,
        liveness_endpoint=args.liveness or None,
        clusterwide=not args.namespace,
        namespaces=args.namespace,
    )
    return 0
