"""The compile program inferentia-operator runs in the compile Job, inside your Neuron framework image.

It traces a PyTorch model for the plan's NeuronCore Group with the family's Neuron framework,
one artefact per input-shape bucket, and saves each with ``torch.jit.save``:

- inf1: ``torch_neuron.trace(model, example_inputs, compiler_args=..., dynamic_batch_size=...)``
  (neuron-cc; https://awsdocs-neuron.readthedocs-hosted.com/en/latest/frameworks/torch/torch-neuron/api-compilation-python-api.html);
- inf2, trn1, trn2: ``torch_neuronx.trace(func, example_inputs, compiler_args=..., cpu_backend=True)``
  (neuronx-cc; https://awsdocs-neuron.readthedocs-hosted.com/en/latest/frameworks/torch/torch-neuronx/api-reference-guide/inference/api-torch-neuronx-trace.html).
  The compile Job has no Neuron device, and without one torch-neuronx's default tracing fails
  ("a Neuron device is currently required for torch 2.x compilation", aws-neuron/aws-neuron-sdk#910).
  ``cpu_backend=True`` traces "completely on CPU" and "needs to be used with the compiler_args
  option to set the --target flag" (the page above), which the plan's arguments carry; the
  operator also sets ``NEURON_PLATFORM_TARGET_OVERRIDE`` in the Job, before anything is imported,
  as optimum-neuron does to compile on a CPU instance (huggingface/optimum-neuron PR #961).
  ``cpu_backend`` came with Neuron 2.21: an image with an older torch-neuronx for torch 2.x is
  refused with the reason; torch-neuronx for torch 1.13 traces without a device as it is.

Both return a ScriptModule that ``torch.jit.save`` writes and ``torch.jit.load`` reads back once
the framework is imported. The example inputs are zeros of shape ``[compile.batchSize, *bucket]``
in the plan's input dtype.

It needs only the image's Python, torch and Neuron framework: it is shipped in the plan
ConfigMap and never imports inferentia_operator. Its inputs (all set by the operator):

- ``INFERENTIA_PLAN_FILE``: plan.json (family, compilerArgs, batchSize, dynamicBatchSize, buckets, inputDtype);
- ``INFERENTIA_MODEL_PATH``: the model, fetched by the operator's init container: a TorchScript file
  (``torch.jit.save``), a module saved with ``torch.save``, or a directory holding exactly one of them;
- ``INFERENTIA_COMPILED_MODEL_DIR``: where ``bucket-<i>.pt`` and ``manifest.json`` are written.

How much of the model runs on Neuron goes into the manifest (``neuronPlacement``) and, as one
JSON line, into the container's termination message (``/dev/termination-log``, which the
kubelet gives every container; ``INFERENTIA_TERMINATION_LOG`` moves it), which the operator
reads into the model's status. On inf1 torch-neuron partitions the graph, runs what neuron-cc
cannot compile on the CPU, and logs the count to the ``Neuron`` logger:
"Number of arithmetic operators (post-compilation) before = 565, compiled = 555, percent
compiled = 98.23%" (as in AWS's torch-neuron tutorials, e.g. the EKS workshop's trace on
inf1). torch_neuronx.trace compiles the whole graph or fails: a traced inf2, trn1 or trn2
model runs entirely on Neuron.

Exit status 0 with every artefact written, 1 with a message on stderr otherwise.
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
MODEL_SUFFIXES = (".pt", ".pth", ".ts", ".torchscript")
# The framework that traces for each family, and the keyword arguments its trace takes
# beyond (model, example_inputs).
FRAMEWORKS = {"inf1": "torch_neuron"}
DEFAULT_FRAMEWORK = "torch_neuronx"


class CompileError(Exception):
    pass


def framework_for(family: str) -> str:
    return FRAMEWORKS.get(family, DEFAULT_FRAMEWORK)


def import_framework(family: str) -> Any:
    """The family's Neuron framework. Importing it also registers the Neuron ops a traced
    graph calls, without which torch.jit.load fails with "Unknown builtin op: neuron::...\"."""
    name = framework_for(family)
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise CompileError(
            f"{name} is not importable in this image ({exc}); {family} models need an image with {name} "
            f"(AWS's Neuron Deep Learning Containers for {family} ship it)"
        ) from exc


def model_file(path: Path) -> Path:
    """The model file: ``path`` itself, or the one model file in the directory ``path``."""
    if path.is_file():
        return path
    if not path.is_dir():
        raise CompileError(f"no model at {path}: the fetch init container did not write it, or the path is wrong")
    candidates = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in MODEL_SUFFIXES)
    if len(candidates) != 1:
        found = ", ".join(str(p.relative_to(path)) for p in candidates) or "none"
        raise CompileError(f"{path} must hold exactly one model file ({', '.join(MODEL_SUFFIXES)}); found {found}")
    return candidates[0]


def load_model(torch: Any, path: Path) -> Any:
    """A TorchScript file, else a module pickled with torch.save; in evaluation mode."""
    source = model_file(path)
    try:
        model = torch.jit.load(str(source), map_location="cpu")
    except RuntimeError:
        # Not TorchScript: a whole module saved with torch.save. torch 2.6 and later load
        # weights only by default, which refuses a pickled module; the model is the user's own.
        kwargs = {"weights_only": False} if "weights_only" in inspect.signature(torch.load).parameters else {}
        try:
            model = torch.load(str(source), map_location="cpu", **kwargs)
        except Exception as exc:
            raise CompileError(f"{source} is neither TorchScript nor a module saved with torch.save: {exc}") from exc
    if not callable(model):
        raise CompileError(f"{source} holds a {type(model).__name__}, not a model: save the module itself, not its state_dict")
    if hasattr(model, "eval"):
        model.eval()
    return model


def example_input(torch: Any, batch_size: int, shape: list[int], dtype: str) -> Any:
    return torch.zeros([batch_size, *shape], dtype=getattr(torch, dtype))


# torch-neuron's partitioner report, after each trace.
PLACEMENT_LINE = re.compile(r"Number of arithmetic operators \(post-compilation\) before = (\d+), compiled = (\d+)")


class PlacementLog(logging.Handler):
    """Collects torch-neuron's ``Neuron`` logger lines while the model is traced."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.counts: list[tuple[int, int]] = []

    def emit(self, record: logging.LogRecord) -> None:
        found = PLACEMENT_LINE.search(record.getMessage())
        if found:
            self.counts.append((int(found.group(1)), int(found.group(2))))


def placement(family: str, counts: list[tuple[int, int]]) -> dict[str, Any]:
    """The share of the model's operators that runs on Neuron, over every bucket."""
    if family != "inf1":
        return {"percent": 100.0, "how": "torch_neuronx.trace compiles the whole graph for Neuron"}
    if not counts:
        return {"percent": None, "how": "torch-neuron logged no operator count"}
    operators, compiled = sum(c[0] for c in counts), sum(c[1] for c in counts)
    percent = round(100.0 * compiled / operators, 2) if operators else 100.0
    return {"percent": percent, "operators": operators, "compiledOperators": compiled, "how": "torch-neuron's partitioner report"}


def report_placement(found: dict[str, Any]) -> None:
    """One JSON line in the container's termination message, which the operator reads."""
    path = Path(os.environ.get("INFERENTIA_TERMINATION_LOG", "/dev/termination-log"))
    if "INFERENTIA_TERMINATION_LOG" not in os.environ and not path.exists():
        return  # not in a container: nobody reads it
    path.write_text(json.dumps({"neuronPlacementPercent": found["percent"]}) + "\n")


def trace(framework: Any, family: str, model: Any, example: Any, plan: dict[str, Any]) -> Any:
    args = list(plan["compilerArgs"])
    if family == "inf1":
        # neuron-cc compiles on any machine ("Compilation can be done on any EC2 machine").
        return framework.trace(model, example, compiler_args=args, dynamic_batch_size=bool(plan.get("dynamicBatchSize")))
    if "cpu_backend" not in inspect.signature(framework.trace).parameters:
        version = str(getattr(framework, "__version__", "unknown"))
        if version.startswith("1."):
            # "By default, torch_neuronx.trace() supports compilation on non-Neuron devices for
            # torch 1.13. However, a Neuron device is currently required for torch 2.x" (AWS, aws-neuron-sdk#910).
            return framework.trace(model, example, compiler_args=args)
        raise CompileError(
            f"torch-neuronx {version} in this image cannot trace without a Neuron device (its trace has no cpu_backend, "
            "which came with Neuron 2.21), and the compile Job runs on a node without one; use an image of Neuron 2.21 "
            "or later, for example public.ecr.aws/neuron/pytorch-inference-neuronx:2.9.0-neuronx-py312-sdk2.31.1-ubuntu24.04"
        )
    return framework.trace(model, example, compiler_args=args, cpu_backend=True)


def compile_all(plan: dict[str, Any], model_path: Path, out: Path) -> dict[str, Any]:
    """Trace the model once per bucket, save each artefact and the manifest; returns the manifest."""
    buckets = plan.get("buckets") or []
    if not buckets:
        raise CompileError(
            "the plan has no input shape: set spec.compile.buckets (one shape per compiled model, without the batch dimension)"
        )
    import torch

    family = plan["family"]
    framework = import_framework(family)
    model = load_model(torch, model_path)
    dtype = plan.get("inputDtype", "float32")
    out.mkdir(parents=True, exist_ok=True)
    artefacts = []
    log = PlacementLog()
    neuron_logger = logging.getLogger("Neuron")
    neuron_logger.addHandler(log)
    if neuron_logger.getEffectiveLevel() > logging.INFO:
        neuron_logger.setLevel(logging.INFO)
    with torch.no_grad():
        for i, shape in enumerate(buckets):
            example = example_input(torch, plan["batchSize"], shape, dtype)
            print(f"compile: tracing bucket {shape} (batch {plan['batchSize']}, {dtype}) with {framework.__name__}", flush=True)
            traced = trace(framework, family, model, example, plan)
            name = f"bucket-{i}.pt"
            torch.jit.save(traced, str(out / name))
            artefacts.append({"file": name, "shape": list(shape)})
    neuron_logger.removeHandler(log)
    manifest = {
        "format": 1,
        "family": family,
        "framework": framework.__name__,
        "compiler": plan["compiler"],
        "compilerArgs": plan["compilerArgs"],
        "batchSize": plan["batchSize"],
        "dynamicBatchSize": bool(plan.get("dynamicBatchSize")),
        "inputDtype": dtype,
        "artefacts": artefacts,
        "torch": str(torch.__version__),
        "source": model_file(model_path).name,
        "neuronPlacement": placement(family, log.counts),
    }
    # The manifest last: a directory with a manifest holds every artefact it names.
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return manifest


def main() -> int:
    try:
        plan = json.loads(Path(os.environ.get("INFERENTIA_PLAN_FILE", "/etc/inferentia/plan.json")).read_text())
        model_path = Path(os.environ["INFERENTIA_MODEL_PATH"])
        out = Path(os.environ["INFERENTIA_COMPILED_MODEL_DIR"])
        manifest = compile_all(plan, model_path, out)
    except KeyError as exc:
        print(f"compile: {exc.args[0]} is not set: the operator sets it in the compile Job", file=sys.stderr)
        return 1
    except CompileError as exc:
        print(f"compile: {exc}", file=sys.stderr)
        return 1
    print(f"compile: wrote {len(manifest['artefacts'])} artefact(s) and {MANIFEST} to {out}", flush=True)
    found = manifest["neuronPlacement"]
    print(f"compile: {found['percent']}% of the model's operators run on Neuron ({found['how']})", flush=True)
    report_placement(found)
    return 0


if __name__ == "__main__":
    sys.exit(main())
