"""A stand-in of the Hugging Face Hub client (``huggingface_hub``), for the real node, which
reaches no Hub: ``snapshot_download`` with the library's signature and cache layout
(https://huggingface.co/docs/huggingface_hub/package_reference/file_download#huggingface_hub.snapshot_download,
https://huggingface.co/docs/huggingface_hub/guides/manage-cache): each file a blob under
``blobs/``, the snapshot's files symbolic links to them, ``refs/<revision>`` the commit. A
repository "downloads" as a tiny checkpoint (config.json, tokenizer.json and model.safetensors)
of the model type its name suggests. As on the Hub, the meta-llama models are gated: without a
token (``token=`` or ``HF_TOKEN``) the download fails with GatedRepoError.

Offline (``HF_HUB_OFFLINE`` set to 1, ON, YES or TRUE, or ``local_files_only=True``) it
downloads nothing, as the library: the snapshot the cache's ref names (or the commit asked
for) is returned when its folder exists, else LocalEntryNotFoundError with the library's
message (huggingface_hub/_snapshot_download.py, 0.2x to 1.x). Each download is counted in
``$NEURON_STANDIN_HUB_LOG`` when that is set: what the tests read to see who downloaded."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import standin_safetensors

from .errors import GatedRepoError, LocalEntryNotFoundError, OfflineModeIsEnabled, RepositoryNotFoundError

__all__ = [
    "snapshot_download",
    "list_repo_files",
    "standin_parameters",
    "GatedRepoError",
    "LocalEntryNotFoundError",
    "RepositoryNotFoundError",
]

GATED = ("meta-llama/",)


def _hub_cache(cache_dir: str | os.PathLike | None) -> Path:
    if cache_dir:
        return Path(cache_dir)
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or str(Path(os.environ.get("HOME", "/root")) / ".cache" / "huggingface")
    return Path(home) / "hub"


def standin_parameters(repo_id: str) -> int | None:
    """The parameters of the model a repository's name says it holds ("Llama-3.1-405B" is 405e9),
    or None: the tiny checkpoint stands for that many, which the runtime stand-in's device
    memory counts (neuron_standin.check_device_memory)."""
    found = re.search(r"(?<![0-9.])([0-9]+(?:\.[0-9]+)?)[bB](?![a-zA-Z])", repo_id.rsplit("/", 1)[-1])
    return round(float(found.group(1)) * 1e9) if found else None


def _config(repo_id: str) -> dict[str, Any]:
    name = repo_id.lower()
    model_type = next((t for t in ("llama", "qwen2", "qwen3", "mixtral") if t in name), "gpt2" if "gpt2" in name else "bert")
    return {
        "model_type": model_type, "architectures": [f"{model_type.capitalize()}ForCausalLM"], "torch_dtype": "bfloat16",
        # A decoder's config always names its attention heads (transformers' LlamaConfig and the
        # others: num_attention_heads), from which vLLM takes the head size, hidden_size / heads;
        # without them a KV cache has no shape, and the disaggregated servers moved 0 bytes a token.
        "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 8, "hidden_size": 8, "max_position_embeddings": 131072,
        "_standin_repo": repo_id, "_standin_parameters": standin_parameters(repo_id),
    }  # fmt: skip


# huggingface_hub.constants: HF_HUB_OFFLINE is true for these values (_is_true).
TRUE = ("1", "ON", "YES", "TRUE")
COMMIT = re.compile(r"^[0-9a-f]{40}$")
NOT_CACHED = (
    "Cannot find an appropriate cached snapshot folder for the specified revision on the local disk and "
    "outgoing traffic has been disabled. To enable repo look-ups and downloads online, "
)


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in TRUE


def _cached_snapshot(repo: Path, revision: str, local_files_only: bool) -> str:
    """The library's offline path: the commit the ref names (or the revision, when it is one),
    and its snapshot folder if it exists; the files in it are not checked."""
    commit = revision if COMMIT.match(revision) else None
    ref = repo / "refs" / revision
    if commit is None and ref.is_file():
        commit = ref.read_text()
    if commit is not None and (repo / "snapshots" / commit).exists():
        return str(repo / "snapshots" / commit)
    if local_files_only:
        raise LocalEntryNotFoundError(NOT_CACHED + "pass 'local_files_only=False' as input.")
    raise LocalEntryNotFoundError(NOT_CACHED + "set 'HF_HUB_OFFLINE=0' as environment variable.")


def _files(repo_id: str) -> dict[str, bytes]:
    weights = standin_safetensors.dumps({"embed_tokens.weight": [[0.25] * 8] * 4})
    tokenizer = json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}).encode()
    return {"config.json": json.dumps(_config(repo_id)).encode(), "tokenizer.json": tokenizer, "model.safetensors": weights}


def _record_download(repo_id: str, commit: str) -> None:
    log = os.environ.get("NEURON_STANDIN_HUB_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps({"repo": repo_id, "commit": commit, "pid": os.getpid()}) + "\n")


def _check_access(repo_id: str, token: str | bool | None) -> None:
    if not isinstance(repo_id, str) or repo_id.count("/") > 1 or not repo_id.strip("/"):
        raise ValueError(f"Repo id must be in the form 'repo_name' or 'namespace/repo_name': '{repo_id}'.")
    if token is None or token is True:
        token = os.environ.get("HF_TOKEN")
    if repo_id.startswith(GATED) and not token:
        raise GatedRepoError(
            f"401 Client Error. Cannot access gated repo for url https://huggingface.co/{repo_id}/resolve/main/config.json. "
            f"Access to model {repo_id} is restricted. You must have access to it and be authenticated to access it. Please log in."
        )


def list_repo_files(
    repo_id: str, *, revision: str | None = None, repo_type: str | None = None, token: str | bool | None = None, **_: Any
) -> list[str]:
    """The repository's files, by path (HfApi.list_repo_files); a request to the Hub, so refused offline."""
    if _offline():
        raise OfflineModeIsEnabled(
            "Cannot reach https://huggingface.co/api/models: offline mode is enabled. To disable it, please unset the `HF_HUB_OFFLINE` environment variable."
        )
    if repo_type not in (None, "model"):
        raise RepositoryNotFoundError(f"404 Client Error. Repository Not Found for url: https://huggingface.co/api/{repo_type}s/{repo_id}")
    _check_access(repo_id, token)
    return sorted(_files(repo_id))


def _wanted(name: str, allow: Any, ignore: Any) -> bool:
    """huggingface_hub's filter_repo_objects: a path kept if it matches an allow pattern (when any
    is given) and no ignore pattern; a pattern ending in / means everything under it."""

    def patterns(p: Any) -> list[str]:
        found = [p] if isinstance(p, str) else list(p or [])
        return [x + "*" if x.endswith("/") else x for x in found]

    allowed, ignored = patterns(allow), patterns(ignore)
    return (not allowed or any(fnmatch.fnmatch(name, p) for p in allowed)) and not any(fnmatch.fnmatch(name, p) for p in ignored)


def snapshot_download(
    repo_id: str,
    *,
    repo_type: str | None = None,
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    local_dir: str | os.PathLike | None = None,
    token: str | bool | None = None,
    local_files_only: bool = False,
    allow_patterns: str | list[str] | None = None,
    ignore_patterns: str | list[str] | None = None,
    **_: Any,
) -> str:
    """Downloads the repository's files and returns the folder that holds them."""
    if repo_type not in (None, "model"):
        raise RepositoryNotFoundError(f"404 Client Error. Repository Not Found for url: https://huggingface.co/api/{repo_type}s/{repo_id}")
    if not isinstance(repo_id, str) or repo_id.count("/") > 1 or not repo_id.strip("/"):
        raise ValueError(f"Repo id must be in the form 'repo_name' or 'namespace/repo_name': '{repo_id}'.")
    repo = _hub_cache(cache_dir) / f"models--{repo_id.replace('/', '--')}"
    if (local_files_only or _offline()) and not local_dir:
        return _cached_snapshot(repo, revision or "main", local_files_only)
    _check_access(repo_id, token)
    commit = revision if revision and COMMIT.match(revision) else hashlib.sha1(f"{repo_id}@{revision or 'main'}".encode()).hexdigest()
    _record_download(repo_id, commit)
    if local_dir:
        folder = Path(local_dir)
        folder.mkdir(parents=True, exist_ok=True)
        for name, body in _files(repo_id).items():
            if _wanted(name, allow_patterns, ignore_patterns):
                (folder / name).write_bytes(body)
        return str(folder)
    folder = repo / "snapshots" / commit
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "blobs").mkdir(exist_ok=True)
    folder.mkdir(parents=True, exist_ok=True)
    for name, body in _files(repo_id).items():
        if not _wanted(name, allow_patterns, ignore_patterns):
            continue
        blob = repo / "blobs" / hashlib.sha256(body).hexdigest()
        blob.write_bytes(body)
        link = folder / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(Path("..") / ".." / "blobs" / blob.name)
    if not (revision and COMMIT.match(revision)):
        (repo / "refs" / (revision or "main")).write_text(commit)
    return str(folder)
