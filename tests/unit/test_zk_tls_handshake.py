"""check_handshake: servers tried one after another, not the whole ensemble at once.

A stand-in for kazoo's handler decides what each server does with a handshake
(completes, refuses, or stays silent until the test lets it go); the order is fixed by
replacing the module's shuffle. The real handshakes, refusals and their messages are
tested against a real ZooKeeper in tests/integration/test_zk_tls.py.
"""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from discovery.errors import ZkConnectionError
from discovery.zk import tls

LOCALHOST = "127.0.0.1"


class _Socket:
    def close(self) -> None:
        pass


@dataclass
class _Handler:
    """kazoo's handler as check_handshake uses it: ``create_connection``, per port."""

    behaviour: dict[int, str]
    released: threading.Event = field(default_factory=threading.Event)
    calls: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def create_connection(self, address: tuple[str, int], *, timeout: float, **_: Any) -> _Socket:
        port = address[1]
        with self.lock:
            self.calls.append(port)
        what = self.behaviour[port]
        if what == "refuses":
            raise ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number")
        if what == "silent":
            self.released.wait(timeout)
            raise TimeoutError("timed out")
        return _Socket()


@dataclass
class _Client:
    """The parts of a KazooClient that check_handshake reads."""

    handler: _Handler
    hosts: list[tuple[str, int]]
    use_ssl: bool = True
    ca: str | None = None
    certfile: str | None = None
    keyfile: str | None = None


@pytest.fixture(autouse=True)
def in_the_order_written(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tls.random, "sample", lambda hosts, n: list(hosts)[:n])


@pytest.fixture
def make_client() -> Iterator[Any]:
    handlers: list[_Handler] = []

    def make(*behaviours: str) -> _Client:
        ports = range(20001, 20001 + len(behaviours))
        handler = _Handler(dict(zip(ports, behaviours, strict=True)))
        handlers.append(handler)
        return _Client(handler, [(LOCALHOST, port) for port in ports])

    yield make
    for handler in handlers:
        handler.released.set()


async def test_one_handshake_when_the_first_server_completes_it(make_client: Any) -> None:
    client = make_client("completes", "completes", "completes")
    await tls.check_handshake(client, timeout=5, stagger=60)
    assert client.handler.calls == [20001]


async def test_a_refusal_moves_to_the_next_server_at_once(make_client: Any) -> None:
    # A stagger of a minute: only the refusal can have started the second attempt.
    client = make_client("refuses", "completes", "completes")
    await tls.check_handshake(client, timeout=5, stagger=60)
    assert client.handler.calls == [20001, 20002]


async def test_a_silent_server_gets_company_after_the_stagger(make_client: Any) -> None:
    client = make_client("silent", "completes", "completes")
    try:
        await tls.check_handshake(client, timeout=30, stagger=0.05)
        assert client.handler.calls == [20001, 20002]
        assert not client.handler.released.is_set()  # returned while the first was silent
    finally:
        # Now, not in the fixture: the loop's teardown waits for the silent thread.
        client.handler.released.set()


async def test_the_timeout_bounds_every_attempt_together(make_client: Any) -> None:
    # The first server silent for the whole timeout: no time is left for the second
    # (kazoo's own connection and retries take over from there).
    client = make_client("silent", "completes")
    await tls.check_handshake(client, timeout=0.2, stagger=60)
    assert client.handler.calls == [20001]


async def test_every_server_refusing_is_an_error_naming_each(make_client: Any) -> None:
    client = make_client("refuses", "refuses")
    with pytest.raises(ZkConnectionError, match="TLS handshake with ZooKeeper refused") as err:
        await tls.check_handshake(client, timeout=5, stagger=60)
    assert f"{LOCALHOST}:20001" in str(err.value)
    assert f"{LOCALHOST}:20002" in str(err.value)


async def test_no_answer_at_all_leaves_it_to_kazoo(make_client: Any) -> None:
    client = make_client("silent", "silent")
    client.handler.released.set()  # each attempt times out at once
    await tls.check_handshake(client, timeout=1, stagger=0.05)
    assert sorted(client.handler.calls) == [20001, 20002]


async def test_a_plaintext_client_is_not_checked(make_client: Any) -> None:
    client = make_client("refuses")
    client.use_ssl = False
    await tls.check_handshake(client, timeout=5)
    assert client.handler.calls == []
