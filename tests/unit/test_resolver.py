"""The fan-out's name cache: one lookup per name and freshness period, never a lookup in
front of a connection once a name has been resolved, and a name that moved followed at
once. The HTTP client's half runs against real sockets and the system's resolver."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Sequence

import pytest

from search_server.httpclient import Endpoint, HttpClient
from search_server.resolver import AddrInfo, CachingResolver, Resolver
from tests.support import eventually


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Lookups:
    """A lookup that answers as told and counts; ``gate`` holds answers until set."""

    def __init__(self, *addresses: str) -> None:
        self.addresses = list(addresses)
        self.calls: list[str] = []
        self.fail: OSError | None = None
        self.gate: asyncio.Event | None = None
        self.called = asyncio.Event()

    async def __call__(self, host: str) -> Sequence[AddrInfo]:
        self.calls.append(host)
        self.called.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return [_info(address) for address in self.addresses]


def _info(address: str) -> AddrInfo:
    return (socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, 0))


def _addresses(infos: Sequence[AddrInfo]) -> list[str]:
    return [info[4][0] for info in infos]


@pytest.fixture
async def clock() -> Clock:
    return Clock()


async def test_the_resolver_implements_the_seam() -> None:
    assert isinstance(CachingResolver(), Resolver)


async def test_an_answer_is_reused_while_fresh(clock: Clock) -> None:
    lookups = Lookups("10.0.0.1")
    resolver = CachingResolver(ttl=10, lookup=lookups, clock=clock)
    for _ in range(5):
        assert _addresses(await resolver.resolve("ds-1")) == ["10.0.0.1"]
    clock.now += 9.9
    await resolver.resolve("ds-1")
    assert lookups.calls == ["ds-1"]
    await resolver.resolve("ds-2")
    assert lookups.calls == ["ds-1", "ds-2"]
    assert len(resolver) == 2


async def test_a_stale_answer_is_used_while_it_is_refreshed_in_the_background(
    clock: Clock,
) -> None:
    lookups = Lookups("10.0.0.1")
    resolver = CachingResolver(ttl=10, lookup=lookups, clock=clock)
    await resolver.resolve("ds-1")
    lookups.addresses = ["10.0.0.2"]
    lookups.gate = asyncio.Event()  # a slow resolver: the refresh does not answer yet
    lookups.called.clear()
    clock.now += 11
    # Answered at once, from the stale entry: no lookup stands in front of the caller.
    for _ in range(3):
        infos = await asyncio.wait_for(resolver.resolve("ds-1"), 1)
        assert _addresses(infos) == ["10.0.0.1"]
    # The refresh runs in a task of its own: started once the loop gets a turn (since
    # Python 3.12 wait_for gives it none for a coroutine that never suspends).
    await asyncio.wait_for(lookups.called.wait(), 1)
    assert lookups.calls == ["ds-1", "ds-1"]  # one refresh, shared
    lookups.gate.set()

    async def refreshed() -> bool:
        return _addresses(await resolver.resolve("ds-1")) == ["10.0.0.2"]

    await eventually(refreshed, timeout=5, interval=0.001, message="the refreshed answer")
    assert lookups.calls == ["ds-1", "ds-1"]
    await resolver.aclose()


async def test_a_failed_refresh_keeps_the_stale_answer_until_max_stale(clock: Clock) -> None:
    lookups = Lookups("10.0.0.1")
    resolver = CachingResolver(ttl=10, max_stale=60, lookup=lookups, clock=clock)
    await resolver.resolve("ds-1")
    lookups.fail = socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
    clock.now += 30
    assert _addresses(await resolver.resolve("ds-1")) == ["10.0.0.1"]
    await eventually(
        lambda: len(lookups.calls) == 2 and "ds-1" not in resolver._pending,
        timeout=5,
        interval=0.001,
        message="the failed refresh",
    )
    assert _addresses(await resolver.resolve("ds-1")) == ["10.0.0.1"]  # still the stale one
    # Past its freshness plus max_stale the answer is not used: the caller sees the failure.
    clock.now += 41
    with pytest.raises(socket.gaierror):
        await resolver.resolve("ds-1")
    assert len(resolver) == 0


async def test_connections_needing_a_name_at_once_share_one_lookup(clock: Clock) -> None:
    lookups = Lookups("10.0.0.1")
    lookups.gate = asyncio.Event()
    resolver = CachingResolver(lookup=lookups, clock=clock)
    callers = [asyncio.create_task(resolver.resolve("ds-1")) for _ in range(10)]
    await asyncio.wait_for(lookups.called.wait(), 5)
    # One caller gives up (its query's deadline): the lookup goes on for the others.
    callers[0].cancel()
    lookups.gate.set()
    answers = await asyncio.gather(*callers[1:])
    assert all(_addresses(infos) == ["10.0.0.1"] for infos in answers)
    assert lookups.calls == ["ds-1"]
    assert resolver.lookups == 1


async def test_a_failed_lookup_is_not_kept(clock: Clock) -> None:
    lookups = Lookups("10.0.0.1")
    lookups.fail = socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    resolver = CachingResolver(lookup=lookups, clock=clock)
    for _ in range(2):
        with pytest.raises(socket.gaierror):
            await resolver.resolve("gone")
    assert lookups.calls == ["gone", "gone"]
    lookups.fail = None
    assert _addresses(await resolver.resolve("gone")) == ["10.0.0.1"]


async def test_forget_makes_the_next_connection_look_the_name_up(clock: Clock) -> None:
    lookups = Lookups("10.0.0.1")
    resolver = CachingResolver(lookup=lookups, clock=clock)
    await resolver.resolve("ds-1")
    resolver.forget("ds-1")
    resolver.forget("never-seen")  # harmless
    await resolver.resolve("ds-1")
    assert lookups.calls == ["ds-1", "ds-1"]


async def test_at_most_max_names_are_kept_the_oldest_going_first(clock: Clock) -> None:
    lookups = Lookups("10.0.0.1")
    resolver = CachingResolver(max_names=3, lookup=lookups, clock=clock)
    for name in ("a", "b", "c", "d"):
        await resolver.resolve(name)
    assert len(resolver) == 3
    await resolver.resolve("a")  # evicted: looked up again
    await resolver.resolve("d")  # kept
    assert lookups.calls == ["a", "b", "c", "d", "a"]


async def test_ttl_zero_keeps_nothing(clock: Clock) -> None:
    lookups = Lookups("10.0.0.1")
    resolver = CachingResolver(ttl=0, max_stale=0, lookup=lookups, clock=clock)
    await resolver.resolve("ds-1")
    await resolver.resolve("ds-1")
    assert lookups.calls == ["ds-1", "ds-1"]
    assert len(resolver) == 0


async def test_aclose_cancels_lookups_in_progress(clock: Clock) -> None:
    lookups = Lookups("10.0.0.1")
    lookups.gate = asyncio.Event()  # never set
    resolver = CachingResolver(lookup=lookups, clock=clock)
    caller = asyncio.create_task(resolver.resolve("ds-1"))
    await asyncio.wait_for(lookups.called.wait(), 5)
    await asyncio.wait_for(resolver.aclose(), 5)
    with pytest.raises(asyncio.CancelledError):
        await caller
    await resolver.aclose()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        await resolver.resolve("ds-2")


@pytest.mark.parametrize(
    ("options", "message"),
    [({"ttl": -1}, "ttl"), ({"max_stale": -1}, "max_stale"), ({"max_names": 0}, "max_names")],
)
def test_bad_settings_are_refused(options: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CachingResolver(**options)  # type: ignore[arg-type]


# -- the HTTP client's use of it, on real sockets -----------------------------------------


class CountingResolver(CachingResolver):
    """The default resolver (the system's getaddrinfo), counting what it is asked."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = 0

    async def resolve(self, host: str) -> Sequence[AddrInfo]:
        self.asked += 1
        return await super().resolve(host)


async def _answering_server() -> tuple[asyncio.Server, int, list[int]]:
    accepted: list[int] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], accepted


@pytest.fixture
async def answering() -> AsyncIterator[tuple[int, list[int]]]:
    server, port, accepted = await _answering_server()
    async with server:
        yield port, accepted
        server.close()


async def test_new_connections_to_a_name_do_not_each_look_it_up(
    answering: tuple[int, list[int]],
) -> None:
    port, accepted = answering
    resolver = CountingResolver()
    # max_idle=0: no connection is kept, every request opens one (as requests abandoned
    # at their deadline do, in an overload).
    async with HttpClient(resolver=resolver, max_idle=0) as client:
        endpoint = Endpoint.of("localhost", port)
        for _ in range(10):
            assert await client.get(endpoint, b"/") == (200, b"ok")
        answers = await asyncio.gather(*(client.get(endpoint, b"/") for _ in range(8)))
        assert answers == [(200, b"ok")] * 8
    assert len(accepted) == 18
    assert resolver.asked == 18
    assert resolver.lookups == 1  # the system's resolver was asked once


class Answers(CachingResolver):
    """A resolver whose answer for every name is ``addresses`` (then the system's)."""

    def __init__(self, *addresses: str) -> None:
        self.addresses = list(addresses)
        super().__init__(lookup=self._answer)

    async def _answer(self, host: str) -> Sequence[AddrInfo]:
        return [_info(address) for address in self.addresses]


async def test_a_refused_cached_address_is_passed_over_and_the_name_forgotten(
    answering: tuple[int, list[int]],
) -> None:
    port, accepted = answering
    # A port nobody listens on, at an address that refuses at once: 127.0.0.2 is
    # loopback too, and nothing listens there.
    resolver = Answers("127.0.0.2", "127.0.0.1")
    async with HttpClient(resolver=resolver) as client:
        endpoint = Endpoint.of("moved.example", port)
        assert await client.get(endpoint, b"/") == (200, b"ok")
        assert resolver.lookups == 1
        # The first address refused: the name was forgotten, so a new connection asks
        # again (and would follow the name to wherever it went).
        resolver.addresses = ["127.0.0.1"]
        answers = await asyncio.gather(*(client.get(endpoint, b"/") for _ in range(2)))
        assert answers == [(200, b"ok")] * 2
        assert resolver.lookups == 2
    assert len(accepted) >= 2
