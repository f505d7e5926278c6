"""Where the operator's pods keep the model and its compiled artefact, and where the
programs find the uncompiled model."""

from __future__ import annotations

from inferentia_operator.core.pod.model import Model
from inferentia_operator.core.sizing import FETCHED_SCHEMES
from inferentia_operator.programs import HUB_SNAPSHOT_DIR

# Where the fetch init container puts the compiled artefact, read-only for the server, and
# where the compile program writes it in the compile Job.
COMPILED_DIR = "/var/lib/inferentia/compiled"
# Where a Hub model's files are kept in the artefact, in the Hub cache's layout: the compile
# Job downloads them there once, and every serving pod reads them offline (programs/hub_snapshot.py).
HUB_CACHE_DIR = f"{COMPILED_DIR}/{HUB_SNAPSHOT_DIR}"
# Where the uncompiled model is fetched to, for the compile program (or the model server
# when there is no compile step).
MODEL_DIR = "/var/lib/inferentia/model"


def remote_model(model: Model) -> bool:
    return model.spec.model.uri.startswith(FETCHED_SCHEMES)


def model_path(model: Model) -> str:
    """Where the programs find the uncompiled model: the fetched copy, or a path in the image."""
    return MODEL_DIR if remote_model(model) else model.spec.model.uri.removeprefix("file://")
