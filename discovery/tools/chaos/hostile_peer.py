"""A hostile "data server" for chaos runs: registered like any other, answers like none.

``python -m discovery.tools.chaos.hostile_peer --mode endless|garbage|trickle|huge ...``
registers through :class:`~discovery.zk.registration.Registration`; on SIGTERM or SIGINT it
leaves as an agent does, prints its counts as one JSON line and exits 0 (ZooKeeper
unreachable at start: 2).

Development: docs/development.md, "The chaos run" (hostile participants).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import logging
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from discovery.cli.entrypoint import configure_logging, stop_on_signals
from discovery.config import ZkConfig
from discovery.errors import DiscoveryError
from discovery.instance import MAX_WEIGHT, InstancePayload, InstanceState, ServiceInstance
from discovery.zk.registration import Registration
from discovery.zk.session import ZkSession

__all__ = ["HUGE_ID", "MODES", "HostilePeer", "PeerConfig", "huge_answer", "main"]

log = logging.getLogger(__name__)

MODES = ("endless", "garbage", "trickle", "huge")
#: Longest request head read: the search server's sub-requests are a few hundred bytes.
MAX_HEAD = 64 * 1024
#: Seconds between marking our node draining and deleting it, on SIGTERM.
DEPARTURE_GRACE = 1.0
#: What an endless body repeats: hits, as a runaway result would stream them.
_HIT = b'{"id":"endless","score":1.0,"title":"endless"},'
_ENDLESS_CHUNK = (_HIT * (64 * 1024 // len(_HIT) + 1))[: 64 * 1024]
_ENDLESS_FRAMINGS = ("chunked", "close", "huge-length")
#: The prefix of every id a huge answer carries: a hit with it in a search result is one
#: the search server should have refused.
HUGE_ID = "huge-"
#: Hits of one huge answer: valid, each scored 1e308, about 7.8 MiB in all, just under
#: the sub-request client's 8 MiB ceiling (issue 42 measured 400,000 shorter ones).
HUGE_HITS = 240_000


@dataclass(frozen=True)
class PeerConfig:
    """The peer's settings (its flags)."""

    mode: str
    zk_hosts: str
    id: str
    shard: int
    replica: int
    host: str
    port: int
    session_timeout: float = 5.0
    seed: int = 0
    trickle_interval: float = 0.05
    docs: int = 300
    #: The most a registration may claim: against replicas in slow start and ranked by
    #: their answers, a newcomer of the default weight may get no request at all while
    #: a fault lasts; a hostile one claims all it may (issue 42).
    weight: int = MAX_WEIGHT


class HostilePeer:
    """The server side: answers each request as ``mode`` says; counts what it did."""

    def __init__(self, mode: str, *, shard: int, seed: int, trickle_interval: float) -> None:
        if mode not in MODES:
            raise ValueError(f"--mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.mode = mode
        self._shard = shard
        self._rng = random.Random(seed)
        self._trickle_interval = trickle_interval
        self.connections = 0
        self.requests = 0
        self.bytes_sent = 0
        # Each open connection's handler and writer, so that closing ends them all.
        self._open: dict[asyncio.StreamWriter, asyncio.Task[None] | None] = {}

    def summary(self) -> dict[str, object]:
        return {
            "hostile_peer": self.mode,
            "connections": self.connections,
            "requests": self.requests,
            "bytes_sent": self.bytes_sent,
        }

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection: answer requests until the answer ends it or the client goes."""
        self.connections += 1
        self._open[writer] = asyncio.current_task()
        try:
            while True:
                try:
                    await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                    return
                self.requests += 1
                if not await self._answer(writer):
                    return
        except (ConnectionError, TimeoutError):
            return  # the client gave up on us: what it should do
        finally:
            self._open.pop(writer, None)
            writer.close()
            with contextlib.suppress(ConnectionError, TimeoutError):
                await writer.wait_closed()

    async def aclose(self) -> None:
        """End every connection (an endless answer never ends by itself): abort its
        transport, so that its handler's next write or read fails and it returns."""
        handlers = [task for task in self._open.values() if task is not None]
        for writer in list(self._open):
            writer.transport.abort()
        if handlers:
            await asyncio.wait(handlers, timeout=5.0)

    async def _send(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(data)
        self.bytes_sent += len(data)
        await writer.drain()

    async def _answer(self, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; True if the connection may carry another."""
        if self.mode == "endless":
            await self._endless(writer, _ENDLESS_FRAMINGS[self.requests % len(_ENDLESS_FRAMINGS)])
            return False
        if self.mode == "garbage":
            await self._send(writer, garbage(self._rng, with_status_line=self.requests % 2 == 0))
            return False
        if self.mode == "huge":
            await self._send(writer, huge_answer(self._shard))
            return True
        for byte in trickle_answer(self._shard):
            await self._send(writer, bytes([byte]))
            await asyncio.sleep(self._trickle_interval)
        return True

    async def _endless(self, writer: asyncio.StreamWriter, framing: str) -> None:
        head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        if framing == "chunked":
            head += "Transfer-Encoding: chunked\r\n"
        elif framing == "huge-length":
            head += f"Content-Length: {10**12}\r\n"
        else:
            head += "Connection: close\r\n"
        await self._send(writer, (head + "\r\n").encode("ascii") + b'{"hits":[')
        chunk = _ENDLESS_CHUNK
        if framing == "chunked":
            chunk = f"{len(chunk):x}\r\n".encode("ascii") + chunk + b"\r\n"
        while not writer.is_closing():
            await self._send(writer, chunk)


def garbage(rng: random.Random, *, with_status_line: bool) -> bytes:
    """1 byte to 64 KiB of random bytes, after a ``200`` status line if asked: a parser
    must refuse either without an exception escaping it."""
    noise = rng.randbytes(rng.randint(1, 64 * 1024))
    return (b"HTTP/1.1 200 OK\r\n" + noise) if with_status_line else noise


def trickle_answer(shard: int) -> bytes:
    """A complete, valid search answer of one hit (head and body), to be sent slowly."""
    body = json.dumps(
        {
            "hits": [{"id": "trickle", "score": 1.0, "title": "trickle"}],
            "shard": shard,
            "took_ms": 1,
        },
        separators=(",", ":"),
    ).encode("ascii")
    head = (
        f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode("ascii")
    return head + body


@functools.cache
def huge_answer(shard: int, hits: int = HUGE_HITS) -> bytes:
    """A complete, valid search answer (head and body) of ``hits`` hits, whatever ``k``
    was asked, each scored ``1e308``: a success that only its size and scores betray."""
    prefix = HUGE_ID.encode("ascii")
    listed = b",".join(b'{"id":"%s%d","score":1e308}' % (prefix, i) for i in range(hits))
    body = b'{"hits":[%s],"shard":%d,"took_ms":1}' % (listed, shard)
    head = (
        f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode("ascii")
    return head + body


def _instance(config: PeerConfig) -> ServiceInstance:
    payload = InstancePayload(
        shard=config.shard,
        replica=config.replica,
        docs=config.docs,
        version="hostile",
        state=InstanceState.SERVING,
        weight=config.weight,
    )
    return ServiceInstance.create("data_servers", config.id, config.host, config.port, payload)


async def _announce_departure(registration: Registration) -> None:
    """Mark our node draining and give the leader :data:`DEPARTURE_GRACE` to read it.

    What the peer tests is how it answers, not how it leaves: a departure nobody
    announced is one the leader's mass-loss brake may hold, listing the peer again for
    the brake's whole hold if other servers vanish within its window (a ZooKeeper
    server cut off with their sessions, say). A failure to mark is logged; the
    deregistration follows regardless.
    """
    draining = registration.instance.with_state(InstanceState.DRAINING, reason="stopping")
    try:
        await registration.update(draining)
    except DiscoveryError as exc:
        log.warning("marking %s draining failed: %s", draining.id, exc)
        return
    # The agent's drain grace, shortened: the leader reads the mark within milliseconds.
    await asyncio.sleep(DEPARTURE_GRACE)


async def run(config: PeerConfig) -> int:
    """Listen, register, serve until SIGTERM/SIGINT, deregister; the exit status."""
    peer = HostilePeer(
        config.mode, shard=config.shard, seed=config.seed, trickle_interval=config.trickle_interval
    )
    stop = stop_on_signals()
    server = await asyncio.start_server(peer.handle, config.host, config.port, limit=MAX_HEAD)
    session = ZkSession.from_config(
        ZkConfig(config.zk_hosts, session_timeout=config.session_timeout)
    )
    try:
        await session.start()
    except DiscoveryError as exc:
        print(f"hostile peer: cannot reach ZooKeeper: {exc}", file=sys.stderr)
        server.close()
        return 2
    try:
        async with Registration(session, _instance(config)) as registration:
            log.info(
                "hostile peer %s (%s) registered for shard %d", config.id, config.mode, config.shard
            )
            await stop.wait()
            await _announce_departure(registration)
    finally:
        server.close()
        await peer.aclose()
        await server.wait_closed()
        await session.aclose()
        print(json.dumps(peer.summary()), flush=True)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m discovery.tools.chaos.hostile_peer",
        description="A registered data server that answers with an endless body, garbage, "
        "a trickle or a huge valid answer (a chaos run's hostile participant).",
    )
    parser.add_argument("--mode", choices=MODES, required=True, help="how to answer")
    parser.add_argument("--zk", required=True, help="ZooKeeper hosts string")
    parser.add_argument("--id", required=True, help="instance id to register")
    parser.add_argument("--shard", type=int, required=True, help="shard to claim")
    parser.add_argument("--replica", type=int, default=90, help="replica number [default 90]")
    parser.add_argument("--host", required=True, help="address to bind and register")
    parser.add_argument("--port", type=int, required=True, help="port to bind and register")
    parser.add_argument(
        "--session-timeout", type=float, default=5.0, help="ZooKeeper session timeout [5]"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the garbage [0]")
    parser.add_argument(
        "--weight", type=int, default=MAX_WEIGHT, help=f"weight to claim [{MAX_WEIGHT}]"
    )
    parser.add_argument(
        "--trickle-interval", type=float, default=0.05, help="seconds between bytes [0.05]"
    )
    parser.add_argument("--log-level", default="INFO", help="logging level [INFO]")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level)
    config = PeerConfig(
        mode=args.mode,
        zk_hosts=args.zk,
        id=args.id,
        shard=args.shard,
        replica=args.replica,
        host=args.host,
        port=args.port,
        session_timeout=args.session_timeout,
        seed=args.seed,
        trickle_interval=args.trickle_interval,
        weight=args.weight,
    )
    return asyncio.run(run(config))


if __name__ == "__main__":
    sys.exit(main())
