"""``discovery zk-exporter``: ZooKeeper's own figures for Prometheus, read with ``mntr``.

It serves each server's last ``mntr`` answer, so a scrape never waits on ZooKeeper; a server
that stops answering exports only ``zookeeper_up`` 0, no figure frozen at its last value.

Operating (the metric families): docs/operating.md, "``discovery zk-exporter``".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import math
import re
import ssl
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Final

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.aiohttp import make_aiohttp_handler
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from discovery.aio import cancel_and_wait, log_crash
from discovery.cli.entrypoint import run_event_loop, stop_on_signals
from discovery.cli.options import ZK_OPTIONS, Option, add_options, listen_options, positive_float
from discovery.config import ZkConfig
from discovery.errors import ConfigError
from discovery.zk.tls import KazooTls

__all__ = [
    "MntrCollector",
    "MntrReading",
    "ZkExporter",
    "add_parser",
    "parse_mntr",
    "read_mntr",
    "run",
]

log = logging.getLogger(__name__)

PROG: Final = "discovery zk-exporter"
DEFAULT_PORT: Final = 9141
_NAME: Final = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# A counter set's key: <stat>_<namespace>_<set>, e.g. avg_test-a.b_write_per_namespace.
_SET_KEY: Final = re.compile(
    r"(avg|min|max|cnt|sum|p50|p95|p99|p999)_(.+)_([a-z]+_per_namespace)", re.DOTALL
)
# Answers beyond this are not mntr's (a few kB with every metric of 3.8).
_MAX_ANSWER: Final = 1 << 20


@dataclass(frozen=True)
class MntrReading:
    """One server's last ``mntr``: its numbers and words by key (``zk_`` taken off), its
    per-namespace figures by ``(set, namespace, stat)``, the lines skipped; ``error``
    says why it was not read (everything else then empty)."""

    server: str
    numbers: dict[str, float] = field(default_factory=dict)
    words: dict[str, str] = field(default_factory=dict)
    sets: dict[tuple[str, str, str], float] = field(default_factory=dict)
    malformed: int = 0
    error: str | None = None

    @property
    def up(self) -> bool:
        return self.error is None


def parse_mntr(server: str, text: str) -> MntrReading:
    """The reading of ``server`` from an ``mntr`` answer.

    Each line is ``zk_<key>\\t<value>``. A per-namespace counter set's key is split into
    its set, namespace and statistic. A line without a tab, a key that is neither a
    metric name nor a set's, or a set's value that is not a number, is skipped and
    counted; another non-numeric value is kept as a word (the server's state and
    version are). An answer with no ``zk_`` line at all is not an
    ``mntr`` answer (a 4lw refused by the whitelist answers with a sentence): that is an
    error, not a server with no figures.
    """
    numbers: dict[str, float] = {}
    words: dict[str, str] = {}
    sets: dict[tuple[str, str, str], float] = {}
    malformed = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        key, tab, value = line.partition("\t")
        key, value = key.strip(), value.strip()
        if not tab or not key.startswith("zk_"):
            malformed += 1
            continue
        key = key[3:]
        number = _number(value)
        in_set = _SET_KEY.fullmatch(key)
        if in_set is not None and number is not None:
            stat, namespace, name = in_set.groups()
            sets[(name, namespace, stat)] = number
        elif in_set is not None or not _NAME.fullmatch(key):
            malformed += 1
        elif number is not None:
            numbers[key] = number
        elif value.lower() == "nan":
            malformed += 1
        else:
            words[key] = value
    if not numbers and not words and not sets:
        first = text.strip().splitlines()[0][:120] if text.strip() else "an empty answer"
        return MntrReading(server, malformed=malformed, error=f"not an mntr answer: {first!r}")
    return MntrReading(server, numbers, words, sets, malformed)


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return None if math.isnan(value) else value


async def read_mntr(
    host: str, port: int, timeout: float, *, context: ssl.SSLContext | None = None
) -> str:
    """Send ``mntr`` to ``host:port`` and return the answer (read to the end); with
    ``context`` over TLS (a ``secureClientPort`` answers four-letter words too).

    Raises:
        OSError: the connection failed or was reset (``ssl.SSLError``: TLS refused).
        TimeoutError: no whole answer within ``timeout`` seconds.
        ValueError: the answer is larger than any ``mntr`` answer.
    """
    chunks: list[bytes] = []
    total = 0
    async with asyncio.timeout(timeout):
        reader, writer = await asyncio.open_connection(host, port, ssl=context)
        try:
            writer.write(b"mntr")
            await writer.drain()
            # The server answers and closes: read to the end.
            while chunk := await reader.read(65536):
                total += len(chunk)
                if total > _MAX_ANSWER:
                    raise ValueError(f"an answer over {_MAX_ANSWER} bytes is not mntr's")
                chunks.append(chunk)
        finally:
            writer.close()
            # A reset while closing changes nothing that was read.
            with contextlib.suppress(OSError):
                await writer.wait_closed()
    return b"".join(chunks).decode("utf-8", errors="replace")


class MntrCollector(Collector):
    """Serves the last reading of each server as metric families (see the module
    docstring); :meth:`update` replaces a server's reading."""

    def __init__(self, servers: Sequence[str]) -> None:
        self._readings = {s: MntrReading(s, error="not read yet") for s in servers}

    def update(self, reading: MntrReading) -> None:
        self._readings[reading.server] = reading

    def collect(self) -> Iterator[Metric]:
        readings = list(self._readings.values())
        up = GaugeMetricFamily(
            "zookeeper_up", "1 if the server answered its last mntr, else 0.", labels=["server"]
        )
        for reading in readings:
            up.add_metric([reading.server], 1.0 if reading.up else 0.0)
        yield up
        state = GaugeMetricFamily(
            "zookeeper_server_state",
            "1 for the state the server reported (leader, follower, standalone, observer).",
            labels=["server", "state"],
        )
        info = GaugeMetricFamily(
            "zookeeper_info",
            "1, with the version the server reported.",
            labels=["server", "version"],
        )
        families: dict[str, GaugeMetricFamily] = {}
        sets: dict[str, GaugeMetricFamily] = {}
        for reading in readings:
            if not reading.up:
                continue
            if "server_state" in reading.words:
                state.add_metric([reading.server, reading.words["server_state"]], 1.0)
            if "version" in reading.words:
                info.add_metric([reading.server, reading.words["version"].split(",")[0]], 1.0)
            for key, value in reading.numbers.items():
                family = families.get(key)
                if family is None:
                    family = families[key] = GaugeMetricFamily(
                        f"zookeeper_{key}", f"mntr's zk_{key}.", labels=["server"]
                    )
                family.add_metric([reading.server], value)
            for (name, namespace, stat), value in reading.sets.items():
                family = sets.get(name)
                if family is None:
                    family = sets[name] = GaugeMetricFamily(
                        f"zookeeper_{name}",
                        f"mntr's zk_<stat>_<namespace>_{name}, by top-level znode.",
                        labels=["server", "namespace", "stat"],
                    )
                family.add_metric([reading.server, namespace, stat], value)
        yield state
        yield info
        yield from families.values()
        # Were a plain key named like a set (none is in ZooKeeper 3.8), the plain one wins.
        yield from (family for name, family in sets.items() if name not in families)


def split_servers(hosts: str) -> list[tuple[str, int]]:
    """``host:port`` pairs of a kazoo hosts string (a chroot is ignored; port 2181 when
    none is given).

    Raises:
        ValueError: an empty list, or a port that is not a number in 1..65535.
    """
    servers: list[tuple[str, int]] = []
    for part in hosts.split("/", 1)[0].split(","):
        part = part.strip()
        if not part:
            continue
        host, colon, port_text = part.rpartition(":")
        if not colon:
            host, port_text = part, "2181"
        host = host.strip("[]")
        try:
            port = int(port_text)
        except ValueError:
            raise ValueError(f"not a port: {port_text!r} in {part!r}") from None
        if not 0 < port < 65536 or not host:
            raise ValueError(f"not host:port: {part!r}")
        servers.append((host, port))
    if not servers:
        raise ValueError(f"no ZooKeeper server in {hosts!r}")
    return servers


class ZkExporter:
    """Polls ``servers`` with ``mntr`` every ``interval`` seconds into ``registry``.

    ``async with ZkExporter(...)`` reads every server once before returning (so the
    first scrape has figures), then keeps polling in a task until the block ends. A
    server that cannot be read is logged when it goes down and when it comes back, not
    at every poll.
    """

    def __init__(
        self,
        servers: Iterable[tuple[str, int]],
        registry: CollectorRegistry,
        *,
        interval: float = 5.0,
        timeout: float = 2.0,
        context: ssl.SSLContext | None = None,
    ) -> None:
        if not interval > 0 or not timeout > 0:
            raise ValueError(f"interval and timeout must be > 0, got {interval}, {timeout}")
        self._servers = [(host, port, f"{host}:{port}") for host, port in servers]
        self._interval = interval
        self._timeout = timeout
        self._context = context
        self.collector = MntrCollector([name for _, _, name in self._servers])
        registry.register(self.collector)
        self._failures = Counter(
            "zookeeper_exporter_mntr_failures",
            "mntr reads that failed (refused, timed out, not whitelisted, not mntr).",
            ["server"],
            registry=registry,
        )
        self._malformed = Counter(
            "zookeeper_exporter_malformed_lines",
            "mntr answer lines skipped: no tab, or a key that cannot be a metric name.",
            ["server"],
            registry=registry,
        )
        for _, _, name in self._servers:
            self._failures.labels(server=name)
            self._malformed.labels(server=name)
        self._down: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> ZkExporter:
        await self.poll()
        self._task = asyncio.create_task(self._run(), name="zk-exporter-poll")
        self._task.add_done_callback(log_crash)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])

    async def poll(self) -> list[MntrReading]:
        """Read every server once, concurrently; returns the readings (also collected)."""
        readings = await asyncio.gather(*(self._read(h, p, n) for h, p, n in self._servers))
        for reading in readings:
            self.collector.update(reading)
            if reading.malformed:
                self._malformed.labels(server=reading.server).inc(reading.malformed)
            if reading.up:
                if reading.server in self._down:
                    self._down.discard(reading.server)
                    log.info("ZooKeeper %s answers mntr again", reading.server)
                continue
            self._failures.labels(server=reading.server).inc()
            if reading.server not in self._down:
                self._down.add(reading.server)
                log.warning("ZooKeeper %s: no mntr figures: %s", reading.server, reading.error)
        return readings

    async def _read(self, host: str, port: int, name: str) -> MntrReading:
        try:
            text = await read_mntr(host, port, self._timeout, context=self._context)
        except TimeoutError:
            return MntrReading(name, error=f"no answer within {self._timeout:g} s")
        except (OSError, ValueError) as exc:
            return MntrReading(name, error=f"{type(exc).__name__}: {exc}")
        return parse_mntr(name, text)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            # A fixed cadence, so that a slow poll does not push the next ones later; but
            # after a poll longer than the interval (servers timing out), the next one
            # starts at once and the cadence restarts from there, with no burst.
            next_at = max(next_at + self._interval, loop.time())
            await asyncio.sleep(next_at - loop.time())
            await self.poll()


ZK_EXPORTER_OPTIONS: tuple[Option, ...] = (
    # The servers' own --zk (same variable and default); its chroot has no use here.
    dataclasses.replace(
        next(o for o in ZK_OPTIONS if o.flag == "--zk"),
        help="ZooKeeper servers to read, host:port[,host:port...] (a /chroot is ignored)",
    ),
    # The servers' --host and --port (same variables), serving /metrics here.
    *(
        dataclasses.replace(o, help=o.help.replace("listen on", "serve /metrics on"))
        for o in listen_options(DEFAULT_PORT, "zk-exporter")
        if o.flag in ("--host", "--port")
    ),
    Option(
        "--interval",
        "DISCOVERY_ZK_EXPORTER_INTERVAL",
        "seconds between two reads of every server",
        type=positive_float,
        default=5.0,
        metavar="SECONDS",
    ),
    Option(
        "--timeout",
        "DISCOVERY_ZK_EXPORTER_TIMEOUT",
        "seconds one server has to answer mntr",
        type=positive_float,
        default=2.0,
        metavar="SECONDS",
    ),
    # The servers' TLS settings: mntr goes to the same (secure) client port.
    *(o for o in ZK_OPTIONS if o.flag.startswith("--zk-tls")),
)


def add_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """Register ``zk-exporter`` on the ``discovery`` command's subparsers."""
    parser = subparsers.add_parser(
        "zk-exporter",
        help="serve ZooKeeper's mntr figures as Prometheus metrics",
        description=(
            "Read every ZooKeeper server of --zk with the mntr four-letter command (it must "
            "be in their 4lw.commands.whitelist) every --interval seconds and serve the "
            "figures on http://HOST:PORT/metrics: zookeeper_up, zookeeper_server_state, "
            "zookeeper_info and a zookeeper_<key> gauge per numeric mntr key, each with a "
            "server label. Runs until SIGINT or SIGTERM; exit status 0 then, 1 if the port "
            "cannot be bound, 2 for bad arguments."
        ),
    )
    add_options(parser, ZK_EXPORTER_OPTIONS)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Serve until a signal; see :func:`add_parser` for the exit status."""
    try:
        servers = split_servers(args.zk)
    except ValueError as exc:
        print(f"{PROG}: --zk: {exc}", file=sys.stderr, flush=True)
        return 2
    try:
        # The servers' --zk-tls flags, checked as the servers check them.
        tls = KazooTls.from_config(
            ZkConfig(
                args.zk,
                tls=args.zk_tls,
                tls_ca=args.zk_tls_ca,
                tls_cert=args.zk_tls_cert,
                tls_key=args.zk_tls_key,
            )
        )
        context = None if tls is None else tls.ssl_context()
    except ConfigError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr, flush=True)
        return 2
    serving = _serve(servers, args.host, args.port, args.interval, args.timeout, context)
    try:
        return run_event_loop(serving)
    except OSError as exc:
        log.error("cannot serve on %s:%d: %s", args.host, args.port, exc)
        return 1


async def _serve(
    servers: list[tuple[str, int]],
    host: str,
    port: int,
    interval: float,
    timeout: float,
    context: ssl.SSLContext | None,
) -> int:
    stop = stop_on_signals()
    registry = CollectorRegistry()
    async with ZkExporter(servers, registry, interval=interval, timeout=timeout, context=context):
        app = web.Application()
        app.router.add_get("/metrics", make_aiohttp_handler(registry))
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            site = web.TCPSite(runner, host, port)
            await site.start()
            log.info(
                "serving mntr figures of %s on http://%s:%d/metrics every %g s",
                ", ".join(f"{h}:{p}" for h, p in servers),
                host,
                port,
                interval,
            )
            await stop.wait()
            log.info("stopping")
        finally:
            await runner.cleanup()
    return 0
