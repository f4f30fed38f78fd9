"""The data-server agent: register when ready, probe, go offline when unhealthy, drain.

An :class:`Agent` runs on a :class:`~discovery.agent.loopthread.LoopThread`, never on the
server's own loop, so it can take offline a server whose loop is blocked. Its public
methods are thread-safe: blocking ones, and awaitable ones (``a...``) for asyncio servers.

Design: docs/design/data-server.md, "The agent".
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry

from discovery.agent.loopthread import LoopThread
from discovery.agent.policy import AgentState, HealthPolicy, ProbeResult
from discovery.agent.presence import Presence
from discovery.agent.pressure import CpuPressure, ThreadRunDelay
from discovery.agent.probeloop import ProbeLoop
from discovery.agent.probes import Probe
from discovery.agent.probing import ProbeRunner
from discovery.agent.status import AgentStatus, snapshot
from discovery.config import AgentConfig, ZkConfig
from discovery.instance import ServiceInstance
from discovery.metrics import AgentMetrics
from discovery.zk.acl import CREATE, Access, check_access
from discovery.zk.paths import DATA_SERVERS_PATH
from discovery.zk.registration import Registration, Removal
from discovery.zk.session import ZkSession

__all__ = ["Agent", "AgentState", "AgentStatus", "ProbeResult"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class Agent:
    """Keep one data server registered exactly while it is healthy.

    Args:
        instance: what to register (its id is the znode name).
        probe: the health check, e.g. :class:`~discovery.agent.probes.SearchProbe`.
        zk: how to reach ZooKeeper; the agent opens its own session.
        config: probe schedule, thresholds, flap damping, drain grace.
        registry: where the agent's, registration's and session's metrics go.
        loop_thread: a shared :class:`LoopThread` (a fleet shares one); by default
            the agent starts and stops one of its own.
        clock: monotonic seconds, for flap-damping windows and probe latency.
        pressure: the CPU pressure read before and after each probe. By default
            :class:`~discovery.agent.pressure.ThreadRunDelay` of the thread calling
            this constructor (its native id is taken here, not on the agent's loop
            thread), which must be the thread that answers the probe: an asyncio
            server constructs the agent on its event loop. A server whose requests
            are served by other threads passes ``ThreadRunDelay(tid)`` of one of
            them, or :class:`~discovery.agent.pressure.PsiCpuPressure` for the
            machine's stall (which excuses a hung server on a busy machine too).
    """

    def __init__(
        self,
        instance: ServiceInstance,
        probe: Probe,
        *,
        zk: ZkConfig,
        config: AgentConfig | None = None,
        registry: CollectorRegistry | None = None,
        loop_thread: LoopThread | None = None,
        base_path: str = DATA_SERVERS_PATH,
        clock: Callable[[], float] = time.monotonic,
        pressure: CpuPressure | None = None,
    ) -> None:
        self._zk = zk
        config = config or AgentConfig()
        self._registry = registry if registry is not None else CollectorRegistry()
        self._owns_thread = loop_thread is None
        self._thread = loop_thread or LoopThread(f"agent-{instance.id}")
        self._base_path = base_path
        self._verify_interval = config.verify_interval
        metrics = AgentMetrics(self._registry, [s.value for s in AgentState])
        # Everything below is touched only on the agent's loop, except the immutable
        # status snapshot, which other threads read.
        self._policy = HealthPolicy(config, clock=clock)
        self._prober = ProbeRunner(
            instance.id,
            probe,
            config,
            # ThreadRunDelay() takes the calling thread's id: this constructor runs on
            # the embedder's thread (the server's event loop), never on self._thread.
            pressure=pressure if pressure is not None else ThreadRunDelay(),
            metrics=metrics,
            clock=clock,
        )
        self._presence = Presence(
            instance,
            self._policy,
            drain_grace=config.drain_grace,
            metrics=metrics,
            on_change=self._publish,
        )
        self._probe_loop = ProbeLoop(
            instance.id,
            config,
            policy=self._policy,
            prober=self._prober,
            presence=self._presence,
            metrics=metrics,
            clock=clock,
            on_change=self._publish,
        )
        self._session: ZkSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._status = self._snapshot()

    # -- public, thread-safe --------------------------------------------------

    @property
    def instance(self) -> ServiceInstance:
        """The instance as the agent was given it (its state is the agent's to set)."""
        return self._presence.instance

    @property
    def registry(self) -> CollectorRegistry:
        """The registry holding the agent's, registration's and session's metrics."""
        return self._registry

    @property
    def pressure(self) -> CpuPressure:
        """The CPU pressure read before and after each probe (the ``pressure`` given, or
        the default :class:`~discovery.agent.pressure.ThreadRunDelay`)."""
        return self._prober.pressure

    @property
    def session(self) -> ZkSession | None:
        """The agent's ZooKeeper session (None before :meth:`start`), for diagnostics and
        fault injection (:func:`discovery.zk.expiry.expire_session`).

        It lives on the agent's loop thread: read its properties, but await its
        methods only through :meth:`call`.
        """
        return self._session

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on the agent's loop (for code that must touch its session)."""
        return await self._on_agent_loop(coro)

    def status(self) -> AgentStatus:
        """The latest snapshot; ``registered`` is read live from the registration."""
        status = self._status
        registration = self._presence.registration
        registered = registration is not None and registration.registered
        conflict = registration.conflict if registration is not None else None
        text = None if conflict is None else str(conflict)
        if registered != status.registered or text != status.conflict:
            status = dataclasses.replace(status, registered=registered, conflict=text)
        return status

    def start(self, timeout: float | None = None) -> None:
        """Connect to ZooKeeper (blocking). Probing begins after :meth:`set_ready`.

        Raises:
            DiscoveryError: ZooKeeper could not be reached (see ``ZkConfig``).
        """
        self._thread.start()
        try:
            self._thread.run(self._start(), timeout)
        except BaseException:
            self._stop_thread()
            raise

    async def astart(self) -> None:
        """:meth:`start` for asyncio callers (does not block their loop)."""
        self._thread.start()
        try:
            await self._on_agent_loop(self._start())
        except BaseException:
            await asyncio.to_thread(self._stop_thread)
            raise

    def set_ready(self) -> None:
        """The server is ready (index loaded, port listening): start probing.

        The node is created after the first good probe, never before.
        """
        self._thread.loop.call_soon_threadsafe(self._set_ready)

    def take_offline(self, reason: str = "admin") -> None:
        """Remove our node and stay offline until :meth:`bring_online`."""
        self._thread.run(self._presence.take_offline(reason))

    async def atake_offline(self, reason: str = "admin") -> None:
        """The awaitable :meth:`take_offline`."""
        await self._on_agent_loop(self._presence.take_offline(reason))

    def bring_online(self) -> None:
        """Undo :meth:`take_offline`: register again after the next good probe."""
        self._thread.run(self._bring_online())

    async def abring_online(self) -> None:
        """The awaitable :meth:`bring_online`."""
        await self._on_agent_loop(self._bring_online())

    def update_instance(self, instance: ServiceInstance) -> None:
        """Publish a new version of our instance, in place if registered (for example a
        new ``docs`` count after the index grew).

        The caller's address, ports, payload and the rest are taken; what the agent owns
        is kept: the state and its reason (with ``enabled``) and the registration time.
        So an update never brings a draining or offline server back, nor revives an old
        registration time. Raises :class:`~discovery.errors.InvalidInstanceError` if
        ``instance`` has another id: the id is the node's name.
        """
        self._thread.run(self._presence.accept_update(instance))

    async def aupdate_instance(self, instance: ServiceInstance) -> None:
        """The awaitable :meth:`update_instance`."""
        await self._on_agent_loop(self._presence.accept_update(instance))

    def drain(self, grace: float | None = None) -> None:
        """Mark our node draining, keep serving for ``grace`` seconds, then remove it.

        Blocks for the grace period. Search servers stop routing to a draining node;
        afterwards the caller stops accepting requests, finishes in-flight ones and
        exits. Probes no longer change anything once draining has begun.
        """
        self._thread.run(self._presence.drain(grace))

    async def adrain(self, grace: float | None = None) -> None:
        """The awaitable :meth:`drain`: waits out the grace period without blocking the
        caller's loop, which keeps serving meanwhile."""
        await self._on_agent_loop(self._presence.drain(grace))

    def stop(self) -> None:
        """Deregister (if still registered), close the session, stop the loop thread."""
        if self._thread.running:
            try:
                self._thread.run(self._stop(), timeout=30)
            finally:
                self._stop_thread()

    async def astop(self) -> None:
        """The awaitable :meth:`stop` (also ``aclose``)."""
        if self._thread.running:
            try:
                await self._on_agent_loop(self._stop())
            finally:
                await asyncio.to_thread(self._stop_thread)

    aclose = astop

    def __enter__(self) -> Agent:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    async def __aenter__(self) -> Agent:
        await self.astart()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.astop()

    async def _on_agent_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        return await asyncio.wrap_future(self._thread.submit(coro))

    def _stop_thread(self) -> None:
        if self._owns_thread:
            self._thread.stop()

    # -- on the agent's loop -------------------------------------------------

    async def _start(self) -> None:
        session = ZkSession.from_config(self._zk, registry=self._registry)
        await session.start()
        try:
            # A wrong password or a missing grant fails start-up, naming the cause,
            # instead of showing up later as refused registrations.
            await check_access(session, (Access(self._base_path, CREATE, "register"),))
        except BaseException:
            await session.aclose()
            raise
        self._session = session
        # Read once now, so that a machine without the source says so at start-up rather
        # than at the first probe.
        self._prober.read_pressure()
        self._presence.attach(
            Registration(
                session,
                self._presence.instance,
                base_path=self._base_path,
                registry=self._registry,
                # This session serves the registration alone, so where the ACL refuses
                # deletes the node may go by ending the session.
                removal=Removal.AUTO,
                verify_interval=self._verify_interval,
            )
        )
        self._task = asyncio.create_task(
            self._probe_loop.run(), name=f"agent:{self._presence.instance.id}"
        )
        self._task.add_done_callback(self._on_task_done)
        self._publish()

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "agent %s probe loop crashed", self._presence.instance.id, exc_info=task.exception()
            )

    def _set_ready(self) -> None:
        self._probe_loop.set_ready()
        self._publish()

    async def _bring_online(self) -> None:
        if not self._presence.bring_online():
            return
        self._probe_loop.wake()
        self._publish()

    async def _stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._presence.stop(session_closing=self._session is not None)
        await self._prober.aclose()
        if self._session is not None:
            await self._session.aclose()
        self._publish()

    def _publish(self) -> None:
        self._status = self._snapshot()

    def _snapshot(self) -> AgentStatus:
        return snapshot(
            self._policy,
            registration=self._presence.registration,
            busy_guard=self._prober.guard_active,
        )
