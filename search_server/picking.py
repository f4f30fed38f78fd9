"""Which replica of a shard gets a query's request: the picker seam of the fan-out.

:class:`~search_server.fanout.FanOut` asks its :class:`ReplicaPicker` to choose among a
shard's candidate replicas (routable, not ejected, not yet tried by this query) and tells
it when each request starts and how it ended, so a picker can keep whatever load or
latency signal it ranks by. The default is :class:`PowerOfTwoChoices`; another policy
(adaptive replica selection, zone preference) is a new class passed as
``FanOut(picker=...)``, not an edit of the fan-out.

A picker runs on the fan-out's event loop and is not thread-safe; it must be fast (it
runs for every sub-request) and must never raise for a non-empty list of candidates.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Literal, Protocol, runtime_checkable

from discovery.instance import ServiceInstance

__all__ = ["Outcome", "PowerOfTwoChoices", "ReplicaPicker", "target_key"]

#: How a request ended: answered, failed (error, bad answer), timed out, or cancelled
#: (the query ended first, e.g. another replica answered or the client went away).
Outcome = Literal["ok", "failed", "timed_out", "cancelled"]


def target_key(instance: ServiceInstance) -> str:
    """What the fan-out keys a replica's load and health by.

    The id alone is not enough: a data server restarted on another port (or a second
    server misconfigured with the same id) is a different target with its own health.
    Nor is the address: a server its agent took offline and admitted again (after
    ``rise`` good probes) registers anew, and must not stay ejected for what it did
    before it left.
    """
    return f"{instance.id}@{instance.address}:{instance.port}/{instance.registration_time_utc}"


@runtime_checkable
class ReplicaPicker(Protocol):
    """Chooses one replica of a shard for a request, and learns from each request."""

    def pick(self, candidates: Sequence[ServiceInstance]) -> ServiceInstance:
        """One of ``candidates`` (never empty) for the next request."""
        ...

    def started(self, instance: ServiceInstance) -> None:
        """A request to ``instance`` was sent."""
        ...

    def finished(self, instance: ServiceInstance, outcome: Outcome, seconds: float) -> None:
        """A request to ``instance`` ended after ``seconds``; called once per
        :meth:`started`."""
        ...


class PowerOfTwoChoices:
    """Two random candidates; the one with fewer requests outstanding (from this search
    server) wins, ties to the first.

    Nearly as good as "least busy" and, unlike it, it does not send every search
    server's next request to the same replica at once ("The Power of Two Choices in
    Randomized Load Balancing", Mitzenmacher). ``rng`` makes the choice reproducible.
    """

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng if rng is not None else random.Random()
        # Requests in flight per target, across all queries; entries are removed at zero.
        self._outstanding: dict[str, int] = {}

    def outstanding(self, instance: ServiceInstance) -> int:
        """Requests to ``instance`` in flight now."""
        return self._outstanding.get(target_key(instance), 0)

    def pick(self, candidates: Sequence[ServiceInstance]) -> ServiceInstance:
        if len(candidates) == 1:
            return candidates[0]
        first, second = self._rng.sample(candidates, 2)
        load = self._outstanding.get
        return first if load(target_key(first), 0) <= load(target_key(second), 0) else second

    def started(self, instance: ServiceInstance) -> None:
        key = target_key(instance)
        self._outstanding[key] = self._outstanding.get(key, 0) + 1

    def finished(self, instance: ServiceInstance, outcome: Outcome, seconds: float) -> None:
        key = target_key(instance)
        left = self._outstanding.get(key, 0) - 1
        if left > 0:
            self._outstanding[key] = left
        else:
            self._outstanding.pop(key, None)
