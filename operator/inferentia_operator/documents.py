"""Reads Kubernetes manifests (files, directories, stdin) and checks InferentiaModel documents.

Used by ``inferentia-operator validate`` and ``plan`` to gate a whole GitOps
repository: every InferentiaModel is checked, every other kind is skipped.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import api
from .children import Model, plan_size_findings
from .findings import Finding, errors
from .parsing import parse_spec
from .planner import plan
from .rules import check_name

MANIFEST_SUFFIXES = {".yaml", ".yml", ".json"}


class ManifestError(Exception):
    """A file that cannot be read or parsed."""


@dataclass
class ModelDocument:
    """One InferentiaModel found in a manifest, with everything wrong with it."""

    source: str
    name: str
    namespace: str
    body: dict[str, Any]
    findings: list[Finding] = field(default_factory=list)
    spec: api.InferentiaModelSpec | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def valid(self) -> bool:
        return self.spec is not None and not errors(self.findings)


def check_document(body: dict[str, Any], source: str = "") -> ModelDocument:
    metadata = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
    name, namespace = metadata.get("name"), metadata.get("namespace") or "default"
    doc = ModelDocument(source, str(name) if name else "<unnamed>", str(namespace), body)
    if body.get("apiVersion") != api.API_VERSION:
        doc.findings.append(
            Finding("apiVersion", f"{body.get('apiVersion')!r} is not served; valid values are {api.API_VERSION}")
        )
    doc.findings += check_name(name)
    doc.spec, spec_findings = parse_spec(body.get("spec"))
    doc.findings += spec_findings
    if doc.valid:
        assert doc.spec is not None
        model = Model(doc.name, doc.namespace, "", doc.spec, plan(doc.spec))
        doc.findings += plan_size_findings(model)
    return doc


def _is_model(body: Any) -> bool:
    if not isinstance(body, dict) or body.get("kind") != api.KIND:
        return False
    version = body.get("apiVersion")
    # Another group's InferentiaModel is not ours to judge; a wrong version of ours is an error.
    return not isinstance(version, str) or version.split("/")[0] == api.GROUP


def _objects(document: Any) -> Iterator[Any]:
    if isinstance(document, dict) and document.get("kind") == "List" and isinstance(document.get("items"), list):
        yield from document["items"]
    else:
        yield document


def _files(path: str) -> Iterator[tuple[str, str]]:
    if path == "-":
        yield "<stdin>", sys.stdin.read()
        return
    p = Path(path)
    if p.is_dir():
        candidates = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in MANIFEST_SUFFIXES)
    elif p.exists():
        candidates = [p]
    else:
        raise ManifestError(f"{path}: no such file or directory")
    for f in candidates:
        try:
            yield str(f), f.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ManifestError(f"{f}: cannot be read: {exc}") from None


def _documents(source: str, text: str) -> list[Any]:
    try:
        return list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        lines = str(exc).strip().splitlines()
        raise ManifestError(f"{source}: not valid YAML: {' '.join(line.strip() for line in lines)}") from None
    except (RecursionError, ValueError, TypeError, OverflowError) as exc:
        raise ManifestError(f"{source}: cannot be parsed: {type(exc).__name__}") from None


@dataclass
class Loaded:
    """What a set of paths held: the models, checked, and the files that could not be read."""

    models: list[ModelDocument] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def load_models(paths: list[str]) -> Loaded:
    """Every InferentiaModel in the paths (stdin when none), checked. Unreadable files are
    recorded and the rest still read, so one bad file does not hide the others' results."""
    loaded = Loaded()
    seen: set[str] = set()
    for path in paths or ["-"]:
        try:
            for source, text in _files(path):
                key = source if source == "<stdin>" else str(Path(source).resolve())
                if key in seen:
                    continue  # a file named twice (a folder and its subfolder) is checked once
                seen.add(key)
                for document in _documents(source, text):
                    for body in _objects(document):
                        if _is_model(body):
                            loaded.models.append(check_document(body, source))
        except ManifestError as exc:
            loaded.problems.append(str(exc))
    return loaded
