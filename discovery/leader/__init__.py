"""What the elected leader does: watch ``/data_servers`` and publish the live list.

Only the leader watches ZooKeeper's membership (one watcher for the cluster, not one
per search server) and writes the live list, through the fenced
:class:`~discovery.livelist.LiveListPublisher` its :class:`~discovery.livelist.LiveListStore`
gives it for the term (by default :class:`~discovery.livelist.redis.RedisLiveStore`: Redis).
A term of leadership is one call of :class:`LeaderDuty`; it runs as a task of
:class:`~discovery.zk.election.LeaderElection` until cancelled.

Within a term:

* the first write is the full snapshot (a new epoch starts at version 1);
* every membership change is published as a diff against what was last published
  (added, changed, removed with a reason), computed over the ids the watcher's change
  sets touched (plus the brake's held and released ones): O(changed), whatever the
  cluster's size;
* a heartbeat tells readers the leader is alive every ``heartbeat_interval``; if it
  finds the stored list missing or not ours (Redis restarted empty, FLUSHALL), the full
  snapshot is republished, so the list is back within one heartbeat interval;
* while the ZooKeeper connection is SUSPENDED nothing is written at all: we may
  already have been replaced. On reconnection in the same session the full snapshot
  is republished; on LOST the election cancels the term;
* a write refused by the fence (:class:`~discovery.errors.FencedError`) means a newer
  leader exists: the term ends and the election contends again. Unless the stored
  epoch is one no leader can hold: above the election directory's pzxid, read after
  a ``sync`` (:mod:`discovery.zk.epochs`). Resigning for such an epoch would hand it from
  search server to search server for ever, so the leader keeps its term, publishes
  nothing (search servers route with the list they hold), sets
  ``discovery_leader_fence_poisoned`` and logs an error naming ``discovery fence
  repair``; it tries the fence again with a heartbeat after the heartbeat interval,
  doubling to ``fence_recheck_max``, and publishes in full once the fence lets it.
  Never an automatic override: only an operator resets the fence. If ZooKeeper cannot
  be asked, it holds the same way and asks again later;
* we write only under a **lease**: within half a session timeout of the last answer
  that showed our election node ours (read back three times per lease; winning the
  term counts as the first). A leader cut from ZooKeeper so stops publishing well
  before the server can expire its session, whatever kazoo believes of the connection;
* if that read finds our election node gone or not ours, the term ends. No event
  may ever say so: a client can stay connected to a session the ensemble has closed
  (see :class:`~discovery.zk.session.ZkSession`), and a leader in that state would otherwise
  publish until a successor's epoch fences it;
* store errors (a Redis outage, a Sentinel failover, error replies) are logged; the
  store is then probed with a heartbeat every 0.2 s, and the first that succeeds
  brings a full snapshot (a write whose outcome is unknown leaves readers unsure of
  what they hold); once every write has failed for ``store_grace``
  (the search server uses its heartbeat TTL) the term ends, and the election's next
  contender leads: a leader cut from Redis alone must not hold the cluster's list
  stale while another search server could publish it (if nobody reaches Redis,
  leadership rotates, harmlessly). A store that refuses our credentials
  (:class:`~discovery.errors.RedisAccessError`) ends the term, for the caller to handle;
* every publish decision goes through the term's
  :class:`~discovery.livelist.brake.MassLossBrake`: when many data servers vanish at once
  without announcing it, their removals are held (they stay in what we publish,
  full snapshots included) for at most ``mass_loss.hold`` seconds. The loop wakes at
  the end of a hold to publish the release even if nothing else happens;
* operators' maintenance markers (``/maintenance/<id>``, followed by a
  :class:`~discovery.zk.maintenance.MaintenanceWatcher` for the term, read before the
  first publish) are laid over what is published: a marked server that is registered
  (or held by the brake) is published with state ``maintenance``, the marker's reason
  and ``enabled: false``, through its re-registrations and restarts, until the marker
  is cleared. A marker change marks only its id dirty, so it costs a delta of that id;
  a full snapshot applies the markers in O(markers). The brake sees the real members,
  so a server put in maintenance is no loss, and a server in maintenance whose node
  then goes is a deliberate removal (announced), never held.

The modules, one concern each: :mod:`~discovery.leader.duty` (:class:`LeaderDuty`, which
sets a term up), :mod:`~discovery.leader.term` (its loop), :mod:`~discovery.leader.publication`
and :mod:`~discovery.leader.diff` (what is published), :mod:`~discovery.leader.lease`,
:mod:`~discovery.leader.fencing` and :mod:`~discovery.leader.outage` (whether it may write).
"""

from discovery.leader.duty import LeaderDuty
from discovery.leader.settings import FENCE_RECHECK_MAX

__all__ = ["FENCE_RECHECK_MAX", "LeaderDuty"]
