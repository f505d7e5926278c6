"""The Hugging Face Hub snapshot a vLLM compile step read, kept in the artefact it uploads, so
that the Hub is read once per model revision and never once per replica.

The compile step (``vllm_compile.py``, ``nxdi_compile.py``) imports this module from the plan
ConfigMap beside it. Given ``INFERENTIA_HUB_CACHE`` (a folder inside the directory the upload
step uploads), it writes there the model's files in the Hub cache's own layout
(``models--<org>--<name>/refs/main`` naming the commit, ``snapshots/<commit>/<files>``,
https://huggingface.co/docs/huggingface_hub/guides/manage-cache), each file a regular file: an
object store keeps no symbolic link, so the snapshot's links to ``blobs/`` are replaced by the
blobs they name (a rename, not a copy) and ``blobs/`` goes. The serving pods fetch the artefact
and run vLLM with ``HF_HUB_CACHE`` at that folder and ``HF_HUB_OFFLINE=1``: the Hub client
resolves the same model id to the same commit from the cache and downloads nothing ("Offline
mode", https://huggingface.co/docs/huggingface_hub/package_reference/environment_variables#hfhuboffline).

The commit is reported as ``{"hubRevision": "<commit>"}``, one JSON line in the container's
termination message, which the operator keeps in the compile's record and shows in status.

It needs only the image's Python and huggingface_hub, and never imports inferentia_operator.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

# A Hub model id: "name" or "org/name" (huggingface_hub's validate_repo_id), never a path or a URI.
# Both are used with fullmatch: $ alone would let a last newline in.
REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?")
COMMIT = re.compile(r"[0-9a-f]{40}")
# Weights in the formats the Hub holds them: what a compiled NxD Inference model has already
# sharded into its own weights/, so its artefact keeps only the configuration and tokenizer.
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf", "*.h5", "*.msgpack", "*.ckpt", "*.ot", "*.onnx")
# What vLLM reads of a checkpoint it loads itself: its configuration and tokenizer (and code, for
# --trust-remote-code), and one format of weights, the first of these the repository has, as
# vLLM's download_weights_from_hf picks it (vllm/model_executor/model_loader/weight_utils.py);
# Meta's original/ folder holds a second copy of the weights in another format.
CONFIG_PATTERNS = ["*.json", "*.txt", "*.model", "*.tiktoken", "*.jinja", "*.py"]
WEIGHT_FORMATS = ["*.safetensors", "*.bin", "*.pt"]
IGNORED_PATTERNS = ["original/*"]


def hub_cache() -> Path | None:
    """Where the artefact keeps the snapshot, when the model is a Hub id (the operator sets it then)."""
    where = os.environ.get("INFERENTIA_HUB_CACHE")
    return Path(where) if where else None


def is_repo_id(model: str) -> bool:
    return bool(REPO_ID.fullmatch(model)) and not Path(model).exists()


def repo_folder(cache: Path, repo_id: str) -> Path:
    return cache / f"models--{repo_id.replace('/', '--')}"


def download_served(repo_id: str, cache: Path) -> Path:
    """The files vLLM loads, into ``cache`` (HF_TOKEN from the environment for a gated model).
    In a process of its own: the Hub client reads HF_HUB_OFFLINE when it is imported, and the
    engine that then reads the snapshot must do so offline, so that it reads this commit."""
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "download", repo_id, str(cache)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit status {done.returncode}")
    return Path(done.stdout.strip().splitlines()[-1])


def keep(snapshot: Path, repo_id: str, cache: Path, weights: bool) -> str:
    """The snapshot's files as regular files under ``cache``'s folder for ``repo_id``, with
    ``refs/main`` naming its commit; weight files left out unless ``weights``. A snapshot already
    in ``cache`` is made regular where it lies; one elsewhere is copied (without its weights,
    the only case that has one elsewhere). Returns the commit."""
    commit = snapshot.name
    if not COMMIT.fullmatch(commit):
        raise ValueError(f"{snapshot} is not a Hub snapshot folder (its name is not a commit)")
    repo = repo_folder(cache, repo_id)
    target = repo / "snapshots" / commit
    moved: dict[Path, Path] = {}
    for path in sorted(snapshot.rglob("*")):
        relative = path.relative_to(snapshot)
        if path.is_dir() and not path.is_symlink():
            continue
        if not weights and any(fnmatch.fnmatch(path.name, p) for p in WEIGHT_PATTERNS):
            if target == snapshot:
                path.unlink()
            continue
        destination = target / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        blob = path.resolve()
        if target != snapshot:
            shutil.copyfile(blob, destination)
        elif path.is_symlink():
            if blob in moved:  # two names for one blob: the second is a copy of the first
                path.unlink()
                shutil.copyfile(moved[blob], destination)
            else:
                os.replace(blob, destination)  # the blob takes the link's place
                moved[blob] = destination
    for leftover in ("blobs", ".locks", ".no_exist"):
        shutil.rmtree(repo / leftover, ignore_errors=True)
    # The client's download locks, under the cache's own .locks/ (huggingface_hub's file_download).
    shutil.rmtree(cache / ".locks" / repo.name, ignore_errors=True)
    if (cache / ".locks").is_dir() and not any((cache / ".locks").iterdir()):
        (cache / ".locks").rmdir()
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return commit


def keep_and_report(snapshot: Path, repo_id: str, cache: Path, weights: bool, failed: str, report_commit: bool = True,
                    about: str | None = None) -> bool:  # fmt: skip
    """:func:`keep`, then :func:`report` unless not ``report_commit`` (a snapshot kept beside the
    one the termination message names); False, with the reason after ``failed`` on stderr, when the
    snapshot cannot be kept (the compile step then fails: its artefact would serve nothing).
    ``about``: what the log line says the snapshot is."""
    try:
        commit = keep(snapshot, repo_id, cache, weights)
    except (OSError, ValueError) as exc:
        print(f"{failed}: keeping the Hub snapshot of {repo_id} in {cache}: {exc}", file=sys.stderr)
        return False
    if report_commit:
        report(commit)
    about = about or (None if weights else "its configuration and tokenizer")
    print(f"kept {repo_id}{f' ({about})' if about else ''} at commit {commit} under {cache}")
    return True


def report(commit: str) -> None:
    """The commit, as the last line of the container's termination message (``/dev/termination-log``,
    which the kubelet gives every container; ``INFERENTIA_TERMINATION_LOG`` moves it)."""
    path = Path(os.environ.get("INFERENTIA_TERMINATION_LOG", "/dev/termination-log"))
    if "INFERENTIA_TERMINATION_LOG" not in os.environ and not path.exists():
        return  # not in a pod: nothing reads it
    path.write_text(json.dumps({"hubRevision": commit}) + "\n")


def served_patterns(files: list[str]) -> list[str]:
    """The configuration, and the first weight format the repository's ``files`` hold."""
    kept = [f for f in files if not any(fnmatch.fnmatch(f, p) for p in IGNORED_PATTERNS)]
    weights = next((p for p in WEIGHT_FORMATS if any(fnmatch.fnmatch(f, p) for f in kept)), None)
    return [*CONFIG_PATTERNS, *([weights] if weights else [])]


def _download(repo_id: str, cache: str) -> int:
    from huggingface_hub import list_repo_files, snapshot_download

    try:
        allow = served_patterns(list_repo_files(repo_id))
        print(snapshot_download(repo_id=repo_id, cache_dir=cache, allow_patterns=allow, ignore_patterns=IGNORED_PATTERNS))
    except Exception as exc:  # noqa: BLE001 - the parent reports the Hub's reason
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "download":
        print("usage: hub_snapshot.py download <repo id> <cache>", file=sys.stderr)
        sys.exit(2)
    sys.exit(_download(sys.argv[2], sys.argv[3]))
