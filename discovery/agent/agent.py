"""The data-server agent: register when ready, probe, go offline when unhealthy, drain.

An :class:`Agent` is embedded in a data server. It owns the server's ZooKeeper
session and its :class:`~discovery.zk.registration.Registration`, and it runs on a
:class:`~discovery.agent.loopthread.LoopThread`, never on the server's own event loop: the
case we exist for is a server whose ZooKeeper session is alive (kazoo's threads keep
pinging) while the server itself cannot answer, and an agent on a blocked loop could
not take it offline.

Life of a server, as the agent sees it::

    STARTING --(ready and one good probe)--> SERVING
    SERVING --(fall failed probes)--> OFFLINE --(rise good probes)--> SERVING
    OFFLINE --(rise good probes, but re-admitted flap_max times within flap_window)-->
        DAMPED --(flap_cooldown elapsed and rise good probes)--> SERVING
    any --(take_offline)--> ADMIN_OFFLINE --(bring_online and a good probe)--> SERVING
    any --(drain)--> DRAINING: node marked draining, grace period, node removed
    any --(stop)--> STOPPED

"Offline" always means our node is deleted, so search servers stop routing to us;
the ZooKeeper session stays open, so coming back is one create. Where the ACL
refuses data servers deletes (``discovery zk-init``, see :mod:`discovery.zk.acl`), the
node goes by ending the session instead, and a new session is opened at once
(:class:`~discovery.zk.registration.Removal`). After a session
expiry the registration re-creates the node by itself if, and only if, the agent
still wants to be online.

What to do when is decided by a :class:`~discovery.agent.policy.HealthPolicy`, a plain
object fed the probes' results and a clock (its module spells the rules out); the
agent carries its decisions out with ZooKeeper calls, metrics and logs.

Around each probe the agent reads a CPU pressure
(:class:`~discovery.agent.pressure.CpuPressure`) and gives the policy the share of
the probe's time spent waiting for a CPU: a probe slow only because the machine is
busy is excused for a bounded time (``busy_grace``), so that load does not take every
server of a machine offline at once. By default the pressure is the run delay of the
thread that constructed the agent
(:class:`~discovery.agent.pressure.ThreadRunDelay`): the time the server's own thread
was runnable but given no CPU, so that a hung or slowed server, whose thread is
blocked or asleep rather than waiting for a CPU, is never excused, however busy the
machine. A probe during which that thread was busy (running or waiting for a CPU)
nearly all along is excused too: a loop saturated by its searches is serving (a loop
spinning forever looks the same, and goes after ``busy_grace``). Where the pressure is
unknown (not Linux) nothing is excused: the "busy guard" is off, which is logged once
at info and shown in the status.

The public methods are thread-safe and come in two flavours: blocking ones for
threaded servers (``start``, ``drain``, ``stop``...) and awaitable ones for asyncio
servers (``astart``, ``adrain``, ``astop``...), which wait without blocking the
caller's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry

from discovery.agent.loopthread import LoopThread
from discovery.agent.policy import Action, AgentState, Decision, HealthPolicy, ProbeResult
from discovery.agent.pressure import (
    CpuPressure,
    PressureReading,
    ThreadRunDelay,
    busy_share,
    stall_share,
)
from discovery.agent.probes import Probe
from discovery.config import AgentConfig, ZkConfig
from discovery.errors import DiscoveryError, InvalidInstanceError, ProbeFailed, ZkError
from discovery.instance import InstanceState, ServiceInstance
from discovery.metrics import AgentMetrics
from discovery.zk.acl import CREATE, Access, check_access
from discovery.zk.paths import DATA_SERVERS_PATH
from discovery.zk.registration import Registration, Removal
from discovery.zk.session import ZkSession

__all__ = ["Agent", "AgentState", "AgentStatus", "ProbeResult"]

log = logging.getLogger(__name__)

T = TypeVar("T")

# At most one warning per agent in this many seconds about probes excused as busy: a
# starved machine excuses one probe a second for up to busy_grace.
_BUSY_LOG_INTERVAL = 30.0


@dataclass(frozen=True)
class AgentStatus:
    """A consistent snapshot of the agent, safe to read from any thread.

    It is published once a decision's ZooKeeper work has returned, so for a moment the
    node may already be gone (or back) while the status still shows the old state.
    """

    state: AgentState
    reason: str | None
    ready: bool
    registered: bool
    consecutive_failures: int
    consecutive_successes: int
    last_probe: ProbeResult | None
    damped_for: float | None  # seconds of cool-down left
    # Why we are not registered although we want to be: another session holds our id.
    conflict: str | None = None
    # Whether a slow probe can be excused as busy now: CPU pressure known (at the last
    # reading) and a busy grace above 0.
    busy_guard: bool = False
    # Seconds since the first excused probe of the current run of failed ones.
    busy_for: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "state": self.state.value,
            "reason": self.reason,
            "ready": self.ready,
            "registered": self.registered,
            "consecutive_failures": self.consecutive_failures,
            "consecutive_successes": self.consecutive_successes,
            "last_probe": None
            if self.last_probe is None
            else {
                "ok": self.last_probe.ok,
                "kind": self.last_probe.kind,
                "latency_ms": round(self.last_probe.latency * 1000, 3),
                "reason": self.last_probe.reason,
                "stall_share": None
                if self.last_probe.stall_share is None
                else round(self.last_probe.stall_share, 3),
                "busy_share": None
                if self.last_probe.busy_share is None
                else round(self.last_probe.busy_share, 3),
            },
            "damped_for_s": self.damped_for,
            "conflict": self.conflict,
            "busy_guard": self.busy_guard,
            "busy_for_s": self.busy_for,
        }


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
        self._instance = instance
        self._probe = probe
        self._zk = zk
        self._config = config or AgentConfig()
        self._registry = registry if registry is not None else CollectorRegistry()
        self._owns_thread = loop_thread is None
        self._thread = loop_thread or LoopThread(f"agent-{instance.id}")
        self._base_path = base_path
        self._clock = clock
        # ThreadRunDelay() takes the calling thread's id: this constructor runs on the
        # embedder's thread (the server's event loop), never on self._thread.
        self._pressure = pressure if pressure is not None else ThreadRunDelay()
        self._metrics = AgentMetrics(self._registry, [s.value for s in AgentState])
        # Everything below is touched only on the agent's loop, except the immutable
        # status snapshot, which other threads read.
        self._policy = HealthPolicy(self._config, clock=clock)
        self._session: ZkSession | None = None
        self._registration: Registration | None = None
        self._task: asyncio.Task[None] | None = None
        # asyncio primitives bind to a loop on first use, which is the agent's. The
        # ready event only starts the probe loop; the policy's flag is the one shown.
        self._ready = asyncio.Event()
        self._wake = asyncio.Event()
        # Whether the last pressure reading was known (None: none taken yet); a change
        # is logged, so a machine without the source says so once, not every probe.
        self._pressure_known: bool | None = None
        # The warning about excused probes, rate-limited: when it was last logged and
        # how many probes were excused since.
        self._busy_logged_at: float | None = None
        self._busy_unlogged = 0
        self._status = self._snapshot()

    # -- public, thread-safe --------------------------------------------------

    @property
    def instance(self) -> ServiceInstance:
        """The instance as the agent was given it (its state is the agent's to set)."""
        return self._instance

    @property
    def registry(self) -> CollectorRegistry:
        """The registry holding the agent's, registration's and session's metrics."""
        return self._registry

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
        registration = self._registration
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
        self._thread.run(self._take_offline_admin(reason))

    async def atake_offline(self, reason: str = "admin") -> None:
        """The awaitable :meth:`take_offline`."""
        await self._on_agent_loop(self._take_offline_admin(reason))

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
        self._thread.run(self._accept_update(instance))

    async def aupdate_instance(self, instance: ServiceInstance) -> None:
        """The awaitable :meth:`update_instance`."""
        await self._on_agent_loop(self._accept_update(instance))

    def drain(self, grace: float | None = None) -> None:
        """Mark our node draining, keep serving for ``grace`` seconds, then remove it.

        Blocks for the grace period. Search servers stop routing to a draining node;
        afterwards the caller stops accepting requests, finishes in-flight ones and
        exits. Probes no longer change anything once draining has begun.
        """
        self._thread.run(self._drain(grace))

    async def adrain(self, grace: float | None = None) -> None:
        """The awaitable :meth:`drain`: waits out the grace period without blocking the
        caller's loop, which keeps serving meanwhile."""
        await self._on_agent_loop(self._drain(grace))

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
        self._read_pressure()
        self._registration = Registration(
            session,
            self._instance,
            base_path=self._base_path,
            registry=self._registry,
            # This session serves the registration alone, so where the ACL refuses
            # deletes the node may go by ending the session.
            removal=Removal.AUTO,
            verify_interval=self._config.verify_interval,
        )
        self._task = asyncio.create_task(self._probe_loop(), name=f"agent:{self._instance.id}")
        self._task.add_done_callback(self._on_task_done)
        self._publish()

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("agent %s probe loop crashed", self._instance.id, exc_info=task.exception())

    def _set_ready(self) -> None:
        self._policy.set_ready()
        self._ready.set()
        self._wake.set()
        self._publish()

    async def _probe_loop(self) -> None:
        await self._ready.wait()
        while not self._policy.finished:
            started = self._clock()
            result = await self._probe_once()
            if self._policy.finished:
                self._count(result, excused=False)
                return
            await self._decide(result)
            # The next probe is due one interval after this one started; an admin
            # change wakes us early so its effect does not wait for the schedule.
            delay = max(0.0, started + self._config.probe_interval - self._clock())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wake.wait()
            self._wake.clear()

    async def _probe_once(self) -> ProbeResult:
        config = self._config
        before = self._read_pressure()
        started = self._clock()
        try:
            async with asyncio.timeout(config.probe_timeout):
                await self._probe.check()
        except TimeoutError:
            result = ProbeResult(
                False,
                "timeout",
                self._clock() - started,
                f"timed out after {config.probe_timeout:g}s",
            )
        except ProbeFailed as exc:
            result = ProbeResult(False, "error", self._clock() - started, str(exc))
        except Exception as exc:  # a probe is user code: any failure is a verdict, not a crash
            result = ProbeResult(
                False, "error", self._clock() - started, f"{type(exc).__name__}: {exc}"
            )
        else:
            latency = self._clock() - started
            if latency > config.max_latency:
                result = ProbeResult(
                    False,
                    "slow",
                    latency,
                    f"answered in {latency * 1000:.0f} ms > {config.max_latency * 1000:.0f} ms",
                )
            else:
                result = ProbeResult(True, "ok", latency)
        after = self._read_pressure()
        share = stall_share(before, after)
        result = dataclasses.replace(
            result, stall_share=share, busy_share=busy_share(before, after)
        )
        if not result.ok:
            log.debug(
                "probe of %s failed: %s (CPU stalled: %s)",
                self._instance.id,
                result.reason,
                "unknown" if share is None else f"{share:.0%}",
            )
        return result

    def _read_pressure(self) -> PressureReading | None:
        """A reading of the CPU pressure, None if unknown; a change between known and
        unknown is logged."""
        try:
            reading = self._pressure.read()
        except Exception as exc:  # an extension point: a failure means "unknown"
            if self._pressure_known is not False:  # said once, not at every probe
                log.debug("reading CPU pressure failed: %s: %s", type(exc).__name__, exc)
            reading = None
        known = reading is not None
        if known != self._pressure_known:
            if not known:
                log.info(
                    "busy guard off for %s: no CPU pressure from %r, so slow probes are "
                    "never excused as busy",
                    self._instance.id,
                    self._pressure,
                )
            elif self._pressure_known is not None:
                log.info("busy guard on again for %s: CPU pressure readable", self._instance.id)
            self._pressure_known = known
            self._metrics.busy_guard.set(1 if self._guard_active() else 0)
        return reading

    def _guard_active(self) -> bool:
        return bool(self._pressure_known) and self._config.busy_grace > 0

    def _count(self, result: ProbeResult, *, excused: bool) -> None:
        self._metrics.probes.labels(result="busy" if excused else result.kind).inc()
        if result.kind in ("ok", "slow"):
            self._metrics.probe_seconds.observe(result.latency)

    def _log_excused(self, result: ProbeResult) -> None:
        """Warn that a probe was excused as busy, at most once per
        30 s (``_BUSY_LOG_INTERVAL``), with the figures."""
        self._busy_unlogged += 1
        now = self._clock()
        if self._busy_logged_at is not None and now - self._busy_logged_at < _BUSY_LOG_INTERVAL:
            return
        busy_for = self._policy.busy_for() or 0.0
        share = result.stall_share or 0.0
        busy = result.busy_share
        log.warning(
            "%s: probe %s in %.0f ms (bound %.0f ms) while the machine's CPU was stalled "
            "%.0f%% of the time (the server's thread busy %s): excused as busy (%d "
            "excused since the last such warning; excusing for %.0fs of a %gs grace)",
            self._instance.id,
            "timed out" if result.kind == "timeout" else "answered",
            result.latency * 1000,
            self._config.max_latency * 1000,
            share * 100,
            "?" if busy is None else f"{busy:.0%}",
            self._busy_unlogged,
            busy_for,
            self._config.busy_grace,
        )
        self._busy_logged_at = now
        self._busy_unlogged = 0

    async def _decide(self, result: ProbeResult) -> None:
        """Carry out the policy's decision on ``result`` (the policy is already in its
        new state)."""
        decision = self._policy.observe(result)
        self._count(result, excused=decision.excused)
        if decision.excused:
            self._log_excused(result)
        await self._carry_out(decision, result)
        self._publish()

    async def _carry_out(self, decision: Decision, result: ProbeResult) -> None:
        action = decision.action
        if action is Action.ADMIT:
            await self._admit("ready")
        elif action is Action.LEAVE:
            self._metrics.forced_offline.labels(reason=result.kind).inc()
            log.warning("taking %s offline: %s", self._instance.id, decision.reason)
            await self._leave(decision.reason)
        elif action is Action.DAMP:
            self._metrics.damped.inc()
            log.warning("%s is %s", self._instance.id, decision.reason)
            self._show_state()
        elif action is Action.READMIT:
            self._metrics.readmissions.inc()
            log.info("%s is healthy again; re-registering", self._instance.id)
            await self._admit(None)

    async def _admit(self, why: str | None) -> None:
        assert self._registration is not None
        self._show_state()
        # Every admission is a new registration: serving again (an announced departure
        # left "draining" behind) and stamped now, so that search servers treat the
        # server as a fresh target rather than as the one they ejected before it left.
        instance = dataclasses.replace(
            self._instance.with_state(InstanceState.SERVING),
            registration_time_utc=int(time.time() * 1000),
        )
        try:
            await self._update_instance(instance)
        except DiscoveryError as exc:
            log.error("updating %s before registering failed: %s", self._instance.id, exc)
        try:
            await self._registration.register()
        except ZkError as exc:
            # The registration keeps trying (at reconnect, or when a conflicting
            # node goes); our intent is recorded, the error is not ours to raise.
            log.error("registering %s failed for now: %s", self._instance.id, exc)
        else:
            if why:
                log.info("%s registered (%s)", self._instance.id, why)

    async def _leave(self, reason: str | None) -> None:
        """Announce the departure the policy decided and delete our node."""
        assert self._registration is not None
        self._show_state()
        # A registration in flight (an admin request can arrive during one) is waited
        # for: its node may already be seen, and must be announced like any other.
        if await self._registration.settled():
            # Announce the departure before the node goes: readers stop routing at the
            # first write, and the leader knows this removal is deliberate, not one of
            # the unexplained vanishings its mass-loss brake holds back.
            leaving = self._instance.with_state(InstanceState.DRAINING, reason=f"offline: {reason}")
            try:
                await self._update_instance(leaving)
            except DiscoveryError as exc:
                log.warning("announcing %s offline failed: %s", self._instance.id, exc)
        try:
            await self._registration.deregister()
        except ZkError as exc:
            log.error("deregistering %s failed for now: %s", self._instance.id, exc)

    async def _take_offline_admin(self, reason: str) -> None:
        if not self._policy.take_offline(reason):
            return
        log.info("taking %s offline on request: %s", self._instance.id, reason)
        self._publish()  # the new state shows at once, not once the node has gone
        await self._leave(reason)
        self._publish()

    async def _bring_online(self) -> None:
        if not self._policy.bring_online():
            return
        self._show_state()
        self._wake.set()
        self._publish()

    async def _accept_update(self, instance: ServiceInstance) -> None:
        current = self._instance
        if instance.id != current.id:
            raise InvalidInstanceError(
                f"update_instance: id {instance.id!r} is not this agent's ({current.id!r})"
            )
        payload = dataclasses.replace(
            instance.payload, state=current.payload.state, reason=current.payload.reason
        )
        await self._update_instance(
            dataclasses.replace(
                instance,
                payload=payload,
                enabled=current.enabled,
                registration_time_utc=current.registration_time_utc,
            )
        )

    async def _update_instance(self, instance: ServiceInstance) -> None:
        assert self._registration is not None
        self._instance = instance
        await self._registration.update(instance)

    async def _drain(self, grace: float | None) -> None:
        assert self._registration is not None
        if not self._policy.drain():
            return
        grace = self._config.drain_grace if grace is None else grace
        self._show_state()
        self._publish()
        log.info("draining %s (grace %gs)", self._instance.id, grace)
        # Settled, not merely "registered": while a create was on its way that read
        # False, and the node it made went without the mark and the grace.
        if await self._registration.settled():
            draining = self._instance.with_state(InstanceState.DRAINING, reason="draining")
            try:
                await self._update_instance(draining)
            except DiscoveryError as exc:
                log.error("marking %s draining failed: %s", self._instance.id, exc)
            # The grace period is the contract with the search servers: they stop
            # routing to a draining node within it, while we keep answering.
            await asyncio.sleep(grace)
        try:
            await self._registration.deregister()
        except ZkError as exc:
            log.error("deregistering %s after drain failed: %s", self._instance.id, exc)
        log.info("%s drained", self._instance.id)

    async def _stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._policy.stop()
        self._show_state()
        if self._registration is not None:
            await self._registration.aclose(session_closing=self._session is not None)
        closer = getattr(self._probe, "aclose", None)
        if closer is not None:
            await closer()
        if self._session is not None:
            await self._session.aclose()
        self._publish()

    def _show_state(self) -> None:
        """The state metric follows the policy's state (after every change of it)."""
        self._metrics.state.state(self._policy.state.value)

    def _publish(self) -> None:
        self._status = self._snapshot()

    def _snapshot(self) -> AgentStatus:
        policy = self._policy
        damped_for = policy.damped_for()
        busy_for = policy.busy_for()
        return AgentStatus(
            state=policy.state,
            reason=policy.reason,
            ready=policy.ready,
            registered=self._registration is not None and self._registration.registered,
            consecutive_failures=policy.consecutive_failures,
            consecutive_successes=policy.consecutive_successes,
            last_probe=policy.last_probe,
            damped_for=None if damped_for is None else round(damped_for, 3),
            busy_guard=self._guard_active(),
            busy_for=None if busy_for is None else round(busy_for, 3),
        )
