"""How the operator's event loop ends: no error on the way out.

kopf 1.45's watcher iterates its watch stream (an async generator holding others: kopf's
`streaming_block` context manager and the continuous watch) and does not close it when it is
cancelled while awaiting something else. asyncio.run then closes every async generator still
open at once, the held ones and their holder together, and the holder fails with "generator
didn't stop after athrow()" (seen in the operator's log on SIGTERM). The scenario here is that
shape, reduced."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest

from inferentia_operator.shell.runner import closing_generators_outermost_first


@contextlib.asynccontextmanager
async def block() -> AsyncIterator[None]:
    waiter = asyncio.create_task(asyncio.sleep(100))
    try:
        yield None
    finally:
        with contextlib.suppress(asyncio.CancelledError):
            waiter.cancel()
            await waiter


async def held() -> AsyncIterator[int]:
    while True:
        await asyncio.sleep(0.001)
        yield 1


async def holder(closed: list[str]) -> AsyncIterator[int]:
    try:
        while True:
            async with block():
                async for item in held():
                    yield item
    finally:
        closed.append("holder")


async def watcher_cancelled_between_events(closed: list[str], errors: list[dict[str, Any]]) -> AsyncIterator[int]:
    asyncio.get_running_loop().set_exception_handler(lambda loop, context: errors.append(context))

    stream = holder(closed)  # still referenced on the way out, as kopf's are (the log's error)

    async def consume() -> None:
        async for _ in stream:
            await asyncio.sleep(100)  # cancelled here, not inside the generator

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.05)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return stream  # held by asyncio.run's task until it has closed the loop's generators


def test_closing_what_a_holder_holds_before_the_holder_fails():
    """The control: asyncio.run closes the open generators all at once, in the order of a
    WeakSet (by address), so a held one can go first; done so on purpose here, it fails."""
    closed: list[str] = []
    errors: list[dict[str, Any]] = []
    failures: list[str] = []

    async def newest_first() -> None:
        started: list[AsyncIterator[Any]] = []
        sys.set_asyncgen_hooks(firstiter=started.append, finalizer=lambda generator: None)
        stream = await watcher_cancelled_between_events(closed, errors)
        assert stream is started[0] and len(started) == 3  # the holder, block()'s, held()
        for generator in reversed(started):
            try:
                await generator.aclose()  # type: ignore[attr-defined]
            except RuntimeError as exc:
                failures.append(f"{generator.__qualname__}: {exc}")

    asyncio.run(newest_first())
    assert failures == ["holder: generator didn't stop after athrow()"]


def test_the_operator_closes_holders_before_what_they_hold():
    closed: list[str] = []
    errors: list[dict[str, Any]] = []

    async def operator() -> None:
        stream = await closing_generators_outermost_first(watcher_cancelled_between_events(closed, errors))
        # Closed before asyncio.run's own closing, whose order (a WeakSet's) is left to chance.
        assert closed == ["holder"] and stream.ag_frame is None  # type: ignore[attr-defined]

    asyncio.run(operator())
    assert errors == []


def test_what_the_coroutine_returns_or_raises_passes_through():
    async def answer() -> int:
        return 42

    async def fail() -> None:
        raise ValueError("bad")

    assert asyncio.run(closing_generators_outermost_first(answer())) == 42
    with pytest.raises(ValueError, match="bad"):
        asyncio.run(closing_generators_outermost_first(fail()))


def test_a_generator_that_fails_to_close_is_reported_as_asyncio_reports_it_and_the_rest_are_closed():
    """What asyncio.run's own closing does with an error (the loop's exception handler), not a
    traceback out of the operator's return, and the generators after it still closed."""
    closed: list[str] = []
    errors: list[dict[str, Any]] = []

    async def failing() -> AsyncIterator[int]:
        try:
            yield 1
        finally:
            raise ValueError("cannot close")

    async def operator() -> tuple[AsyncIterator[int], AsyncIterator[int]]:
        first = failing()
        await anext(first)
        return first, await watcher_cancelled_between_events(closed, errors)  # both still referenced

    asyncio.run(closing_generators_outermost_first(operator()))
    assert [(type(e["exception"]), e["asyncgen"].__name__) for e in errors] == [(ValueError, "failing")]
    assert closed == ["holder"]
