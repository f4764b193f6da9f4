"""``bridge.testing.servers.free_ports``: distinct, free, never handed out twice, and drawn below the kernel's
ephemeral range (where no bind-to-0 or outgoing connection of another process can take them before they are bound)
when the range leaves room."""

from __future__ import annotations

import socket

import pytest

from bridge.testing import servers
from bridge.testing.servers import PORTS_FROM, free_ports


def test_ports_are_distinct_bindable_below_the_ephemeral_range_and_never_repeated() -> None:
    first = free_ports(20)
    second = free_ports(20)
    assert len(set(first + second)) == 40
    low = servers._below_ephemeral()
    for port in first + second:
        if low:
            assert PORTS_FROM <= port < low, (port, low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))  # free now


def test_without_room_below_the_range_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(servers, "_below_ephemeral", lambda: 0)
    ports = free_ports(3)
    assert len(set(ports)) == 3 and all(port > 0 for port in ports)
