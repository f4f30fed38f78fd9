"""A simulated fleet: one process answering for thousands of data servers.

Each server of a :class:`SimulatedFleet` is an ephemeral registration and a loopback address
of its own, with canned answers, faults and counts. Not thread-safe: it runs on the event
loop that started it.

Development: docs/development.md, "The development cluster" (a simulated fleet).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import resource
import signal
import socket
import sys
from array import array
from collections.abc import Sequence
from typing import Literal

import orjson

from discovery.config import ZkConfig
from discovery.errors import DiscoveryError
from discovery.instance import InstancePayload, ServiceInstance
from discovery.zk.paths import DATA_SERVERS_PATH
from discovery.zk.session import ZkSession

__all__ = ["MAX_SIZE", "Mode", "SimulatedFleet", "address_of", "raise_open_files_limit"]

log = logging.getLogger(__name__)

#: What a simulated server does with a request.
Mode = Literal["ok", "refuse", "hang", "slow"]

#: Most simulated servers one fleet holds (its addresses: 127.10.0.1 to 127.15.249.250).
MAX_SIZE = 6 * 250 * 250
# Longest request head accepted; a longer one closes the connection.
_MAX_HEAD = 16 * 1024
_MODES: tuple[Mode, ...] = ("ok", "refuse", "hang", "slow")


def address_of(index: int) -> str:
    """The loopback address of simulated server ``index`` (0-based): ``127.a.b.c``
    with ``a`` from 10, ``b`` in 0..249 and ``c`` in 1..250.

    Raises ``ValueError`` for an index outside ``0..MAX_SIZE-1``.
    """
    if not 0 <= index < MAX_SIZE:
        raise ValueError(f"index must be in 0..{MAX_SIZE - 1}, got {index}")
    return f"127.{10 + index // 62_500}.{(index // 250) % 250}.{index % 250 + 1}"


class SimulatedFleet:
    """``size`` simulated data servers over ``shards`` shards, registered in the
    ZooKeeper of ``zk`` (see the module's docstring). ``async with`` it, or
    :meth:`start` and :meth:`aclose`.

    ``hits`` is how many hits each answer carries (fewer when a query asks for fewer: a
    search server refuses more hits than its ``k``); ``port`` 0 picks a
    free one (:attr:`port` after :meth:`start`). ``first`` makes it a part of a larger
    fleet split over processes (a process may hold only so many sockets): its servers
    are the fleet's ``first`` to ``first + size - 1`` (their ids, addresses, shards and
    replicas), while this object's methods and counts index them from 0.

    Raises ``ValueError`` for servers outside ``0..MAX_SIZE-1``, fewer than one, or
    fewer than one shard or session.
    """

    def __init__(
        self,
        zk: ZkConfig,
        *,
        size: int,
        shards: int,
        docs: int = 1000,
        hits: int = 10,
        sessions: int = 4,
        batch: int = 250,
        port: int = 0,
        id_prefix: str = "sim",
        first: int = 0,
    ) -> None:
        if first < 0 or not 1 <= size <= MAX_SIZE - first:
            raise ValueError(
                f"servers {first}..{first + size - 1} are not within 0..{MAX_SIZE - 1}"
            )
        if shards < 1 or sessions < 1 or batch < 1:
            raise ValueError("shards, sessions and batch must be >= 1")
        self._zk = zk
        self.size = size
        self.first = first
        self.shards = shards
        self.docs = docs
        self._sessions_wanted = sessions
        self._batch = batch
        self._port_wanted = port
        self.port = 0
        self.ids = [f"{id_prefix}-{first + i:05d}" for i in range(size)]
        self._by_address = {address_of(first + i): i for i in range(size)}
        #: Requests answered, per simulated server.
        self.served = array("q", bytes(8 * size))
        #: Connections open, per simulated server.
        self.connections = array("q", bytes(8 * size))
        self._modes: dict[int, tuple[Mode, float]] = {}
        self._hits = hits
        self._bodies = [_answer(shard, docs, hits) for shard in range(shards)]
        # Answers to queries for fewer hits, by (shard, k): made when first asked for.
        self._fewer: dict[tuple[int, int], bytes] = {}
        self._sessions: list[ZkSession] = []
        self._server: asyncio.Server | None = None
        self._transports: set[asyncio.Transport] = set()

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Listen, then register every simulated server.

        Raises:
            DiscoveryError: ZooKeeper unreachable or a registration refused (everything
                started is stopped again).
        """
        loop = asyncio.get_running_loop()
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("0.0.0.0", self._port_wanted))
            self.port = sock.getsockname()[1]
            self._server = await loop.create_server(
                lambda: _Connection(self), sock=sock, backlog=4096
            )
            self._sessions = [ZkSession.from_config(self._zk) for _ in range(self._sessions_wanted)]
            await asyncio.gather(*(session.start() for session in self._sessions))
            await self._sessions[0].ensure_path(DATA_SERVERS_PATH)
            for start in range(0, self.size, self._batch):
                await asyncio.gather(
                    *(self.register(i) for i in range(start, min(self.size, start + self._batch)))
                )
        except BaseException:
            await self.aclose()
            raise
        log.info(
            "simulated fleet: %d data servers in %d shards on port %d",
            self.size,
            self.shards,
            self.port,
        )

    async def aclose(self) -> None:
        """Close the sessions (their nodes go with them), connections and listener."""
        sessions, self._sessions = self._sessions, []
        for session in sessions:
            await session.aclose()
        if self._server is not None:
            self._server.close()
            for transport in list(self._transports):
                transport.abort()
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> SimulatedFleet:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- registrations -----------------------------------------------------------------

    def instance(self, index: int) -> ServiceInstance:
        """Simulated server ``index``'s registration."""
        number = self.first + index
        payload = InstancePayload.from_dict(
            {
                "shard": number % self.shards,
                "replica": number // self.shards,
                "docs": self.docs,
                "version": "simulated",
                "state": "serving",
            }
        )
        return ServiceInstance.create(
            "data_servers", self.ids[index], address_of(number), self.port, payload
        )

    async def register(self, index: int) -> None:
        """Create simulated server ``index``'s node (by session ``index % sessions``)."""
        if not self._sessions:
            raise DiscoveryError("the simulated fleet is not started")
        session = self._sessions[index % len(self._sessions)]
        instance = self.instance(index)
        await session.create(
            f"{DATA_SERVERS_PATH}/{instance.id}", instance.to_json(), ephemeral=True
        )

    async def deregister(self, index: int) -> None:
        """Delete simulated server ``index``'s node."""
        if not self._sessions:
            raise DiscoveryError("the simulated fleet is not started")
        session = self._sessions[index % len(self._sessions)]
        await session.delete(f"{DATA_SERVERS_PATH}/{self.ids[index]}")

    # -- faults and counts -------------------------------------------------------------

    def set_mode(self, indices: int | Sequence[int], mode: Mode, delay: float = 0.0) -> None:
        """What the simulated servers ``indices`` do from now on with new requests
        (``refuse`` also closes their open connections).

        Raises ``ValueError`` for an unknown mode or a negative delay.
        """
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {', '.join(_MODES)}, got {mode!r}")
        if delay < 0:
            raise ValueError(f"delay must be >= 0, got {delay}")
        chosen = [indices] if isinstance(indices, int) else list(indices)
        for index in chosen:
            if mode == "ok":
                self._modes.pop(index, None)
            else:
                self._modes[index] = (mode, delay)
        if mode == "refuse":
            refused = set(chosen)
            for transport in list(self._transports):
                if self.index_of(transport) in refused:
                    transport.abort()

    def reset_counts(self) -> None:
        """Zero :attr:`served` (connections stay counted as they are)."""
        self.served = array("q", bytes(8 * self.size))

    # -- what the connections ask ---------------------------------------------------------

    def index_of(self, transport: asyncio.BaseTransport) -> int | None:
        """The simulated server ``transport`` was made to (by its local address); None
        for a connection to another interface."""
        sockname = transport.get_extra_info("sockname")
        return None if sockname is None else self._by_address.get(sockname[0])

    def mode_of(self, index: int) -> tuple[Mode, float]:
        """What simulated server ``index`` does now with new requests, and its delay."""
        return self._modes.get(index, ("ok", 0.0))

    def answer(self, index: int, k: int | None = None) -> bytes:
        """Simulated server ``index``'s answer to every query for ``k`` hits (the HTTP
        body): its shard's hits, at most ``k`` of them (None: all)."""
        shard = (self.first + index) % self.shards
        if k is None or k >= self._hits:
            return self._bodies[shard]
        body = self._fewer.get((shard, k))
        if body is None:
            body = self._fewer[shard, k] = _answer(shard, self.docs, max(k, 0))
        return body

    def opened(self, index: int, transport: asyncio.Transport) -> None:
        """Count a connection to ``index``: the fleet aborts it at :meth:`aclose`, or
        when ``index`` is set to ``refuse``."""
        self.connections[index] += 1
        self._transports.add(transport)

    def lost(self, index: int, transport: asyncio.Transport) -> None:
        """Count a connection to ``index`` of :meth:`opened` gone."""
        self.connections[index] -= 1
        self._transports.discard(transport)


def _answer(shard: int, docs: int, hits: int) -> bytes:
    """A shard's answer to every query, as the HTTP response's body."""
    return orjson.dumps(
        {
            "hits": [
                {
                    "id": f"s{shard}-d{j}",
                    "score": round(10.0 - j * 0.5 + shard * 1e-4, 6),
                    "title": "",
                }
                for j in range(hits)
            ],
            "shard": shard,
            "docs": docs,
            "took_ms": 0.05,
            "queue": 0,
            "cut": False,
        }
    )


_HEALTHY = b'{"status":"ok"}'
# The k of a /search request's target.
_K = re.compile(rb"[?&]k=(\d{1,9})(?:&|$)")


class _Connection(asyncio.Protocol):
    """One keep-alive connection to one simulated server: requests in, answers out,
    in order."""

    __slots__ = ("_buffer", "_fleet", "_index", "_transport")

    def __init__(self, fleet: SimulatedFleet) -> None:
        self._fleet = fleet
        self._buffer = b""
        self._index = -1
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        fleet = self._fleet
        index = fleet.index_of(transport)
        if index is None or fleet.mode_of(index)[0] == "refuse":
            transport.abort()  # not one of ours (another interface), or "dead"
            return
        self._index = index
        self._transport = transport
        fleet.opened(index, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is not None:
            self._fleet.lost(self._index, self._transport)
            self._transport = None

    def data_received(self, data: bytes) -> None:
        transport = self._transport
        if transport is None:
            return
        buffer = self._buffer + data
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > _MAX_HEAD:
                    transport.abort()
                    return
                self._buffer = buffer
                return
            head, buffer = buffer[:end], buffer[end + 4 :]
            self._answer(transport, head)

    def _answer(self, transport: asyncio.Transport, head: bytes) -> None:
        fleet, index = self._fleet, self._index
        line = head.split(b"\r\n", 1)[0]
        parts = line.split(b" ")
        target = parts[1] if len(parts) == 3 else b""
        if target.startswith(b"/search"):
            asked = _K.search(target)
            status, body = b"200 OK", fleet.answer(index, int(asked[1]) if asked else None)
        elif target == b"/healthz":
            status, body = b"200 OK", _HEALTHY
        elif target == b"/_fleet/stats":
            # For a benchmark in another process: the counts, not counted themselves
            # (nor the connection this request came on).
            connections = fleet.connections.tolist()
            connections[index] -= 1
            body = orjson.dumps({"served": fleet.served.tolist(), "connections": connections})
            transport.write(_response(b"200 OK", body))
            return
        elif target == b"/_fleet/reset":
            fleet.reset_counts()
            transport.write(_response(b"200 OK", b"{}"))
            return
        else:
            status, body = b"404 Not Found", b'{"error":"not found"}'
        response = _response(status, body)
        mode, delay = fleet.mode_of(index)
        if mode == "hang":
            return
        fleet.served[index] += 1
        if mode == "slow" and delay > 0:
            asyncio.get_running_loop().call_later(delay, _write, transport, response)
        else:
            transport.write(response)


def _response(status: bytes, body: bytes) -> bytes:
    return b"HTTP/1.1 %b\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (
        status,
        len(body),
        body,
    )


def _write(transport: asyncio.Transport, data: bytes) -> None:
    if not transport.is_closing():
        transport.write(data)


def raise_open_files_limit() -> int:
    """Raise this process's limit of open files as far as it may go (a fleet, and a
    search server routing to one, hold a socket per connection): the new limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        # Root may raise the hard limit too, up to the kernel's per-process bound.
        with open("/proc/sys/fs/nr_open") as bound:
            wanted = max(hard, min(int(bound.read()), 1 << 20))
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, wanted))
        return wanted
    except (OSError, ValueError):
        if soft != hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        return hard


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m discovery.testing.simfleet``: run a fleet until SIGINT/SIGTERM.

    Prints ``ready <port>`` once every server is registered; ``GET /_fleet/stats`` on
    any of its addresses answers the counts, ``GET /_fleet/reset`` zeroes them.
    """
    parser = argparse.ArgumentParser(
        prog="python -m discovery.testing.simfleet",
        description="Simulated data servers for benchmarks: registrations and answers.",
    )
    parser.add_argument("--zk", required=True, help="ZooKeeper hosts (with a chroot, if any)")
    parser.add_argument("--size", type=int, required=True, help="simulated data servers")
    parser.add_argument(
        "--first", type=int, default=0, help="the first one's number (a part of a larger fleet)"
    )
    parser.add_argument("--shards", type=int, required=True, help="shards they are spread over")
    parser.add_argument("--docs", type=int, default=1000, help="documents per server")
    parser.add_argument("--sessions", type=int, default=8, help="ZooKeeper sessions")
    parser.add_argument("--port", type=int, default=0, help="port (0: a free one)")
    parser.add_argument("--session-timeout", type=float, default=30.0, help="seconds")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    raise_open_files_limit()
    try:
        fleet = SimulatedFleet(
            ZkConfig(hosts=args.zk, session_timeout=args.session_timeout),
            size=args.size,
            shards=args.shards,
            docs=args.docs,
            sessions=args.sessions,
            port=args.port,
            first=args.first,
        )
    except ValueError as exc:
        parser.error(str(exc))

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        async with fleet:
            print(f"ready {fleet.port}", flush=True)
            await stop.wait()

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
