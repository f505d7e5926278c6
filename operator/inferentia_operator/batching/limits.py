"""What a client may cost the batching front end: its own module so that the CLI can show the
defaults without loading aiohttp."""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1024 * 1024


@dataclass(frozen=True)
class Limits:
    """What one client, or many, may hold of the front end.

    A JSON body of short numbers takes about eleven times its size once decoded (4 MiB of
    ``1.5,`` is 45 MiB of Python floats), and the front end holds it decoded twice (the input,
    then the model process's output) besides the bytes: about twenty times the body, as
    measured by tests/test_frontend_limits.py. So the bodies held at once, from the first
    byte read to the answer sent, are budgeted in bytes: 8 MiB of them is about 160 MiB, inside
    the batcher container's 256 MiB limit with the process's own 40. A request over the budget
    is shed with 503 and Retry-After, as an over-latency one is.
    """

    # From a connection's start, or from its last answer, until a request's headers are in.
    # aiohttp has no header-read timeout of its own; its keep-alive timer, armed when a
    # connection opens and after each answer, closes a connection still waiting for a whole
    # request line and headers (aiohttp web_protocol.RequestHandler._process_keepalive), so
    # that timer is this deadline. Clients that keep connections open reconnect after it.
    header_timeout: float = 15.0
    body_timeout: float = 30.0  # from the handler's start until the whole body is read: 408 after
    max_connections: int = 1024  # open connections; one more is answered 503 and closed
    max_body: int = 4 * MIB  # one request: 413 above it
    body_budget: int = 8 * MIB  # bodies held at once, read through answered

    def budget_for(self, size: int) -> int:
        """The part of the budget a body of ``size`` may fill. An eighth is kept for small
        bodies (up to a sixteenth of that eighth), so that large ones sent at once, which the
        budget sheds, never starve the ordinary clients beside them."""
        reserve = self.body_budget // 8
        return self.body_budget if size <= reserve // 16 else self.body_budget - reserve


DEFAULT_LIMITS = Limits()
