"""The parts a data server builds as it starts (:class:`DataServerParts`): set by
:class:`~data_server.server.DataServer` as it loads, listens and connects, read by its
HTTP handlers (``/readyz`` answers 503 until the index and a registered agent are there)."""

from __future__ import annotations

from dataclasses import dataclass

from discovery.agent.agent import Agent

from .index import InvertedIndex

__all__ = ["DataServerParts"]


@dataclass(eq=False, slots=True)
class DataServerParts:
    """One data server's parts; each None until start-up has built it."""

    #: The id until the agent has one (``--id``, else one naming the configured port).
    configured_id: str
    index: InvertedIndex | None = None
    #: The port listened on (the configured one may be 0).
    port: int | None = None
    agent: Agent | None = None

    @property
    def instance_id(self) -> str:
        """The id registered in ZooKeeper once the agent exists, else :attr:`configured_id`."""
        return self.agent.instance.id if self.agent is not None else self.configured_id
