"""Each test's Azurite is its own: one started on a port that another process took in between
(pytest-xdist's other worker, while a chaos run's outage left the port free) refuses to start
rather than hand its test the other's emulator."""

from __future__ import annotations

import socket

import pytest

from shared.idempotency.testing.azurite import Azurite, NotListening


def test_an_emulator_whose_port_another_process_listens_on_does_not_start() -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        with pytest.raises(NotListening):  # it exits (the port is in use) or never holds the port
            Azurite(port=other.getsockname()[1]).start(timeout=3)


def test_an_emulator_on_a_port_of_its_own_starts_and_holds_it() -> None:
    with Azurite() as azurite:
        socket.create_connection(("127.0.0.1", azurite.port), timeout=1).close()
