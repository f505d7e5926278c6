"""A stand-in of the Hugging Face Hub client (``huggingface_hub``), for the real node, which
reaches no Hub: ``snapshot_download`` with the library's signature and cache layout
(https://huggingface.co/docs/huggingface_hub/package_reference/file_download#huggingface_hub.snapshot_download,
https://huggingface.co/docs/huggingface_hub/guides/manage-cache). A repository "downloads" as
a tiny checkpoint (config.json and model.safetensors) of the model type its name suggests.
As on the Hub, the meta-llama models are gated: without a token (``token=`` or ``HF_TOKEN``)
the download fails with GatedRepoError."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import standin_safetensors

from .errors import GatedRepoError, RepositoryNotFoundError

__all__ = ["snapshot_download", "standin_parameters", "GatedRepoError", "RepositoryNotFoundError"]

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
        "num_hidden_layers": 2, "num_key_value_heads": 8, "hidden_size": 8, "max_position_embeddings": 131072,
        "_standin_repo": repo_id, "_standin_parameters": standin_parameters(repo_id),
    }  # fmt: skip


def snapshot_download(
    repo_id: str,
    *,
    repo_type: str | None = None,
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    local_dir: str | os.PathLike | None = None,
    token: str | bool | None = None,
    **_: Any,
) -> str:
    """Downloads the repository's files and returns the folder that holds them."""
    if repo_type not in (None, "model"):
        raise RepositoryNotFoundError(f"404 Client Error. Repository Not Found for url: https://huggingface.co/api/{repo_type}s/{repo_id}")
    if not isinstance(repo_id, str) or repo_id.count("/") > 1 or not repo_id.strip("/"):
        raise ValueError(f"Repo id must be in the form 'repo_name' or 'namespace/repo_name': '{repo_id}'.")
    if token is None or token is True:
        token = os.environ.get("HF_TOKEN")
    if repo_id.startswith(GATED) and not token:
        raise GatedRepoError(
            f"401 Client Error. Cannot access gated repo for url https://huggingface.co/{repo_id}/resolve/main/config.json. "
            f"Access to model {repo_id} is restricted. You must have access to it and be authenticated to access it. Please log in."
        )
    commit = hashlib.sha1(f"{repo_id}@{revision or 'main'}".encode()).hexdigest()
    if local_dir:
        folder = Path(local_dir)
    else:
        repo = _hub_cache(cache_dir) / f"models--{repo_id.replace('/', '--')}"
        folder = repo / "snapshots" / commit
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / (revision or "main")).write_text(commit)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(_config(repo_id)))
    standin_safetensors.write(folder / "model.safetensors", {"embed_tokens.weight": [[0.25] * 8] * 4})
    return str(folder)
