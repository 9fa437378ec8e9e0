"""Loopback ports for the servers keyshift and its tests start: outside the kernel's
ephemeral range, where an outgoing connection could take a port picked free before
the server binds it."""

from __future__ import annotations

import socket

import pytest

from keyshift.store.server import ephemeral_port_range, free_port, listening_ports


def test_listening_ports_stop_below_the_ephemeral_range() -> None:
    assert listening_ports(20000, 55000, (32768, 60999)) == range(20000, 32768)
    assert listening_ports(20000, 30000, (32768, 60999)) == range(20000, 30000)


def test_a_range_that_leaves_too_few_ports_below_it_is_not_avoided() -> None:
    assert listening_ports(20000, 55000, (1024, 65535)) == range(20000, 55000)


def test_free_port_is_bindable_and_not_ephemeral() -> None:
    first, _ = ephemeral_port_range()
    for _ in range(50):
        port = free_port()
        assert 20000 <= port < min(55000, first)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_an_outgoing_connection_holds_cannot_be_listened_on() -> None:
    """Why: the failure the range avoids, on this kernel."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        with socket.create_connection(server.getsockname()) as client:
            local = client.getsockname()[1]
            first, last = ephemeral_port_range()
            assert first <= local <= last
            with socket.socket() as other:
                other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                with pytest.raises(OSError, match="in use"):
                    other.bind(("127.0.0.1", local))
