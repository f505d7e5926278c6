"""The batching front end under open-loop load, for real on loopback: fixed windows of 0,
5, 10, 20 and 40 ms and the adaptive dispatcher, side by side in one run, under steady
Poisson traffic and under on/off (bursty) Poisson traffic.

    make benchmark-batching          # or: python cluster/benchmark_batching.py --runs 3

Two stand-in model processes (``model_server --stand-in``) take FIXED + PER_ITEM * n ms
for a batch of n, one batch at a time each. The curve is illustrative, not a measured
model: a fixed cost per call that batching amortises and a cost per input that it does
not, the shape the Neuron batching guide describes for compiled batch sizes. The
offline throughput of always-full batches, processes * max_batch / latency(max_batch),
is the ceiling, measured in the same run.

For each traffic shape and rate, every dispatcher sees the same arrival times, after
WARM_UP seconds of the same traffic that are not measured (a front end runs for days;
the adaptive one tunes its window within its first few hundred requests). Per row:
p50 and p99 of the answered requests, requests answered within the budget per second
(an answer after the budget counts as a miss: the fixed windows never refuse, and would
otherwise be credited with answers seconds late), and the share refused with 503.

Goals (the verdict columns): at every rate, adaptive's p99 is at most 10% (or 5 ms)
above the best fixed window's and it answers at least as many within the budget (1%
allowed for noise); and its highest steady rate with p99 within the budget is at least
0.9x the offline ceiling. With --runs N the whole grid runs N times and the summary gives
the spread, since this machine is shared.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import multiprocessing
import random
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor

import aiohttp
from aiohttp import web

from batching_sim import TRAFFIC, WINDOWS, FixedWindow, Result, goal_met
from inferentia_operator.batching import model_server
from inferentia_operator.batching.dispatch import Dispatcher
from inferentia_operator.batching.frontend import FrontEnd
from ports import free_port

PROCESSES, MAX_BATCH, BUDGET = 2, 8, 0.100
FIXED_MS, PER_ITEM_MS = 20.0, 2.0
MIN_REQUESTS = 800  # measured per row, so that a low rate's p99 is not just its few slowest requests
WARM_UP = 2.0  # seconds of the same traffic first, not measured: a front end runs for days, not for one row


def dispatchers() -> dict[str, Callable[[], Dispatcher]]:
    modes: dict[str, Callable[[], Dispatcher]] = {}
    for w in WINDOWS:
        modes[f"fixed {w * 1000:g} ms"] = functools.partial(FixedWindow, PROCESSES, MAX_BATCH, w)
    modes["adaptive"] = lambda: Dispatcher(PROCESSES, MAX_BATCH, BUDGET)
    return modes


async def start(app: web.Application, port: int) -> web.AppRunner:
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


def load_in_another_process(url: str, times: list[float], measured_from: float) -> tuple[list[float], int, int, float]:
    """The load generator runs in a process of its own, so that its work does not delay
    the front end's (the machine has two cores: one for each)."""
    return asyncio.run(load(url, times, measured_from))


async def load(url: str, times: list[float], measured_from: float) -> tuple[list[float], int, int, float]:
    """Open loop: one request at each of ``times`` (seconds from the start), whatever the
    answers take; those sent before ``measured_from`` warm the front end up and are not
    counted. Returns the sorted latencies of the answered requests, the refused count,
    the sent count and the wall time from the first measured request to the last answer."""
    latencies: list[float] = []
    refused = 0
    measured = [at >= measured_from for at in times]
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(i: int) -> None:
            nonlocal refused
            started = time.monotonic()
            async with session.post(url, json=[i]) as r:
                await r.read()
                if not measured[i]:
                    return
                if r.status == 200:
                    latencies.append(time.monotonic() - started)
                else:
                    refused += 1

        tasks = []
        first = time.monotonic()
        for i, at in enumerate(times):
            await asyncio.sleep(max(0.0, first + at - time.monotonic()))
            tasks.append(asyncio.ensure_future(one(i)))
        await asyncio.gather(*tasks)
    return sorted(latencies), refused, sum(measured), time.monotonic() - (first + measured_from)


async def offline_throughput(backends: list[str], seconds: float = 4.0) -> float:
    """Always-full batches sent back to back to every process, with no front end: the
    ceiling, measured on this machine in this run (HTTP to the processes included)."""
    done = 0
    async with aiohttp.ClientSession() as session:

        async def feed(url: str) -> None:
            nonlocal done
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                async with session.post(url + "/", json=list(range(MAX_BATCH))) as r:
                    await r.read()
                done += MAX_BATCH

        await asyncio.gather(*(feed(b) for b in backends))
    return done / seconds


def verdict(rows: dict[str, Result]) -> tuple[Result, float, bool]:
    """The goal at one rate, with 1% of the answered-in-budget rate allowed for noise."""
    return goal_met(rows["adaptive"], [r for n, r in rows.items() if n.startswith("fixed")], BUDGET, 0.99)


async def one_run(run: int, rates: list[float], seconds: float, backends: list[str], clients: ProcessPoolExecutor) -> dict:
    """The grid once: {(shape, rate): {mode: Result}}."""
    results: dict[tuple[str, float], dict[str, Result]] = {}
    for shape, traffic in TRAFFIC.items():
        for rate in rates:
            times = traffic(rate, WARM_UP + max(seconds, MIN_REQUESTS / rate), random.Random(run * 1000 + int(rate)))
            results[shape, rate] = {}
            for name, make in dispatchers().items():
                front = FrontEnd(backends, MAX_BATCH, BUDGET, dispatcher=make())
                port = free_port()
                runner = await start(front.app(), port)
                try:
                    outcome = await asyncio.get_running_loop().run_in_executor(
                        clients, load_in_another_process, f"http://127.0.0.1:{port}/", times, WARM_UP
                    )
                finally:
                    await runner.cleanup()
                results[shape, rate][name] = Result(*outcome)
    return results


def print_run(results: dict, offline: float) -> float:
    """Prints one run's grid and returns adaptive's highest steady rate within the budget, as a share of offline."""
    names = list(dispatchers())
    print(
        "| traffic | offered /s | "
        + " | ".join(f"{n}: p99 ms" for n in names)
        + " | best fixed: p99 ms, in budget /s | adaptive: p99 ms, in budget /s, 503 | goal |"
    )
    print("|---" * (len(names) + 5) + "|")
    highest = 0.0
    for (shape, rate), rows in results.items():
        adaptive = rows["adaptive"]
        best, _, ok = verdict(rows)
        cells = " | ".join(f"{rows[n].pct(99) * 1000:.0f}" for n in names)
        print(f"| {shape} | {rate:.0f} | {cells} | {best.pct(99) * 1000:.0f}, {best.within(BUDGET):.0f} | "
              f"{adaptive.pct(99) * 1000:.0f}, {adaptive.within(BUDGET):.0f}, {adaptive.refused / max(1, adaptive.sent):.0%} | "
              f"{'met' if ok else 'NOT met'} |")  # fmt: skip
        if shape == "steady" and adaptive.pct(99) <= BUDGET:
            highest = max(highest, adaptive.answered_per_second / offline)
    print(f"\nadaptive: highest steady rate with p99 within {BUDGET * 1000:.0f} ms: {highest:.2f}x offline "
          f"({'met' if highest >= 0.9 else 'NOT met'}: goal 0.90x)\n")  # fmt: skip
    return highest


async def main_async(rates: list[float], seconds: float, runs: int) -> None:
    ports = [free_port() for _ in range(PROCESSES)]
    runners = [await start(model_server.app(model_server.stand_in(FIXED_MS, PER_ITEM_MS)), p) for p in ports]
    backends = [f"http://127.0.0.1:{p}" for p in ports]
    nominal = PROCESSES * MAX_BATCH / ((FIXED_MS + PER_ITEM_MS * MAX_BATCH) / 1000)
    clients = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    all_runs = []
    try:
        for run in range(1, runs + 1):
            offline = await offline_throughput(backends)
            print(f"## run {run} of {runs}: {PROCESSES} processes, batch latency {FIXED_MS:g} + {PER_ITEM_MS:g}*n ms, "
                  f"max batch {MAX_BATCH}, budget {BUDGET * 1000:.0f} ms; offline throughput of full batches: "
                  f"{offline:.0f}/s measured ({nominal:.0f}/s on paper, without HTTP)\n")  # fmt: skip
            results = await one_run(run, rates, seconds, backends, clients)
            all_runs.append((results, print_run(results, offline)))
    finally:
        clients.shutdown()
        for r in runners:
            await r.cleanup()
    if runs > 1:
        summarise(all_runs)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f})"


def summarise(all_runs: list[tuple[dict, float]]) -> None:
    print(f"## Across {len(all_runs)} runs: median (min-max)\n")
    print("| traffic | offered /s | best fixed: p99 ms | adaptive: p99 ms | best fixed: in budget /s | adaptive: in budget /s | goal met |")
    print("|---|---|---|---|---|---|---|")
    for key in all_runs[0][0]:
        best_p99, ad_p99, best_in, ad_in, met = [], [], [], [], 0
        for results, _ in all_runs:
            rows = results[key]
            best, most, ok = verdict(rows)
            best_p99.append(best.pct(99) * 1000)
            ad_p99.append(rows["adaptive"].pct(99) * 1000)
            best_in.append(most)
            ad_in.append(rows["adaptive"].within(BUDGET))
            met += ok
        print(f"| {key[0]} | {key[1]:.0f} | {spread(best_p99)} | {spread(ad_p99)} | {spread(best_in)} | {spread(ad_in)} | "
              f"{met} of {len(all_runs)} |")  # fmt: skip
    highest = [h for _, h in all_runs]
    print(f"\nadaptive's highest steady rate within the budget: {', '.join(f'{h:.2f}x' for h in highest)} of offline "
          f"({'met' if min(highest) >= 0.9 else 'NOT met'} in every run: goal 0.90x)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="50,100,150,200,300,400,450,600")
    parser.add_argument("--seconds", type=float, default=3.0, help=f"per row, or as long as {MIN_REQUESTS} requests take")
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    asyncio.run(main_async([float(r) for r in args.rates.split(",")], args.seconds, args.runs))


if __name__ == "__main__":
    main()
