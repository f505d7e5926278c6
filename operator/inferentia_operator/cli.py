"""The inferentia-operator command: validate and plan manifests offline, print the CRD, run the operator."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from .batching.limits import DEFAULT_LIMITS, MIB, PEER_SHARE, Limits
from .core.api import InferentiaModelSpec, Plan
from .core.autoscaling import Prometheus, target_in_flight
from .core.catalogue import FAMILIES, GIB
from .core.cores import device_memory_per_process
from .core.crd import crd_yaml
from .core.decide import rendered
from .core.names import ALLOCATIONS, DEFAULT_EPP_IMAGE, DEFAULT_OPERATOR_IMAGE, DEVICE_PLUGIN
from .core.pod.model import plan_document
from .core.rules.identity import check_namespace
from .core.settings import DEFAULT_SETTINGS, Settings
from .manifests import Loaded, ModelDocument, load_models

EXIT_OK, EXIT_INVALID, EXIT_UNREADABLE = 0, 1, 2
EXIT_USAGE = 2  # argparse's own, for flags that do not go together


def _report(doc: ModelDocument, out: Any) -> None:
    if doc.valid:
        print(f"{doc.key}: ok", file=out)
    for finding in doc.findings:
        print(f"{doc.key}: {finding}", file=out)


def _load(paths: list[str], allocation: str = DEVICE_PLUGIN, scheduler_name: str = "") -> Loaded:
    loaded = load_models(paths, allocation, scheduler_name)
    for note in loaded.skipped:
        print(f"note: {note}", file=sys.stderr)
    for problem in loaded.problems:
        print(f"error: {problem}", file=sys.stderr)
    if not loaded.models and not loaded.problems:
        print(f"no InferentiaModel found in {', '.join(paths) or '<stdin>'}", file=sys.stderr)
    return loaded


def _exit_code(loaded: Loaded) -> int:
    if loaded.problems:
        return EXIT_UNREADABLE
    return EXIT_OK if all(d.valid for d in loaded.models) else EXIT_INVALID


def cmd_validate(args: argparse.Namespace) -> int:
    loaded = _load(args.paths, args.allocation, args.scheduler_name)
    for doc in loaded.models:
        _report(doc, sys.stdout)
    return _exit_code(loaded)


def plan_record(doc: ModelDocument) -> dict[str, Any]:
    assert doc.model is not None
    spec = doc.model.spec
    scaling = spec.autoscaling
    replicas: dict[str, Any] = {"replicas": spec.replicas}
    if scaling is not None:
        # The range and the target the ScaledObject carries (docs/autoscaling.md).
        replicas = {
            "autoscaling": {
                "minReplicas": scaling.min_replicas, "maxReplicas": scaling.max_replicas,
                "targetInFlight": target_in_flight(spec),
            }
        }  # fmt: skip
    plan = doc.model.plan
    memory = device_memory_per_process(spec, FAMILIES[plan.family], plan.group_size)
    return {"name": doc.name, "namespace": doc.namespace, **replicas, **plan_document(plan), "deviceMemoryPerProcess": memory}


def _device_memory(record: dict[str, Any]) -> str:
    """What a process's model needs of device memory against what its cores hold, in GiB
    ("?" where the weights are unknown; inf1: what its cores hold)."""
    memory = record["deviceMemoryPerProcess"]
    has = f"{memory['availableBytes'] / GIB:.4g}GiB"
    if "neededBytes" not in memory:
        return has
    needed = memory["neededBytes"]
    return ("?" if needed is None else f"{needed / GIB:.3g}") + "/" + has


def _replicas(record: dict[str, Any]) -> str:
    """A fixed count, or the autoscaling range."""
    scaling = record.get("autoscaling")
    return f"{scaling['minReplicas']}-{scaling['maxReplicas']}" if scaling else str(record["replicas"])


def _instance_types(record: dict[str, Any]) -> str:
    """The types that hold a replica; for replicas that share a chip, with how many one instance holds."""
    per = record.get("replicasPerInstance") or {}
    return ",".join(f"{t}({per[t]})" if t in per else t for t in record["instanceTypes"])


def _table(records: list[dict[str, Any]]) -> str:
    columns: list[tuple[str, Callable[[dict[str, Any]], Any]]] = [
        ("NAMESPACE", lambda r: r["namespace"]),
        ("NAME", lambda r: r["name"]),
        ("REPLICAS", _replicas),
        ("FAMILY", lambda r: r["family"]),
        ("COMPILER", lambda r: r["compiler"]),
        ("CHIPS", lambda r: r.get("chips", "shared")),
        # A replica across nodes: CHIPS, CORES and the groups are each node's, and TP spans them all.
        ("NODES", lambda r: r.get("nodes", 1)),
        ("LNC", lambda r: r.get("lnc", "-")),
        ("CORES", lambda r: r["totalCores"]),
        ("GROUPS", lambda r: r["groups"]),
        ("NCG", lambda r: r["groupSize"]),
        # Data parallel over tensor parallel: independent processes (vLLM's DP ranks), each one
        # model sharded over its group's cores (its VISIBLE-CORES range).
        ("DPxTP", lambda r: f"{r['groups']}x{r['tensorParallelSize']}" if r.get("tensorParallelSize") else "-"),
        ("VISIBLE-CORES", lambda r: ",".join(r["visibleCores"])),
        ("DEVICE-MEMORY", _device_memory),
        # vLLM on trn2 and trn3: the plugin's KV cache blocks and their tokens (status.plan.kvCache).
        ("KV-BLOCKS", lambda r: f"{r['kvCache']['blocks']}x{r['kvCache']['blockSize']}" if r.get("kvCache") else "-"),
        ("STATIC-WEIGHTS", lambda r: str(r["staticWeights"]).lower()),
        ("INSTANCE-TYPES", _instance_types),
    ]
    rows = [[h for h, _ in columns]] + [[str(get(r)) for _, get in columns] for r in records]
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows)


def cmd_plan(args: argparse.Namespace) -> int:
    loaded = _load(args.paths, args.allocation, args.scheduler_name)
    records = []
    for doc in loaded.models:
        if doc.valid:
            records.append(plan_record(doc))
        else:
            for finding in doc.findings:
                print(f"{doc.key}: {finding}", file=sys.stderr)
    if args.output == "json":
        print(json.dumps(records, indent=2))
    elif args.output == "yaml":
        print(yaml.safe_dump(records, sort_keys=False), end="")
    elif args.output == "wait-timeout":
        # The longest of the models, for one `kubectl wait` over all of them.
        waits = [ready_within_seconds(doc.model.spec, doc.model.plan) for doc in loaded.models if doc.model is not None and doc.valid]
        if waits:
            print(f"{max(waits)}s")
    elif records:
        print(_table(records))
    return _exit_code(loaded)


def ready_within_seconds(spec: InferentiaModelSpec, plan: Plan) -> int:
    """How long a model may take to become Ready by its own budgets: the compile Job's deadline
    (compile.timeoutSeconds) when it compiles ahead, then a serving pod's start-up budget
    (status.plan.sizes.startupSeconds), which includes a compile at start."""
    return (spec.compile.timeout_seconds if spec.compile.image else 0) + plan.sizes.startup_seconds


# render has no cluster to ask for the model's uid; the owner references carry this one.
PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000"


def rendered_objects(doc: ModelDocument, settings: Settings = DEFAULT_SETTINGS) -> list[dict[str, Any]]:
    """Every object the operator would create for a valid model: the same parts a reconcile
    decides with (each core/<feature>/part.py), with nothing observed."""
    assert doc.model is not None
    return rendered(replace(doc.model, uid=PLACEHOLDER_UID, operator_image=settings.operator_image), settings)


class _ReviewDumper(yaml.SafeDumper):
    """Multi-line strings (plan.json, env files, launch.sh) as literal blocks, readable in a diff;
    a value the builders share between fields (a probe's httpGet) printed in full each time,
    never as a YAML anchor and alias, which a reviewer would have to resolve by hand."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


_ReviewDumper.add_representer(
    str,
    lambda dumper, text: dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None),
)


def cmd_render(args: argparse.Namespace) -> int:
    loaded = _load(args.paths, args.allocation, args.scheduler_name)
    objects = []
    settings = settings_from(args)
    for doc in loaded.models:
        if doc.valid:
            objects += rendered_objects(doc, settings)
            if doc.spec is not None and doc.spec.autoscaling is not None and not settings.prometheus.address:
                print(f"note: {doc.key}: no ScaledObject without --prometheus-address, as the operator would run it", file=sys.stderr)
        else:
            for finding in doc.findings:
                print(f"{doc.key}: {finding}", file=sys.stderr)
    if args.output == "json":
        print(json.dumps(objects, indent=2))
    elif objects:
        print(yaml.dump_all(objects, Dumper=_ReviewDumper, sort_keys=False), end="")
    return _exit_code(loaded)


def cmd_crd(args: argparse.Namespace) -> int:
    print(crd_yaml(), end="")
    return EXIT_OK


def cmd_batch(args: argparse.Namespace) -> int:
    from .batching.frontend import serve  # aiohttp loads only for this command

    limits = _limits(args, "batch")
    if limits is None:
        return EXIT_USAGE
    backends = [f"http://127.0.0.1:{args.process_base_port + i}" for i in range(args.processes)]
    buckets = json.loads(args.buckets) if args.buckets else None
    serve(args.port, backends, args.max_batch_size, args.max_latency_ms / 1000, buckets, limits, args.host)
    return EXIT_OK


def _limits(args: argparse.Namespace, command: str) -> Limits | None:
    """The limits the flags set, or None (the reason printed) when one address's share is not
    one: more than all addresses may hold. (A budget share below the largest body is one: an
    address holding nothing else may still send that body, Budget.resize.)"""
    limits = Limits(
        header_timeout=args.header_timeout_s,
        body_timeout=args.body_timeout_s,
        max_connections=args.max_connections,
        max_body=int(args.max_body_mib * MIB),
        body_budget=int(args.body_budget_mib * MIB),
        process_timeout=args.process_timeout_s,
        max_peer_connections=args.max_peer_connections or 0,
        # At least a byte: 0 would mean the default.
        peer_budget=max(1, int(args.peer_body_budget_mib * MIB)) if args.peer_body_budget_mib else 0,
    )
    wrong = []
    if limits.max_peer_connections > limits.max_connections:
        wrong.append(f"--max-peer-connections {limits.max_peer_connections} is more than --max-connections {limits.max_connections}")
    if limits.peer_budget > limits.body_budget:
        wrong.append(f"--peer-body-budget-mib {args.peer_body_budget_mib:g} is more than --body-budget-mib {args.body_budget_mib:g}")
    for why in wrong:
        print(f"{command}: {why}", file=sys.stderr)
    return None if wrong else limits


def _port_pairs(value: str) -> list[tuple[int, int]]:
    """ "8080,8081" or "18080:8080": (listen, upstream) port pairs."""
    pairs = []
    for item in value.split(","):
        listen, _, upstream = item.partition(":")
        pairs.append((int(listen), int(upstream or listen)))
    return pairs


def cmd_node_plugin(args: argparse.Namespace) -> int:
    from .batching.node_plugin import prepare, serve  # grpc loads only for this command

    pins = Path(args.pins_dir) if args.pins_dir else Path(args.dir) / "pins"
    if args.prepare:
        uid, _, gid = args.prepare.partition(":")
        if not (uid.isdigit() and gid.isdigit()):
            print(f"node-plugin: --prepare {args.prepare!r}: valid values look like 65532:65532 (UID:GID)", file=sys.stderr)
            return EXIT_INVALID
        prepare(Path(args.dir), pins, (int(uid), int(gid)))
        return EXIT_OK
    serve(Path(args.dir), Path(args.kubelet_dir), args.node_name, pins)
    return EXIT_OK


def cmd_node_cache(args: argparse.Namespace) -> int:
    from .batching.node_cache import serve  # aiohttp loads only for this command

    serve(
        Path(args.dir),
        args.max_bytes,
        args.port,
        args.host,
        node=args.node_name,
        body_timeout=args.body_timeout_s,
        fill_lease=args.fill_lease_s,
        pins=Path(args.pins_dir) if args.pins_dir else None,
    )
    return EXIT_OK


def cmd_hold(args: argparse.Namespace) -> int:
    from .batching.holder import serve, upstream_host  # aiohttp loads only for this command

    limits = _limits(args, "hold")
    if limits is None:
        return EXIT_USAGE
    upstream = args.upstream or upstream_host(args.upstream_service, os.environ)
    serve(upstream, args.ports, args.hold_seconds, args.max_held, limits, args.host, args.scaler_port, args.target)
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    from .shell.runner import RunOptions, run  # kopf and the API client (shell/transport.py) load only for this command

    options = RunOptions(
        namespaces=tuple(args.namespace), liveness=args.liveness, peering=args.peering, standalone=args.standalone,
        priority=args.priority, resync_seconds=args.resync_seconds, workers=args.workers, metrics_port=args.metrics_port,
        key_secret=args.key_secret, key_namespace=args.key_namespace, verbose=args.verbose, node_faults=args.node_faults,
    )  # fmt: skip
    return run(options, settings_from(args))


def _limit_arguments(p: argparse.ArgumentParser) -> None:
    """What a client can cost (batching.limits.Limits says why each default is what it is)."""
    d = DEFAULT_LIMITS
    p.add_argument(
        "--header-timeout-s",
        type=float,
        default=d.header_timeout,
        help="headers must be in this long after a connection opens or its last answer",
    )
    p.add_argument("--body-timeout-s", type=float, default=d.body_timeout, help="a body not read in this long gets 408")
    p.add_argument("--max-connections", type=int, default=d.max_connections, help="open connections; more are answered 503 and closed")
    p.add_argument("--max-body-mib", type=float, default=d.max_body / MIB, help="one request's body: 413 above it")
    p.add_argument("--body-budget-mib", type=float, default=d.body_budget / MIB, help="bodies held at once; more are answered 503")
    p.add_argument(
        "--process-timeout-s", type=float, default=d.process_timeout,
        help="one call to a model process or replica, from sending to its answer (the holder: to its next byte)",
    )  # fmt: skip
    # Unset: a share of the caps above (batching.limits.PEER_SHARE), derived from them as given.
    p.add_argument(
        "--max-peer-connections", type=_above_zero(int), metavar="N",
        help=f"open connections from one client address; more are answered 503 and closed (default: --max-connections / "
        f"{PEER_SHARE}, {d.max_peer_connections})",
    )  # fmt: skip
    p.add_argument(
        "--peer-body-budget-mib", type=_above_zero(float), metavar="MIB",
        help=f"bodies one client address holds at once; more are answered 503 (default: --body-budget-mib / {PEER_SHARE}, "
        f"at least --max-body-mib, {d.peer_budget / MIB:g})",
    )  # fmt: skip


def _above_zero(kind: Callable[[str], int | float]) -> Callable[[str], int | float]:
    """An argparse type: a finite number of ``kind`` above 0 (else exit 2 with why)."""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"{text!r}: valid values are finite numbers above 0")
        return value

    return parse


def namespace_name(value: str) -> str:
    """A namespace flag's value, checked as validate checks metadata.namespace: a wrong one stops
    the operator at its start rather than failing each model's NetworkPolicy at the API server."""
    refused = check_namespace(value) if value else []
    if refused:
        raise argparse.ArgumentTypeError(refused[0].message)
    return value


def _prometheus_arguments(p: argparse.ArgumentParser) -> None:
    """Where the ScaledObjects of autoscaled models read in-flight requests from, and the
    serving pods' scheduler: the settings of the children `run` writes and `render` prints."""
    _scheduler_argument(p)
    p.add_argument(
        "--node-cache-url", default="", metavar="URL",
        help="the node-local artefact cache the serving pods' fetch asks first, e.g. "
        "http://inferentia-operator-node-cache.inferentia-system.svc:8080 (chart nodeCache.enabled; default: none)",
    )  # fmt: skip
    p.add_argument(
        "--node-views", action="store_true",
        help="the node plugin runs beside the node cache (chart nodeCache.views.enabled): serving pods mount the cache's views of "
        "what they fetch, read-only, and link to them instead of copying (with --node-cache-url)",
    )  # fmt: skip
    p.add_argument(
        "--node-cache-namespace", default=os.environ.get("POD_NAMESPACE", ""), metavar="NAMESPACE",
        help="where the node cache's pods run, each labelled with the artefacts it holds: serving pods prefer (never require) "
        "a node whose cache holds theirs (default: $POD_NAMESPACE, the operator's own; none without --node-cache-url)",
    )  # fmt: skip
    p.add_argument(
        "--endpoint-picker-image", default=DEFAULT_EPP_IMAGE, metavar="IMAGE",
        help="the Gateway API Inference Extension's endpoint picker, run for models with spec.routing.inferencePool "
        f"(default: {DEFAULT_EPP_IMAGE})",
    )  # fmt: skip
    p.add_argument(
        "--endpoint-picker-role", default=Settings.endpoint_picker_role, metavar="CLUSTERROLE",
        help="the ClusterRole each endpoint picker's RoleBinding grants (the chart's <release>-endpoint-picker: reads of pods and "
        "InferencePools); the one role the operator may bind",
    )  # fmt: skip
    d = Prometheus()
    p.add_argument(
        "--prometheus-address", default=d.address,
        help="Prometheus's URL for the ScaledObjects of models with spec.autoscaling, e.g. http://prometheus.monitoring:9090 "
        "(default: none; such models run at minReplicas)",
    )  # fmt: skip
    p.add_argument("--prometheus-namespace-label", default=d.namespace_label, help="the label Prometheus gives a pod's namespace")
    p.add_argument(
        "--prometheus-model-label", default=d.model_label,
        help="the label Prometheus gives a pod's inferentia.dev/model label",
    )  # fmt: skip
    p.add_argument(
        "--prometheus-pool-label", default=d.pool_label,
        help="the label Prometheus gives a pod's inferentia.dev/pool label (the prefill or decode pool it serves in)",
    )  # fmt: skip
    p.add_argument(
        "--prometheus-authentication", default=d.authentication, metavar="NAME",
        help="the KEDA TriggerAuthentication (in each model's namespace) or ClusterTriggerAuthentication the ScaledObjects' "
        "trigger uses, for a Prometheus that wants credentials (default: none)",
    )  # fmt: skip
    p.add_argument(
        "--prometheus-authentication-kind", default=d.authentication_kind, choices=["TriggerAuthentication", "ClusterTriggerAuthentication"],
        help="the kind of --prometheus-authentication",
    )  # fmt: skip
    p.add_argument(
        "--prometheus-aws-region", default=d.aws_region, metavar="REGION",
        help="Amazon Managed Prometheus: the region KEDA signs its queries for (SigV4), with an aws podIdentity authentication",
    )  # fmt: skip
    p.add_argument(
        "--no-push-activation", dest="push_activation", action="store_false",
        help="leave out the external-push trigger through which a scaled-to-zero model's holder tells KEDA of a held "
        "request at once (for clusters where KEDA cannot reach the holder's port 50051); KEDA then sees it at its next poll",
    )  # fmt: skip
    p.add_argument(
        "--keda-namespace", default="", metavar="NAMESPACE", type=namespace_name,
        help="where KEDA runs: each holder gets a NetworkPolicy letting only that namespace reach its external scaler "
        "(default: none, no policy)",
    )  # fmt: skip
    p.add_argument(
        "--prometheus-namespace", default="", metavar="NAMESPACE", type=namespace_name,
        help="where the Prometheus that scrapes the models' pods runs: a disaggregated model's prefill and decode pools admit "
        "this namespace to their port, which otherwise only the model's proxy reaches (default: none)",
    )  # fmt: skip


def settings_from(args: argparse.Namespace) -> Settings:
    """The settings the decision reads, from the flags `run` and `render` share; built once."""
    prometheus = Prometheus(
        args.prometheus_address, args.prometheus_namespace_label, args.prometheus_model_label,
        args.prometheus_authentication, args.prometheus_authentication_kind, args.prometheus_aws_region,
        pool_label=args.prometheus_pool_label,
    )  # fmt: skip
    return Settings(
        operator_image=args.operator_image, prometheus=prometheus, allocation=args.allocation, scheduler_name=args.scheduler_name,
        push_activation=args.push_activation, keda_namespace=args.keda_namespace, node_cache_url=args.node_cache_url,
        node_cache_namespace=args.node_cache_namespace if args.node_cache_url else "", node_views=args.node_views,
        endpoint_picker_image=args.endpoint_picker_image, endpoint_picker_role=args.endpoint_picker_role,
        prometheus_namespace=args.prometheus_namespace,
    )  # fmt: skip


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="inferentia-operator",
        description="Serve ML models on AWS Inferentia and Trainium: validate and plan InferentiaModels, or run the operator.",
    )
    sub = top.add_subparsers(dest="command", required=True)

    v = sub.add_parser("validate", help="check InferentiaModel manifests (files, directories, - for stdin)")
    v.add_argument("paths", nargs="*", metavar="PATH", help="YAML or JSON files, directories, or - (default: stdin)")
    _allocation_argument(v)
    _scheduler_argument(v)
    v.set_defaults(func=cmd_validate)

    p = sub.add_parser("plan", help="print the NeuronCore plan of each InferentiaModel")
    p.add_argument("paths", nargs="*", metavar="PATH")
    _allocation_argument(p)
    _scheduler_argument(p)
    p.add_argument(
        "-o", "--output", choices=["table", "json", "yaml", "wait-timeout"], default="table",
        help="wait-timeout: how long the models may take to become Ready by their own budgets (the longest), as kubectl "
        "wait's --timeout takes it",
    )  # fmt: skip
    p.set_defaults(func=cmd_plan)

    r = sub.add_parser(
        "render",
        help="print every object the operator would create for each InferentiaModel (plan ConfigMap, compile Job, Deployment, "
        "Services, ScaledObject, scale-to-zero holder)",
    )
    r.add_argument("paths", nargs="*", metavar="PATH")
    r.add_argument("-o", "--output", choices=["yaml", "json"], default="yaml")
    _allocation_argument(r)
    r.add_argument(
        "--operator-image",
        default=DEFAULT_OPERATOR_IMAGE,
        help=f"the operator's own image, as the operator's --operator-image names it (default {DEFAULT_OPERATOR_IMAGE})",
    )
    _prometheus_arguments(r)
    r.set_defaults(func=cmd_render)

    c = sub.add_parser("crd", help="print the InferentiaModel CustomResourceDefinition")
    c.set_defaults(func=cmd_crd)

    b = sub.add_parser("batch", help="run the batching front end of a serving pod (the operator adds it as a sidecar)")
    b.add_argument("--port", type=int, required=True, help="port the front end listens on (the model's serving port)")
    # Every address of the pod by default: the Service reaches the pod's address.
    b.add_argument("--host", default="0.0.0.0", help="address to listen on")
    b.add_argument("--processes", type=int, required=True, help="model processes, on ports process-base-port + i")
    b.add_argument("--process-base-port", type=int, required=True)
    b.add_argument("--max-batch-size", type=int, required=True)
    b.add_argument("--max-latency-ms", type=float, required=True)
    b.add_argument("--buckets", help="input-shape buckets as JSON, e.g. [[64],[128]]: inputs are padded to the smallest that holds them")
    _limit_arguments(b)
    b.set_defaults(func=cmd_batch)

    h = sub.add_parser(
        "hold", help="hold a scaled-to-zero model's requests until a replica answers, then forward them (the <model>-holder pod)"
    )
    to = h.add_mutually_exclusive_group(required=True)
    to.add_argument("--upstream", help="the host that reaches the model's replicas")
    to.add_argument(
        "--upstream-service", help="the Service that reaches the model's replicas (its <model>-replicas Service), in the pod's namespace"
    )
    h.add_argument(
        "--ports", type=_port_pairs, required=True,
        help="the Service's ports, each forwarded to the same port upstream (8080,8081) or to another (18080:8080)",
    )  # fmt: skip
    h.add_argument("--host", default="0.0.0.0", help="address to listen on")
    h.add_argument("--hold-seconds", type=float, default=300.0, help="a request no replica answered within this long gets 503")
    h.add_argument("--max-held", type=int, default=1024, help="requests held at once; more are answered 503")
    h.add_argument(
        "--scaler-port", type=int,
        help="serve KEDA's external scaler API (externalscaler.ExternalScaler) on this port: the model's ScaledObject "
        "learns of a held request at once (its external-push trigger)",
    )  # fmt: skip
    h.add_argument("--target", type=int, default=1, help="held requests a replica is for (the external scaler's metric target)")
    _limit_arguments(h)
    h.set_defaults(func=cmd_hold)

    nc = sub.add_parser(
        "node-cache", help="keep compiled artefacts' files by SHA-256 for the pods of this node (a DaemonSet; fetch reads through it)"
    )
    nc.add_argument(
        "--dir", required=True, help="where the files are kept (the pod's emptyDir, or a directory of the node's disk with views)"
    )
    nc.add_argument("--max-bytes", type=int, required=True, help="the cache's size; the least recently used files go first")
    nc.add_argument("--port", type=int, default=8080)
    nc.add_argument("--host", default="0.0.0.0", help="address to listen on")
    nc.add_argument(
        "--node-name", default=os.environ.get("NODE_NAME", ""), metavar="NODE",
        help="answer only pods of this node, each showing its projected token (a TokenReview says whose); "
        "default: $NODE_NAME, the chart's; without it, any caller",
    )  # fmt: skip
    nc.add_argument(
        "--body-timeout-s",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="seconds an offer's body may send nothing before it is refused",
    )
    nc.add_argument(
        "--fill-lease-s", type=float, default=30.0, metavar="SECONDS",
        help="seconds a replica filling a file from the store holds it (others wait) unless it renews",
    )  # fmt: skip
    nc.add_argument(
        "--pins-dir", default="", help="where the node plugin pins the views pods have mounted, read only (default: the cache's pins/)"
    )
    nc.set_defaults(func=cmd_node_cache)

    npl = sub.add_parser(
        "node-plugin", help="mount the node cache's views read-only into the pods of this node (a CSI node plugin, beside the cache)"
    )
    npl.add_argument("--dir", required=True, help="the node cache's directory (its --dir), which both containers mount")
    npl.add_argument("--kubelet-dir", default="/var/lib/kubelet", help="the kubelet's root directory (its --root-dir)")
    npl.add_argument("--node-name", default=os.environ.get("NODE_NAME", ""), metavar="NODE", help="this node (default: $NODE_NAME)")
    npl.add_argument("--pins-dir", default="", help="where it pins the views pods have mounted (default: the store's pins/)")
    npl.add_argument(
        "--prepare", metavar="UID:GID", default="",
        help="make the store (owned by UID:GID, the cache's user) and the pins directory, then exit (the chart's init container)",
    )  # fmt: skip
    npl.set_defaults(func=cmd_node_plugin)

    f = sub.add_parser("fetch", help="copy a compiled artefact (or, with --model, a model) into a pod (an init container)")
    f.add_argument(
        "--from", dest="uri", required=True, help="the artefact's s3:// URI (status.compiledUri); with --model, s3:// or https://"
    )
    f.add_argument("--to", dest="destination", required=True, help="the local directory to fill")
    f.add_argument("--model", action="store_true", help="an uncompiled model: no completion marker is expected")
    f.add_argument(
        "--fill",
        action="store_true",
        help="fill the node's cache ahead of a replica (the operator's fill Jobs); --to is scratch, emptied after",
    )
    f.set_defaults(func=cmd_fetch)

    u = sub.add_parser("upload", help="upload a compiled artefact, completion marker last (the compile Job's last container)")
    u.add_argument("--from", dest="source", required=True, help="the directory the compile step wrote")
    u.add_argument("--to", dest="uri", required=True, help="the artefact's s3:// URI (status.compiledUri)")
    u.set_defaults(func=cmd_upload)

    ix = sub.add_parser(
        "index",
        help="write a completion marker for a model already in S3 (each file hashed in place), so replicas read it through the node cache",
    )
    ix.add_argument("--at", dest="uri", required=True, help="the model's s3:// prefix (spec.model.uri)")
    ix.set_defaults(func=cmd_index)

    r = sub.add_parser("run", help="run the operator against the current kubeconfig or in-cluster config")
    r.add_argument("-n", "--namespace", action="append", default=[], help="watch this namespace (repeatable); default: all")
    r.add_argument("--liveness", default="http://0.0.0.0:8080/healthz", help="liveness endpoint URL ('' to disable)")
    r.add_argument("--peering", default="inferentia-operator", help="peering name: replicas with the same name elect one active")
    r.add_argument("--standalone", action="store_true", help="no peering: act even if another replica is running")
    r.add_argument(
        "--no-node-faults", dest="node_faults", action="store_false",
        help="watch no Node: a model's status then names no pod whose node reports a Neuron hardware fault "
        "(for an install with no right to list and watch nodes)",
    )  # fmt: skip
    r.add_argument(
        "--priority", type=int, default=None,
        help="peering priority: the live replica with the highest acts, the others stand by (default: the millisecond it "
        "starts, so that a replacement outranks a replica that died without stopping)",
    )  # fmt: skip
    r.add_argument("--resync-seconds", type=float, default=300.0, help="seconds between resyncs of every model against the caches")
    r.add_argument(
        "--workers", type=int, default=16,
        help="reconciles in flight at once (default 16: each spends most of its time waiting for the API server's answers)",
    )  # fmt: skip
    r.add_argument("--metrics-port", type=int, default=8081, help="port of the Prometheus /metrics endpoint (0 to disable)")
    r.add_argument(
        "--operator-image", "--batching-image", dest="operator_image", default=DEFAULT_OPERATOR_IMAGE,
        help="this operator's own image, which compile and serving pods run to fetch and upload artefacts and for the "
        "batching front end (--batching-image is its former name)",
    )  # fmt: skip
    _prometheus_arguments(r)
    _allocation_argument(r)
    r.add_argument(
        "--key-secret", default="inferentia-operator-proof-key",
        help="the Secret holding the key that proves which compile records and Jobs the operator made (created if missing)",
    )  # fmt: skip
    r.add_argument(
        "--key-namespace", default=os.environ.get("POD_NAMESPACE") or "default",
        help="the key Secret's namespace: the operator's own, which model users cannot read (default: $POD_NAMESPACE, else default)",
    )  # fmt: skip
    r.add_argument("--verbose", action="store_true")
    r.set_defaults(func=cmd_run)
    return top


def cmd_fetch(args: argparse.Namespace) -> int:
    from .fetch import main as fetch_main

    return fetch_main(args.uri, args.destination, model=args.model, fill_only=args.fill)


def cmd_index(args: argparse.Namespace) -> int:
    from .fetch import index_main

    return index_main(args.uri)


def cmd_upload(args: argparse.Namespace) -> int:
    from .fetch import upload_main

    return upload_main(args.source, args.uri)


def _scheduler_argument(p: argparse.ArgumentParser) -> None:
    """One flag for run, render, validate and plan: the scheduler the serving pods name."""
    p.add_argument(
        "--scheduler-name", default="", metavar="NAME",
        help="the scheduler of serving pods that take devices from the Neuron device plugin: my-scheduler on EKS, where AWS's "
        "Neuron scheduler extension runs beside a second scheduler (default: the cluster's default scheduler; validate and "
        "plan then warn of a pod that takes more than one Neuron device or core)",
    )  # fmt: skip


def _allocation_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--allocation", choices=ALLOCATIONS, default=DEVICE_PLUGIN,
        help="how replicas get Neuron devices where a model's spec.compute.allocation does not say: the Neuron device plugin "
        "or AWS's Neuron DRA driver (default %(default)s; the operator's own --allocation)",
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            # A name or message may hold any character; a terminal that cannot show it
            # gets an escape, not a UnicodeEncodeError.
            stream.reconfigure(errors="backslashreplace")
    args = parser().parse_args(argv)
    try:
        code: int = args.func(args)
        return code
    except BrokenPipeError:
        return EXIT_OK
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
