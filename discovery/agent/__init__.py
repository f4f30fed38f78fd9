"""The agent a data server embeds: register when ready, probe, go offline, drain.

* :mod:`~discovery.agent.agent`: :class:`Agent`, which owns the session and the
  registration and acts on the decisions of its policy.
* :mod:`~discovery.agent.policy`: :class:`HealthPolicy`, which decides when the server
  is admitted, taken offline or held out: no I/O, its clock passed in.
* :mod:`~discovery.agent.probes`: the :class:`Probe` protocol and its implementations.
* :mod:`~discovery.agent.loopthread`: :class:`LoopThread`, an event loop in a thread
  of its own, for servers that are not asyncio.
"""

from discovery.agent.agent import Agent, AgentStatus
from discovery.agent.loopthread import LoopThread
from discovery.agent.policy import Action, AgentState, Decision, HealthPolicy, ProbeResult
from discovery.agent.probes import CallableProbe, HttpProbe, Probe, SearchProbe

__all__ = [
    "Action",
    "Agent",
    "AgentState",
    "AgentStatus",
    "CallableProbe",
    "Decision",
    "HealthPolicy",
    "HttpProbe",
    "LoopThread",
    "Probe",
    "ProbeResult",
    "SearchProbe",
]
