"""Free ports for the local cluster and the tests: outside the kernel's ephemeral range,
where no outgoing connection can take one between its pick and its bind."""

import socket

from ports import ephemeral_range, free_port


def test_ports_are_free_distinct_and_below_the_ephemeral_range():
    low, _ = ephemeral_range()
    picked = [free_port() for _ in range(50)]
    assert len(set(picked)) == 50
    assert all(1024 <= p < low for p in picked)
    for port in picked[:5]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # still free


def test_a_port_something_listens_on_is_never_picked(monkeypatch):
    import ports

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        busy = held.getsockname()[1]
        choices = iter([busy, busy])
        monkeypatch.setattr("ports._random.randrange", lambda a, b: next(choices, a + 7))
        monkeypatch.setattr(ports, "ephemeral_range", lambda: (busy + 2000, 60999))
        assert free_port() != busy
