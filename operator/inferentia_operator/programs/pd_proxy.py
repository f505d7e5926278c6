"""The proxy in front of disaggregated prefill and decode servers (vLLM on the vLLM Neuron plugin,
Trn2 and Trn3), as AWS's tutorial runs it: each request goes to a prefill server with
``max_tokens=1``, then to a decode server with the ``kv_transfer_params`` the prefill returned,
and the decode's answer is streamed back.

The command line is the toy proxy's (``toy_proxy_server.py``: ``--host``, ``--port``,
``--prefiller-hosts``/``--prefiller-host``, ``--prefiller-ports``/``--prefiller-port``,
``--decoder-hosts``/``--decoder-host``, ``--decoder-ports``/``--decoder-port``, each list paired
by position, "Number of prefiller hosts must match number of prefiller ports"), and so is the
routing: round robin over each list independently ("prefill and decode selection are decoupled"),
the prefill request's ``kv_transfer_params`` {do_remote_decode: true, do_remote_prefill: false,
remote_*: null}, ``stream`` false, ``max_tokens`` (and ``max_completion_tokens``) 1, no
``stream_options``, ``min_tokens`` held back for the decode; ``POST /v1/completions``,
``POST /v1/chat/completions`` and ``GET /healthcheck``. Sources: "Tutorial: Configure
disaggregated inference with 1P1D and xPyD", Step 3 and Step 5
(https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/tutorials/tutorial-di-1p1d-xpyd.html),
the DI design page's "Proxy Server" and "Request Flow (read mode)"
(https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/design/vllm/disaggregated-inference.html),
and vLLM's tests/v1/kv_connector/nixl_integration/toy_proxy_server.py (vllm-project/vllm 030ea52e).

Why this is the operator's own program and not a stand-in: the docs place the proxy outside vLLM
and the plugin. The design page's component table calls it "Application-level (not vLLM)", a
"CPU-only load balancer"; the toy proxy is an example in the vllm-neuron repository
(``examples/vllm_neuron/vllm/disaggregated_inference/``), not a module of the installed package,
and the tutorial says "For production deployments, consider using an orchestrator". So the serving
pod runs a proxy the project ships, with the toy's interface, and with what the toy lacks: it
bounds what a client can hold (docs/security.md, "The limits"), each limit an environment variable
of this program, checked at start (a value that is not a positive number stops it, exit code 2):

- ``INFERENTIA_PD_PROXY_MAX_CONNECTIONS`` (1024): open client connections; one more gets 503 and is closed.
- ``INFERENTIA_PD_PROXY_MAX_PEER_CONNECTIONS`` (a quarter of the connections, 256): open
  connections from one address; one more gets 503 and is closed.
- ``INFERENTIA_PD_PROXY_HEADER_TIMEOUT_S`` (15): from a connection's accept, or its last answer,
  to the end of a request's headers, however the bytes trickle; the connection is closed after.
- ``INFERENTIA_PD_PROXY_IDLE_TIMEOUT_S`` (5): a kept-alive connection waiting for its next request.
- ``INFERENTIA_PD_PROXY_MAX_BODY_MIB`` (4): one request body; 413 above it, unread. A body
  without a Content-Length is refused (411), one that is not ASCII digits too (400).
- ``INFERENTIA_PD_PROXY_CLIENT_TIMEOUT_S`` (30): a read from the client, a write to it, and the
  whole body from its first read; 408 after.
- ``INFERENTIA_PD_PROXY_DEADLINE_S`` (300): one request from its body to the decode's last byte:
  every read of the prefill's answer and of the decode's must come within what is left; 504
  before the answer has started, the connection cut after.
- ``INFERENTIA_PD_PROXY_PREFILL_ANSWER_KIB`` (1024): the prefill's answer the proxy reads; 502 above it.

A request fails only itself: a prefill or decode server that refuses, fails or is gone answers
that request 502 (or the server's own 4xx), and the proxy goes on serving the others.

It needs only the image's Python (the standard library); it never imports inferentia_operator.
"""

from __future__ import annotations

import argparse
import functools
import http.client
import io
import itertools
import json
import math
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MIB = 1024 * 1024
# The defaults of the limits below; main reads each from its environment variable (VARIABLES).
MAX_CONNECTIONS = 1024
PEER_SHARE = 4  # one address may hold the connections over this, also when only their number is set
MAX_PEER_CONNECTIONS = MAX_CONNECTIONS // PEER_SHARE
MAX_BODY = 4 * MIB
HEADER_TIMEOUT = 15.0
IDLE_TIMEOUT = 5.0
CLIENT_TIMEOUT = 30.0
DEADLINE = 300.0
PREFILL_ANSWER = 1024 * 1024
CHUNK = 64 * 1024


@dataclass(frozen=True)
class Limits:
    max_connections: int = MAX_CONNECTIONS
    max_peer_connections: int = MAX_PEER_CONNECTIONS
    max_body: int = MAX_BODY
    header_timeout: float = HEADER_TIMEOUT
    idle_timeout: float = IDLE_TIMEOUT
    client_timeout: float = CLIENT_TIMEOUT
    deadline: float = DEADLINE
    prefill_answer: int = PREFILL_ANSWER


# Each variable: the field it sets, and the bytes (or 1) in one unit of it; 0 reads a whole number.
VARIABLES: dict[str, tuple[str, int]] = {
    "INFERENTIA_PD_PROXY_MAX_CONNECTIONS": ("max_connections", 0),
    "INFERENTIA_PD_PROXY_MAX_PEER_CONNECTIONS": ("max_peer_connections", 0),
    "INFERENTIA_PD_PROXY_MAX_BODY_MIB": ("max_body", MIB),
    "INFERENTIA_PD_PROXY_HEADER_TIMEOUT_S": ("header_timeout", 1),
    "INFERENTIA_PD_PROXY_IDLE_TIMEOUT_S": ("idle_timeout", 1),
    "INFERENTIA_PD_PROXY_CLIENT_TIMEOUT_S": ("client_timeout", 1),
    "INFERENTIA_PD_PROXY_DEADLINE_S": ("deadline", 1),
    "INFERENTIA_PD_PROXY_PREFILL_ANSWER_KIB": ("prefill_answer", 1024),
}


def limits_from(env: Mapping[str, str]) -> Limits:
    """The limits the environment sets, or ValueError naming the variable that is not one."""
    values: dict[str, int | float] = {}
    for name, (field, unit) in VARIABLES.items():
        if (text := env.get(name)) is not None:
            values[field] = _limit(name, text, unit)
    if "max_peer_connections" not in values and "max_connections" in values:
        values["max_peer_connections"] = max(1, int(values["max_connections"]) // PEER_SHARE)
    return Limits(**values)  # type: ignore[arg-type]


def _limit(name: str, text: str, unit: int) -> int | float:
    try:
        number: int | float = int(text) if unit == 0 else float(text)
    except ValueError:  # not a number, or an int past Python's 4,300 digits
        number = math.nan
    if unit > 1 and math.isfinite(number):
        number = int(number * unit)  # a byte count: a fraction of a byte is none
    if not math.isfinite(number) or number <= 0:
        wanted = "a whole number above 0" if unit == 0 else "a finite number above 0"
        raise ValueError(f"{name}={text!r}: must be {wanted}" + (", at least one byte" if unit > 1 else ""))
    return number


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The toy proxy's flags and defaults, and its check that each host list pairs with its ports."""
    p = argparse.ArgumentParser(prog="pd_proxy.py")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--host", type=str, default="127.0.0.1")
    p.add_argument("--prefiller-hosts", "--prefiller-host", type=str, nargs="+", default=["localhost"])
    p.add_argument("--prefiller-ports", "--prefiller-port", type=int, nargs="+", default=[8100])
    p.add_argument("--decoder-hosts", "--decoder-host", type=str, nargs="+", default=["localhost"])
    p.add_argument("--decoder-ports", "--decoder-port", type=int, nargs="+", default=[8200])
    args = p.parse_args(argv)
    if len(args.prefiller_hosts) != len(args.prefiller_ports):
        p.error("Number of prefiller hosts must match number of prefiller ports")
    if len(args.decoder_hosts) != len(args.decoder_ports):
        p.error("Number of decoder hosts must match number of decoder ports")
    args.prefiller_instances = list(zip(args.prefiller_hosts, args.prefiller_ports, strict=True))
    args.decoder_instances = list(zip(args.decoder_hosts, args.decoder_ports, strict=True))
    return args


class RoundRobin:
    def __init__(self, instances: list[tuple[str, int]]) -> None:
        self.instances = instances
        self.cycle = itertools.cycle(range(len(instances)))
        self.lock = threading.Lock()

    def next(self) -> tuple[str, int]:
        with self.lock:
            return self.instances[next(self.cycle)]


class Failed(Exception):
    """A request that fails here, with the status and message its client gets."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def prefill_request(body: dict[str, Any]) -> dict[str, Any]:
    """What the toy proxy sends the prefill server (send_request_to_service)."""
    data = dict(body)
    data["kv_transfer_params"] = {
        "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None, "remote_block_ids": None,
        "remote_host": None, "remote_port": None,
    }  # fmt: skip
    data["stream"] = False
    data["max_tokens"] = 1
    if "max_completion_tokens" in data:
        data["max_completion_tokens"] = 1
    data.pop("stream_options", None)
    data.pop("min_tokens", None)
    data.pop("min_completion_tokens", None)
    return data


def left(deadline: float) -> float:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise Failed(504, "the request's deadline passed")
    return remaining


class Timed(io.RawIOBase):
    """A socket's reads (``raw``, its unbuffered file), each allowed at most ``per_read`` (None: no
    bound of its own) and nothing past ``until``, which its owner moves from phase to phase. A
    socket timeout alone is armed afresh at every receive, so a peer sending a byte just within it
    would hold a read of headers, a body or an answer open for ever."""

    def __init__(self, raw: io.RawIOBase, sock: socket.socket, per_read: float | None, until: float = math.inf) -> None:
        super().__init__()
        self.raw, self.sock, self.per_read, self.until = raw, sock, per_read, until

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        remaining = self.until - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the deadline passed")
        self.sock.settimeout(remaining if self.per_read is None else min(self.per_read, remaining))
        try:
            return self.raw.readinto(buffer)
        finally:
            if self.per_read is not None:
                # Writes share the socket's timeout: they keep a read's whole allowance, not its rest.
                self.sock.settimeout(self.per_read)

    def close(self) -> None:
        self.raw.close()  # the socket's own close waits for this file's (socket.makefile's references)
        super().close()


class _Answer(http.client.HTTPResponse):
    """A prefill or decode server's answer, every read of it held to the request's deadline."""

    def __init__(self, sock: socket.socket, *args: Any, until: float, **kwargs: Any) -> None:
        super().__init__(sock, *args, **kwargs)
        self.fp = io.BufferedReader(Timed(self.fp.detach(), sock, None, until))


class Upstream(http.client.HTTPConnection):
    def __init__(self, where: tuple[str, int], deadline: float) -> None:
        super().__init__(where[0], where[1], timeout=left(deadline))
        self.response_class = functools.partial(_Answer, until=deadline)  # type: ignore[assignment]


def headers_for(request_id: str) -> dict[str, str]:
    # No Authorization: the toy proxy sends OPENAI_API_KEY as a bearer token, but the operator sets
    # none in the proxy's pod and its prefill and decode servers take none (no --api-key).
    return {"Content-Type": "application/json", "X-Request-Id": request_id}


def call_prefill(where: tuple[str, int], api: str, body: dict[str, Any], request_id: str, deadline: float, most: int) -> dict[str, Any]:
    """The prefill's answer, of at most ``most`` bytes, all of it within the request's deadline."""
    conn = Upstream(where, deadline)
    try:
        conn.request("POST", f"/v1{api}", body=json.dumps(prefill_request(body)).encode(), headers=headers_for(request_id))
        answer = conn.getresponse()
        data = answer.read(most + 1)
    except TimeoutError:
        raise Failed(504, f"prefill server {where[0]}:{where[1]} did not answer within the request's deadline") from None
    except (OSError, http.client.HTTPException) as exc:
        raise Failed(502, f"prefill server {where[0]}:{where[1]}: {exc}") from None
    finally:
        conn.close()
    if len(data) > most:
        raise Failed(502, f"prefill server {where[0]}:{where[1]} answered more than {most} bytes")
    if answer.status >= 400:
        raise Failed(answer.status if answer.status < 500 else 502,
                     f"prefill server {where[0]}:{where[1]} answered {answer.status}: {data[:512].decode(errors='replace')}")  # fmt: skip
    try:
        found = json.loads(data)
    except ValueError:
        raise Failed(502, f"prefill server {where[0]}:{where[1]} answered no JSON") from None
    return found if isinstance(found, dict) else {}


def call_decode(conn: Upstream, where: tuple[str, int], api: str, body: dict[str, Any], request_id: str) -> http.client.HTTPResponse:
    """The decode's answer once it has started, or Failed."""
    try:
        conn.request("POST", f"/v1{api}", body=json.dumps(body).encode(), headers=headers_for(request_id))
        answer = conn.getresponse()
        if answer.status < 400:
            return answer
        text = answer.read(4096).decode(errors="replace")
    except TimeoutError:
        raise Failed(504, f"decode server {where[0]}:{where[1]} did not answer within the request's deadline") from None
    except (OSError, http.client.HTTPException) as exc:
        raise Failed(502, f"decode server {where[0]}:{where[1]}: {exc}") from None
    raise Failed(answer.status if answer.status < 500 else 502, f"decode server {where[0]}:{where[1]} answered {answer.status}: {text}")


def content_length(value: str | None, most: int) -> int:
    """A body's declared length, or Failed: 411 without one, 400 for anything but ASCII digits
    (``str.isdigit`` takes '²', which int refuses), 413 above ``most``. The digits are counted
    before int reads them: more than ``most`` has is always above it, and int refuses more than
    4,300."""
    if value is None:
        raise Failed(411, "a request needs a Content-Length")
    if not (value.isascii() and value.isdigit()):
        raise Failed(400, "Content-Length is not a number")
    digits = value.lstrip("0") or "0"
    if len(digits) > len(str(most)) or int(digits) > most:
        raise Failed(413, f"a request body is at most {most} bytes")
    return int(digits)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ProxyServer

    def setup(self) -> None:
        super().setup()
        per_read = self.server.limits.client_timeout
        # Writes go through the socket without the reader: this timeout is what bounds them.
        self.connection.settimeout(per_read)
        self.reader = Timed(self.rfile.detach(), self.connection, per_read)
        self.rfile = self.buffered = io.BufferedReader(self.reader)

    def handle(self) -> None:
        """Requests, as long as the client keeps the connection: each one's headers within the
        header deadline, from the connection's accept, then from the end of the last answer, and
        the next one's first byte within the idle timeout."""
        limits, since = self.server.limits, self.server.accepted(self.request)
        self.close_connection = True
        while True:
            self.reader.until = since + limits.header_timeout
            try:
                self.handle_one_request()
            except OSError:
                return  # the client reset the connection: nothing to answer, and no traceback
            if self.close_connection:
                return
            since = time.monotonic()
            self.reader.until = since + limits.idle_timeout
            try:
                if not self.buffered.peek(1):
                    return
            except OSError:
                return

    def _json(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if code >= 400:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/healthcheck":
            self._json(200, {"status": "ok", "prefill_instances": len(self.server.prefill.instances),
                             "decode_instances": len(self.server.decode.instances)})  # fmt: skip
        else:
            self._json(404, {"error": "not found"})

    def do_POST(self) -> None:
        api = {"/v1/completions": "/completions", "/v1/chat/completions": "/chat/completions"}.get(self.path)
        if api is None:
            self._json(404, {"error": "not found"})
            return
        try:
            body = self._body()
            self._relay(api, body)
        except Failed as exc:
            self._json(exc.status, {"error": str(exc)})
        except OSError:
            self.close_connection = True  # the client went away or stopped reading: only its request ends

    def _body(self) -> dict[str, Any]:
        if self.headers.get("Transfer-Encoding"):
            raise Failed(411, "a request needs a Content-Length")
        if len(set(self.headers.get_all("Content-Length") or [])) > 1:
            raise Failed(400, "Content-Length given twice")
        length = content_length(self.headers.get("Content-Length"), self.server.limits.max_body)
        self.reader.until, data = time.monotonic() + self.server.limits.client_timeout, b""
        try:
            while len(data) < length:
                piece = self.rfile.read1(length - len(data))
                if not piece:
                    raise Failed(400, "the body ended early")
                data += piece
        except TimeoutError:
            raise Failed(408, "the body took too long") from None
        finally:
            self.reader.until = math.inf  # the relay reads nothing more from the client
        try:
            body = json.loads(data)
        except ValueError:
            raise Failed(400, "the body is not JSON") from None
        if not isinstance(body, dict):
            raise Failed(400, "the body is not a JSON object")
        return body

    def _relay(self, api: str, body: dict[str, Any]) -> None:
        server = self.server
        deadline = time.monotonic() + server.limits.deadline
        request_id = str(uuid.uuid4())
        found = call_prefill(server.prefill.next(), api, body, request_id, deadline, server.limits.prefill_answer)
        # The client's own kv_transfer_params never reach the decode: they would have it fetch
        # blocks from whatever host and port they name. Without the prefill's, the decode
        # computes the prompt itself, as NixlConnector does for a request without them.
        body = {key: value for key, value in body.items() if key != "kv_transfer_params"}
        kv = found.get("kv_transfer_params")
        if kv:
            body["kv_transfer_params"] = kv
        where = server.decode.next()
        conn = Upstream(where, deadline)
        try:
            self._stream(call_decode(conn, where, api, body, request_id))
        finally:
            conn.close()

    def _stream(self, answer: http.client.HTTPResponse) -> None:
        """The decode's answer, piece by piece as it comes (the toy's StreamingResponse)."""
        self.send_response(answer.status)
        self.send_header("Content-Type", answer.getheader("Content-Type") or "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        while True:
            try:
                piece = answer.read1(CHUNK)
            except (OSError, http.client.HTTPException):
                # Past the deadline, or the decode failed, mid-answer: cut, as the client will see.
                self.close_connection = True
                return
            if not piece:
                break
            self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def log_message(self, format: str, *args: Any) -> None:
        pass


class ProxyServer(ThreadingHTTPServer):
    """A thread per connection, within ``max_connections`` in all and ``max_peer_connections``
    from one address; one more gets 503 and is closed. Its threads are not daemons: on SIGTERM
    server_close joins them, so the requests in hand are answered before the process exits (a
    daemon thread dies with it, its client cut mid-request)."""

    daemon_threads = False

    def __init__(self, address: tuple[str, int], limits: Limits, prefill: RoundRobin, decode: RoundRobin) -> None:
        self.limits, self.prefill, self.decode = limits, prefill, decode
        self.request_queue_size = limits.max_connections
        self.lock = threading.Lock()
        self.held = 0
        self.by_peer: dict[str, int] = {}
        self.accepts: dict[socket.socket, float] = {}
        super().__init__(address, Handler)

    def accepted(self, request: socket.socket) -> float:
        """When the connection was accepted, which its header deadline counts from."""
        with self.lock:
            return self.accepts.pop(request, time.monotonic())

    def process_request(self, request: Any, client_address: Any) -> None:
        peer = client_address[0]
        with self.lock:
            admitted = self.held < self.limits.max_connections and self.by_peer.get(peer, 0) < self.limits.max_peer_connections
            if admitted:
                self.held += 1
                self.by_peer[peer] = self.by_peer.get(peer, 0) + 1
                self.accepts[request] = time.monotonic()
        if not admitted:
            try:
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            except OSError:
                pass
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.lock:
                self.held -= 1
                self.by_peer[client_address[0]] -= 1
                if not self.by_peer[client_address[0]]:
                    del self.by_peer[client_address[0]]


def serve(args: argparse.Namespace, limits: Limits | None = None) -> ProxyServer:
    return ProxyServer((args.host, args.port), limits or Limits(), RoundRobin(args.prefiller_instances), RoundRobin(args.decoder_instances))


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        limits = limits_from(os.environ)
    except ValueError as exc:
        print(f"pd_proxy.py: {exc}", file=sys.stderr)
        return 2
    server = serve(args, limits)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    print(
        f"Initialized {len(args.prefiller_instances)} prefill clients and {len(args.decoder_instances)} decode clients; "
        f"listening on {args.host}:{args.port}",
        flush=True,
    )
    server.serve_forever()
    server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
