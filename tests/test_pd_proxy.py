"""The proxy in front of disaggregated prefill and decode servers (programs/pd_proxy.py), run as a
real process on 127.0.0.1 before stub servers that record what it sends them: the toy proxy's
command line and routing, and the bounds it keeps (its docstring). Each wait is for an event; the
timeouts are only a safety net."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from inferentia_operator import programs
from ports import free_port
from test_disaggregated import get, post

PROXY = Path(__file__).resolve().parent.parent / "operator" / "inferentia_operator" / "programs" / programs.PD_PROXY_PROGRAM
SAFETY = 60  # seconds: only if something hangs


def start_proxy(prefill: list[int], decode: list[int], **env: str) -> tuple[subprocess.Popen, int]:
    """The proxy, once it answers /healthcheck."""
    port = free_port()
    argv = [sys.executable, str(PROXY), "--port", str(port), "--prefiller-hosts", *["127.0.0.1"] * len(prefill),
            "--prefiller-ports", *map(str, prefill), "--decoder-hosts", *["127.0.0.1"] * len(decode),
            "--decoder-ports", *map(str, decode)]  # fmt: skip
    proc = subprocess.Popen(argv, env={"PATH": "/usr/bin:/bin", **env}, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + SAFETY
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        try:
            if get(port, "/healthcheck")[0] == 200:
                return proc, port
        except OSError:
            time.sleep(0.05)
    raise AssertionError("the proxy never answered /healthcheck")


@pytest.fixture
def proxies():
    started: list[subprocess.Popen] = []

    def start(prefill: list[int], decode: list[int], **env: str) -> int:
        proc, port = start_proxy(prefill, decode, **env)
        started.append(proc)
        return port

    yield start
    for proc in started:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=SAFETY)


class Stub:
    """A server that records what it was sent and answers as a prefill or decode server would."""

    def __init__(self, role: str, hold: threading.Event | None = None, params: bool = True) -> None:
        self.role, self.hold, self.seen = role, hold, []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.seen.append(body)
                if stub.hold is not None:
                    stub.hold.wait(SAFETY)
                answer = {"choices": [{"text": stub.role}]}
                if stub.role == "prefill" and params:
                    answer["kv_transfer_params"] = {"remote_engine_id": f"e{self.server.server_port}"}
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_port
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_the_proxy_round_robins_each_list_on_its_own_and_sends_what_the_toy_proxy_sends(proxies):
    prefills, decodes = [Stub("prefill") for _ in range(2)], [Stub("decode") for _ in range(3)]
    proxy = proxies([s.port for s in prefills], [s.port for s in decodes])
    for _ in range(6):
        body = {"model": "m", "prompt": "p", "max_tokens": 9, "stream": True, "stream_options": {}, "min_tokens": 2}
        status, text = post(proxy, "/v1/completions", body)
        assert status == 200 and json.loads(text)["choices"][0]["text"] == "decode", text
    assert [len(s.seen) for s in prefills] == [3, 3] and [len(s.seen) for s in decodes] == [2, 2, 2]
    sent = prefills[0].seen[0]
    assert sent["max_tokens"] == 1 and sent["stream"] is False and "stream_options" not in sent and "min_tokens" not in sent
    assert sent["kv_transfer_params"] == {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                                          "remote_block_ids": None, "remote_host": None, "remote_port": None}  # fmt: skip
    to_decode = decodes[0].seen[0]
    assert to_decode["max_tokens"] == 9 and to_decode["min_tokens"] == 2
    assert to_decode["kv_transfer_params"] == {"remote_engine_id": f"e{prefills[0].port}"}


@pytest.mark.parametrize("params", [True, False])
def test_a_clients_own_kv_transfer_params_reach_neither_server(proxies, params):
    """A client's kv_transfer_params would have the decode server connect to whatever host and
    port they name: the prefill sees only the proxy's, the decode only the prefill's or none."""
    prefill, decode = Stub("prefill", params=params), Stub("decode")
    proxy = proxies([prefill.port], [decode.port])
    theirs = {"do_remote_prefill": True, "remote_engine_id": "x", "remote_block_ids": [1, 2],
              "remote_host": "attacker.example", "remote_port": 5557}  # fmt: skip
    status, text = post(proxy, "/v1/completions", {"model": "m", "prompt": "p", "kv_transfer_params": theirs})
    assert status == 200, text
    assert "attacker.example" not in json.dumps(prefill.seen) and "attacker.example" not in json.dumps(decode.seen)
    assert prefill.seen[0]["kv_transfer_params"]["do_remote_decode"] is True
    if params:
        assert decode.seen[0]["kv_transfer_params"] == {"remote_engine_id": f"e{prefill.port}"}
    else:
        assert "kv_transfer_params" not in decode.seen[0]


def test_the_proxy_bounds_bodies_and_a_requests_time(proxies):
    hold = threading.Event()
    prefill, decode = Stub("prefill"), Stub("decode", hold)
    try:
        proxy = proxies([prefill.port], [decode.port], INFERENTIA_PD_PROXY_MAX_BODY_MIB="0.001",
                              INFERENTIA_PD_PROXY_DEADLINE_S="1")  # fmt: skip
        assert post(proxy, "/v1/completions", None, raw=b"x" * 2000)[0] == 413
        assert post(proxy, "/v1/completions", None, raw=b"[1, 2]")[0] == 400
        assert post(proxy, "/v1/completions", None, raw=b"{not json")[0] == 400
        status, text = post(proxy, "/v1/completions", {"prompt": "p"})  # the decode holds past the deadline
        assert status == 504, text
    finally:
        hold.set()
    # The held request failed only itself: the same servers answer through a proxy without the short deadline.
    assert post(proxies([prefill.port], [decode.port]), "/v1/completions", {"prompt": "p"})[0] == 200


@pytest.mark.parametrize(("flags", "said"), [
    (["--prefiller-hosts", "a", "b", "--prefiller-ports", "1"], "Number of prefiller hosts must match number of prefiller ports"),
    (["--decoder-host", "a", "--decoder-port", "1", "2"], "Number of decoder hosts must match number of decoder ports"),
])  # fmt: skip
def test_the_proxy_takes_the_toy_proxys_command_line(flags, said):
    done = subprocess.run([sys.executable, str(PROXY), *flags], capture_output=True, text=True, timeout=SAFETY)
    assert done.returncode == 2 and said in done.stderr, done.stderr


def test_the_proxy_answers_503_past_its_connections(proxies):
    """A connection that sends nothing holds its slot (until INFERENTIA_PD_PROXY_CLIENT_TIMEOUT_S);
    the next one is refused at once. The idle connection may itself meet the slot of a check that
    has just closed, not yet released: then it is the one refused, and the test takes another."""
    proxy = proxies([free_port()], [free_port()], INFERENTIA_PD_PROXY_MAX_CONNECTIONS="1")
    for _ in range(50):
        with socket.create_connection(("127.0.0.1", proxy), timeout=SAFETY):
            if get(proxy, "/healthcheck")[0] == 503:
                break
    else:
        raise AssertionError("an idle connection never held the proxy's only slot")
    deadline = time.monotonic() + SAFETY
    while get(proxy, "/healthcheck")[0] != 200:  # the slot is free once the idle connection closed
        assert time.monotonic() < deadline
        time.sleep(0.05)


def exchange(port: int, data: bytes, source: str = "127.0.0.1") -> bytes:
    """What the proxy answers to these bytes, up to its closing the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=SAFETY, source_address=(source, 0)) as s:
        s.sendall(data)
        answer = b""
        while piece := s.recv(65536):
            answer += piece
        return answer


@pytest.mark.parametrize("length", ["²", "9" * 5000, "-1", "1_0"])
def test_an_odd_content_length_is_refused_and_fails_only_its_request(proxies, length):
    proxy = proxies([free_port()], [free_port()])
    # Headers are read as Latin-1: the byte 0xb2 is "²", which str.isdigit takes and int refuses.
    answer = exchange(proxy, f"POST /v1/completions HTTP/1.1\r\nContent-Length: {length}\r\n\r\n".encode("latin-1"))
    assert answer.startswith((b"HTTP/1.1 400", b"HTTP/1.1 413")), answer
    assert get(proxy, "/healthcheck")[0] == 200


@pytest.mark.parametrize(("name", "value"), [
    ("INFERENTIA_PD_PROXY_MAX_CONNECTIONS", "many"), ("INFERENTIA_PD_PROXY_MAX_CONNECTIONS", "0"),
    ("INFERENTIA_PD_PROXY_MAX_PEER_CONNECTIONS", "-2"), ("INFERENTIA_PD_PROXY_MAX_BODY_MIB", "0"),
    ("INFERENTIA_PD_PROXY_CLIENT_TIMEOUT_S", "nan"), ("INFERENTIA_PD_PROXY_DEADLINE_S", "-1"),
    ("INFERENTIA_PD_PROXY_HEADER_TIMEOUT_S", "inf"), ("INFERENTIA_PD_PROXY_IDLE_TIMEOUT_S", "0"),
    ("INFERENTIA_PD_PROXY_PREFILL_ANSWER_KIB", "0.0001"),
])  # fmt: skip
def test_a_bad_limit_stops_the_proxy_with_its_name(name, value):
    done = subprocess.run([sys.executable, str(PROXY), "--port", str(free_port())], capture_output=True, text=True,
                          timeout=SAFETY, env={"PATH": "/usr/bin:/bin", name: value})  # fmt: skip
    assert done.returncode == 2 and name in done.stderr and "Traceback" not in done.stderr, done.stderr


def trickle(port: int, head: bytes, data: bytes, every: float = 0.1) -> bytes | None:
    """Sends `head`, then `data` a byte at a time, each `every` seconds after the last, until the
    proxy closes the connection: what it answered then, or None if the bytes ran out first."""
    with socket.create_connection(("127.0.0.1", port), timeout=SAFETY) as s:
        closed, answer = threading.Event(), bytearray()

        def read() -> None:
            while piece := s.recv(65536):
                answer.extend(piece)
            closed.set()

        threading.Thread(target=read, daemon=True).start()
        s.sendall(head)
        for byte in data:
            try:
                s.sendall(bytes([byte]))
            except OSError:
                break
            if closed.wait(every):
                break
        return bytes(answer) if closed.wait(SAFETY) else None


def test_headers_sent_a_byte_at_a_time_lose_the_connection_at_the_header_deadline(proxies):
    """Each byte comes well within the read timeout, so only the deadline from accept ends it."""
    proxy = proxies([free_port()], [free_port()], INFERENTIA_PD_PROXY_HEADER_TIMEOUT_S="1")
    assert trickle(proxy, b"", b"GET /healthcheck HTTP/1.1\r\nX: " + b"y" * 60_000) == b""


def test_a_kept_alive_connection_goes_when_idle(proxies):
    proxy = proxies([free_port()], [free_port()], INFERENTIA_PD_PROXY_IDLE_TIMEOUT_S="0.2")
    with socket.create_connection(("127.0.0.1", proxy), timeout=10) as s:
        s.sendall(b"GET /healthcheck HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while piece := s.recv(65536):  # closed well before the 10 s here, and the 30 s a read may take
            answer += piece
    assert answer.startswith(b"HTTP/1.1 200"), answer


def test_a_body_sent_a_byte_at_a_time_gets_408_at_the_body_deadline(proxies):
    proxy = proxies([free_port()], [free_port()], INFERENTIA_PD_PROXY_CLIENT_TIMEOUT_S="1")
    answer = trickle(proxy, b"POST /v1/completions HTTP/1.1\r\nContent-Length: 100000\r\n\r\n", b" " * 100_000)
    assert answer is not None and answer.startswith(b"HTTP/1.1 408"), answer


def test_a_read_ends_at_its_deadline_not_at_the_read_timeout():
    """The reader the proxy puts under each socket: a peer that sends nothing is cut at the
    phase's deadline, though a read alone may take far longer."""
    from inferentia_operator.programs import pd_proxy

    ours, theirs = socket.socketpair()
    with ours, theirs:
        reader = pd_proxy.Timed(ours.makefile("rb", buffering=0), ours, per_read=SAFETY * 10)
        reader.until = time.monotonic() + 0.2
        theirs.sendall(b"x")
        assert reader.read(10) == b"x"
        with pytest.raises(TimeoutError):
            reader.read(10)


def post_from(source: str, port: int, results: list[int]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=SAFETY, source_address=(source, 0))
    try:
        conn.request("POST", "/v1/completions", body=b'{"prompt": "p"}')
        results.append(conn.getresponse().status)
    finally:
        conn.close()


def test_one_address_holds_at_most_its_share_of_the_connections(proxies):
    """Two requests from one address, held at the decode, take that address's share; its next
    connection gets 503 while another address is still served."""
    hold = threading.Event()
    prefill, decode = Stub("prefill"), Stub("decode", hold)
    proxy = proxies([prefill.port], [decode.port], INFERENTIA_PD_PROXY_MAX_PEER_CONNECTIONS="2")
    results: list[int] = []
    held = [threading.Thread(target=post_from, args=("127.0.0.3", proxy, results)) for _ in range(2)]
    try:
        for t in held:
            t.start()
        deadline = time.monotonic() + SAFETY
        while len(decode.seen) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert exchange(proxy, b"GET /healthcheck HTTP/1.1\r\n\r\n", source="127.0.0.3").startswith(b"HTTP/1.1 503")
        assert get(proxy, "/healthcheck")[0] == 200
    finally:
        hold.set()
        for t in held:
            t.join(SAFETY)
    assert results == [200, 200]


class Trickler:
    """A prefill server whose answer comes a byte at a time, each well within any read timeout."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        trickler = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(200)
                self.send_header("Content-Length", "100000")
                self.end_headers()
                try:
                    while not trickler.stop.wait(0.05):
                        self.wfile.write(b" ")
                        self.wfile.flush()
                except OSError:
                    pass

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_port
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_a_prefill_answer_that_trickles_is_held_to_the_requests_deadline(proxies):
    prefill = Trickler()
    try:
        proxy = proxies([prefill.port], [free_port()], INFERENTIA_PD_PROXY_DEADLINE_S="1")
        assert post(proxy, "/v1/completions", {"prompt": "p"})[0] == 504
    finally:
        prefill.stop.set()


def test_a_request_in_flight_is_answered_after_the_proxys_sigterm():
    """On SIGTERM the proxy stops accepting and finishes what it relays (the proxy pool's
    terminationGracePeriodSeconds counts on it): a request held at the decode when the signal
    comes is answered 200, and the proxy exits 0 after."""
    hold = threading.Event()
    prefill, decode = Stub("prefill"), Stub("decode", hold)
    proc, proxy = start_proxy([prefill.port], [decode.port])
    results: list[int] = []
    call = threading.Thread(target=post_from, args=("127.0.0.1", proxy, results))
    try:
        call.start()
        deadline = time.monotonic() + SAFETY
        while not decode.seen:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        while True:  # the proxy has stopped listening: it is shutting down, the request still held
            assert time.monotonic() < deadline
            try:
                socket.create_connection(("127.0.0.1", proxy), timeout=SAFETY).close()
            except (ConnectionRefusedError, ConnectionResetError):
                # Refused once the listening socket is closed; reset when the probe's handshake
                # was still in its queue as it closed (seen once in make test).
                break
            time.sleep(0.02)
        hold.set()
        call.join(SAFETY)
        assert results == [200]
        assert proc.wait(SAFETY) == 0
    finally:
        hold.set()
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=SAFETY)
