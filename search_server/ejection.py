"""Outlier ejection and half-open probing: which data servers a fan-out skips for now.

:class:`OutlierEjection` keeps its state on each :class:`~search_server.picking.Replica`,
so it survives changes of the live list. Every method takes ``now`` from the caller's
clock: no sockets, no event loop, no clock of its own. Not thread-safe. The ejection cap
counts only replicas that have answered: registrations that never did neither widen it
nor fill it.

Design: docs/design/search-server.md, "Local outlier ejection".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Container, Iterable

from .picking import Replica

__all__ = ["OutlierEjection"]

log = logging.getLogger(__name__)

# Seconds between two warnings that the ejection cap refused an ejection.
_CAP_LOG_INTERVAL = 10.0


class OutlierEjection:
    """The ejections of one fan-out, and the half-open probes of ejected replicas.

    Raises ``ValueError`` for ``eject_after`` below 1, a negative cool-down, a share
    out of 0..1 or a probe interval that is not positive.
    """

    def __init__(
        self,
        *,
        eject_after: int = 3,
        eject_cooldown: float = 10.0,
        max_ejected_share: float = 0.5,
        probe_interval: float = 1.0,
    ) -> None:
        if eject_after < 1:
            raise ValueError(f"eject_after must be >= 1, got {eject_after}")
        if not eject_cooldown >= 0:
            raise ValueError(f"eject_cooldown must be >= 0 seconds, got {eject_cooldown}")
        if not 0 <= max_ejected_share <= 1:
            raise ValueError(f"max_ejected_share must be in 0..1, got {max_ejected_share}")
        if not probe_interval > 0:
            raise ValueError(f"probe_interval must be > 0 seconds, got {probe_interval}")
        self._eject_after = eject_after
        self._eject_cooldown = eject_cooldown
        self._max_ejected_share = max_ejected_share
        self._probe_interval = probe_interval
        self._cap_logged_at = -_CAP_LOG_INTERVAL
        self._cap_refusals = 0
        #: Ejections refused because the cap was reached (the cluster's panic: many
        #: servers failing at once is more likely our trouble than theirs).
        self.capped = 0
        # The replicas ejected at some point and not yet seen expired: the ejection cap
        # and ejected() look at these, never at every replica routed to.
        self._ejected: set[Replica] = set()
        # Those of them ejected under the cap (they had answered): what the cap counts.
        self._capped: set[Replica] = set()
        # The same, by shard: the fan-out's panic threshold asks per shard, per query.
        self._by_shard: dict[int, set[Replica]] = {}

    def record_failure(
        self, replica: Replica, now: float, *, answered: Callable[[], int], detail: str
    ) -> bool:
        """Count a failure or timeout of ``replica``; True if it is ejected for it now.

        ``answered()`` is how many routable data servers have answered at least once:
        the base of the cap, asked only when the cap is consulted. ``detail`` says what
        went wrong, for the warning an ejection logs. Not ejected: a draining replica,
        one already ejected (failures of requests sent before the ejection do not
        extend it), and one that has answered while the cap is reached.

        A replica that has never answered is ejected outside the cap: it neither counts
        in its base nor takes a place under it. The cap keeps capacity known to work
        from being ejected wholesale in a moment of trouble on our side; one that never
        answered is no such capacity, and registrations that never answer (a typo, a
        squatter, thousands of fakes) must not make room for, nor use up the room of,
        real replicas that break.
        """
        replica.failures += 1
        instance = replica.instance
        # After a cool-down the count is still at the limit: one more failure re-ejects.
        if replica.failures < self._eject_after or not instance.routable or replica.is_ejected(now):
            return False
        proven = replica.samples > 0
        if proven and self._cap_reached(now, answered()):
            return False
        replica.ejected_until = now + self._eject_cooldown
        # No probe before an interval: the failures were just seen.
        replica.next_probe = now + self._probe_interval
        self._ejected.add(replica)
        if proven:
            self._capped.add(replica)
        self._by_shard.setdefault(replica.shard, set()).add(replica)
        log.warning(
            "ejecting data server %s (%s:%d, shard %d) for %.1fs after %d consecutive "
            "failures%s; last: %s",
            instance.id,
            instance.address,
            instance.port,
            replica.shard,
            self._eject_cooldown,
            replica.failures,
            "" if proven else " (it has never answered: outside the ejection cap)",
            detail,
        )
        return True

    def _cap_reached(self, now: float, answered: int) -> bool:
        # When many servers fail at once the cause is more likely on our side (a CPU
        # stall, a network blip) than theirs; ejecting them all would turn a slow moment
        # into empty answers. Discovery still removes servers that are really down.
        self.ejected(now)  # forgets the expired ones
        ejected = len(self._capped)
        if ejected + 1 <= max(1, int(self._max_ejected_share * answered)):
            return False
        # At the cap every further failure lands here, hundreds a second in a stall:
        # one line per interval, with the count, keeps the log (and the CPU it costs,
        # when the stall is CPU) bounded.
        self._cap_refusals += 1
        self.capped += 1
        if now - self._cap_logged_at >= _CAP_LOG_INTERVAL:
            log.warning(
                "not ejecting more data servers: %d of the %d that have answered already "
                "ejected (cap %.0f%%); %d ejection(s) refused since the last such line",
                ejected,
                answered,
                self._max_ejected_share * 100,
                self._cap_refusals,
            )
            self._cap_logged_at = now
            self._cap_refusals = 0
        return True

    def record_success(self, replica: Replica, now: float, *, probe: bool = False) -> None:
        """Count an answer of ``replica``: its run of failures ends.

        An answer to a ``probe`` ends its ejection at once; an answer to a request sent
        before its ejection leaves the ejection to run its course, so that a flapping
        server does not bounce straight back (its shard's other replicas take its share
        meanwhile).
        """
        ejected = replica.is_ejected(now)
        if probe and ejected:
            # Its count may already be 0 (an answer to a request sent before the
            # ejection): the probe's answer ends the ejection all the same.
            log.info(
                "data server %s answered a probe: its ejection ends early (its shard had "
                "no other usable replica)",
                replica.instance.id,
            )
        elif replica.failures == 0:
            return
        elif ejected:
            replica.failures = 0
            return
        elif replica.ejected_until is not None:
            log.info("data server %s answers again after its ejection", replica.instance.id)
        replica.failures = 0
        replica.ejected_until = None
        self._forget(replica)

    def ejected(self, now: float) -> set[Replica]:
        """The replicas ejected at ``now`` (forgetting those whose cool-down ran out).

        The set is this object's own: do not modify it.
        """
        expired = [r for r in self._ejected if not r.is_ejected(now)]
        for replica in expired:
            self._forget(replica)
        return self._ejected

    def ejected_in(self, shard: int, now: float) -> int:
        """How many replicas of ``shard`` are ejected at ``now``: O(1) while none is (the
        usual case), else O(those ejected)."""
        ejected = self._by_shard.get(shard)
        if not ejected:
            return 0
        expired = [r for r in ejected if not r.is_ejected(now)]
        for replica in expired:
            self._forget(replica)
        return len(ejected)

    def _forget(self, replica: Replica) -> None:
        self._ejected.discard(replica)
        self._capped.discard(replica)
        shard = self._by_shard.get(replica.shard)
        if shard is not None:
            shard.discard(replica)
            if not shard:
                del self._by_shard[replica.shard]

    def probe(
        self, replicas: Iterable[Replica], tried: Container[Replica], now: float
    ) -> Replica | None:
        """A shard's every untried replica is ejected: the one to send a probe to now, if
        any (the caller must send it: its next probe is not before an interval).

        The one whose cool-down ends first, among ``replicas`` not in ``tried``, with
        nothing in flight from us and whose last probe is ``probe_interval`` ago: at
        most one probe at a time per replica, and a hung one costs one query per
        interval its deadline.
        """
        best: Replica | None = None
        for replica in replicas:
            if (
                replica.outstanding == 0
                and replica not in tried
                and replica.next_probe <= now
                and (best is None or (replica.ejected_until or 0) < (best.ejected_until or 0))
            ):
                best = replica
        if best is not None:
            best.next_probe = now + self._probe_interval
        return best
