"""The holder (`inferentia-operator hold`), as its own process: requests that arrive while no
replica answers are held, counted in the gauge the ScaledObject sums, and forwarded once a
replica answers; bounded by the hold and the number held, past which they get 503."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from ports import free_port
from test_batching import stand_in_model_server
from test_frontend_limits import _wait_for


class Holder:
    def __init__(self, hold_seconds: float = 30, max_held: int = 50, scaler: bool = False):
        self.port, self.upstream, self.scaler = free_port(), free_port(), free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "inferentia_operator", "hold", "--host", "127.0.0.1", "--upstream", "127.0.0.1",
             "--ports", f"{self.port}:{self.upstream}", "--hold-seconds", str(hold_seconds), "--max-held", str(max_held),
             *(["--scaler-port", str(self.scaler), "--target", "2"] if scaler else [])],
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        _wait_for(f"http://127.0.0.1:{self.port}/healthz", self.proc)
        self.model: subprocess.Popen | None = None

    def start_model(self) -> None:
        self.model = subprocess.Popen(stand_in_model_server(self.upstream), stderr=subprocess.DEVNULL)
        _wait_for(f"http://127.0.0.1:{self.upstream}/healthz", self.model)

    def waiting(self) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            text = r.read().decode()
        return float(re.search(r"^inferentia_num_requests_waiting (\S+)$", text, re.M).group(1))

    def post(self, body: object, path: str = "/") -> tuple[int, dict, bytes, float]:
        started = time.monotonic()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as r:
                return r.status, dict(r.headers), r.read(), time.monotonic() - started
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read(), time.monotonic() - started

    def stop(self) -> str:
        for p in (self.proc, self.model):
            if p is not None and p.poll() is None:
                p.terminate()
                p.wait(10)
        return self.proc.stderr.read() if self.proc.stderr else ""


@pytest.fixture
def holder() -> Iterator[Holder]:
    h = Holder()
    yield h
    assert "Traceback" not in h.stop()


def test_requests_sent_while_no_replica_answers_are_held_counted_and_answered_once_one_does(holder):
    answers: list[tuple[int, dict, bytes, float]] = []
    clients = [threading.Thread(target=lambda i=i: answers.append(holder.post([[i, i]]))) for i in range(3)]
    for c in clients:
        c.start()
    deadline = time.monotonic() + 10
    while holder.waiting() < 3:
        assert time.monotonic() < deadline, "the held requests were never counted"
        time.sleep(0.1)
    time.sleep(1)
    assert not answers, "answered with no replica"
    holder.start_model()
    for c in clients:
        c.join(30)
    assert sorted(a[0] for a in answers) == [200, 200, 200], answers
    # The stand-in model answers each input with itself: every held request got its own answer.
    assert sorted(json.loads(a[2]) for a in answers) == [[[i, i]] for i in range(3)]
    assert holder.waiting() == 0


def test_a_warm_replica_is_reached_at_once_and_its_status_passes_through(holder):
    holder.start_model()
    status, _, body, took = holder.post([[1, 2]])
    assert (status, json.loads(body)) == (200, [[1, 2]])
    assert took < 1
    status, _, _, _ = holder.post(["not", "a", "batch"], path="/nowhere")
    assert status == 404  # the model server's own answer, not the holder's


def test_a_request_no_replica_answers_within_the_hold_gets_503_and_retry_after():
    h = Holder(hold_seconds=1)
    try:
        status, headers, body, took = h.post([[1]])
        assert status == 503 and headers["Retry-After"] == "1" and "within 1 s" in json.loads(body)["error"]
        assert 0.9 < took < 3
        assert h.waiting() == 0
    finally:
        assert "Traceback" not in h.stop()


def test_more_requests_than_may_be_held_get_503_at_once():
    h = Holder(hold_seconds=5, max_held=2)
    try:
        answers: list[tuple[int, dict, bytes, float]] = []
        held = [threading.Thread(target=lambda: answers.append(h.post([[1]]))) for _ in range(2)]
        for t in held:
            t.start()
        while h.waiting() < 2:
            time.sleep(0.05)
        status, headers, body, took = h.post([[1]])
        assert status == 503 and headers["Retry-After"] == "1" and took < 1, body
        for t in held:
            t.join(10)
        assert [a[0] for a in answers] == [503, 503]  # no replica came: each ended at the hold
    finally:
        assert "Traceback" not in h.stop()


def test_the_upstream_service_is_found_by_the_kubelets_variable_else_by_name():
    from inferentia_operator.batching.holder import upstream_host

    environ = {"LLAMA_8B_REPLICAS_SERVICE_HOST": "10.96.4.2", "OTHER_SERVICE_HOST": "10.96.0.1"}
    assert upstream_host("llama-8b-replicas", environ) == "10.96.4.2"
    assert upstream_host("bert-replicas", environ) == "bert-replicas"  # enableServiceLinks off: cluster DNS


# -- KEDA's external scaler API (issue 41): demand pushed, not scraped ------------------------------
# A client of externalscaler.ExternalScaler as KEDA's external-push scaler calls it
# (github.com/kedacore/keda, pkg/scalers/external_scaler.go), over the wire format of its proto.


def scaler_call(port: int, method: str, request: bytes, stream: bool = False, timeout: float = 5):
    import grpc

    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    path = f"/externalscaler.ExternalScaler/{method}"
    call = channel.unary_stream(path) if stream else channel.unary_unary(path)
    return channel, call(request, timeout=timeout)


def test_the_holder_pushes_activation_to_keda_the_moment_a_request_is_held():
    from inferentia_operator.batching import scaler as proto

    h = Holder(scaler=True)
    try:
        _wait_for(f"http://127.0.0.1:{h.port}/healthz", h.proc)
        ref = proto.ScaledObjectRef(name="m", namespace="ns").SerializeToString()
        channel, spec = scaler_call(h.scaler, "GetMetricSpec", ref)
        [metric] = proto.GetMetricSpecResponse.FromString(spec).metricSpecs
        assert (metric.metricName, metric.targetSizeFloat, metric.targetSize) == ("held-requests", 2.0, 2)
        channel.close()
        channel, active = scaler_call(h.scaler, "IsActive", ref)
        assert proto.IsActiveResponse.FromString(active).result is False
        channel.close()

        channel, stream = scaler_call(h.scaler, "StreamIsActive", ref, stream=True, timeout=30)
        first = proto.IsActiveResponse.FromString(next(stream))
        assert first.result is False  # the state at once, as KEDA's stream expects
        answers: list = []
        sent = time.monotonic()
        threading.Thread(target=lambda: answers.append(h.post([1])), daemon=True).start()
        pushed = proto.IsActiveResponse.FromString(next(stream))
        took = time.monotonic() - sent
        assert pushed.result is True and took < 5, took
        request = proto.GetMetricsRequest(scaledObjectRef=proto.ScaledObjectRef(name="m", namespace="ns"), metricName="held-requests")
        metrics_channel, values = scaler_call(h.scaler, "GetMetrics", request.SerializeToString())
        [value] = proto.GetMetricsResponse.FromString(values).metricValues
        assert (value.metricName, value.metricValueFloat) == ("held-requests", 1.0)
        metrics_channel.close()
        # The replica comes: the held request is answered, and the demand goes.
        h.start_model()
        assert proto.IsActiveResponse.FromString(next(stream)).result is False
        _wait_for_true(lambda: answers and answers[0][0] == 200)
        channel.close()
    finally:
        assert "Traceback" not in h.stop()


def _wait_for_true(check, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


class Relay:
    """A TCP relay on loopback whose connections reach ``port`` from ``source``: to the holder,
    a client of that address (a pod of its own), whatever the client speaks (gRPC here)."""

    def __init__(self, port: int, source: str) -> None:
        import socket

        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port, self.target, self.source = self.listener.getsockname()[1], port, source
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket

        while True:
            try:
                client, _ = self.listener.accept()
                upstream = socket.create_connection(("127.0.0.1", self.target), source_address=(self.source, 0))
            except OSError:
                return
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a, b) -> None:
        try:
            while block := a.recv(1 << 16):
                b.sendall(block)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(2)
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()


def open_streams(relay: Relay, connections: int, ref: bytes, channels: list, kept: list) -> list[str]:
    """``StreamIsActive`` calls through ``relay``, as many as each of ``connections`` connections
    may carry: the code of each ("ok" once it answered). The streams and channels are kept in
    ``kept`` and ``channels``: a stream let go is cancelled."""
    import grpc

    from inferentia_operator.batching import scaler as proto

    codes = []
    for _ in range(connections):
        channel = grpc.insecure_channel(f"127.0.0.1:{relay.port}", options=[("grpc.use_local_subchannel_pool", 1)])
        channels.append(channel)
        for _ in range(proto.STREAMS_PER_CONNECTION):
            try:
                stream = channel.unary_stream("/externalscaler.ExternalScaler/StreamIsActive")(ref, timeout=5)
                kept.append(stream)
                next(stream)
                codes.append("ok")
            except grpc.RpcError as exc:
                codes.append(exc.code().name)
    return codes


def test_the_external_scaler_bounds_what_a_client_may_cost():
    """Anyone in the cluster can reach the port: a request too large is refused by itself, and
    one address (a pod) holds at most MAX_PEER_CONNECTIONS connections of STREAMS_PER_CONNECTION
    calls each, streams and calls that never send their request alike. KEDA, another address,
    keeps its stream and its calls throughout."""
    import grpc

    from inferentia_operator.batching import scaler as proto

    h = Holder(scaler=True)
    attacker = Relay(h.scaler, "127.0.0.9")
    channels, kept = [], []
    try:
        with pytest.raises(grpc.RpcError) as too_big:
            scaler_call(h.scaler, "IsActive", b"\x0a" + b"\xff\xff\x03" + b"x" * 70000)
        assert too_big.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        ref = proto.ScaledObjectRef(name="m", namespace="ns").SerializeToString()
        # The attacker: streams over many connections, then calls that never send a request.
        codes = open_streams(attacker, proto.MAX_PEER_CONNECTIONS + 2, ref, channels, kept)
        assert codes.count("ok") == proto.MAX_PEER_CONNECTIONS * proto.STREAMS_PER_CONNECTION, codes
        stalled = grpc.insecure_channel(f"127.0.0.1:{attacker.port}", options=[("grpc.use_local_subchannel_pool", 1)])
        channels.append(stalled)
        never = threading.Event()
        for _ in range(16):
            stalled.stream_unary("/externalscaler.ExternalScaler/IsActive").future(iter(never.wait, True), timeout=30)
        # KEDA, from its own address, is served.
        channel, stream = scaler_call(h.scaler, "StreamIsActive", ref, stream=True, timeout=10)
        assert proto.IsActiveResponse.FromString(next(stream)).result is False
        channel.close()
        channel, active = scaler_call(h.scaler, "IsActive", ref)
        assert proto.IsActiveResponse.FromString(active).result is False
        channel.close()
        assert holder_counter(h, 'inferentia_hold_rejected_total{code="scaler"}') >= 1
        with urllib.request.urlopen(f"http://127.0.0.1:{h.port}/healthz", timeout=5) as alive:
            assert alive.status == 200
    finally:
        for c in channels:
            c.close()
        attacker.close()
        assert "Traceback" not in h.stop()


def test_the_external_scaler_refuses_streams_past_its_bound_from_many_addresses():

    from inferentia_operator.batching import scaler as proto

    h = Holder(scaler=True)
    per_address = proto.MAX_PEER_CONNECTIONS * proto.STREAMS_PER_CONNECTION
    relays = [Relay(h.scaler, f"127.0.0.{20 + i}") for i in range(proto.MAX_STREAMS // per_address + 1)]
    channels, codes, kept = [], [], []
    try:
        ref = proto.ScaledObjectRef(name="m", namespace="ns").SerializeToString()
        for relay in relays:
            codes += open_streams(relay, proto.MAX_PEER_CONNECTIONS, ref, channels, kept)
        assert codes.count("ok") == proto.MAX_STREAMS and "RESOURCE_EXHAUSTED" in codes, codes
    finally:
        for c in channels:
            c.close()
        for relay in relays:
            relay.close()
        assert "Traceback" not in h.stop()


# A client of the scaler's port that sends calls over HTTP/2 by hand and never reads an answer:
# the frames of RFC 9113 (the preface, SETTINGS, WINDOW_UPDATE, then HEADERS and DATA a call).
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def h2_frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    import struct

    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def h2_literal(index: int, value: str) -> bytes:
    """An HPACK literal header field without indexing, its name by static-table index."""
    head = bytes([index]) if index < 15 else bytes([15, index - 15])
    return head + bytes([len(value)]) + value.encode()


def a_client_that_never_reads(port: int, source: str, calls: int):
    import socket
    import struct

    headers = (
        bytes([0x83, 0x86]) + h2_literal(4, "/externalscaler.ExternalScaler/GetMetricSpec") + h2_literal(1, "x")
        + h2_literal(31, "application/grpc") + b"\x00\x02te\x08trailers"
    )  # fmt: skip
    conn = socket.socket()
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    conn.bind((source, 0))
    conn.connect(("127.0.0.1", port))
    conn.settimeout(3)
    conn.sendall(H2_PREFACE + h2_frame(4, 0, 0, struct.pack(">HI", 4, 2**31 - 1)) + h2_frame(8, 0, 0, struct.pack(">I", 2**31 - 2**16 - 1)))
    try:
        for i in range(calls):
            conn.sendall(h2_frame(1, 4, 2 * i + 1, headers) + h2_frame(0, 1, 2 * i + 1, b"\x00" * 5))
    except OSError:  # the holder stopped reading it, or closed it
        pass
    return conn


def test_clients_that_never_read_their_answers_do_not_keep_the_holder_from_stopping():
    """Answers a client never reads fill the sockets' buffers both ways; a connection closed
    politely would wait on them for ever, and the holder's stop with it (the pod killed at the
    end of its grace). Its connections are aborted instead: the holder stops at once."""
    import signal

    h = Holder(scaler=True)
    clients = []
    try:
        for i in range(4):
            clients.append(a_client_that_never_reads(h.scaler, f"127.0.0.{40 + i // 2}", 100_000))
        began = time.monotonic()
        h.proc.send_signal(signal.SIGTERM)
        h.proc.wait(20)
        assert time.monotonic() - began < 10
    finally:
        for c in clients:
            c.close()
        assert "Traceback" not in h.stop()


def holder_counter(h: Holder, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{h.port}/metrics", timeout=5) as r:
        text = r.read().decode()
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def test_the_holder_asks_for_a_replica_soon_after_a_refusal_and_then_at_a_bounded_rate():
    """Issue 41: no fixed probe period. The first tries come within tens of milliseconds (a
    replica that comes up just after a refused try is found at once); a long wait then costs at
    most one try per PROBE_SECONDS a port, however many requests are held."""
    from inferentia_operator.batching import holder as module

    h = Holder(hold_seconds=3)
    try:
        answers: list = []
        threads = [threading.Thread(target=lambda i=i: answers.append(h.post([i])), daemon=True) for i in range(5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        probes = holder_counter(h, "inferentia_hold_probes_total")
        # 3 s held: the quick tries while the delay doubles, then one per PROBE_SECONDS.
        doubling = 1 + math.ceil(math.log2(module.PROBE_SECONDS / module.FIRST_PROBE_SECONDS))
        assert doubling <= probes <= doubling + 3 / module.PROBE_SECONDS + 2, probes
        assert [a[0] for a in answers] == [503] * 5
    finally:
        assert "Traceback" not in h.stop()
