"""The leader's mass-loss brake: hold removals when too many data servers vanish at once.

:class:`MassLossBrake` is a policy (clock passed in, no I/O but logs and metrics) that
never raises on input. Only unannounced losses are held, each for at most ``hold``
seconds after its server vanished; a brake belongs to one leader term.

Design: docs/design/live-list.md, "The mass-loss brake".
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import immutables

from discovery.errors import ConfigError
from discovery.instance import ServiceInstance
from discovery.metrics import MassLossBrakeMetrics

__all__ = ["BrakeDecision", "BrakeStatus", "MassLossBrake", "MassLossBrakeConfig"]

log = logging.getLogger(__name__)

# Log lines name at most this many ids; a brake over 1,000 servers must not log them all.
_LOGGED_IDS = 10


@dataclass(frozen=True)
class MassLossBrakeConfig:
    """When the leader holds removals (``--mass-loss-*`` flags of the search server).

    Attributes:
        fraction: engage when more than this share of the members known in the
            window vanish unannounced (0 < fraction <= 1; 1 disables the brake,
            since no more than all members can vanish).
        window: seconds within which vanishings count together.
        hold: longest time, in seconds, a removal is held; 0 disables the brake.
        min_count: engage only when at least this many vanished, so that losing
            one of two servers is never mistaken for a partition.
    """

    fraction: float = 0.3
    window: float = 10.0
    hold: float = 30.0
    min_count: int = 3

    def __post_init__(self) -> None:
        if not (0 < self.fraction <= 1):
            raise ConfigError(
                f"--mass-loss-fraction must be in (0, 1] (1 disables), got {self.fraction!r}"
            )
        if not (self.window > 0 and math.isfinite(self.window)):
            raise ConfigError(
                f"--mass-loss-window must be a positive number of seconds, got {self.window!r}"
            )
        if not (self.hold >= 0 and math.isfinite(self.hold)):
            raise ConfigError(
                f"--mass-loss-hold must be 0 (disabled) or a positive number of seconds, "
                f"got {self.hold!r}"
            )
        if isinstance(self.min_count, bool) or not (
            isinstance(self.min_count, int) and self.min_count >= 1
        ):
            raise ConfigError(f"--mass-loss-min must be an integer >= 1, got {self.min_count!r}")

    @property
    def enabled(self) -> bool:
        return self.fraction < 1 and self.hold > 0


@dataclass(frozen=True)
class BrakeDecision:
    """What to publish: ``members`` (the real members plus held ones) and the ids
    whose hold ended in this decision without them coming back (``released``)."""

    members: Mapping[str, ServiceInstance]
    released: frozenset[str] = frozenset()


@dataclass(frozen=True)
class BrakeStatus:
    """The brake as shown by ``/cluster``: ``held`` ids sorted, ``release_in`` the
    seconds until the next held removal is due (None if nothing is held)."""

    enabled: bool
    engaged: bool
    held: tuple[str, ...] = ()
    release_in: float | None = None
    engagements: int = 0

    def to_dict(self) -> dict[str, object]:
        return {
            "enabled": self.enabled,
            "engaged": self.engaged,
            "held": list(self.held),
            "release_in_ms": None if self.release_in is None else round(self.release_in * 1000),
            "engagements": self.engagements,
        }


@dataclass(frozen=True)
class _Loss:
    at: float  # when the server was first seen gone
    instance: ServiceInstance  # the last version seen


def _announced(instance: ServiceInstance) -> bool:
    # A node that said it was draining (or was disabled) before going left on purpose.
    return not instance.routable


def _some(ids: Iterable[str]) -> str:
    names = sorted(ids)
    shown = ", ".join(names[:_LOGGED_IDS])
    return shown + (f", … ({len(names) - _LOGGED_IDS} more)" if len(names) > _LOGGED_IDS else "")


class MassLossBrake:
    """The policy; see the module docstring. Not thread-safe: use from one task."""

    def __init__(
        self,
        config: MassLossBrakeConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        metrics: MassLossBrakeMetrics | None = None,
    ) -> None:
        self.config = config
        self._clock = clock
        self._metrics = metrics
        self._seen: Mapping[str, ServiceInstance] | None = None
        # Unannounced losses of the window while disengaged (published as removed).
        self._losses: dict[str, _Loss] = {}
        # While engaged: the removals held (published as present).
        self._held: dict[str, _Loss] = {}
        self._engaged_at: float | None = None
        self._engagements = 0
        self._released = 0
        self._returned = 0
        self._update_gauges()

    @property
    def engaged(self) -> bool:
        return self._engaged_at is not None

    @property
    def held(self) -> Mapping[str, ServiceInstance]:
        """The removals held now: id -> the last instance seen."""
        return {instance_id: loss.instance for instance_id, loss in self._held.items()}

    def status(self) -> BrakeStatus:
        return BrakeStatus(
            self.config.enabled,
            self.engaged,
            tuple(sorted(self._held)),
            self.seconds_until_release(),
            self._engagements,
        )

    def seconds_until_release(self) -> float | None:
        """Seconds until the next held removal is due (None if nothing is held); the
        caller must :meth:`apply` again by then to keep the ``hold`` bound."""
        if not self._held:
            return None
        due = min(loss.at for loss in self._held.values()) + self.config.hold
        return max(0.0, due - self._clock())

    def apply(
        self,
        members: Mapping[str, ServiceInstance],
        removed: Mapping[str, ServiceInstance] | None = None,
    ) -> BrakeDecision:
        """Record ``members`` (the current real view) and say what to publish.

        ``removed``, if given, is every member removed since the last call, with its
        last instance (the leader collects them from the watcher's change sets): the
        brake then looks only at those, O(changed). Without it the brake compares
        ``members`` with the view of its last call, O(members). ``members`` is kept by
        reference and must not be mutated afterwards (the watcher's views are
        immutable).
        """
        now = self._clock()
        previous, self._seen = self._seen, members
        if previous is None or not self.config.enabled:
            return BrakeDecision(members)
        gone = previous.items() if removed is None else removed.items()
        vanished = {
            instance_id: _Loss(now, instance)
            for instance_id, instance in gone
            if instance_id not in members and not _announced(instance)
        }
        # Members that came back are no losses (O(losses), not O(members)).
        for instance_id in [i for i in self._losses if i in members]:
            del self._losses[instance_id]
        released: frozenset[str] = frozenset()
        if self.engaged:
            returned = [i for i in self._held if i in members]
            for instance_id in returned:
                del self._held[instance_id]
            self._returned += len(returned)
            if self._metrics is not None and returned:
                self._metrics.released.labels(outcome="returned").inc(len(returned))
            # The partition is under way: every further unannounced loss waits too.
            self._held.update(vanished)
            released = self._release_due(now)
            if not self._held:
                self._disengage(now)
        else:
            self._losses.update(vanished)
            horizon = now - self.config.window
            self._losses = {i: loss for i, loss in self._losses.items() if loss.at > horizon}
            if vanished:
                self._maybe_engage(now, members)
        self._update_gauges()
        if not self._held:
            return BrakeDecision(members, released)
        if isinstance(members, immutables.Map):
            # O(held): the held instances are put back into a view sharing the rest.
            return BrakeDecision(members.update(self.held), released)
        published = dict(members)
        published.update(self.held)
        return BrakeDecision(published, released)

    def close(self) -> None:
        """The term ended: this brake holds nothing any more (gauges back to 0)."""
        if self._held:
            log.warning(
                "leader term ended with %d removals held by the mass-loss brake; the next "
                "leader's snapshot decides about them: %s",
                len(self._held),
                _some(self._held),
            )
        self._held.clear()
        self._losses.clear()
        self._engaged_at = None
        self._update_gauges()

    def _maybe_engage(self, now: float, members: Mapping[str, ServiceInstance]) -> None:
        config = self.config
        lost = len(self._losses)
        known = len(members) + lost
        if lost < config.min_count or not lost > config.fraction * known:
            return
        # Every loss of the window is held, the ones already published as removed too,
        # unless its own hold would already be over.
        self._held = {i: loss for i, loss in self._losses.items() if loss.at + config.hold > now}
        self._losses.clear()
        self._engaged_at = now
        self._engagements += 1
        self._released = self._returned = 0
        if self._metrics is not None:
            self._metrics.engagements.inc()
        log.error(
            "mass-loss brake engaged: %d of %d data servers vanished within %gs without "
            "announcing it (threshold: more than %g%% and at least %d); holding their "
            "removals for up to %gs each: %s",
            lost,
            known,
            config.window,
            config.fraction * 100,
            config.min_count,
            config.hold,
            _some(self._held),
        )

    def _release_due(self, now: float) -> frozenset[str]:
        hold = self.config.hold
        due = frozenset(i for i, loss in self._held.items() if loss.at + hold <= now)
        if not due:
            return due
        for instance_id in due:
            del self._held[instance_id]
        self._released += len(due)
        if self._metrics is not None:
            self._metrics.released.labels(outcome="expired").inc(len(due))
        log.warning(
            "mass-loss brake: hold of %gs over, publishing %d removals (still gone: %s); "
            "%d still held",
            hold,
            len(due),
            _some(due),
            len(self._held),
        )
        return due

    def _disengage(self, now: float) -> None:
        assert self._engaged_at is not None
        log.warning(
            "mass-loss brake released after %.1fs: %d removals published at the end of "
            "their hold, %d data servers came back",
            now - self._engaged_at,
            self._released,
            self._returned,
        )
        self._engaged_at = None

    def _update_gauges(self) -> None:
        if self._metrics is None:
            return
        self._metrics.engaged.set(1 if self.engaged else 0)
        self._metrics.held.set(len(self._held))
