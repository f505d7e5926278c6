"""The model server inferentia-operator runs in each serving process, inside your Neuron framework image.

The launcher starts it once per NeuronCore Group, with the group's runtime environment
(``NEURON_RT_VISIBLE_CORES`` and the rest) and ``PORT``. It imports the family's Neuron
framework (torch_neuron on inf1, torch_neuronx elsewhere), which registers the Neuron ops a
traced graph calls, then loads every compiled artefact with ``torch.jit.load``. Loading is
where the Neuron runtime takes the group's cores.

Where the artefacts come from:

- with a compile step, ``INFERENTIA_COMPILED_MODEL_DIR``: the compile Job's ``manifest.json`` and
  ``bucket-<i>.pt`` files, fetched by the operator's init container;
- without one, ``INFERENTIA_MODEL_PATH``: the uncompiled model, which it traces at start with the
  compile program (neuron_compile.py, beside this file), as the Neuron frameworks compile at load.

It serves the contract the operator's batching front end speaks:

- ``POST /``: a JSON list of inputs (each a nested list of numbers, without the batch dimension),
  answered with a JSON list of outputs, same length and order. Each input runs on the artefact of
  the smallest bucket that holds it, padded with zeros; an output of the bucket's shape is cut back
  to the input's. Inputs are run in batches of the compiled batch size, padded with zero inputs.
- ``GET /healthz``: 200 once every artefact is loaded and has run once (it listens only after that).

It needs only the image's Python, torch and Neuron framework; it never imports inferentia_operator.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import neuron_compile

MAX_BODY = 64 * 1024 * 1024
# What one client may hold: seconds a read may wait, and connections at once. Environment
# variables of this program only, for tests that cannot wait the defaults.
CLIENT_TIMEOUT = float(os.environ.get("INFERENTIA_SERVE_CLIENT_TIMEOUT_S", "30"))
MAX_CONNECTIONS = int(os.environ.get("INFERENTIA_SERVE_MAX_CONNECTIONS", "256"))
# The batching front end's CLOSE_BUSY, written again: this program runs in the user's image and
# imports nothing of the operator's package.
_BUSY_BODY = b'{"error": "too many connections; retry later"}'
BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\n"
    + f"Content-Length: {len(_BUSY_BODY)}\r\n\r\n".encode()
    + _BUSY_BODY
)


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON number")


class BadInput(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Model:
    """The loaded artefacts, one per bucket, and how to run a batch of inputs through them."""

    def __init__(self, torch: Any, manifest: dict[str, Any], modules: list[Any]) -> None:
        self.torch = torch
        self.batch_size = int(manifest["batchSize"])
        self.dtype = getattr(torch, manifest.get("inputDtype", "float32"))
        self.shapes = [list(a["shape"]) for a in manifest["artefacts"]]
        self.modules = modules
        # One batch at a time per NeuronCore Group, as the runtime runs them.
        self.lock = threading.Lock()

    def bucket_for(self, shape: list[int]) -> int:
        fits = [i for i, b in enumerate(self.shapes) if len(b) == len(shape) and all(s <= d for s, d in zip(shape, b, strict=True))]
        if not fits:
            raise BadInput(413, f"an input of shape {shape} fits no compiled bucket; the buckets are {self.shapes}")
        return min(fits, key=lambda i: (self._volume(self.shapes[i]), i))

    @staticmethod
    def _volume(shape: list[int]) -> int:
        n = 1
        for d in shape:
            n *= d
        return n

    def predict(self, inputs: list[Any]) -> list[Any]:
        torch = self.torch
        tensors = []
        for item in inputs:
            try:
                tensors.append(torch.tensor(item, dtype=self.dtype))
            except (TypeError, ValueError, RuntimeError, RecursionError) as exc:
                raise BadInput(400, f"an input is not a rectangular list of numbers: {exc}") from exc
        by_bucket: dict[int, list[int]] = {}
        for index, t in enumerate(tensors):
            by_bucket.setdefault(self.bucket_for(list(t.shape)), []).append(index)
        outputs: list[Any] = [None] * len(inputs)
        with self.lock, torch.no_grad():
            for bucket, indices in by_bucket.items():
                shape = self.shapes[bucket]
                for start in range(0, len(indices), self.batch_size):
                    chunk = indices[start : start + self.batch_size]
                    batch = torch.zeros([self.batch_size, *shape], dtype=self.dtype)
                    for row, index in enumerate(chunk):
                        t = tensors[index]
                        batch[(row, *(slice(0, d) for d in t.shape))] = t
                    result = self.modules[bucket](batch)
                    for row, index in enumerate(chunk):
                        out = result[row]
                        if list(out.shape) == shape:  # an output of the bucket's shape: cut back to the input's
                            out = out[tuple(slice(0, d) for d in tensors[index].shape)]
                        outputs[index] = out.tolist()
        return outputs


def load(plan: dict[str, Any]) -> Model:
    import torch

    framework = neuron_compile.import_framework(plan["family"])
    compiled = os.environ.get("INFERENTIA_COMPILED_MODEL_DIR")
    if compiled:
        directory = Path(compiled)
        manifest_path = directory / neuron_compile.MANIFEST
        if not manifest_path.is_file():
            raise neuron_compile.CompileError(f"no {neuron_compile.MANIFEST} in {directory}: the compiled artefact was not fetched")
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("framework") != framework.__name__:
            raise neuron_compile.CompileError(
                f"the artefact was traced with {manifest.get('framework')}, this process runs {framework.__name__}"
            )
    else:
        # No compile step: trace at start, as the Neuron frameworks compile at load time.
        directory = Path(os.environ.get("TMPDIR", "/tmp")) / f"compiled-{os.getpid()}"
        manifest = neuron_compile.compile_all(plan, Path(os.environ["INFERENTIA_MODEL_PATH"]), directory)
    modules = []
    dtype = getattr(torch, manifest.get("inputDtype", "float32"))
    for artefact in manifest["artefacts"]:
        module = torch.jit.load(str(directory / artefact["file"]))
        module.eval()
        # Warm up: the first inference is where the Neuron runtime loads the model onto the
        # process's NeuronCores, so a wrong grant or a model that does not fit fails here, before
        # the server listens and the pod is ready, not on a client's request.
        with torch.no_grad():
            module(torch.zeros([int(manifest["batchSize"]), *artefact["shape"]], dtype=dtype))
        modules.append(module)
    return Model(torch, manifest, modules)


class BoundedServer(ThreadingHTTPServer):
    """One thread per connection, as ThreadingHTTPServer, up to MAX_CONNECTIONS of them: one
    more is answered 503 and closed at once, so a flood of connections costs no threads."""

    # Threads are joined on close: a SIGTERM lets every request in hand be answered.
    daemon_threads = False
    block_on_close = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]):
        super().__init__(address, handler)
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            try:
                request.sendall(BUSY)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


def handler(model: Model) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # A socket timeout (socketserver.StreamRequestHandler.timeout) on every read: a client
        # that dribbles its headers or body, or idles on a kept-alive connection, is closed after
        # it rather than holding a thread for ever.
        timeout = CLIENT_TIMEOUT

        def _json(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path in ("/healthz", "/readyz"):
                self._json(200, {"ok": True, "buckets": model.shapes})
            else:
                self._json(404, {"error": "not found"})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                self.close_connection = True
                self._json(413, {"error": f"the body is larger than {MAX_BODY} bytes"})
                return
            body = self.rfile.read(length)
            if self.path not in ("/", "/predict"):
                self._json(404, {"error": "not found"})
                return
            try:
                inputs = json.loads(body, parse_constant=_not_json)
            except (ValueError, RecursionError):
                # Not JSON, NaN or Infinity (not JSON numbers), or nested past the decoder's limit.
                self._json(400, {"error": "the body is not a JSON list of finite numbers"})
                return
            if not isinstance(inputs, list):
                self._json(400, {"error": "a JSON list of inputs is expected"})
                return
            try:
                self._json(200, model.predict(inputs))
            except BadInput as exc:
                self._json(exc.status, {"error": str(exc)})
            except Exception as exc:  # noqa: BLE001 - the model's own failure on these inputs: answered, and the server goes on
                lines = str(exc).strip().splitlines() or [type(exc).__name__]
                print(f"serve: the model failed on a batch of {len(inputs)}: {lines[-1]}", file=sys.stderr, flush=True)
                self._json(500, {"error": f"the model failed: {lines[-1]}"})

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


def main() -> int:
    try:
        plan = json.loads(Path(os.environ.get("INFERENTIA_PLAN_FILE", "/etc/inferentia/plan.json")).read_text())
        model = load(plan)
    except RuntimeError as exc:  # the Neuron runtime's refusal to load, through torch
        print(f"serve: the model could not be loaded onto its NeuronCores: {exc}", file=sys.stderr)
        return 1
    except neuron_compile.CompileError as exc:
        print(f"serve: {exc}", file=sys.stderr)
        return 1
    except KeyError as exc:
        print(f"serve: {exc.args[0]} is not set: the operator sets it in the serving container", file=sys.stderr)
        return 1
    port = int(os.environ.get("PORT", "8080"))
    server = BoundedServer(("0.0.0.0", port), handler(model))
    print(
        f"serve: {len(model.modules)} artefact(s) loaded, buckets {model.shapes}, batch {model.batch_size}, "
        f"cores {os.environ.get('NEURON_RT_VISIBLE_CORES', '-')}, port {port}",
        flush=True,
    )
    # SIGTERM (the pod's drain is over): stop listening, answer the requests in hand (their
    # threads are joined, each bounded by CLIENT_TIMEOUT), then exit 0.
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    server.serve_forever()
    server.server_close()
    print("serve: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
