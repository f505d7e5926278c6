"""The batching front end: the dispatcher's decisions with a fake clock, padding properties,
and the front end run for real on loopback in front of stand-in model processes."""

import asyncio
import json
import random
import time

import aiohttp
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

import batching_sim
from inferentia_operator.batching import dispatch, model_server
from inferentia_operator.batching.dispatch import Dispatch, Dispatcher, LatencyModel, Reject, Request, p99, replay
from inferentia_operator.batching.frontend import FrontEnd
from inferentia_operator.batching.padding import TooLarge, bucket_for, pad, shape_of, unpad
from ports import free_port


def request(at, bucket=None):
    return Request(at, bucket, {"x": at})


def trained(d: Dispatcher, fixed=0.010, per_item=0.002):
    for p in range(len(d.models)):
        d.models[p].fixed, d.models[p].per_item = fixed, per_item
    return d


# --- the latency model ------------------------------------------------------------------


def test_the_latency_model_fits_fixed_and_per_item_cost():
    m = LatencyModel()
    for n in (1, 2, 4, 8, 1, 8):
        m.observe(n, 0.010 + 0.003 * n)
    assert m.fixed == pytest.approx(0.010) and m.per_item == pytest.approx(0.003)
    assert m(16) == pytest.approx(0.058)


# --- the dispatcher, with a fake clock -------------------------------------------------------


def test_a_full_batch_goes_at_once_and_never_exceeds_the_maximum():
    d = trained(Dispatcher(processes=1, max_batch=4, max_latency=0.100))
    for _ in range(6):
        assert d.arrive(request(0.0)) is None
    actions, _ = d.decide(0.0)
    [batch] = actions
    assert isinstance(batch, Dispatch) and len(batch.requests) == 4 and d.queued == 2


def test_a_partial_batch_is_held_for_the_window_and_never_past_the_budget():
    d = trained(Dispatcher(processes=1, max_batch=8, max_latency=0.100))
    assert d.max_latency == pytest.approx(0.095)  # 5% of the budget is kept for the HTTP around the batch
    d.window = 0.020
    for t in (0.000, 0.005, 0.010):
        d.arrive(request(t))
    actions, wake = d.decide(0.010)
    assert actions == [] and wake == pytest.approx(0.020)  # the oldest has waited 10 of its 20 ms
    [batch], _ = d.decide(0.020)
    assert len(batch.requests) == 3
    # A window longer than the budget allows: held only while a batch one larger still fits.
    d2 = trained(Dispatcher(processes=1, max_batch=8, max_latency=0.100))
    d2.window = 1.0
    d2.arrive(request(0.0))
    _, wake = d2.decide(0.0)
    assert wake == pytest.approx(0.095 - (0.010 + 0.002 * 2))


def test_until_tuned_a_lone_request_goes_at_once():
    d = trained(Dispatcher(processes=1, max_batch=8, max_latency=0.100))
    d.arrive(request(5.0))
    [batch], wake = d.decide(5.0)
    assert len(batch.requests) == 1 and wake is None and d.window == 0.0


def test_replay_of_a_fixed_window_by_hand():
    one_call = lambda n: 0.010 + 0.001 * n  # noqa: E731
    # One process, arrivals at 0, 1, 2 and 30 ms. Window 0: 0 alone (done 11), then 1 and 2
    # together (11 to 23: latencies 22 and 21), then 30 alone (41: 11).
    assert replay([0.0, 0.001, 0.002, 0.030], 1, 8, one_call, 0.0) == pytest.approx([0.011, 0.022, 0.021, 0.011])
    # Window 5 ms: 0, 1 and 2 go together at 5 ms (done 18), 30 goes at 35 (done 46).
    assert replay([0.0, 0.001, 0.002, 0.030], 1, 8, one_call, 0.005) == pytest.approx([0.018, 0.017, 0.016, 0.016])
    # A full batch does not wait for the window; two processes take two batches at once.
    assert replay([0.0, 0.001], 1, 2, one_call, 1.0) == pytest.approx([0.013, 0.012])
    assert replay([0.0, 0.0, 0.0], 2, 1, one_call, 0.0) == pytest.approx([0.011, 0.011, 0.022])
    assert p99([0.011, 0.022, 0.021, 0.011]) == pytest.approx(0.021)


def test_the_replay_agrees_with_the_fixed_window_batcher_it_models():
    """replay() is the fast, analytic form of batching_sim.FixedWindow run event by event."""
    one_call = lambda n: 0.020 + 0.002 * n  # noqa: E731
    arrivals = batching_sim.steady(300, 5, random.Random(7))
    for processes, window in [(1, 0.0), (2, 0.005), (2, 0.020), (4, 0.010)]:
        simulated = batching_sim.simulate(batching_sim.FixedWindow(processes, 8, window), arrivals, one_call)
        assert sorted(replay(arrivals, processes, 8, one_call, window)) == pytest.approx(simulated.latencies)


def test_the_window_is_tuned_from_the_arrivals_to_the_best_replay():
    d = trained(Dispatcher(processes=1, max_batch=8, max_latency=10.0), fixed=0.020, per_item=0.001)
    # Pairs of requests 1 ms apart, every 100 ms: one process, so holding the first for
    # the second (a quarter of a call is enough) beats sending it alone and making the
    # second wait a whole call.
    times = [t for k in range(100) for t in (k * 0.1, k * 0.1 + 0.001)]
    for t in times:
        d.arrive(request(t))
        d.queues.clear()
    assert 0.001 <= d.window <= 0.021 * 0.5
    # Lone requests 100 ms apart: holding buys nothing, so it goes back to dispatching at once.
    for k in range(Dispatcher.HISTORY + Dispatcher.RETUNE_EVERY):  # once the pairs have left the history
        d.arrive(request(20.0 + k * 0.1))
        d.queues.clear()
    assert d.window == 0.0


def test_no_arrival_pays_for_more_than_one_candidate_windows_replay(monkeypatch):
    """Tuning replays the recent arrivals through every candidate window, about 0.5 ms each on
    this machine. Done within one arrival, the ten replays held the front end's event loop for
    5 to 22 ms every RETUNE_EVERY arrivals, which the requests in flight then waited out, enough
    to raise a row's p99 (docs/benchmarks.md). So an arrival runs at most one replay, and the
    window the candidates' replays choose is the same."""
    replays: list[float] = []

    def counted(arrivals, processes, max_batch, latency, window):
        replays.append(window)
        return replay(arrivals, processes, max_batch, latency, window)

    monkeypatch.setattr(dispatch, "replay", counted)
    d = trained(Dispatcher(processes=1, max_batch=8, max_latency=10.0), fixed=0.020, per_item=0.001)
    for t in [t for k in range(100) for t in (k * 0.1, k * 0.1 + 0.001)]:
        before = len(replays)
        d.arrive(request(t))
        d.queues.clear()
        assert len(replays) - before <= 1
    assert len(replays) >= len(Dispatcher.CANDIDATES)  # it did tune
    assert 0.001 <= d.window <= 0.021 * 0.5  # to what the whole tune chooses (the test above)


def test_the_tuned_dispatcher_is_as_good_as_the_best_fixed_window_at_every_load():
    """The issue's bar, on the simulation: at every offered rate, steady and bursty, p99 no
    more than 10% (or 5 ms) above the best fixed window's, and as many answered within
    the budget; on 1, 2 and 4 processes and two latency curves."""
    failures = []
    for processes, fixed, per_item in [(2, 0.020, 0.002), (1, 0.020, 0.002), (4, 0.020, 0.002), (2, 0.005, 0.005)]:
        ceiling = processes * 8 / (fixed + per_item * 8)
        for shape, traffic in batching_sim.TRAFFIC.items():
            for share in (0.05, 0.2, 0.4, 0.6, 0.8, 0.9, 1.0, 1.1):
                rate = share * ceiling
                arrivals = traffic(rate, 3000 / rate, random.Random(int(rate)))
                tuned, windows = batching_sim.compare(processes, 8, 0.100, fixed, per_item, arrivals)
                best, most_in_budget, ok = batching_sim.goal_met(tuned, list(windows.values()), 0.100, 0.995)
                if not ok:
                    failures.append(
                        f"{processes} processes, {fixed * 1000:g}+{per_item * 1000:g}n ms, {shape} {rate:.0f}/s: "
                        f"p99 {tuned.pct(99) * 1000:.1f} ms vs best fixed {best.pct(99) * 1000:.1f}; "
                        f"in budget {tuned.within(0.100):.0f}/s vs {most_in_budget:.0f}/s"
                    )
    assert failures == []


def test_above_capacity_on_a_noisy_machine_what_is_answered_is_answered_within_the_budget():
    """The budget is a promise about every answer, not the average one: batches that run up
    to half again as long as the fit at random, and one in a hundred twice as long (a shared
    machine), still leave the answered requests' p99 within the budget at 1.2 to 2 times
    capacity; what does not fit is refused."""
    fixed, per_item, budget = 0.020, 0.002, 0.100
    ceiling = 2 * 8 / (fixed + per_item * 8)
    over = []
    for shape, traffic in batching_sim.TRAFFIC.items():
        for share in (1.2, 1.5, 2.0):
            arrivals = traffic(share * ceiling, 3000 / (share * ceiling), random.Random(int(share * 100)))
            noise = random.Random(7)

            def batch_seconds(n, noise=noise):
                slow = 2.0 if noise.random() < 0.01 else 1 + abs(noise.gauss(0, 0.2))
                return (fixed + per_item * n) * slow

            result = batching_sim.simulate(Dispatcher(2, 8, budget), arrivals, batch_seconds, overhead=0.0015)
            assert result.refused > 0  # above capacity: something must be refused
            if result.pct(99) > budget:
                over.append(f"{shape} {share}x: p99 {result.pct(99) * 1000:.1f} ms")
    assert over == []


def test_a_model_that_takes_over_half_the_budget_is_served_from_its_first_batch():
    """Before anything is learnt the fit is nothing: a first batch's time is not an overrun of
    it. (Taken as one, a model taking 60% of the budget was estimated to take 120% at worst,
    was probed, forgot, and learnt the same again: shed for ever.)"""
    d = Dispatcher(processes=1, max_batch=4, max_latency=0.100)
    for k in range(50):
        now = k * 0.1
        assert d.arrive(request(now)) is None, f"request {k} refused"
        actions, _ = d.decide(now)
        [batch] = [a for a in actions if isinstance(a, Dispatch)]
        d.done(batch.process, len(batch.requests), 0.060, probe=batch.requests[0].probe)
        assert not d.shedding
    assert d.models[0].late(1) < 0.095


def test_requests_that_cannot_finish_in_time_are_refused_at_once():
    d = trained(Dispatcher(processes=1, max_batch=2, max_latency=0.030), fixed=0.020, per_item=0.001)
    assert d.arrive(request(0.0)) is None  # 0.021 s alone
    assert d.arrive(request(0.0)) is None  # 0.022 s, batched with the first
    refused = d.arrive(request(0.0))  # a second batch after the first: 0.043 s
    assert isinstance(refused, Reject) and refused.retry_after > 0
    # One already queued that aged past the budget is refused when the dispatcher looks.
    d2 = trained(Dispatcher(processes=1, max_batch=4, max_latency=0.030), fixed=0.020, per_item=0.001)
    d2.arrive(request(0.0))
    actions, _ = d2.decide(0.015)  # 0.015 waited + 0.021 to run > 0.030
    assert [type(a) for a in actions] == [Reject]


def test_one_batch_in_flight_per_process_and_the_least_loaded_first():
    d = trained(Dispatcher(processes=2, max_batch=1, max_latency=1.0))
    for _ in range(3):
        d.arrive(request(0.0))
    actions, _ = d.decide(0.0)
    assert sorted(a.process for a in actions) == [0, 1] and d.queued == 1  # the third waits for a free process
    d.done(1, 1, 0.012)
    [next_batch], _ = d.decide(0.012)
    assert next_batch.process == 1


def test_buckets_are_batched_apart():
    d = trained(Dispatcher(processes=2, max_batch=4, max_latency=1.0))
    for bucket in [(64,), (128,), (64,), (128,)]:
        d.arrive(request(0.0, bucket))
    actions, _ = d.decide(0.0)
    assert sorted(tuple(r.bucket for r in a.requests) for a in actions) == [((64,), (64,)), ((128,), (128,))]


# --- a model that paused: shedding, probing, serving again -------------------------------------


def paused(processes=2):
    """Trained fast, then every process ran one batch of 3 s (a pause of the model): each
    estimate leaves no request within the budget of 100 ms."""
    d = trained(Dispatcher(processes=processes, max_batch=4, max_latency=0.100))
    for p in range(processes):
        d.inflight[p] += 1
        d.done(p, 4, 3.0)
    return d


def test_after_a_pause_a_probe_is_sent_and_a_fast_answer_serves_again():
    """Seen: after one batch slower than the budget, every request got 503 for as long as the
    test ran (40 s), since nothing was sent and nothing learnt. Now a stale process is probed."""
    d = paused()
    assert d.shedding
    probe = request(10.0)
    assert d.arrive(probe) is None  # admitted as a probe, whatever the estimate says
    [sent], _ = d.decide(10.0)
    assert isinstance(sent, Dispatch) and sent.requests == [probe] and probe.probe
    # One probe at a time: meanwhile the estimate still refuses.
    assert isinstance(d.arrive(request(10.01)), Reject)
    d.done(sent.process, 1, 0.012, probe=True)  # back: faster than it was estimated
    assert not d.shedding and d.models[sent.process](1) == pytest.approx(0.012)
    assert d.arrive(request(10.02)) is None
    [batch], _ = d.decide(10.02)
    assert batch.process == sent.process and not batch.requests[0].probe
    # The other process is probed in its turn, PROBE_INTERVAL after the first probe.
    assert d.arrive(request(10.0 + Dispatcher.PROBE_INTERVAL)).__class__ is not Reject
    [second], _ = d.decide(10.0 + Dispatcher.PROBE_INTERVAL)
    assert second.process != sent.process and second.requests[0].probe


def test_a_probe_that_is_still_slow_keeps_the_process_stale_and_probes_again_later():
    d = paused(processes=1)
    d.arrive(request(5.0))
    [sent], _ = d.decide(5.0)
    d.done(0, 1, 2.0, probe=True)
    assert d.shedding
    assert isinstance(d.arrive(request(5.1)), Reject)  # before the next probe is due
    assert d.arrive(request(5.0 + Dispatcher.PROBE_INTERVAL)) is None


def test_a_probe_the_process_never_answered_is_no_sign_that_it_is_back():
    """A process that is not listening fails a call at once: that says nothing of its speed."""
    d = paused(processes=1)
    d.arrive(request(5.0))
    d.decide(5.0)
    d.done(0, 1, 0.001, probe=True, answered=False)
    assert d.shedding


def test_while_shedding_what_waits_is_refused_not_stranded():
    """Requests queued before every process went stale are refused at once, with a retry after
    the next probe, never left queued past their budget."""
    d = trained(Dispatcher(processes=1, max_batch=1, max_latency=0.100))
    for _ in range(3):
        d.arrive(request(0.0))
    [sent], _ = d.decide(0.0)
    d.done(0, 1, 3.0)  # paused under its first batch: now stale, two requests still queued
    actions, _ = d.decide(3.0)
    refused = [a for a in actions if isinstance(a, Reject)]
    assert len(refused) == 2 and d.queued <= 1  # at most the probe the dispatcher made itself


def test_a_replica_out_of_its_service_probes_itself_with_the_last_request_it_admitted():
    """While shedding, /readyz fails and the Service sends nothing: the dispatcher sends the last
    request it admitted again, answered to nobody, and learns that its model is back."""
    d = trained(Dispatcher(processes=1, max_batch=4, max_latency=0.100))
    d.arrive(request(0.0))
    [first], _ = d.decide(0.0)
    d.done(0, 1, 3.0)  # the model paused under it
    assert d.shedding
    actions, _ = d.decide(3.0)
    [probe] = actions
    assert probe.requests[0].probe and probe.requests[0].payload == {"x": 0.0} and probe.requests[0].id != first.requests[0].id
    d.done(0, 1, 2.5, probe=True)  # still paused
    actions, wake = d.decide(3.1)
    assert actions == [] and wake == pytest.approx(3.0 + Dispatcher.PROBE_INTERVAL)
    [again], _ = d.decide(wake)
    d.done(0, 1, 0.011, probe=True)
    assert not d.shedding and again.requests[0].probe


# --- padding ------------------------------------------------------------------------------


def test_padding_examples():
    assert bucket_for((100,), [(64,), (128,), (256,)]) == (128,)
    assert bucket_for((3, 5), [(4, 4), (8, 8), (4, 6)]) == (4, 6)
    with pytest.raises(TooLarge, match=r"fits no bucket; buckets: \[\[64\], \[128\]\]"):
        bucket_for((129,), [(64,), (128,)])
    assert pad([[1, 2], [3, 4]], (3, 3)) == [[1, 2, 0], [3, 4, 0], [0, 0, 0]]


shapes = st.lists(st.integers(1, 6), min_size=1, max_size=3)


@settings(max_examples=200, deadline=None)
@given(st.data(), shapes)
def test_every_input_lands_in_the_smallest_fitting_bucket_and_comes_back_unpadded(data, shape):
    dims = len(shape)
    buckets = data.draw(st.lists(st.tuples(*[st.integers(1, 8)] * dims), min_size=1, max_size=5, unique=True))

    counter = iter(range(1, 10**6))

    def build(s):
        return [build(s[1:]) for _ in range(s[0])] if s else next(counter)

    value = build(tuple(shape))
    fitting = [b for b in buckets if all(x <= y for x, y in zip(shape, b, strict=True))]
    if not fitting:
        with pytest.raises(TooLarge):
            bucket_for(tuple(shape), buckets)
        return
    chosen = bucket_for(tuple(shape), buckets)
    assert chosen in fitting
    volume = 1
    for x in chosen:
        volume *= x
    assert all(volume <= __import__("math").prod(b) for b in fitting)  # no smaller bucket holds it
    padded = pad(value, chosen)
    assert shape_of(padded) == chosen
    assert unpad(padded, tuple(shape)) == value


# --- the front end for real, on loopback ----------------------------------------------------


async def start(app, port):
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


async def with_front_end(scenario, *, processes=2, fixed_ms=20, per_item_ms=2, max_batch=8, max_latency=0.5, buckets=None):
    ports = [free_port() for _ in range(processes)]
    runners = [await start(model_server.app(model_server.stand_in(fixed_ms, per_item_ms)), p) for p in ports]
    front = FrontEnd([f"http://127.0.0.1:{p}" for p in ports], max_batch, max_latency, buckets)
    front_port = free_port()
    runners.append(await start(front.app(), front_port))
    try:
        async with aiohttp.ClientSession() as session:
            return await scenario(session, f"http://127.0.0.1:{front_port}")
    finally:
        for r in runners:
            await r.cleanup()


def test_the_front_end_batches_answers_each_request_and_reports_metrics():
    async def scenario(session, url):
        async with session.get(f"{url}/readyz") as r:
            assert r.status == 200

        async def one(i):
            async with session.post(f"{url}/predict", json=[i, i + 1]) as r:
                return r.status, await r.json()

        results = await asyncio.gather(*(one(i) for i in range(40)))
        assert [status for status, _ in results] == [200] * 40, results
        assert [body for _, body in results] == [[i, i + 1] for i in range(40)]  # each gets its own answer
        async with session.get(f"{url}/metrics") as r:
            text = await r.text()
        batches = float(next(line.split()[-1] for line in text.splitlines() if line.startswith("inferentia_batch_size_count")))
        assert batches < 40  # requests were grouped
        assert "inferentia_batch_queue_wait_seconds_bucket" in text and 'inferentia_batch_inflight{process="1"}' in text

    # A budget no busy test machine misses: this is about batching, not latency.
    asyncio.run(with_front_end(scenario, max_latency=10.0))


def test_inputs_are_padded_to_their_bucket_and_too_large_ones_get_413():
    async def scenario(session, url):
        async with session.post(url + "/", json=[1, 2, 3]) as r:
            assert r.status == 200 and await r.json() == [1, 2, 3]  # padded to [4], answered, cut back
        async with session.post(url + "/", json=list(range(9))) as r:
            assert r.status == 413
            assert (await r.json())["buckets"] == [[4], [8]]

    asyncio.run(with_front_end(scenario, buckets=[[4], [8]], max_latency=10.0))


# Held to seconds of real time: make test runs it alone (pyproject's exclusive marker).
@pytest.mark.exclusive
@pytest.mark.parametrize("buckets", [None, [[4], [8]]])
def test_hostile_bodies_get_400_at_a_bounded_cost_and_a_normal_client_is_answered(buckets):
    """100,000 nested arrays once answered 500 (RecursionError in the decoder); NaN and
    Infinity are not JSON numbers; a number too long to convert is not an input."""
    hostile = {
        "deep": b"[" * 100_000 + b"]" * 100_000,
        "nan": b"[NaN, 1]",
        "infinity": b"[1, Infinity]",
        "huge integer": b"[" + b"9" * 10_000 + b"]",
        "not json": b"[1, 2",
    }
    if buckets:
        # JSON the decoder takes, but no input of a bucket's shape: the shape check must refuse it
        # (without buckets the front end does not read inputs, and passes it on).
        hostile["deep, within the decoder's limit"] = b"[" * 900 + b"1" + b"]" * 900

    async def scenario(session, url):
        for name, body in hostile.items():
            started = time.monotonic()
            async with session.post(url + "/", data=body, headers={"Content-Type": "application/json"}) as r:
                assert r.status == 400, (name, r.status, await r.text())
                assert "error" in await r.json()
            assert time.monotonic() - started < 2, name  # refused at once, not after parsing for seconds
        async with session.post(url + "/", json=[1, 2, 3]) as r:
            assert r.status == 200  # everyone else is still served

    asyncio.run(with_front_end(scenario, buckets=buckets, max_latency=10.0))


def test_overload_is_shed_with_503_and_retry_after_instead_of_queueing():
    async def scenario(session, url):
        async def one(i):
            async with session.post(url + "/", json=i) as r:
                return r.status, r.headers.get("Retry-After")

        results = await asyncio.gather(*(one(i) for i in range(200)))
        codes = [c for c, _ in results]
        assert 503 in codes and 200 in codes
        assert all(retry and int(retry) >= 1 for c, retry in results if c == 503)
        async with session.get(url + "/metrics") as r:
            assert 'inferentia_batch_rejected_total{code="503"}' in await r.text()

    # One slow process, a 100 ms budget, 200 requests at once: most cannot be served in time.
    asyncio.run(with_front_end(scenario, processes=1, fixed_ms=40, per_item_ms=5, max_batch=4, max_latency=0.1))


def test_readyz_waits_for_every_model_process():
    async def scenario():
        front = FrontEnd([f"http://127.0.0.1:{free_port()}"], 4, 0.1)
        port = free_port()
        runner = await start(front.app(), port)
        try:
            async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/readyz") as r:
                assert r.status == 503 and json.loads(await r.text())["processes"]
        finally:
            await runner.cleanup()

    asyncio.run(scenario())


# Held to seconds of real time: make test runs it alone (pyproject's exclusive marker).
@pytest.mark.exclusive
def test_a_model_that_pauses_is_shed_then_served_again_within_two_seconds_of_its_return():
    """A model process that stops answering for two seconds (a GC pause, a runtime hiccup) under
    traffic: its slow batches leave no request within the budget, the front end sheds (503, and
    /readyz fails so the Service routes around it), probes, and serves again once the model answers."""
    gate = asyncio.Event()
    gate.set()

    async def model(request: web.Request) -> web.Response:
        inputs = await request.json()
        await gate.wait()
        await asyncio.sleep(0.005)
        return web.json_response(inputs)

    async def healthz(_request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def scenario():
        app = web.Application()
        app.router.add_post("/", model)
        app.router.add_get("/healthz", healthz)
        model_port, port = free_port(), free_port()
        runners = [await start(app, model_port)]
        front = FrontEnd([f"http://127.0.0.1:{model_port}"], 4, 0.2)
        runners.append(await start(front.app(), port))
        seen: list[tuple[float, int]] = []
        ready: list[tuple[float, int]] = []
        stop = asyncio.Event()

        async def client(session: aiohttp.ClientSession) -> None:
            while not stop.is_set():
                async with session.post(f"http://127.0.0.1:{port}/", json=[1]) as r:
                    seen.append((time.monotonic(), r.status))
                await asyncio.sleep(0.02)

        async def readiness(session: aiohttp.ClientSession) -> None:
            while not stop.is_set():
                async with session.get(f"http://127.0.0.1:{port}/readyz") as r:
                    ready.append((time.monotonic(), r.status))
                await asyncio.sleep(0.05)

        try:
            async with aiohttp.ClientSession() as session:
                tasks = [asyncio.create_task(client(session)) for _ in range(4)] + [asyncio.create_task(readiness(session))]
                await asyncio.sleep(0.1)
                gate.clear()  # the pause: its batch takes 2 s, ten times the budget
                await asyncio.sleep(2.0)
                gate.set()
                back = time.monotonic()
                await asyncio.sleep(3.0)
                stop.set()
                await asyncio.gather(*tasks)
        finally:
            for r in runners:
                await r.cleanup()
        return back, seen, ready

    back, seen, ready = asyncio.run(scenario())
    after = [(t - back, status) for t, status in seen if t > back]
    # Shedding shows in a request's 503 or, when a loaded machine sends the next request only once
    # the front end has probed the model back, in /readyz (polled every 50 ms meanwhile).
    shed = any(status == 503 for _, status in after) or any(status == 503 for t, status in ready if t > back)
    assert shed, f"the slow batches made it shed: {after}, {ready}"
    # Served again, and from then on, within two seconds of the model's return.
    first_served = next((t for t, status in after if status == 200 and all(s == 200 for u, s in after if u >= t)), None)
    assert first_served is not None and first_served < 2.0, after
    assert ready[-1][1] == 200, ready


def test_readyz_fails_while_the_front_end_sheds_everything():
    """While no process is estimated to answer in time, nothing is admitted: the replica says it
    is not ready, so that the Service sends its clients to replicas that can answer."""

    async def scenario():
        front = FrontEnd([f"http://127.0.0.1:{free_port()}"], 4, 0.1, dispatcher=paused(processes=1))
        port = free_port()
        runner = await start(front.app(), port)
        try:
            async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/readyz") as r:
                assert r.status == 503 and "shedding" in json.loads(await r.text())
        finally:
            await runner.cleanup()

    asyncio.run(scenario())


def stand_in_model_server(port: int) -> list[str]:
    """The reference model server's command line (docs/serving-pod.md), a stand-in model of 1 ms a batch, on loopback."""
    import sys

    return [
        sys.executable,
        "-m",
        "inferentia_operator.batching.model_server",
        "--stand-in",
        "1,0",
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
    ]


def test_the_reference_model_server_starts_from_its_command_line():
    """The command docs/serving-pod.md gives (``python -m ...model_server``) starts and answers: it
    once raised NameError at start, which tests calling app() could not see."""
    import subprocess
    import time
    import urllib.request

    port = free_port()
    server = subprocess.Popen(stand_in_model_server(port), stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while True:
            assert server.poll() is None, f"the model server exited: {server.stderr.read()}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as reply:
                    assert json.loads(reply.read()) == {"ok": True}
                    break
            except OSError:
                assert time.monotonic() < deadline, "the model server never answered /healthz"
                time.sleep(0.2)
        request = urllib.request.Request(f"http://127.0.0.1:{port}/", data=b"[1, 2, 3]", headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=5) as reply:
            assert len(json.loads(reply.read())) == 3
    finally:
        server.terminate()
        server.wait(10)


def test_a_process_that_is_not_listening_gets_503_and_retry_after_not_502():
    """The batch never reached the process, so a retry (by the client, or a proxy that retries
    on 503) is safe; 502 stays for a process that took the batch and failed."""

    async def scenario():
        front = FrontEnd([f"http://127.0.0.1:{free_port()}"], 4, 1.0)
        port = free_port()
        runner = await start(front.app(), port)
        try:
            async with aiohttp.ClientSession() as session, session.post(f"http://127.0.0.1:{port}/", json=[1]) as r:
                assert r.status == 503 and r.headers["Retry-After"] == "1", await r.text()
        finally:
            await runner.cleanup()

    asyncio.run(scenario())


def test_requests_waiting_and_running_are_exported_as_the_inference_gateway_reads_them():
    """The Gateway API Inference Extension's TotalQueuedRequests and TotalRunningRequests:
    while one slow process works on a batch, the rest wait; once all are answered, both are 0."""

    def gauge(text, name):
        return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")))

    async def scenario(session, url):
        async def one(i):
            async with session.post(url + "/", json=i) as r:
                return r.status

        requests = [asyncio.create_task(one(i)) for i in range(12)]
        await asyncio.sleep(0.15)  # the first batch (1 to 4 requests) is with the process for 0.3 s; the rest wait
        async with session.get(url + "/metrics") as r:
            during = await r.text()
        running = gauge(during, "inferentia_num_requests_running")
        assert 1 <= running <= 4
        assert gauge(during, "inferentia_num_requests_waiting") == 12 - running
        assert await asyncio.gather(*requests) == [200] * 12
        async with session.get(url + "/metrics") as r:
            after = await r.text()
        assert gauge(after, "inferentia_num_requests_running") == 0 == gauge(after, "inferentia_num_requests_waiting")

    asyncio.run(with_front_end(scenario, processes=1, fixed_ms=300, per_item_ms=0, max_batch=4, max_latency=30.0))
