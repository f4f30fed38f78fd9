"""The settings of a :class:`~discovery.leader.LeaderDuty`, shared by all its terms."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from discovery.instance import ServiceInstance
from discovery.livelist.brake import MassLossBrakeConfig
from discovery.zk.paths import DATA_SERVERS_PATH, MAINTENANCE_PATH

__all__ = ["FENCE_RECHECK_MAX", "LeaderSettings"]

#: The default of ``fence_recheck_max``: the longest a leader holding its term over an
#: impossible epoch waits between tries of the fence, hence how long after a repair it
#: may take to publish again.
FENCE_RECHECK_MAX = 30.0


@dataclass(frozen=True)
class LeaderSettings:
    """What :class:`~discovery.leader.LeaderDuty` takes besides its collaborators (its
    arguments of the same names document them).

    Raises:
        ValueError: ``fence_recheck_max`` is not positive, or ``shards`` negative.
    """

    leader_id: str
    watch_path: str = DATA_SERVERS_PATH
    coalesce_window: float = 0.05
    heartbeat_interval: float = 1.0
    mass_loss: MassLossBrakeConfig = field(default_factory=MassLossBrakeConfig)
    store_grace: float | None = None
    maintenance_path: str | None = MAINTENANCE_PATH
    admit: Callable[[ServiceInstance], str | None] | None = None
    allow_persistent_members: bool = False
    fence_recheck_max: float = FENCE_RECHECK_MAX
    shards: int = 0

    def __post_init__(self) -> None:
        if self.shards < 0:
            raise ValueError(f"shards must be >= 0, got {self.shards!r}")
        if not self.fence_recheck_max > 0:
            raise ValueError(f"fence_recheck_max must be positive, got {self.fence_recheck_max!r}")
