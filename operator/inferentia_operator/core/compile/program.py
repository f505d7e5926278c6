"""What the compile step runs in compile.image, and what it reads: the operator's compile program
by default, the model, the compiler and its flags, where the artefact is written and uploaded."""

from __future__ import annotations

from inferentia_operator.core.names import PLAN_FILE, PLAN_MOUNT
from inferentia_operator.core.pod.artefact import compiled_uri
from inferentia_operator.core.pod.contribution import PodContribution
from inferentia_operator.core.pod.dirs import COMPILED_DIR, model_path
from inferentia_operator.core.pod.model import Model
from inferentia_operator.programs import COMPILE_PROGRAM


def compile_program(model: Model) -> PodContribution:
    """The operator's compile program, and what every compile step reads: the model, the
    compiler and its flags, where it writes the artefact and where the upload puts it, the plan."""
    return PodContribution(
        env={
            "INFERENTIA_MODEL_URI": model.spec.model.uri,
            "INFERENTIA_MODEL_PATH": model_path(model),
            "INFERENTIA_COMPILER": model.plan.compiler,
            "INFERENTIA_OUTPUT_URI": compiled_uri(model),
            "INFERENTIA_COMPILED_MODEL_DIR": COMPILED_DIR,
            "NEURON_CC_FLAGS": " ".join(model.plan.compiler_args),
            "INFERENTIA_PLAN_FILE": PLAN_FILE,
        },
        command=("python3", f"{PLAN_MOUNT}/{COMPILE_PROGRAM}"),
    )
