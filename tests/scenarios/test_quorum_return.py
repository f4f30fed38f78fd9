"""After a quorum outage longer than the session timeout, the next leader is in office
within seconds of the quorum's return, not a session timeout later.

Every client declares its session lost (the watchdog) and starts a new one, but the
ensemble keeps the old sessions, and their election nodes, for a whole session timeout
once a quorum is back: the next leader would wait for them. A session closes the one it
abandoned, by id and password, as soon as its new one is connected.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from prometheus_client import CollectorRegistry

from discovery.testing import ZooKeeperEnsemble
from discovery.zk.election import LeaderElection, Leadership
from discovery.zk.session import SessionState
from tests.support import SessionFactory, eventually, next_change, sample, waited

log = logging.getLogger(__name__)

# Long enough that "a few seconds" and "a session timeout" are told apart.
SESSION = 10.0


def _contender(
    name: str, leaders: asyncio.Queue[str]
) -> Callable[[Leadership], Coroutine[Any, Any, None]]:
    async def lead(leadership: Leadership) -> None:
        leaders.put_nowait(name)
        await asyncio.Event().wait()  # lead until the term is cancelled

    return lead


async def test_the_next_leader_is_in_office_within_seconds_of_the_quorums_return(
    zk_ensemble: ZooKeeperEnsemble,
    chroot: Callable[[str], str],
    make_session: SessionFactory,
) -> None:
    hosts = chroot(zk_ensemble.hosts)
    registries = [CollectorRegistry(), CollectorRegistry()]
    sessions = [
        await make_session(hosts, session_timeout=SESSION, registry=registry)
        for registry in registries
    ]
    leaders: asyncio.Queue[str] = asyncio.Queue()
    elections = [
        LeaderElection(session, "/election", name, _contender(name, leaders))
        for name, session in zip(("a", "b"), sessions, strict=True)
    ]
    try:
        await elections[0].start()
        assert await waited(leaders.get(), "the first leader", timeout=20) == "a"
        await elections[1].start()

        async def both_contend() -> bool:
            return await elections[0].contenders() == ["a", "b"]

        # start() returns before the node is created: without this wait b may have none
        # when the quorum goes, and a would take office again as soon as it is back.
        await eventually(both_contend, timeout=20, message="both election nodes")
        old_ids = [session.session_id for session in sessions]
        events = [session.subscribe() for session in sessions]

        # No quorum for longer than the session timeout: both declare their sessions
        # lost (the ensemble cannot: it has no leader to expire them).
        await asyncio.to_thread(zk_ensemble.stop_server, 1)
        await asyncio.to_thread(zk_ensemble.stop_server, 2)
        for stream in events:
            await next_change(
                stream, lambda e: e.state is SessionState.LOST, "LOST", timeout=4 * SESSION
            )

        # Two servers of three are a quorum: the clock starts when the second serves.
        # (Starting the third as well would let a slow start eat into the session
        # timeout after which the ensemble expires the old sessions by itself.)
        await asyncio.to_thread(zk_ensemble.start_server, 1)
        back = time.monotonic()
        leader = await waited(leaders.get(), "the next leader", timeout=4 * SESSION)
        elapsed = time.monotonic() - back
        # How soon is a figure, not an assertion (this machine's speed is not the
        # code's): the test asserts the mechanism below, which is what makes it soon.
        log.info("the next leader (%s) %.1f s after the quorum's return", leader, elapsed)
        # Each client has a session of its own again.
        for stream, old in zip(events, old_ids, strict=True):
            fresh = await next_change(
                stream,
                lambda e: e.state is SessionState.CONNECTED and e.new_session,
                "a new session",
                timeout=4 * SESSION,
            )
            assert fresh.session_id not in (None, old)

        # Both old nodes went before the ensemble could expire their sessions: each
        # client closed the session it had abandoned, and "closed" (not "failed")
        # means the ensemble still held it, so nothing waited for its expiry.
        def closed() -> float:
            return sum(
                sample(r, "discovery_zk_abandoned_sessions_closed_total", result="closed") or 0
                for r in registries
            )

        await eventually(lambda: closed() == 2, timeout=SESSION, message="both closed")
        for stream in events:
            stream.close()
    finally:
        for election in elections:
            await election.aclose()
