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
of this program:

- ``INFERENTIA_PD_PROXY_MAX_CONNECTIONS`` (1024): open client connections; one more gets 503 and is closed.
- ``INFERENTIA_PD_PROXY_MAX_BODY_MIB`` (4): one request body; 413 above it, unread. A body
  without a Content-Length is refused (411).
- ``INFERENTIA_PD_PROXY_CLIENT_TIMEOUT_S`` (30): a read from the client, and the whole body; 408 after.
- ``INFERENTIA_PD_PROXY_DEADLINE_S`` (300): one request from its body to the decode's last byte:
  the prefill's answer and each read of the decode's must come within what is left; 504 before
  the answer has started, the connection cut after.
- ``INFERENTIA_PD_PROXY_PREFILL_ANSWER_KIB`` (1024): the prefill's answer the proxy reads; 502 above it.

A request fails only itself: a prefill or decode server that refuses, fails or is gone answers
that request 502 (or the server's own 4xx), and the proxy goes on serving the others.

It needs only the image's Python (the standard library); it never imports inferentia_operator.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import os
import signal
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MIB = 1024 * 1024
MAX_CONNECTIONS = int(os.environ.get("INFERENTIA_PD_PROXY_MAX_CONNECTIONS", "1024"))
MAX_BODY = int(float(os.environ.get("INFERENTIA_PD_PROXY_MAX_BODY_MIB", "4")) * MIB)
CLIENT_TIMEOUT = float(os.environ.get("INFERENTIA_PD_PROXY_CLIENT_TIMEOUT_S", "30"))
DEADLINE = float(os.environ.get("INFERENTIA_PD_PROXY_DEADLINE_S", "300"))
PREFILL_ANSWER = int(float(os.environ.get("INFERENTIA_PD_PROXY_PREFILL_ANSWER_KIB", "1024")) * 1024)
CHUNK = 64 * 1024


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


def headers_for(request_id: str) -> dict[str, str]:
    out = {"Content-Type": "application/json", "X-Request-Id": request_id}
    key = os.environ.get("OPENAI_API_KEY")
    if key:
        out["Authorization"] = f"Bearer {key}"
    return out


def call_prefill(where: tuple[str, int], api: str, body: dict[str, Any], request_id: str, deadline: float) -> dict[str, Any]:
    conn = http.client.HTTPConnection(where[0], where[1], timeout=left(deadline))
    try:
        conn.request("POST", f"/v1{api}", body=json.dumps(prefill_request(body)).encode(), headers=headers_for(request_id))
        answer = conn.getresponse()
        data = answer.read(PREFILL_ANSWER + 1)
    except TimeoutError:
        raise Failed(504, f"prefill server {where[0]}:{where[1]} did not answer within the request's deadline") from None
    except OSError as exc:
        raise Failed(502, f"prefill server {where[0]}:{where[1]}: {exc}") from None
    finally:
        conn.close()
    if len(data) > PREFILL_ANSWER:
        raise Failed(502, f"prefill server {where[0]}:{where[1]} answered more than {PREFILL_ANSWER} bytes")
    if answer.status >= 400:
        raise Failed(answer.status if answer.status < 500 else 502,
                     f"prefill server {where[0]}:{where[1]} answered {answer.status}: {data[:512].decode(errors='replace')}")  # fmt: skip
    try:
        found = json.loads(data)
    except ValueError:
        raise Failed(502, f"prefill server {where[0]}:{where[1]} answered no JSON") from None
    return found if isinstance(found, dict) else {}


def serve(args: argparse.Namespace) -> ThreadingHTTPServer:
    prefill, decode = RoundRobin(args.prefiller_instances), RoundRobin(args.decoder_instances)
    slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = CLIENT_TIMEOUT  # every read from the client's socket

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
                self._json(200, {"status": "ok", "prefill_instances": len(prefill.instances),
                                 "decode_instances": len(decode.instances)})  # fmt: skip
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
            length = self.headers.get("Content-Length")
            if self.headers.get("Transfer-Encoding") or length is None:
                raise Failed(411, "a request needs a Content-Length")
            if not length.isdigit():
                raise Failed(400, "Content-Length is not a number")
            if int(length) > MAX_BODY:
                raise Failed(413, f"a request body is at most {MAX_BODY} bytes")
            ends, data = time.monotonic() + CLIENT_TIMEOUT, b""
            try:
                while len(data) < int(length):
                    if time.monotonic() > ends:
                        raise Failed(408, "the body took too long")
                    piece = self.rfile.read1(int(length) - len(data))
                    if not piece:
                        raise Failed(400, "the body ended early")
                    data += piece
            except TimeoutError:
                raise Failed(408, "the body took too long") from None
            try:
                body = json.loads(data)
            except ValueError:
                raise Failed(400, "the body is not JSON") from None
            if not isinstance(body, dict):
                raise Failed(400, "the body is not a JSON object")
            return body

        def _relay(self, api: str, body: dict[str, Any]) -> None:
            deadline = time.monotonic() + DEADLINE
            request_id = str(uuid.uuid4())
            found = call_prefill(prefill.next(), api, body, request_id, deadline)
            kv = found.get("kv_transfer_params")
            if kv:
                body = {**body, "kv_transfer_params": kv}
            where = decode.next()
            conn = http.client.HTTPConnection(where[0], where[1], timeout=left(deadline))
            try:
                try:
                    conn.request("POST", f"/v1{api}", body=json.dumps(body).encode(), headers=headers_for(request_id))
                    answer = conn.getresponse()
                except TimeoutError:
                    raise Failed(504, f"decode server {where[0]}:{where[1]} did not answer within the request's deadline") from None
                except OSError as exc:
                    raise Failed(502, f"decode server {where[0]}:{where[1]}: {exc}") from None
                if answer.status >= 400:
                    text = answer.read(4096).decode(errors="replace")
                    raise Failed(answer.status if answer.status < 500 else 502,
                                 f"decode server {where[0]}:{where[1]} answered {answer.status}: {text}")  # fmt: skip
                self._stream(answer, conn, deadline)
            finally:
                conn.close()

        def _stream(self, answer: http.client.HTTPResponse, conn: http.client.HTTPConnection, deadline: float) -> None:
            """The decode's answer, piece by piece as it comes (the toy's StreamingResponse)."""
            self.send_response(answer.status)
            self.send_header("Content-Type", answer.getheader("Content-Type") or "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self.close_connection = True  # past the deadline mid-answer: cut, as the client will see
                    return
                if conn.sock is not None:
                    conn.sock.settimeout(remaining)
                try:
                    piece = answer.read1(CHUNK)
                except (OSError, http.client.HTTPException):
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

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = MAX_CONNECTIONS

        def process_request(self, request: Any, client_address: Any) -> None:
            if not slots.acquire(blocking=False):
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
                slots.release()

    return Server((args.host, args.port), Handler)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    server = serve(args)
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
