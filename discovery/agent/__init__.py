"""The agent a data server embeds: register when ready, probe, go offline, drain.

Design: docs/design/data-server.md, "The agent".
"""

from discovery.agent.agent import Agent, AgentStatus
from discovery.agent.loopthread import LoopThread
from discovery.agent.policy import Action, AgentState, Decision, HealthPolicy, ProbeResult
from discovery.agent.pressure import CpuPressure, PressureReading, PsiCpuPressure, ThreadRunDelay
from discovery.agent.probes import CallableProbe, HttpProbe, Probe, SearchProbe

__all__ = [
    "Action",
    "Agent",
    "AgentState",
    "AgentStatus",
    "CallableProbe",
    "CpuPressure",
    "Decision",
    "HealthPolicy",
    "HttpProbe",
    "LoopThread",
    "PressureReading",
    "Probe",
    "ProbeResult",
    "PsiCpuPressure",
    "SearchProbe",
    "ThreadRunDelay",
]
