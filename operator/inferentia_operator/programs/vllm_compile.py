"""The compile program inferentia-operator runs in the compile Job of a vLLM model on trn2 and trn3,
inside your vLLM Neuron image.

It fills the vLLM Neuron plugin's compile cache for the model as the serving pods will start it,
on an ordinary node, with no Neuron device: it constructs vLLM's offline engine,
``vllm.LLM(model=..., tensor_parallel_size=..., max_model_len=..., max_num_seqs=...)``, with the
same engine arguments the serving pods' ``vllm serve`` gets. The plugin compiles one graph per
bucket when the engine warms up and stores each under ``$VLLM_CACHE_ROOT/neuron/compile_cache/<hash>/``
("Compilation Cache",
https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/design/compilation/compilation_cache.html).
The operator runs it with:

- ``VLLM_NEURON_CPU_COMPILE=1`` and ``NEURON_PLATFORM_TARGET_OVERRIDE`` (the family): the
  plugin compiles on the CPU for that target without running the graphs ("CPU Compilation",
  https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/design/compilation/cpu_compilation.html);
- ``VLLM_CACHE_ROOT``: the directory the operator's upload step then uploads, with its
  completion marker last, and which the serving pods fetch into their own ``VLLM_CACHE_ROOT``;
- ``INFERENTIA_VLLM_ENGINE_ARGS``: the engine arguments, as JSON;
- ``INFERENTIA_HUB_CACHE``, when the model is a Hugging Face id: the folder inside
  ``VLLM_CACHE_ROOT`` where the model's files are downloaded first (``HF_TOKEN`` from your
  serving.env for a gated model), which the engine then reads offline and the serving pods read
  with it (``hub_snapshot.py``, shipped beside this program). The commit goes into the
  termination message. An EAGLE3 draft the engine arguments name by a Hugging Face id
  (``speculative_config.model``) is downloaded and kept there too, weights and all: vLLM loads the
  draft's checkpoint itself, and the serving pods read the cache offline.

It needs only the image's Python and vLLM with the plugin: it is shipped in the plan ConfigMap
and never imports inferentia_operator. Exit status 0 once the engine is built (every bucket
compiled), 1 with a message on stderr otherwise.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import hub_snapshot  # type: ignore[import-not-found]  # beside this program in the plan ConfigMap, not a package module

CACHE = Path("neuron") / "compile_cache"


def engine_args() -> dict[str, Any]:
    args = json.loads(os.environ["INFERENTIA_VLLM_ENGINE_ARGS"])
    if not isinstance(args, dict) or "model" not in args:
        raise ValueError(f"INFERENTIA_VLLM_ENGINE_ARGS is not an object with a model: {args!r}")
    return args


def draft_model(args: dict[str, Any]) -> str | None:
    """The draft model a speculative config names (vLLM's speculative_config "model"), if any."""
    config = args.get("speculative_config")
    return str(config["model"]) if isinstance(config, dict) and config.get("model") else None


def main() -> int:
    snapshot = hub = draft_snapshot = draft = None
    try:
        args = engine_args()
        cache = Path(os.environ["VLLM_CACHE_ROOT"]) / CACHE
        hub = hub_snapshot.hub_cache()
        if hub is not None and hub_snapshot.is_repo_id(str(args["model"])):
            # Downloaded once, here; the engine then reads that very commit from the cache, as
            # the serving pods will (vLLM takes the same model id, so the plugin's cache keys match).
            snapshot = hub_snapshot.download_served(str(args["model"]), hub)
            draft = draft_model(args)
            if draft is not None and hub_snapshot.is_repo_id(draft):
                # The pods read the cache offline: a draft left out of it could not be loaded there.
                draft_snapshot = hub_snapshot.download_served(draft, hub)
            os.environ |= {"HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1"}
        from vllm import LLM  # the image's vLLM, with the Neuron plugin registered through its entry point

        LLM(**args)
    except Exception as exc:  # noqa: BLE001 - every failure ends the Job with its reason
        print(f"vllm compile failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    entries = sorted(p.name for p in cache.iterdir() if p.is_dir()) if cache.is_dir() else []
    if not entries:
        print(f"vllm compile failed: the engine started but {cache} holds no compiled graph", file=sys.stderr)
        return 1
    print(f"compiled {args['model']} into {len(entries)} cache entries under {cache}: {', '.join(entries)}")
    if snapshot is not None and hub is not None:
        return keep_snapshots(hub, snapshot, str(args["model"]), draft_snapshot, draft)
    return 0


def keep_snapshots(hub: Path, snapshot: Path, repo_id: str, draft_snapshot: Path | None, draft: str | None) -> int:
    """The draft's snapshot kept first, then the target's with its commit in the termination
    message: that message reads as a whole artefact, so nothing is written there once a part failed."""
    failed = "vllm compile failed"
    if draft_snapshot is not None and draft is not None:
        # Kept beside the target's, its commit reported nowhere: the termination message names the target's only.
        if not hub_snapshot.keep_and_report(draft_snapshot, draft, hub, weights=True, failed=failed, report_commit=False,
                                            about="the EAGLE3 draft"):  # fmt: skip
            return 1
    return 0 if hub_snapshot.keep_and_report(snapshot, repo_id, hub, weights=True, failed=failed) else 1


if __name__ == "__main__":
    sys.exit(main())
