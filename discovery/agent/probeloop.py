"""The agent's probe loop: probe on schedule, ask the policy, have its decision carried out.

Design: docs/design/data-server.md, "The agent".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from discovery.agent.policy import Action, Decision, HealthPolicy, ProbeResult
from discovery.agent.presence import Presence
from discovery.agent.probing import ProbeRunner
from discovery.config import AgentConfig
from discovery.metrics import AgentMetrics

__all__ = ["ProbeLoop"]

log = logging.getLogger(__name__)

# At most one warning per agent in this many seconds about probes excused as busy: a
# starved machine excuses one probe a second for up to busy_grace.
_BUSY_LOG_INTERVAL = 30.0


class ProbeLoop:
    """Once the server is ready (:meth:`set_ready`), probe it every ``probe_interval``,
    feed each result to the policy and carry its decision out through the
    :class:`~discovery.agent.presence.Presence`, counting probes and logging the
    excused ones (at most every 30 s). :meth:`wake` runs the next probe at once.

    :meth:`run` returns once the policy is finished (draining, stopped); the agent
    cancels it on stop. It does not raise for a probe (see
    :class:`~discovery.agent.probing.ProbeRunner`).
    """

    def __init__(
        self,
        instance_id: str,
        config: AgentConfig,
        *,
        policy: HealthPolicy,
        prober: ProbeRunner,
        presence: Presence,
        metrics: AgentMetrics,
        clock: Callable[[], float],
        on_change: Callable[[], None],
    ) -> None:
        self._instance_id = instance_id
        self._config = config
        self._policy = policy
        self._prober = prober
        self._presence = presence
        self._metrics = metrics
        self._clock = clock
        self._on_change = on_change
        # asyncio primitives bind to a loop on first use, which is the agent's. The
        # ready event only starts the loop; the policy's flag is the one shown.
        self._ready = asyncio.Event()
        self._wake = asyncio.Event()
        # The warning about excused probes, rate-limited: when it was last logged and
        # how many probes were excused since.
        self._busy_logged_at: float | None = None
        self._busy_unlogged = 0

    def set_ready(self) -> None:
        """The server is ready: start probing (on the agent's loop)."""
        self._policy.set_ready()
        self._ready.set()
        self._wake.set()

    def wake(self) -> None:
        """Probe now rather than at the next interval (after an admin change)."""
        self._wake.set()

    async def run(self) -> None:
        """Probe until the policy is finished."""
        await self._ready.wait()
        while not self._policy.finished:
            started = self._clock()
            result = await self._prober.run()
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
            self._instance_id,
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
        self._on_change()

    async def _carry_out(self, decision: Decision, result: ProbeResult) -> None:
        action = decision.action
        if action is Action.ADMIT:
            await self._presence.admit("ready")
        elif action is Action.LEAVE:
            self._metrics.forced_offline.labels(reason=result.kind).inc()
            log.warning("taking %s offline: %s", self._instance_id, decision.reason)
            await self._presence.leave(decision.reason)
        elif action is Action.DAMP:
            self._metrics.damped.inc()
            log.warning("%s is %s", self._instance_id, decision.reason)
            self._presence.show_state()
        elif action is Action.READMIT:
            self._metrics.readmissions.inc()
            log.info("%s is healthy again; re-registering", self._instance_id)
            await self._presence.admit(None)
