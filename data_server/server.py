"""One data server: an in-memory shard behind an aiohttp API, with an embedded agent.

:class:`DataServer` registers only once it can answer (indexed, listening, a first good
probe) and drains on stop (marked draining for the grace while still answering, then
removed, then the listener closes and the requests in flight finish). This module wires
the parts and runs their life cycle; the HTTP API is :mod:`.handlers`.

Design: docs/design/data-server.md, "The data server".
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web
from prometheus_client import CollectorRegistry

from discovery import __version__
from discovery.agent.agent import Agent
from discovery.agent.loopthread import LoopThread
from discovery.agent.probes import SearchProbe
from discovery.errors import ConfigError
from discovery.http import MAX_QUERY_LENGTH, json_app
from discovery.httpedge import KEEPALIVE_TIMEOUT, HeaderGuard
from discovery.instance import InstancePayload, InstanceState, ServiceInstance
from discovery.looplag import LoopLagMonitor

from .admission import SearchAdmission
from .config import DataServerConfig
from .corpus import Document, generate_documents, load_jsonl, sample_queries
from .faults import Fault, FaultInjector
from .handlers import MAX_K, RETRY_AFTER_S, DataHandlers
from .index import InvertedIndex
from .loadreport import LoadMeter
from .metrics import DataServerMetrics
from .parts import DataServerParts
from .snapshot import IndexSnapshots, SnapshotKey

__all__ = ["MAX_K", "MAX_QUERY_LENGTH", "RETRY_AFTER_S", "DataServer"]

log = logging.getLogger(__name__)


class DataServer:
    """A data server with its agent. ``await start()``, later ``await shutdown()``.

    ``drain_requested`` is set by ``POST /admin/drain``; the owner (the CLI, a fleet)
    reacts by calling :meth:`shutdown`, exactly as on SIGTERM.
    """

    def __init__(
        self,
        config: DataServerConfig,
        *,
        registry: CollectorRegistry | None = None,
        loop_thread: LoopThread | None = None,
        loop_lag: LoopLagMonitor | None = None,
    ) -> None:
        self.config = config
        self.registry = registry if registry is not None else CollectorRegistry()
        self._loop_thread = loop_thread
        # How long a request waits in this loop before its handler runs (it is spent
        # from its budget). A fleet passes the one monitor of its shared loop; alone,
        # the server starts its own with :meth:`start` and stops it at shutdown.
        self._owns_loop_lag = loop_lag is None
        self.loop_lag = (
            loop_lag
            if loop_lag is not None
            else LoopLagMonitor(registry=self.registry, metric="data_server_event_loop_lag_seconds")
        )
        self._metrics = DataServerMetrics(self.registry)
        # The cap on searches in progress; read by the gauge when scraped.
        self._admission = SearchAdmission(config.max_concurrent_searches)
        self._metrics.in_progress.set_function(lambda: self._admission.in_progress)
        self._metrics.limit.set(config.max_concurrent_searches)
        self.faults = FaultInjector()
        # The load every answer reports (search servers may weight replicas by it).
        self._load = LoadMeter()
        self._metrics.utilization.set_function(lambda: self._load.report().utilization)
        self.drain_requested = asyncio.Event()
        # What start-up builds, shared with the handlers.
        self._parts = DataServerParts(config.instance_id or f"ds-{config.advertise}-{config.port}")
        self._runner: web.AppRunner | None = None
        # Bounds the time request headers take to arrive, and the connections waiting.
        self._edge = HeaderGuard(config.http, registry=self.registry)
        self._handlers = DataHandlers(
            config,
            self._parts,
            metrics=self._metrics,
            admission=self._admission,
            faults=self.faults,
            load=self._load,
            loop_lag=self.loop_lag,
            drain_requested=self.drain_requested,
            registry=self.registry,
        )
        self._stopping = False

    # The index, the port and the agent are kept in the parts the handlers share;
    # start-up sets them here as it builds them.

    @property
    def index(self) -> InvertedIndex | None:
        return self._parts.index

    @index.setter
    def index(self, index: InvertedIndex | None) -> None:
        self._parts.index = index

    @property
    def port(self) -> int | None:
        return self._parts.port

    @port.setter
    def port(self, port: int | None) -> None:
        self._parts.port = port

    @property
    def agent(self) -> Agent | None:
        return self._parts.agent

    @agent.setter
    def agent(self, agent: Agent | None) -> None:
        self._parts.agent = agent

    @property
    def handlers(self) -> DataHandlers:
        """The HTTP handlers (see :class:`~data_server.handlers.DataHandlers`)."""
        return self._handlers

    @property
    def instance_id(self) -> str:
        return self._parts.instance_id

    @property
    def searches_in_progress(self) -> int:
        """Searches in progress that count against ``--max-concurrent-searches`` (the
        agent's probes aside), as the gauge ``data_server_searches_in_progress`` shows."""
        return self._admission.in_progress

    @property
    def url(self) -> str:
        return f"http://{self.config.probe_host}:{self.port}"

    # -- lifecycle ---------------------------------------------------------------

    async def load(self) -> None:
        """Load and index the shard (once).

        Raises:
            ConfigError: the ``--docs-file`` cannot be read or has a bad line.
        """
        if self.index is not None:
            return
        started = time.monotonic()
        # Off the loop, so that a slow load does not stall what else runs on it.
        self.index = await asyncio.to_thread(self._build_index)
        self._metrics.index_build_seconds.set(time.monotonic() - started)
        self._metrics.documents.set(self.index.document_count)
        self._metrics.terms.set(self.index.term_count)

    async def start(self) -> None:
        """Index (unless :meth:`load` did), listen, connect the agent, declare readiness.

        Raises:
            DiscoveryError: ZooKeeper unreachable (the HTTP server is stopped again).
            OSError: the port is taken.
            ConfigError: a bad ``--docs-file``.
        """
        await self.load()
        assert self.index is not None

        runner = web.AppRunner(
            self._make_app(),
            access_log=None,
            handle_signals=False,
            shutdown_timeout=self.config.shutdown_timeout,
            keepalive_timeout=KEEPALIVE_TIMEOUT,
        )
        await runner.setup()
        self._runner = runner
        try:
            self.port = await self._edge.listen(runner, self.config.host, self.config.port)
            self.agent = Agent(
                self._instance(),
                SearchProbe(self.url, sample_queries(20, seed=self.config.seed, variant=1), k=10),
                zk=self.config.zk,
                config=self.config.agent,
                registry=self.registry,
                loop_thread=self._loop_thread,
            )
            await self.agent.astart()
        except BaseException:
            self._edge.close()
            await runner.cleanup()
            raise
        if self._owns_loop_lag:
            self.loop_lag.start()
        self.agent.set_ready()
        log.info(
            "data server %s: %d documents indexed, listening on %s:%d",
            self.instance_id,
            self.index.document_count,
            self.config.host,
            self.port,
        )

    async def shutdown(self, grace: float | None = None) -> None:
        """Drain (see the module doc), stop serving, close the agent. Idempotent."""
        if self._stopping:
            return
        self._stopping = True
        if self.agent is not None:
            await self.agent.adrain(grace)
        # Releases requests hung by a fault, so that they end rather than time out.
        self.faults.set(Fault())
        if self._runner is not None:
            self._edge.close()  # stops accepting, as the runner's sites would
            await self._runner.cleanup()
        if self.agent is not None:
            await self.agent.astop()
        if self._owns_loop_lag:
            await self.loop_lag.aclose()
        log.info("data server %s stopped", self.instance_id)

    def _build_index(self) -> InvertedIndex:
        """The shard's index: from its snapshot when ``--index-snapshot-dir`` holds one
        of the same documents, else built (and then saved there)."""
        config = self.config
        snapshots = key = None
        if config.index_snapshot_dir is not None:
            snapshots = IndexSnapshots(config.index_snapshot_dir)
            try:
                key = (
                    SnapshotKey.from_file(config.docs_file, shard=config.shard, version=__version__)
                    if config.docs_file is not None
                    else SnapshotKey.generated(
                        shard=config.shard, seed=config.seed, docs=config.docs, version=__version__
                    )
                )
            except OSError as exc:
                raise ConfigError(f"--docs-file: {exc}") from exc
            index = snapshots.load(key)
            if index is not None:
                self._metrics.from_snapshot.set(1)
                return index
        documents: list[Document]
        if config.docs_file is not None:
            try:
                documents = load_jsonl(config.docs_file)
            except (OSError, ValueError) as exc:
                raise ConfigError(f"--docs-file: {exc}") from exc
        else:
            documents = generate_documents(config.docs, shard=config.shard, seed=config.seed)
        index = InvertedIndex(documents)
        if snapshots is not None and key is not None:
            snapshots.save(key, index)
        return index

    def _instance(self) -> ServiceInstance:
        config = self.config
        assert self.index is not None
        assert self.port is not None
        return ServiceInstance.create(
            "data_servers",
            config.instance_id or f"ds-{config.advertise}-{self.port}",
            config.advertise,
            self.port,
            InstancePayload(
                shard=config.shard,
                replica=config.replica,
                docs=self.index.document_count,
                version=__version__,
                state=InstanceState.SERVING,
                zone=config.zone,
                weight=config.weight,
                group=config.group,
            ),
        )

    def _make_app(self) -> web.Application:
        # JSON errors, 4xx counted on our registry; the edge sees each request arrive.
        app = json_app(self.registry, middlewares=[self._edge.middleware])
        app.add_routes(self._handlers.routes())
        return app
