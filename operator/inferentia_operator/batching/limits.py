"""What a client may cost the batching front end and the holder: its own module, free of
aiohttp, so that the CLI can show the defaults and the pure parts are unit-tested alone.

Every limit here is in the table of docs/security.md, which tests/test_security_docs.py
holds to these defaults."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MIB = 1024 * 1024

# Nesting an input may have. A tensor as JSON is nested as deep as it has dimensions, and no
# Neuron model takes more than a handful; the decoder's own limit (Python's recursion limit,
# about 1,000, and lower on a smaller stack) is never reached, so the verdict on a deep input
# does not depend on the stack, and re-encoding what was admitted cannot recurse too far.
MAX_DEPTH = 32
# What the front end holds for each byte of body the budget charges: the body, then its input
# decoded, then the model process's answer decoded (Limits says how it was measured). The
# budget bounds the process's memory by this times the body budget.
MEMORY_PER_BUDGET_BYTE = 20
# What one padded element is charged against the body budget: as many budget bytes as the memory
# it costs, in that unit. Padding adds an 8-byte slot to a list (the zero is one shared object);
# the batch sent to the model process spends it "0, " (3 bytes), encoded once as text and
# once as bytes; the answer of the bucket's shape, at worst a float an element, costs a number
# of up to 20 characters, then 32 bytes decoded (the float and its slot): 8 + 6 + 20 + 32 = 66
# bytes, 4 budget bytes.
PADDED_ELEMENT_MEMORY = 8 + 2 * 3 + 20 + 32
PADDED_ELEMENT_BYTES = -(-PADDED_ELEMENT_MEMORY // MEMORY_PER_BUDGET_BYTE)
# One client address may hold at most the open connections, and the body budget, over this,
# unless set on its own. A half, not the disaggregated proxy's quarter: the front end's clients
# often come through few addresses (an inference gateway's or ingress's proxy replicas, a source
# NAT: a NodePort Service masquerades its clients to the node's address), and a quarter would
# hold a gateway with one replica to a quarter of the front end; the budget's share must also
# take one largest body, and 8 MiB / 4 is less than 4 MiB. A half still keeps one address from
# taking everything: another (a second client, Prometheus, the kubelet's probes when they come
# from another address than the client's) always finds the other half.
PEER_SHARE = 2


@dataclass(frozen=True)
class Limits:
    """What one client, or many, may hold of the front end or the holder.

    A JSON body of short numbers takes about eleven times its size once decoded (4 MiB of
    ``1.5,`` is 45 MiB of Python floats), and the front end holds it decoded twice (the input,
    then the model process's output) besides the bytes: about twenty times the body, as
    measured by tests/test_frontend_limits.py. So the bodies held at once, from the first
    byte read to the answer sent, are budgeted in bytes: 8 MiB of them is about 160 MiB, inside
    the batcher container's 256 MiB limit with the process's own 40. A request over the budget
    is shed with 503 and Retry-After, as an over-latency one is. A body is charged before it
    is read (its Content-Length), or as it arrives (chunked), and an input padded to a bucket
    is charged its padded size before it is padded.
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
    # One call to a model process (the front end) or a replica (the holder's forward), from
    # sending to the whole answer. It bounds how long a request can hold its part of the budget.
    process_timeout: float = 300.0
    # Open connections from one address; one more is answered 503 and closed. 0: the open
    # connections over PEER_SHARE, at least one.
    max_peer_connections: int = 0
    # Body bytes one address holds at once, one request alone excepted (Budget.resize); 503 past
    # it. 0: the body budget over PEER_SHARE, but never less than one largest body (nor more
    # than the budget), so that an address holding one can still send another.
    peer_budget: int = 0

    def __post_init__(self) -> None:
        if not self.max_peer_connections:
            object.__setattr__(self, "max_peer_connections", max(1, self.max_connections // PEER_SHARE))
        if not self.peer_budget:
            object.__setattr__(self, "peer_budget", max(self.body_budget // PEER_SHARE, min(self.max_body, self.body_budget)))

    def budget_for(self, size: int) -> int:
        """The part of the budget a body of ``size`` may fill. An eighth is kept for small
        bodies (up to a sixteenth of that eighth), so that large ones sent at once, which the
        budget sheds, never starve the ordinary clients beside them."""
        reserve = self.body_budget // 8
        return self.body_budget if size <= reserve // 16 else self.body_budget - reserve


DEFAULT_LIMITS = Limits()


class Budget:
    """The body bytes held at once, by all and by each client address, and whether admission has stalled.

    Each request holds a charge from before its body is read until its answer is sent;
    :meth:`resize` changes it (up only if there is room, in the budget and in its address's
    share, down always). A front end whose budget is held and which has refused every request
    since some moment has *stalled*: :meth:`stalled_for` says how long, so that its readiness
    and liveness can say so. A budget that empties is not stalled, whatever it refused: the next
    request would be admitted; nor is one that refuses only addresses over their share: another
    address would be admitted.

    An address is kept only while it holds bytes, so the addresses kept are never more than the
    requests that hold a charge (each holds a connection: at most Limits.max_connections),
    however many addresses an attacker sends from."""

    def __init__(self, limits: Limits, clock: Callable[[], float] = time.monotonic):
        self.limits, self.clock = limits, clock
        self.held = 0
        self._held_by: dict[str, int] = {}
        self._refusing_since: float | None = None

    def resize(self, charged: int, size: int, peer: str = "") -> bool:
        """Changes a request's charge from ``charged`` to ``size`` bytes, held by the client
        address ``peer``: False (and nothing changed) when growing it would overfill the budget,
        or the address's share of it where the address holds other requests' bytes too."""
        if size > charged:
            if self.held - charged + size > self.limits.budget_for(size):
                if self._refusing_since is None:
                    self._refusing_since = self.clock()
                return False
            # The share bounds what the address holds beside this request: one request alone
            # may take what the budget gives it, or an input padded past the share (within the
            # budget) could never be admitted from any address.
            beside = self._held_by.get(peer, 0) - charged
            if beside and beside + size > self.limits.peer_budget:
                return False
        if charged == 0 and size > 0:
            self._refusing_since = None  # a request admitted: not stalled
        self.held += size - charged
        if held := self._held_by.get(peer, 0) + size - charged:
            self._held_by[peer] = held
        else:
            self._held_by.pop(peer, None)
        if self.held == 0:
            self._refusing_since = None
        return True

    def peers(self) -> int:
        """How many addresses hold bytes."""
        return len(self._held_by)

    def stalled_for(self) -> float:
        """Seconds since the budget last admitted a request while refusing others; 0 when it is not stalled."""
        if self._refusing_since is None or self.held == 0:
            return 0.0
        return self.clock() - self._refusing_since


class BadInput(ValueError):
    pass


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise BadInput(f"{text} is beyond the range of a float; valid numbers are finite")
    return value


def _not_json(constant: str) -> Any:
    raise BadInput(f"{constant} is not a JSON number")


def depth_of(value: Any, limit: int = MAX_DEPTH) -> int:
    """How deeply lists and objects nest in ``value``, counted without recursion and no further than ``limit + 1``."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)):
            depth += 1
            deepest = max(deepest, depth)
            if deepest > limit:
                return deepest
            # Only containers go on the stack: a flat list of a million numbers pushes nothing.
            stack.extend((v, depth) for v in (item.values() if isinstance(item, dict) else item) if isinstance(v, (list, dict)))
    return deepest


def parse_input(body: bytes, max_depth: int = MAX_DEPTH) -> Any:
    """One JSON input, or BadInput with why. Numbers must be finite (``1e999``, ``NaN`` and
    ``Infinity`` are refused: the model process would refuse the whole batch they are in) and
    nesting at most ``max_depth`` deep, at any depth the client tries."""
    try:
        value = json.loads(body, parse_constant=_not_json, parse_float=_finite)
    except RecursionError:
        raise BadInput(f"the body is nested more than {max_depth} deep") from None
    except BadInput:
        raise
    except (ValueError, UnicodeDecodeError):
        raise BadInput("the body must be one JSON input") from None
    if depth_of(value, max_depth) > max_depth:
        raise BadInput(f"the body is nested more than {max_depth} deep")
    return value
