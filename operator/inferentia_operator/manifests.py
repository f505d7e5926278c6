"""Reads Kubernetes manifests (files, directories, stdin) and checks InferentiaModel documents.

Used by ``inferentia-operator validate`` and ``plan`` to gate a whole GitOps
repository: every InferentiaModel is checked, every other kind is skipped.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .core import api
from .core.findings import Finding, errors
from .core.model import check_model
from .core.names import DEVICE_PLUGIN
from .core.parsing import shown
from .core.pod.model import Model

MANIFEST_SUFFIXES = {".yaml", ".yml", ".json"}
# A manifest larger than this is refused unread (the API server's own request limit is 3 MiB).
MAX_MANIFEST_BYTES = 8 * 1024 * 1024
# Nodes a file's documents may have once their aliases are expanded, all documents together:
# aliases are shared at load time, but anything that walks the result (printing a name,
# validating a spec) walks every copy, and a "billion laughs" document has 9^8 of them.
MAX_EXPANDED_NODES = 1_000_000
# Nodes a file may hold as written, counted as the parser builds them, before any alias is
# expanded: each costs about 700 bytes and 20 microseconds (an 8 MB flow list of 4 million
# items took 81 s and 2.9 GB before the expanded count refused it). An InferentiaModel has
# about a hundred; 200,000 is a file of two thousand of them.
MAX_NODES = 200_000


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
    model: Model | None = None  # the planned model, when the document is valid

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def valid(self) -> bool:
        return self.model is not None and not errors(self.findings)


def check_document(
    body: dict[str, Any], source: str = "", allocation: str = DEVICE_PLUGIN, scheduler_name: str | None = None
) -> ModelDocument:
    metadata: dict[str, Any] = body["metadata"] if isinstance(body.get("metadata"), dict) else {}
    name, namespace = metadata.get("name"), metadata.get("namespace") or "default"
    doc = ModelDocument(source, str(name) if name else "<unnamed>", str(namespace), body)
    if body.get("apiVersion") != api.API_VERSION:
        doc.findings.append(Finding("apiVersion", f"{shown(body.get('apiVersion'))} is not served; valid values are {api.API_VERSION}"))
    checked = check_model(name, metadata.get("namespace"), body.get("spec"), allocation=allocation, scheduler_name=scheduler_name)
    doc.findings += checked.findings
    doc.spec, doc.model = checked.spec, checked.model
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


def _read(source: str, read: Any) -> str:
    data = read(MAX_MANIFEST_BYTES + 1)
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{source}: larger than {MAX_MANIFEST_BYTES} bytes; not read")
    try:
        return data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{source}: cannot be read: not UTF-8 ({exc.reason} at byte {exc.start})") from None


@dataclass(frozen=True)
class Skipped:
    """Files a folder holds that are not manifests as they stand, and why."""

    note: str


def _hidden(f: Path, root: Path) -> bool:
    """Below a folder named with a dot (.git, .venv, .cluster): never the user's manifests."""
    return any(part.startswith(".") for part in f.relative_to(root).parts[:-1])


def _chart_of(f: Path) -> Path | None:
    """The Helm chart whose templates/ holds ``f``: templates are Go templates, not YAML."""
    for parent in f.parents:
        if parent.name == "templates" and (parent.parent / "Chart.yaml").is_file():
            return parent.parent
    return None


def _chart_templates(files: list[Path]) -> list[tuple[Path, int]]:
    counts: dict[Path, int] = {}
    for f in files:
        chart = _chart_of(f)
        if chart is not None:
            counts[chart] = counts.get(chart, 0) + 1
    return sorted(counts.items())


def _files(path: str) -> Iterator[tuple[str, str | ManifestError | Skipped]]:
    """(source, text) for each file of ``path``, or (source, the error) for one that cannot be read."""
    if path == "-":
        try:
            yield "<stdin>", _read("<stdin>", sys.stdin.buffer.read if hasattr(sys.stdin, "buffer") else sys.stdin.read)
        except ManifestError as exc:
            yield "<stdin>", exc
        return
    p = Path(path)
    if p.is_dir():
        candidates = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in MANIFEST_SUFFIXES and not _hidden(f, p))
        for chart_dir, templates in _chart_templates(candidates):
            yield (
                str(chart_dir),
                Skipped(
                    f"{chart_dir}: {templates} Helm chart templates skipped (render them first: helm template {chart_dir} | inferentia-operator validate -)"
                ),
            )
        candidates = [f for f in candidates if _chart_of(f) is None]
    else:
        candidates = [p]
    for f in candidates:
        try:
            with _regular_file(f) as stream:
                text = _read(str(f), stream.read)
            yield str(f), text
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                yield str(f), ManifestError(f"{f}: no such file or directory")
            else:
                yield str(f), ManifestError(f"{f}: cannot be read: {exc.strerror or exc}")
        except ManifestError as exc:
            yield str(f), exc


def _regular_file(f: Path) -> Any:
    """``f`` opened for reading, if it is a regular file. Opened without blocking and checked on
    the open descriptor: a FIFO would block until a writer came, and a device never end."""
    fd = os.open(f, os.O_RDONLY | os.O_NONBLOCK)
    try:
        kind = os.fstat(fd).st_mode
        if not stat.S_ISREG(kind):
            what = "a FIFO" if stat.S_ISFIFO(kind) else "a device" if stat.S_ISCHR(kind) or stat.S_ISBLK(kind) else "not a regular file"
            raise ManifestError(f"{f}: {what}; only regular files are read (use - for standard input)")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, bounded over the whole file, not per document: it refuses a file
    once the parser has built MAX_NODES nodes, and one whose documents' aliases expand past
    MAX_EXPANDED_NODES in all."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self.nodes = 0
        self.expanded = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise ManifestError(f"it has more than {MAX_NODES} YAML nodes")
        return super().compose_node(parent, index)

    def compose_document(self) -> Any:
        node = super().compose_document()
        if node is not None:
            self.expanded += _expanded_size(node, {}, MAX_EXPANDED_NODES - self.expanded)
        return node


# kubectl reads YAML with sigs.k8s.io/yaml, whose scalar resolution (go-yaml's) reads as
# numbers two forms that YAML 1.1, and so PyYAML, reads as strings: an exponent without a dot
# (2e0, 1E3) and Go's 0o octal prefix (0o17). validate reads them as kubectl does, so that the
# two give one verdict (tests/e2e/test_control_plane.py runs both on every form).
_GO_INT = "tag:inferentia.dev,2026:go-int"
_BoundedLoader.add_implicit_resolver(_GO_INT, re.compile(r"^[-+]?0o[0-7_]+$"), list("-+0"))
_BoundedLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"), list("-+0123456789.")
)


def _go_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    return int(str(loader.construct_scalar(node)).replace("_", ""), 0)


_BoundedLoader.add_constructor(_GO_INT, _go_int)


def as_the_api_server_receives(value: Any, *, in_spec: bool = False) -> Any:
    """A YAML value as kubectl sends it and the API server keeps it: JSON, in which a whole
    number written as a float (2.0, !!float 2) is the integer Go's encoder writes for it; and,
    inside the spec, without the keys set to null, which the API server prunes from a custom
    resource before defaulting (Kubernetes docs, "Defaulting and Nullable", CRDs)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return int(value)  # Go's json.Marshal writes float64(2) as 2, and 1e21 and beyond with an exponent
    if isinstance(value, dict):
        return {k: as_the_api_server_receives(v, in_spec=in_spec or k == "spec") for k, v in value.items() if not (in_spec and v is None)}
    if isinstance(value, list):
        return [as_the_api_server_receives(v, in_spec=in_spec) for v in value]
    return value


def _expanded_size(node: yaml.Node, sizes: dict[int, int], limit: int = MAX_EXPANDED_NODES) -> int:
    key = id(node)
    if key in sizes:
        if sizes[key] < 0:
            raise ManifestError("an alias refers to itself")
        return sizes[key]
    sizes[key] = -1  # in progress: meeting it again is a cycle
    size = 1
    if isinstance(node, yaml.SequenceNode):
        size += sum(_expanded_size(child, sizes, limit) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        size += sum(_expanded_size(k, sizes, limit) + _expanded_size(v, sizes, limit) for k, v in node.value)
    if size > limit:
        raise ManifestError(f"its aliases expand to more than {MAX_EXPANDED_NODES} nodes in all")
    sizes[key] = size
    return size


def _documents(source: str, text: str) -> list[Any]:
    try:
        return list(yaml.load_all(text, Loader=_BoundedLoader))
    except ManifestError as exc:
        raise ManifestError(f"{source}: refused: {exc}") from None
    except yaml.YAMLError as exc:
        lines = str(exc).strip().splitlines()
        raise ManifestError(f"{source}: not valid YAML: {' '.join(line.strip() for line in lines)}") from None
    except RecursionError:
        raise ManifestError(f"{source}: nested too deeply to read") from None
    except Exception:  # noqa: BLE001 - a tag's constructor (!!int "", !!timestamp "x") may raise anything
        # The API server's YAML reader refuses these too; what PyYAML raised (IndexError for
        # !!int "") says nothing to the user.
        raise ManifestError(
            f"{source}: not valid YAML: a tagged value is not what its tag says (for example !!int with no digits, "
            "or !!timestamp on a word); remove the tag or give it a value of that type"
        ) from None


@dataclass
class Loaded:
    """What a set of paths held: the models, checked, and the files that could not be read."""

    models: list[ModelDocument] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def load_models(paths: list[str], allocation: str = DEVICE_PLUGIN, scheduler_name: str | None = None) -> Loaded:
    """Every InferentiaModel in the paths (stdin when none), checked (``allocation``: the
    operator's default for spec.compute.allocation). Unreadable files are recorded and the
    rest still read, so one bad file does not hide the others' results."""
    loaded = Loaded()
    seen: set[str] = set()
    for path in paths or ["-"]:
        for source, text in _files(path):
            # realpath, not Path.resolve: it never raises, for a symlink loop either (the read says why).
            key = source if source == "<stdin>" else os.path.realpath(source)
            if key in seen:
                continue  # a file named twice (a folder and its subfolder) is checked once
            seen.add(key)
            if isinstance(text, Skipped):
                loaded.skipped.append(text.note)
                continue
            try:
                if isinstance(text, ManifestError):
                    raise text
                models = [
                    check_document(as_the_api_server_receives(b), source, allocation, scheduler_name)
                    for d in _documents(source, text)
                    for b in _objects(d)
                    if _is_model(b)
                ]
            except ManifestError as exc:
                loaded.problems.append(str(exc))
                continue
            except RecursionError:
                loaded.problems.append(f"{source}: nested too deeply to check")
                continue
            loaded.models += models
    return loaded
