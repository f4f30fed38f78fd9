"""One probe of the agent, timed and bounded, with the CPU pressure read around it.

Design: docs/design/data-server.md, "The agent".
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable

from discovery.agent.policy import ProbeResult
from discovery.agent.pressure import CpuPressure, PressureReading, busy_share, stall_share
from discovery.agent.probes import Probe
from discovery.config import AgentConfig
from discovery.errors import ProbeFailed
from discovery.metrics import AgentMetrics

__all__ = ["ProbeRunner"]

log = logging.getLogger(__name__)


class ProbeRunner:
    """Run the server's probe (:meth:`run`) and turn what happens into a
    :class:`~discovery.agent.policy.ProbeResult`: a timeout, an error, an answer slower
    than ``max_latency`` or a good one, with the share of its time the server waited for
    a CPU (``pressure``, read before and after).

    It never raises for the probe: a probe is user code, and any failure is a verdict.
    A pressure that cannot be read counts as unknown, which turns the busy guard off
    (logged once per change, shown by the ``discovery_agent_busy_guard`` gauge).
    """

    def __init__(
        self,
        instance_id: str,
        probe: Probe,
        config: AgentConfig,
        *,
        pressure: CpuPressure,
        metrics: AgentMetrics,
        clock: Callable[[], float],
    ) -> None:
        self._instance_id = instance_id
        self._probe = probe
        self._config = config
        self._pressure = pressure
        self._metrics = metrics
        self._clock = clock
        # Whether the last pressure reading was known (None: none taken yet); a change
        # is logged, so a machine without the source says so once, not every probe.
        self._pressure_known: bool | None = None

    @property
    def pressure(self) -> CpuPressure:
        """The CPU pressure read around each probe."""
        return self._pressure

    @property
    def guard_active(self) -> bool:
        """Whether a slow probe can be excused as busy: pressure known at the last
        reading and a busy grace above 0."""
        return bool(self._pressure_known) and self._config.busy_grace > 0

    async def run(self) -> ProbeResult:
        """Probe once: the result, with the CPU stall and busy shares of its time."""
        config = self._config
        before = self.read_pressure()
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
        after = self.read_pressure()
        share = stall_share(before, after)
        result = dataclasses.replace(
            result, stall_share=share, busy_share=busy_share(before, after)
        )
        if not result.ok:
            log.debug(
                "probe of %s failed: %s (CPU stalled: %s)",
                self._instance_id,
                result.reason,
                "unknown" if share is None else f"{share:.0%}",
            )
        return result

    def read_pressure(self) -> PressureReading | None:
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
                    self._instance_id,
                    self._pressure,
                )
            elif self._pressure_known is not None:
                log.info("busy guard on again for %s: CPU pressure readable", self._instance_id)
            self._pressure_known = known
            self._metrics.busy_guard.set(1 if self.guard_active else 0)
        return reading

    async def aclose(self) -> None:
        """Close the probe, if it has an ``aclose`` (an HTTP probe's client session)."""
        closer = getattr(self._probe, "aclose", None)
        if closer is not None:
            await closer()
