"""Free ports for the local cluster's components and the tests' own servers, on this machine.

A port picked by binding port 0 comes from the kernel's ephemeral range, the range
every outgoing connection takes its local port from: between picking it and the
component binding it, any connection on the machine may take it, and the component
fails with "address already in use". Ports are picked below that range instead, where
the kernel hands none out on its own; each is checked free by binding it, and one
process never hands out the same port twice. A component that still loses its port
(another program bound it in the meantime) is started again on a new one
(localcluster.PortInUse).
"""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

# Ports below the ephemeral range to pick from (the default range starts at 32768).
SPAN = 12000
_handed_out: set[int] = set()
_lock = threading.Lock()
_random = random.SystemRandom()


def ephemeral_range() -> tuple[int, int]:
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def _bindable(address: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((address, port))
        except OSError:
            return False
    return True


def free_port(address: str = "127.0.0.1") -> int:
    """A port nothing listens on, outside the ephemeral range when the machine leaves room below it."""
    low, _ = ephemeral_range()
    first = max(1024, low - SPAN)
    with _lock:
        if low - first >= 1000:
            for _ in range(500):
                port = _random.randrange(first, low)
                if port not in _handed_out and _bindable(address, port):
                    _handed_out.add(port)
                    return port
        # No room below the ephemeral range (or none of it free): the kernel's pick.
        with socket.socket() as s:
            s.bind((address, 0))
            port = s.getsockname()[1]
        _handed_out.add(port)
        return port
