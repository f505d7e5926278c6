"""How the front end and the holder take a request in: charged before it is read, read within
its limits, and every way it can fail turned into an answer to that request alone.

A request's body is charged against the server's :class:`~.limits.Budget` before a byte of it
is read, by its Content-Length; a chunked body, whose length nobody declared, is charged as its
chunks arrive. aiohttp's own parser has already refused the framings a request can lie with
(a negative, non-numeric or repeated Content-Length, one beside Transfer-Encoding, a chunk size
that is not hex or overflows), before any handler runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from .limits import Budget, Limits


class Refusal(Exception):
    """An answer to one request, without going further: its status, why, and whether the
    connection closes with it (the body was not read, so nothing else can follow on it)."""

    def __init__(self, status: int, message: str, *, retry_after: int | None = None, close: bool = False, counted_as: int | None = None):
        super().__init__(message)
        self.status, self.retry_after, self.close = status, retry_after, close
        # What the metrics count it as: 499 (client closed request, as nginx counts it) for a
        # client that left, whose answer nobody reads.
        self.counted_as = counted_as or status

    def response(self) -> web.Response:
        headers = {"Retry-After": str(self.retry_after)} if self.retry_after else None
        answer = web.json_response({"error": str(self)}, status=self.status, headers=headers)
        if self.close:
            answer.force_close()
        return answer


class Charge:
    """What one request, from the client address ``peer``, holds of a budget, from before its
    body is read until it is answered."""

    def __init__(self, budget: Budget, peer: str) -> None:
        self.budget, self.peer, self.bytes = budget, peer, 0

    @classmethod
    def of(cls, budget: Budget, request: web.Request) -> Charge:
        """The charge of ``request``, held by the address it came from (as the socket has it:
        behind a source NAT or a proxy, every client shares the proxy's)."""
        return cls(budget, request.remote or "")

    def to(self, size: int) -> bool:
        """Holds ``size`` bytes from now on; False (holding what it held) when the budget, or its address's share, has no room."""
        if not self.budget.resize(self.bytes, size, self.peer):
            return False
        self.bytes = size
        return True

    def release(self) -> None:
        self.budget.resize(self.bytes, 0, self.peer)
        self.bytes = 0


def over_budget() -> Refusal:
    return Refusal(503, "too many request bytes in flight; retry later", retry_after=1, close=True)


async def read_body(request: web.Request, charge: Charge, limits: Limits) -> bytes:
    """The request's whole body, charged to ``charge`` before it is read (or as it arrives);
    a :class:`Refusal` when it is too large, the budget has no room, it is not sent in time, or
    the client leaves. The caller releases the charge once the request is answered."""
    declared = request.content_length
    if declared is not None and declared > limits.max_body:
        raise Refusal(413, f"the body is larger than {limits.max_body} bytes", close=True)
    if declared and not charge.to(declared):
        raise over_budget()
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(limits.body_timeout):
            while chunk := await request.content.readany():
                size += len(chunk)
                if size > limits.max_body:
                    raise Refusal(413, f"the body is larger than {limits.max_body} bytes", close=True)
                if size > charge.bytes and not charge.to(size):
                    raise over_budget()
                chunks.append(chunk)
    except TimeoutError:
        # The rest of the body is not waited for: the connection closes with the answer.
        raise Refusal(408, f"the body did not arrive within {limits.body_timeout:g} s", close=True) from None
    except ConnectionError:
        # The client left mid-body: nobody to answer, and nothing worth a traceback in the log.
        raise Refusal(400, "the client closed the connection mid-body", close=True, counted_as=499) from None
    return b"".join(chunks)


def stall(budget: Budget, within: float) -> dict[str, Any] | None:
    """Why the server is unwell, or None: no request could be admitted for longer than
    ``within`` seconds. /readyz uses the longest a request is held (stop sending it traffic);
    /healthz the sum of every bound a request has (past it the budget will not empty by
    itself, so the kubelet restarts the container)."""
    stalled = budget.stalled_for()
    if stalled <= within:
        return None
    return {"error": f"no request admitted for {stalled:.1f} s, longer than {within:g} s: the body budget is held"}


async def taken_in_time(request: web.Request, write: Awaitable[object], limits: Limits, cut: Callable[[], None]) -> bool:
    """Whether the client took what ``write`` sends within the body deadline, as its request had
    to arrive within it; if not, its connection is cut (``cut`` counts it): aiohttp would wait for
    ever on a client that stops reading, once more than its buffer's 64 KiB is unread."""
    try:
        async with asyncio.timeout(limits.body_timeout):
            await write
    except TimeoutError:
        cut()
        if request.transport is not None:
            request.transport.abort()
        return False
    return True
