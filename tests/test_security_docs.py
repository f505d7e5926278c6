"""docs/security.md's table of limits states the defaults the code has: each row names where
the value lives, and this reads it from there."""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

import pytest
import yaml

from inferentia_operator import cli, fetch, manifests
from inferentia_operator.batching import limits, node_cache, scaler
from inferentia_operator.programs import pd_proxy

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "security.md"
SERVE = ROOT / "operator" / "inferentia_operator" / "programs" / "neuron_serve.py"
UNITS = {"s": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "bytes": 1, "": 1}


def serve_defaults() -> dict[str, float]:
    """The model server's constants and the defaults of its environment variables, read from its
    source (it runs in the user's image and is not importable here without torch)."""
    values: dict[str, float] = {}
    for node in ast.parse(SERVE.read_text()).body:
        if not (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)):
            continue
        name, source = node.targets[0].id, ast.unparse(node.value)
        env = re.search(r"os\.environ\.get\('(\w+)', '([\d.]+)'\)", source)
        if env:
            scale = 2**20 if env.group(1).endswith("_MIB") else 1
            values[env.group(1)] = float(env.group(2)) * scale
        elif isinstance(node.value, ast.Constant) and isinstance(node.value.value, int):
            values[name] = node.value.value
            values[f"neuron_serve.{name}"] = node.value.value
    return values


def flag_default(command: str, flag: str) -> float:
    subcommands = next(a for a in cli.parser()._actions if isinstance(a, argparse._SubParsersAction))  # noqa: SLF001
    parser = subcommands.choices[command]
    return next(a.default for a in parser._actions if flag in a.option_strings)  # noqa: SLF001


def in_code(reference: str) -> float:
    d = limits.DEFAULT_LIMITS
    known: dict[str, float] = {
        # First: the front end's MAX_DEPTH is the plain name; the model server's is neuron_serve.MAX_DEPTH.
        **serve_defaults(),
        # The disaggregated proxy's variables, each read through the field of Limits it sets.
        **{name: getattr(pd_proxy.Limits(), field) for name, (field, _) in pd_proxy.VARIABLES.items()},
        **{
            f"Limits.{f}": getattr(d, f)
            for f in (
                "header_timeout",
                "body_timeout",
                "max_connections",
                "max_body",
                "body_budget",
                "process_timeout",
                "max_peer_connections",
                "peer_budget",
            )  # fmt: skip
        },
        "MAX_DEPTH": limits.MAX_DEPTH,
        "PADDED_ELEMENT_BYTES": limits.PADDED_ELEMENT_BYTES,
        "MEMORY_PER_BUDGET_BYTE": limits.MEMORY_PER_BUDGET_BYTE,
        "MAX_MANIFEST_BYTES": manifests.MAX_MANIFEST_BYTES,
        "MAX_NODES": manifests.MAX_NODES,
        "MAX_EXPANDED_NODES": manifests.MAX_EXPANDED_NODES,
        "MAX_HTTPS_BYTES": fetch.MAX_HTTPS_BYTES,
        "MAX_MARKER_BYTES": fetch.MAX_MARKER_BYTES,
        "scaler.MAX_MESSAGE": scaler.MAX_MESSAGE,
        "scaler.MAX_STREAMS": scaler.MAX_STREAMS,
        "scaler.MAX_CALLS": scaler.MAX_CALLS,
        "scaler.MAX_CONNECTIONS": scaler.MAX_CONNECTIONS,
        "scaler.MAX_PEER_CONNECTIONS": scaler.MAX_PEER_CONNECTIONS,
        "scaler.STREAMS_PER_CONNECTION": scaler.STREAMS_PER_CONNECTION,
        "scaler.IDLE_SECONDS": scaler.IDLE_SECONDS,
        "node_cache.MAX_OFFERS": node_cache.MAX_OFFERS,
        "node_cache.MAX_CONNECTIONS": node_cache.MAX_CONNECTIONS,
        "node_cache.MAX_PEER_CONNECTIONS": node_cache.MAX_PEER_CONNECTIONS,
        "node_cache.MAX_TOKEN_BYTES": node_cache.MAX_TOKEN_BYTES,
        "node_cache.MAX_REVIEWS": node_cache.MAX_REVIEWS,
        "node_cache.MIN_OFFER_RATE": node_cache.MIN_OFFER_RATE,
        "node_cache.REVIEW_WAIT": node_cache.REVIEW_WAIT,
        "node_cache.PENALTY": node_cache.PENALTY,
        "node_cache.VERDICT_SECONDS": node_cache.VERDICT_SECONDS,
    }
    if reference.startswith(("hold --", "node-cache --")):
        return flag_default(*reference.split(" ", 1))
    assert reference in known, f"the table names {reference}, which this test does not know where to find"
    return known[reference]


def rows() -> list[tuple[str, str, str]]:
    table = PAGE.read_text().split("## The limits", 1)[1].split("\n## ", 1)[0]
    found = []
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[3].startswith("`"):
            found.append((cells[0], cells[2], cells[3].strip("`")))
    return found


def stated(value: str) -> float:
    number, _, unit = value.partition(" ")
    return float(number.replace(",", "")) * UNITS[unit]


def test_the_table_has_every_limit():
    assert len(rows()) >= 20


@pytest.mark.parametrize("what,default,reference", rows(), ids=lambda v: v if isinstance(v, str) and v.isidentifier() else None)
def test_each_limit_is_the_codes_default(what, default, reference):
    assert stated(default) == in_code(reference), f"{what}: the docs say {default}, the code has {in_code(reference)}"


def test_the_allow_list_command_renders_the_policy():
    """The command security.md gives for plain manifests, run as written (with the built Helm)."""
    import shlex
    import subprocess

    helm = (
        Path(subprocess.run(["bash", str(ROOT / "cluster" / "build.sh"), "--print"], capture_output=True, text=True).stdout.strip())
        / "helm"
    )
    if not helm.exists():
        pytest.skip("Helm is built by make controlplane (cluster/build.sh)")
    [command] = re.findall(r"`(helm template [^`]+)`", PAGE.read_text())
    args = shlex.split(command)
    out = subprocess.run([str(helm), *args[1:]], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    assert [d["kind"] for d in docs] == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    allowed = next(v for v in docs[0]["spec"]["variables"] if v["name"] == "allowed")
    assert allowed["expression"] == '["reg.example.com/team"]'
