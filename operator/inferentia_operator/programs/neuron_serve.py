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
  A batch holding an input the server will not take is answered 4xx (400 for an input that is
  not a rectangular list of finite numbers, 413 for one that fits no bucket): the front end then
  splits the batch, so that only that input's request fails. The model's own failure is a 500.
- ``GET /healthz``: 200 once every artefact is loaded and has run once (it listens only after that).

What a client can cost is bounded before it is paid (docs/security.md): the body's framing is
checked (one Content-Length of digits only, or chunked, never both), its size against MAX_BODY
and the bodies held at once against BODY_BUDGET before a byte is read (a chunked body as its
chunks arrive), the whole body within CLIENT_TIMEOUT, nesting, numbers and the inputs in one
request before any tensor is made. Every exception on a request's path answers that request.

It needs only the image's Python, torch and Neuron framework; it never imports inferentia_operator.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import neuron_compile

MIB = 1024 * 1024
# What one client may hold: seconds a read may wait (and a whole body may take), connections at
# once, one body, and the bodies held at once by every connection together. Environment
# variables of this program only, for tests that cannot wait the defaults.
CLIENT_TIMEOUT = float(os.environ.get("INFERENTIA_SERVE_CLIENT_TIMEOUT_S", "30"))
MAX_CONNECTIONS = int(os.environ.get("INFERENTIA_SERVE_MAX_CONNECTIONS", "256"))
MAX_BODY = int(float(os.environ.get("INFERENTIA_SERVE_MAX_BODY_MIB", "64")) * MIB)
BODY_BUDGET = int(float(os.environ.get("INFERENTIA_SERVE_BODY_BUDGET_MIB", "64")) * MIB)
# Inputs in one request: the front end sends at most maxBatchSize (at most 1,024), and each
# becomes a tensor before any runs.
MAX_INPUTS = 4096
# Nesting: the list of inputs, then each input's dimensions (the front end's MAX_DEPTH).
MAX_DEPTH = 33
# A chunk-size line: hex digits and extensions, as far as any client needs.
MAX_CHUNK_LINE = 1024
_DIGITS = re.compile(r"[0-9]+")
# The batching front end's CLOSE_BUSY, written again: this program runs in the user's image and
# imports nothing of the operator's package.
_BUSY_BODY = b'{"error": "too many connections; retry later"}'
BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\n"
    + f"Content-Length: {len(_BUSY_BODY)}\r\n\r\n".encode()
    + _BUSY_BODY
)


class BadInput(Exception):
    """A request refused as it stands: its status, why, and whether its connection must close
    (its body was not read whole, so the next bytes on it are not a request)."""

    def __init__(self, status: int, message: str, close: bool = False) -> None:
        super().__init__(message)
        self.status, self.close = status, close


def _not_json(constant: str) -> Any:
    raise BadInput(400, f"{constant} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise BadInput(400, f"{text} is beyond the range of a float; valid numbers are finite")
    return value


def _depth(value: Any) -> int:
    """How deeply lists and objects nest in ``value``, without recursion, counted no further than MAX_DEPTH + 1.
    batching.limits.depth_of, written again: this program imports nothing of the operator's package."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)):
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_DEPTH:
                return deepest
            # Only containers go on the stack: a flat list of a million numbers pushes nothing.
            stack.extend((v, depth) for v in (item.values() if isinstance(item, dict) else item) if isinstance(v, (list, dict)))
    return deepest


def parse_inputs(body: bytes) -> list[Any]:
    """The request's list of inputs, or BadInput(400) saying why not."""
    try:
        inputs = json.loads(body, parse_constant=_not_json, parse_float=_finite)
    except RecursionError:
        raise BadInput(400, f"the body is nested more than {MAX_DEPTH} deep") from None
    except ValueError:
        raise BadInput(400, "the body is not a JSON list of inputs") from None
    if not isinstance(inputs, list):
        raise BadInput(400, "a JSON list of inputs is expected")
    if len(inputs) > MAX_INPUTS:
        raise BadInput(413, f"{len(inputs)} inputs in one request; at most {MAX_INPUTS}")
    if _depth(inputs) > MAX_DEPTH:
        raise BadInput(400, f"the body is nested more than {MAX_DEPTH} deep")
    return inputs


class Budget:
    """The body bytes every connection holds at once (BODY_BUDGET), charged before they are read."""

    def __init__(self, limit: int) -> None:
        self.limit, self.held = limit, 0
        self.lock = threading.Lock()

    def take(self, size: int) -> bool:
        with self.lock:
            if self.held + size > self.limit:
                return False
            self.held += size
            return True

    def give(self, size: int) -> None:
        with self.lock:
            self.held -= size


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

    def handle_error(self, request: Any, client_address: Any) -> None:
        """One line, not socketserver's traceback: a client that resets its connection would
        otherwise write the log at will."""
        kind, exc, _ = sys.exc_info()
        if kind is not None and not issubclass(kind, (ConnectionError, TimeoutError)):
            print(f"serve: a connection failed: {kind.__name__}: {exc}", file=sys.stderr, flush=True)


def handler(model: Model, budget: Budget) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # A socket timeout (socketserver.StreamRequestHandler.timeout) on every read: a client
        # that dribbles its headers or body, or idles on a kept-alive connection, is closed after
        # it rather than holding a thread for ever.
        timeout = CLIENT_TIMEOUT

        def _json(self, status: int, body: Any, close: bool = False) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if status == 503:
                self.send_header("Retry-After", "1")
            if close:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path in ("/healthz", "/readyz"):
                self._json(200, {"ok": True, "buckets": model.shapes})
            else:
                self._json(404, {"error": "not found"})

        def do_POST(self) -> None:
            charged = [0]
            try:
                self._post(charged)
            except BadInput as exc:
                self._json(exc.status, {"error": str(exc)}, close=exc.close)
            except (ConnectionError, TimeoutError):
                self.close_connection = True  # the client left, or stalled past CLIENT_TIMEOUT: nobody to answer
            except Exception as exc:  # noqa: BLE001 - the model's own failure on these inputs: answered, and the server goes on
                lines = str(exc).strip().splitlines() or [type(exc).__name__]
                print(f"serve: a request failed: {type(exc).__name__}: {lines[-1]}", file=sys.stderr, flush=True)
                self._json(500, {"error": f"the model failed: {lines[-1]}"})
            finally:
                budget.give(charged[0])
                self.connection.settimeout(CLIENT_TIMEOUT)  # the next request on this connection waits as long as the first

        def _post(self, charged: list[int]) -> None:
            body = self._body(charged)
            if self.path not in ("/", "/predict"):
                raise BadInput(404, "not found")
            inputs = parse_inputs(body)
            del body
            self._json(200, model.predict(inputs))

        def _body(self, charged: list[int]) -> bytes:
            """The whole body, its framing checked and its bytes charged before they are read."""
            lengths = self.headers.get_all("Content-Length") or []
            encodings = [e.strip().lower() for v in self.headers.get_all("Transfer-Encoding") or [] for e in v.split(",")]
            if encodings and lengths:
                raise BadInput(400, "Content-Length and Transfer-Encoding together: one or the other", close=True)
            if encodings:
                if encodings != ["chunked"]:
                    raise BadInput(501, f"Transfer-Encoding {', '.join(encodings)} is not supported; chunked is", close=True)
                return self._chunked(charged, time.monotonic() + CLIENT_TIMEOUT)
            if any(not _DIGITS.fullmatch(v.strip()) for v in lengths) or len({v.strip() for v in lengths}) > 1:
                raise BadInput(400, "Content-Length must be one whole number of bytes", close=True)
            length = int(lengths[0]) if lengths else 0
            if length > MAX_BODY:
                raise BadInput(413, f"the body is larger than {MAX_BODY} bytes", close=True)
            self._charge(charged, length)
            return self._read(length, time.monotonic() + CLIENT_TIMEOUT)

        def _charge(self, charged: list[int], size: int) -> None:
            if not budget.take(size - charged[0]):
                raise BadInput(503, "too many request bytes in flight; retry later", close=True)
            charged[0] = size

        def _read(self, size: int, deadline: float) -> bytes:
            """``size`` bytes within the deadline; a client that closes first has left."""
            parts, left = [], size
            while left > 0:
                self._within(deadline)
                part = self.rfile.read1(min(left, 1 << 20))
                if not part:
                    raise ConnectionResetError("the client closed the connection mid-body")
                parts.append(part)
                left -= len(part)
            return b"".join(parts)

        def _line(self, deadline: float) -> bytes:
            self._within(deadline)
            line = self.rfile.readline(MAX_CHUNK_LINE + 1)
            if not line:
                raise ConnectionResetError("the client closed the connection mid-body")
            if len(line) > MAX_CHUNK_LINE or not line.endswith(b"\n"):
                raise BadInput(400, "a chunk-size line is too long", close=True)
            return line

        def _chunked(self, charged: list[int], deadline: float) -> bytes:
            """A chunked body (RFC 9112, section 7.1), each chunk charged as it arrives."""
            parts, size = [], 0
            while True:
                digits = self._line(deadline).split(b";", 1)[0].strip()
                if not digits or len(digits) > 16 or not all(c in b"0123456789abcdefABCDEF" for c in digits):
                    raise BadInput(400, "a chunk size is not a hexadecimal number", close=True)
                chunk = int(digits, 16)
                if chunk == 0:
                    break
                size += chunk
                if size > MAX_BODY:
                    raise BadInput(413, f"the body is larger than {MAX_BODY} bytes", close=True)
                self._charge(charged, size)
                parts.append(self._read(chunk, deadline))
                if self._read(2, deadline) != b"\r\n":
                    raise BadInput(400, "a chunk does not end with CRLF", close=True)
            while self._line(deadline) not in (b"\r\n", b"\n"):
                pass  # trailer fields, each bounded by MAX_CHUNK_LINE and all by the deadline
            return b"".join(parts)

        def _within(self, deadline: float) -> None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BadInput(408, f"the body did not arrive within {CLIENT_TIMEOUT:g} s", close=True)
            self.connection.settimeout(min(left, CLIENT_TIMEOUT))

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
    server = BoundedServer(("0.0.0.0", port), handler(model, Budget(BODY_BUDGET)))
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
