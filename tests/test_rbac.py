"""The chart's RBAC allows every request the actor can send, and the actor's verbs are read
from the actor itself: it runs every path of a reconcile's writes (create, create refused and
then applied, the compile Job's proof, the record, deletes) against a client that records each
request it would send, as (resource, verb). The chart's rules are read from its template."""

from __future__ import annotations

import asyncio
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from inferentia_operator.core.autoscaling import Prometheus
from inferentia_operator.core.compile.job import compile_job, compile_record
from inferentia_operator.core.compile.part import JOB_POLICY
from inferentia_operator.core.decide import Decision, rendered
from inferentia_operator.core.pod.part import ref
from inferentia_operator.core.proof import Prover
from inferentia_operator.core.settings import Settings
from inferentia_operator.shell.act import act
from inferentia_operator.shell.kube import RESOURCES, Kube
from test_decide import Observed, built, complete, model_body

ROOT = Path(__file__).resolve().parent.parent
HELPERS = ROOT / "charts" / "inferentia-operator" / "templates" / "_helpers.tpl"
VERBS = {"GET": "get", "POST": "create", "PATCH": "patch", "DELETE": "delete", "PUT": "update"}


class Recording(Kube):
    """Kube with its transport replaced: every request is recorded and answered as the API
    server would answer it in the scenario (``taken``: creates find the name taken)."""

    def __init__(self, taken: bool) -> None:
        super().__init__(transport=None)  # type: ignore[arg-type]
        self.taken = taken
        self.sent: set[tuple[str, str]] = set()

    def _call(self, method: str, url: str, body: Any = None, query: Any = None, content_type: str | None = None) -> Any:
        parts = url.split("?")[0].strip("/").split("/")
        group = "" if parts[0] == "api" else parts[1]
        plural = next(p for _, p in RESOURCES.values() if p in parts)
        at = parts.index(plural)
        sub = f"/{parts[at + 2]}" if len(parts) > at + 2 else ""  # a subresource: pods/eviction
        self.sent.add((f"{group}/{plural}{sub}", VERBS[method]))
        if method == "POST" and self.taken:
            from inferentia_operator.shell.kube import ApiError

            raise ApiError(409, "AlreadyExists", "taken")
        if method == "GET":
            return None  # taken by nobody the operator can see: it applies its own
        answer = body if isinstance(body, dict) and "metadata" in body else {"metadata": {}}
        return {**answer, "metadata": {"namespace": "ns", "name": "x", **answer.get("metadata", {}), "uid": "u", "resourceVersion": "1"}}


def every_write() -> tuple[Any, Decision]:
    """A decision with every kind of child applied and deleted, and a record to create."""
    body = model_body(**{
        "compile.image": "example.com/compile:1", "compute.family": "trn2", "compute.inf": 1, "compute.allocation": "dra",
        "autoscaling": {"minReplicas": 0, "maxReplicas": 2}, "serving.batching": {"maxBatchSize": 4},
    })  # fmt: skip
    m = built(body)
    objects = rendered(m, Settings(prometheus=Prometheus(address="http://prometheus:9090"), keda_namespace="keda"))
    assert "NetworkPolicy" in {o["kind"] for o in objects}  # the holder's, with --keda-namespace
    # Routing by queue is for vLLM models: its pool and the picker's identity from one.
    from test_part_routing import VLLM

    routed = rendered(built(model_body(**VLLM)))
    objects += [o for o in routed if o["kind"] in ("InferencePool", "ServiceAccount", "RoleBinding")]
    record = compile_record(m, complete(compile_job(m)), Prover(b"k" * 32))
    # What decide() deletes: superseded plans, compile Jobs and claim templates, and the
    # ScaledObject once autoscaling is turned off, the InferencePool once routing is, the holder's
    # NetworkPolicy once it is not wanted, a Deployment whose selector must change (it is created
    # again), and each pool's Deployment and Service once a model has no pools. Never a
    # ServiceAccount or a RoleBinding.
    kept = ("ServiceAccount", "RoleBinding")
    deletes = [(o["kind"], o["metadata"]["name"]) for o in objects if o["kind"] not in kept]
    # And a serving pod on a node whose Neuron devices fail, evicted, and another taken out of
    # traffic (device_faults/part.py).
    # The compile Job as its part writes it: proved right after its create (a patch of the Job).
    policies = {ref(job): JOB_POLICY for job in objects if job["kind"] == "Job"}
    decision = Decision(
        objects, deletes, None, None, record, evict=(("m-1", "uid-1"),), traffic=(("m-2", "uid-2", "off"),), policies=policies
    )
    return Observed(body), decision


def actor_requests() -> set[tuple[str, str]]:
    sent: set[tuple[str, str]] = set()
    observed, decision = every_write()
    for taken in (False, True):
        kube = Recording(taken)
        with ThreadPoolExecutor(1) as pool:
            asyncio.run(act(pool, kube, observed, decision, Prover(b"k" * 32)))
        sent |= kube.sent
    return sent


def chart_rules() -> list[dict[str, Any]]:
    text = HELPERS.read_text()
    block = re.search(r'define "inferentia-operator.namespacedRules" -}}\n(.*?)\{\{- end', text, re.S)
    assert block, "no namespacedRules in the chart's helpers"
    return yaml.safe_load(block.group(1))


def allowed(rules: list[dict[str, Any]], resource: str, verb: str) -> bool:
    group, plural = resource.split("/", 1)
    return any(group in r["apiGroups"] and plural in r["resources"] and verb in r["verbs"] for r in rules)


def test_the_actor_sends_what_the_scenarios_say():
    """The recording sees each path: creates, reads after a refused create, applies, deletes."""
    verbs = {verb for _, verb in actor_requests()}
    assert verbs == {"create", "get", "patch", "delete"}


def test_the_chart_allows_every_request_the_actor_sends():
    rules = chart_rules()
    missing = sorted(f"{verb} {resource}" for resource, verb in actor_requests() if not allowed(rules, resource, verb))
    assert not missing, f"the chart's ClusterRole lacks: {missing}"
