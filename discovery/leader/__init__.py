"""What the elected leader does: watch ``/data_servers`` and publish the live list.

A term of leadership is one call of :class:`LeaderDuty`, a cancellable task of
:class:`~discovery.zk.election.LeaderElection`. It writes through its store's fenced
publisher only while it may (never while SUSPENDED, only under a lease on its election
node, not while the fence holds an epoch no leader can hold), and ends once fenced off
by a newer leader, deposed, or cut from the store for ``store_grace``.

Design: docs/design/live-list.md, "Election and publishing".
"""

from discovery.leader.duty import LeaderDuty
from discovery.leader.settings import FENCE_RECHECK_MAX

__all__ = ["FENCE_RECHECK_MAX", "LeaderDuty"]
