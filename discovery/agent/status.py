"""The agent's status: a snapshot of its policy and registration, safe to read from any
thread (an immutable object, replaced whole on the agent's loop after every change)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from discovery.agent.policy import AgentState, HealthPolicy, ProbeResult
from discovery.zk.registration import Registration

__all__ = ["AgentStatus", "snapshot"]


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


def snapshot(
    policy: HealthPolicy, *, registration: Registration | None, busy_guard: bool
) -> AgentStatus:
    """The status now: ``policy``'s state and counters, whether ``registration`` holds
    our node, and whether the busy guard is on."""
    damped_for = policy.damped_for()
    busy_for = policy.busy_for()
    return AgentStatus(
        state=policy.state,
        reason=policy.reason,
        ready=policy.ready,
        registered=registration is not None and registration.registered,
        consecutive_failures=policy.consecutive_failures,
        consecutive_successes=policy.consecutive_successes,
        last_probe=policy.last_probe,
        damped_for=None if damped_for is None else round(damped_for, 3),
        busy_guard=busy_guard,
        busy_for=None if busy_for is None else round(busy_for, 3),
    )
