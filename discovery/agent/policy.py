"""The agent's health policy: when a data server is admitted, taken offline or held out.

:class:`HealthPolicy` decides, the :class:`~discovery.agent.agent.Agent` carries out. No
I/O, its clock passed in, never raises; not thread-safe (the agent's loop only). A
decision takes effect in the policy at once, before the agent's ZooKeeper work for it.

Design: docs/design/data-server.md, "The policy's rules".
"""

from __future__ import annotations

import dataclasses
import enum
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from discovery.config import AgentConfig

__all__ = ["Action", "AgentState", "Decision", "HealthPolicy", "ProbeResult"]


class AgentState(enum.StrEnum):
    """Where the agent is in its state diagram (docs/design/data-server.md, "The agent")."""

    STARTING = "starting"
    SERVING = "serving"
    OFFLINE = "offline"
    DAMPED = "damped"
    ADMIN_OFFLINE = "admin_offline"
    DRAINING = "draining"
    STOPPED = "stopped"


# Probes change nothing any more in these states: the server is on its way out.
_FINISHED = (AgentState.DRAINING, AgentState.STOPPED)

#: Share of a probe's time the server's thread must have been running or waiting for a
#: CPU (busy, not blocked) for its slowness to be load's: a saturated loop is serving,
#: a stuck one (hung, blocked, sleeping, waiting for the GIL) is idle in between.
BUSY_SHARE = 0.9

# The failures that the machine's CPU stall may excuse: slowness, not wrong answers.
_EXCUSABLE_KINDS = frozenset({"slow", "timeout"})


@dataclass(frozen=True)
class ProbeResult:
    """One probe's outcome.

    ``kind`` is ok, error, timeout or slow as the agent measured it, or busy: a slow
    or timed-out probe the policy excused (only :attr:`HealthPolicy.last_probe` shows
    that kind). ``stall_share`` is the share, in [0, 1], of the probe's wall time
    during which the server was stalled waiting for a CPU (the pressure source's
    reading, :func:`~discovery.agent.pressure.stall_share`), None when unknown.
    """

    ok: bool
    kind: str
    latency: float
    reason: str | None = None
    stall_share: float | None = None
    busy_share: float | None = None


class Action(enum.Enum):
    """What the agent must carry out after a probe."""

    STAY = "stay"  # nothing: the state did not change
    ADMIT = "admit"  # register, out of STARTING
    READMIT = "readmit"  # register again after an outage; counts towards flapping
    LEAVE = "leave"  # announce the departure and delete the node: OFFLINE
    DAMP = "damp"  # the node is already gone; held out for flapping: DAMPED


@dataclass(frozen=True)
class Decision:
    """The policy's answer to a probe: the ``action`` to carry out, and the ``state``
    the policy is in from now on, with its ``reason`` (:attr:`HealthPolicy.reason`);
    ``excused`` if the probe failed but was excused as busy (then the action is STAY)."""

    action: Action
    state: AgentState
    reason: str | None = None
    excused: bool = False


class HealthPolicy:
    """The policy; see the module docstring.

    Args:
        config: the thresholds (``fall``, ``rise``), flap damping (``flap_max``,
            ``flap_window``, ``flap_cooldown``) and the busy excuse (``max_latency``,
            ``busy_grace``); the other fields are not its business.
        clock: monotonic seconds, for the flap window, the cool-down and the busy grace.
    """

    def __init__(
        self, config: AgentConfig | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config or AgentConfig()
        self._clock = clock
        self._state = AgentState.STARTING
        self._reason: str | None = None
        self._ready = False
        self._failures = 0
        self._successes = 0
        self._last_probe: ProbeResult | None = None
        # When the server was re-admitted after an outage, oldest first; pruned to the
        # flap window when the next re-admission is due.
        self._readmissions: deque[float] = deque()
        self._damped_until: float | None = None
        # When the first probe of the current run of failed ones was excused as busy;
        # None when none was (or a good probe ended the run).
        self._busy_since: float | None = None

    @property
    def state(self) -> AgentState:
        return self._state

    @property
    def reason(self) -> str | None:
        """Why the server is offline, damped or draining; None otherwise."""
        return self._reason

    @property
    def ready(self) -> bool:
        return self._ready

    @property
    def finished(self) -> bool:
        """Draining or stopped: probes no longer change anything."""
        return self._state in _FINISHED

    @property
    def consecutive_failures(self) -> int:
        return self._failures

    @property
    def consecutive_successes(self) -> int:
        return self._successes

    @property
    def last_probe(self) -> ProbeResult | None:
        """The last result observed while probes count (see :meth:`observe`); an
        excused one with kind ``busy``."""
        return self._last_probe

    def busy_for(self) -> float | None:
        """Seconds since the first excused probe of the current run of failed probes
        (past ``busy_grace`` once the excuse is used up); None if none was excused."""
        if self._busy_since is None:
            return None
        return max(0.0, self._clock() - self._busy_since)

    def damped_for(self) -> float | None:
        """Seconds of cool-down left while DAMPED (0 once it is over); None otherwise."""
        if self._state is not AgentState.DAMPED or self._damped_until is None:
            return None
        return max(0.0, self._damped_until - self._clock())

    def set_ready(self) -> None:
        """The server is ready: probes count from now on."""
        self._ready = True

    def observe(self, result: ProbeResult) -> Decision:
        """Count ``result`` and decide what follows from it (see the module docstring)."""
        if not self._ready or self.finished:
            return Decision(Action.STAY, self._state, self._reason)
        config = self.config
        now = self._clock()
        if result.ok:
            self._busy_since = None  # a good probe ends the run
        elif config.busy_grace > 0 and self._explained_by_stall(result):
            if self._busy_since is None:
                self._busy_since = now
            if now - self._busy_since <= config.busy_grace:
                return self._excuse(result)
            result = dataclasses.replace(
                result,
                reason=f"{result.reason} (not excused: CPU-stall grace of "
                f"{config.busy_grace:g}s used up)",
            )
        self._last_probe = result
        if result.ok:
            self._successes += 1
            self._failures = 0
        else:
            self._failures += 1
            self._successes = 0
        state = self._state
        if state is AgentState.STARTING and result.ok:
            return self._move(Action.ADMIT, AgentState.SERVING, None)
        if state is AgentState.SERVING and self._failures >= config.fall:
            reason = f"{self._failures} failed probes, last: {result.reason}"
            return self._move(Action.LEAVE, AgentState.OFFLINE, reason)
        if state is AgentState.OFFLINE and self._successes >= config.rise:
            while self._readmissions and now - self._readmissions[0] > config.flap_window:
                self._readmissions.popleft()
            if len(self._readmissions) >= config.flap_max:
                self._damped_until = now + config.flap_cooldown
                reason = (
                    f"flapping: re-admitted {len(self._readmissions)} times in "
                    f"{config.flap_window:g}s; held out for {config.flap_cooldown:g}s"
                )
                return self._move(Action.DAMP, AgentState.DAMPED, reason)
            return self._readmit(now)
        if (
            state is AgentState.DAMPED
            and self._damped_until is not None
            and now >= self._damped_until
            and self._successes >= config.rise
        ):
            # A fresh start: the cool-down is the penalty for the old flaps.
            self._readmissions.clear()
            self._damped_until = None
            return self._readmit(now)
        return Decision(Action.STAY, state, self._reason)

    def take_offline(self, reason: str) -> bool:
        """Go ADMIN_OFFLINE (again, with a new reason, if already there) until
        :meth:`bring_online`. False, changing nothing, once draining or stopped."""
        if self.finished:
            return False
        self._set(AgentState.ADMIN_OFFLINE, reason)
        return True

    def bring_online(self) -> bool:
        """Undo :meth:`take_offline`: back to STARTING with fresh counts, so the next
        good probe admits the server. False, changing nothing, unless ADMIN_OFFLINE."""
        if self._state is not AgentState.ADMIN_OFFLINE:
            return False
        self._successes = self._failures = 0
        self._set(AgentState.STARTING, None)
        return True

    def drain(self) -> bool:
        """Go DRAINING for good. False, changing nothing, if already draining or stopped."""
        if self.finished:
            return False
        self._set(AgentState.DRAINING, "draining")
        return True

    def stop(self) -> None:
        """Go STOPPED, from any state."""
        self._set(AgentState.STOPPED, None)

    def _explained_by_stall(self, result: ProbeResult) -> bool:
        """Whether ``result`` is a slow or timed-out probe that load explains: it would
        have met ``max_latency`` without the CPU stall, or the server's thread was busy
        (running or waiting for a CPU) nearly all along, serving, not stuck. The rule,
        whatever the grace."""
        if result.kind not in _EXCUSABLE_KINDS:
            return False
        busy = result.busy_share
        if busy is not None and math.isfinite(busy) and busy >= BUSY_SHARE:
            return True
        share = result.stall_share
        if share is None or not math.isfinite(share):
            return False
        share = min(1.0, max(0.0, share))
        return result.latency * (1.0 - share) <= self.config.max_latency

    def _excuse(self, result: ProbeResult) -> Decision:
        share = min(1.0, max(0.0, result.stall_share or 0.0))
        why = f"the CPU was stalled {share:.0%} of it"
        if result.busy_share is not None:
            busy = min(1.0, max(0.0, result.busy_share))
            why += f", the server's thread busy {busy:.0%}"
        self._last_probe = dataclasses.replace(
            result, kind="busy", reason=f"{result.reason}; excused: {why}"
        )
        # Neither a failure nor a success (see the module docstring): the failures
        # stand, a run of good probes is broken.
        self._successes = 0
        return Decision(Action.STAY, self._state, self._reason, excused=True)

    def _readmit(self, now: float) -> Decision:
        self._readmissions.append(now)
        return self._move(Action.READMIT, AgentState.SERVING, None)

    def _move(self, action: Action, state: AgentState, reason: str | None) -> Decision:
        self._set(state, reason)
        return Decision(action, state, reason)

    def _set(self, state: AgentState, reason: str | None) -> None:
        self._state = state
        self._reason = reason
