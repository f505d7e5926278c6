"""The pure parts of how the front end and the holder take a request in: the body budget and its
stall, the bounded parse, and the liveness that a stall past every bound turns off, tied to the
probe the kubelet runs on the batcher container."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp.test_utils import TestClient, TestServer

from inferentia_operator.batching import model_server
from inferentia_operator.batching.frontend import FrontEnd
from inferentia_operator.batching.limits import MAX_DEPTH, PEER_SHARE, BadInput, Budget, Limits, depth_of, parse_input
from inferentia_operator.core.serving.front_end import batcher_container
from test_children import THROUGHPUT, model


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# One address may hold the whole budget here: these cases are about the budget's tiers and its
# stall; the share of one address has its own below.
LIMITS = Limits(body_budget=8 * 1024, max_body=4 * 1024, body_timeout=30, process_timeout=300, peer_budget=8 * 1024)


def test_a_budget_grows_a_charge_only_where_there_is_room_and_always_shrinks_it():
    budget = Budget(LIMITS, Clock())
    assert budget.resize(0, 4000) and budget.held == 4000
    assert budget.resize(0, 3000) and budget.held == 7000  # the large tier: 7,168 of 8,192
    assert not budget.resize(0, 1000) and budget.held == 7000
    assert budget.resize(0, 60) and budget.held == 7060  # a small body may use the reserve
    assert budget.resize(4000, 0) and budget.held == 3060
    assert budget.resize(60, 5000) is False and budget.held == 3060


def test_the_budget_stalls_only_while_it_holds_bytes_and_refuses_every_request():
    clock = Clock()
    budget = Budget(LIMITS, clock)
    budget.resize(0, 7000)
    assert budget.stalled_for() == 0
    assert not budget.resize(0, 2000)  # refused: the stall starts
    clock.now = 5
    assert not budget.resize(0, 2000)
    assert budget.stalled_for() == 5
    budget.resize(0, 10)  # a small request admitted: not stalled
    assert budget.stalled_for() == 0
    assert not budget.resize(0, 2000)
    clock.now = 9
    budget.resize(7000, 0)
    budget.resize(10, 0)  # the budget empties: the next request would be admitted
    assert budget.stalled_for() == 0


def test_one_address_holds_at_most_its_share_of_the_budget_and_another_is_still_admitted():
    budget = Budget(Limits(body_budget=8 * 1024, max_body=2 * 1024, peer_budget=3 * 1024), Clock())
    assert budget.resize(0, 2000, peer="10.0.0.1") and budget.resize(0, 1000, peer="10.0.0.1")
    assert not budget.resize(0, 100, peer="10.0.0.1"), "past its share of 3,072 bytes"
    assert not budget.resize(1000, 1200, peer="10.0.0.1"), "a charge grown past the share"
    assert budget.held == 3000
    assert budget.resize(0, 2000, peer="10.0.0.2") and budget.held == 5000
    assert budget.stalled_for() == 0, "one address over its share is no stall of the whole"


def test_one_address_over_its_share_does_not_start_a_stall():
    clock = Clock()
    budget = Budget(Limits(body_budget=8 * 1024, max_body=2 * 1024, peer_budget=3 * 1024), clock)
    budget.resize(0, 3000, peer="10.0.0.1")
    assert not budget.resize(0, 500, peer="10.0.0.1")
    clock.now = 100
    assert budget.stalled_for() == 0


def test_an_address_holding_nothing_else_may_take_one_request_past_its_share():
    """A padded input can cost more than the address's share while the budget holds it: the
    share bounds what an address holds beside a request, not that request alone, or an input
    the budget admitted before the share existed could never be admitted from any address."""
    budget = Budget(Limits(body_budget=8 * 1024, max_body=2 * 1024, peer_budget=3 * 1024), Clock())
    assert budget.resize(0, 1000, peer="10.0.0.1") and budget.resize(1000, 6000, peer="10.0.0.1"), "alone: the budget's part"
    assert not budget.resize(0, 10, peer="10.0.0.1"), "beside it, nothing more: the address is past its share"
    assert budget.resize(0, 1000, peer="10.0.0.2")
    assert not budget.resize(1000, 2500, peer="10.0.0.2") and budget.held == 7000, "the budget still bounds all"
    assert budget.resize(6000, 0, peer="10.0.0.1") and budget.resize(0, 2000, peer="10.0.0.1")
    assert not budget.resize(0, 1500, peer="10.0.0.1"), "two requests: the share again"


def test_an_input_padded_past_an_address_s_share_but_within_the_budget_is_answered():
    """Bucket [1500] pads an input to 6,000 budget bytes: more than the address's share (4 KiB)
    and within what the budget gives one large input (7 KiB). It was answered before the share
    existed; it must not become a 413 that no address can ever get past."""
    limits = Limits(body_budget=8 * 1024, max_body=2 * 1024, body_timeout=30, process_timeout=300)
    assert limits.peer_budget == 4 * 1024 < 1500 * 4 <= limits.budget_for(1500 * 4)

    async def scenario() -> tuple[int, int]:
        process = TestServer(model_server.app(model_server.stand_in(0, 0)))
        await process.start_server()
        front = FrontEnd([str(process.make_url("")).rstrip("/")], max_batch=1, max_latency=1.0, buckets=[[1500]], limits=limits)
        async with TestClient(TestServer(front.app())) as client:
            answer = await client.post("/", data=json.dumps([1.0, 2.0]))
            status = answer.status
        await process.close()
        return status, front.budget.held

    assert asyncio.run(scenario()) == (200, 0)


def test_the_bookkeeping_of_addresses_holds_only_those_holding_bytes():
    """An attacker with many source addresses: each is kept only while it holds a charge, so the
    addresses kept are never more than the requests in flight."""
    budget = Budget(Limits(), Clock())
    for i in range(10_000):
        peer = f"10.{i // 65536}.{i // 256 % 256}.{i % 256}"
        assert budget.resize(0, 10, peer=peer)
        assert budget.resize(10, 0, peer=peer)
    assert budget.held == 0 and budget.peers() == 0
    assert budget.resize(0, 0, peer="10.9.9.9") and budget.peers() == 0, "a request without a body keeps nothing"


def test_the_shares_of_one_address_follow_the_caps_unless_set():
    d = Limits()
    assert d.max_peer_connections == d.max_connections // PEER_SHARE
    assert d.peer_budget == d.body_budget // PEER_SHARE >= d.max_body
    small = Limits(max_connections=10, body_budget=4 * 1024 * 1024, max_body=3 * 1024 * 1024)
    assert small.max_peer_connections == 5
    assert small.peer_budget == 3 * 1024 * 1024, "at least one largest body, or it could never be admitted"
    assert Limits(max_connections=1).max_peer_connections == 1
    assert Limits(max_peer_connections=7, peer_budget=9).max_peer_connections == 7


@pytest.mark.parametrize("depth", [1, 2, MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1, 500, 977, 978, 979, 1000, 5000, 100_000])
def test_parse_input_takes_any_depth_to_max_depth_and_refuses_the_rest_alike(depth):
    body = b"[" * depth + b"0" + b"]" * depth
    if depth <= MAX_DEPTH:
        assert depth_of(parse_input(body)) == depth
    else:
        with pytest.raises(BadInput, match=f"nested more than {MAX_DEPTH} deep"):
            parse_input(body)


@pytest.mark.parametrize("text", ["[1e999]", "[-1e400]", "[NaN]", "[Infinity]", '{"a": -Infinity}'])
def test_parse_input_refuses_numbers_that_are_not_finite(text):
    with pytest.raises(BadInput, match="finite|not a JSON number"):
        parse_input(text.encode())


def test_depth_of_counts_objects_and_lists_without_recursion():
    assert depth_of(0) == 0 and depth_of([]) == 1 and depth_of({"a": [1, {"b": []}]}) == 4
    deep: list = []
    for _ in range(200_000):
        deep = [deep]
    assert depth_of(deep) == MAX_DEPTH + 1  # stops counting past the limit


def test_a_front_end_whose_budget_never_empties_turns_its_liveness_off():
    """A simulated defect: a request's charge leaks, so the budget never empties and nothing
    more is admitted. Not ready after the hold time (maxLatencyMs); not live once past every
    bound a request has, so that the kubelet restarts the container."""
    clock = Clock()

    async def scenario() -> list[tuple[str, int, int]]:
        process = TestServer(model_server.app(model_server.stand_in(0, 0)))
        await process.start_server()
        front = FrontEnd([str(process.make_url("")).rstrip("/")], max_batch=4, max_latency=1.0, clock=clock, limits=LIMITS)
        seen = []
        async with TestClient(TestServer(front.app())) as client:
            front.budget.resize(0, 7100)  # the leak
            for at in (0.0, 0.5, 2.0, 200.0, 400.0):
                clock.now = at
                refused = await client.post("/", data=json.dumps([1] * 1000))
                assert refused.status == 503
                ready, live = await client.get("/readyz"), await client.get("/healthz")
                seen.append((f"t={at:g}", ready.status, live.status))
        await process.close()
        return seen

    # Ready turns off past the hold (max latency, 0.95 s with the dispatcher's headroom); live
    # once past body 30 s + hold + process 300 s.
    assert asyncio.run(scenario()) == [("t=0", 200, 200), ("t=0.5", 200, 200), ("t=2", 503, 200), ("t=200", 503, 200), ("t=400", 503, 503)]


def test_the_kubelet_restarts_a_batcher_whose_healthz_fails():
    """The batcher container's liveness probe asks /healthz on its port: failing it
    failureThreshold times in a row, periodSeconds apart, restarts the container."""
    m = model(**THROUGHPUT, **{"serving.batching": {"maxBatchSize": 4}})
    batcher = batcher_container(m)
    probe = batcher["livenessProbe"]
    assert probe["httpGet"]["path"] == "/healthz" and probe["httpGet"]["port"] == "batch"
    assert any(p["name"] == "batch" and p["containerPort"] == m.plan.front_end.port for p in batcher["ports"])
    assert probe["failureThreshold"] * probe["periodSeconds"] <= 60
