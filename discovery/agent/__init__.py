"""The agent a data server embeds: register when ready, probe, go offline, drain.

* :mod:`~discovery.agent.agent`: :class:`Agent`, which owns the session and the
  registration and acts on the decisions of its policy, through its parts:
  :mod:`~discovery.agent.probeloop` (probe, decide, act), :mod:`~discovery.agent.probing`
  (one probe), :mod:`~discovery.agent.presence` (the node: admit, leave, drain) and
  :mod:`~discovery.agent.status` (:class:`AgentStatus`).
* :mod:`~discovery.agent.policy`: :class:`HealthPolicy`, which decides when the server
  is admitted, taken offline or held out: no I/O, its clock passed in.
* :mod:`~discovery.agent.probes`: the :class:`Probe` protocol and its implementations.
* :mod:`~discovery.agent.pressure`: the :class:`CpuPressure` protocol (how long the
  server waited for a CPU during a probe), :class:`ThreadRunDelay` (the default: one
  thread's run delay, Linux schedstat) and :class:`PsiCpuPressure` (the machine's
  stall, Linux PSI).
* :mod:`~discovery.agent.loopthread`: :class:`LoopThread`, an event loop in a thread
  of its own, for servers that are not asyncio.
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
