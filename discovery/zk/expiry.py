"""Closing a ZooKeeper session from outside it, by its id and password.

:func:`expire_session` makes the server expire a live session (fault injection): its
ephemeral nodes go at once for everybody. :func:`close_session` is re-exported here.

Design: docs/design/zookeeper.md, "The session watchdog: a session can never hang".
"""

from __future__ import annotations

import asyncio
import logging

from discovery.errors import ZkConnectionError
from discovery.zk.session import SessionState, ZkSession, close_session
from discovery.zk.tls import KazooTls

__all__ = ["close_session", "expire_session"]

log = logging.getLogger(__name__)


async def expire_session(session: ZkSession, timeout: float = 30.0) -> int:
    """Expire ``session`` on the server and wait until it is connected on a new one.

    Run it on the loop that owns ``session`` (``agent.call(expire_session(s))`` for an
    agent's). Returns the new session id.

    Raises:
        ZkConnectionError: the session is not connected, so there is nothing to expire,
            or it was closed while waiting for its expiry.
        ZkError: the session could not be attached to.
        TimeoutError: the victim did not see LOST and a new session within ``timeout``.
    """
    client_id = session.client.client_id
    if client_id is None or not session.connected:
        raise ZkConnectionError("the session is not connected; nothing to expire")
    old_id, password = client_id
    events = session.subscribe()
    try:
        log.info("expiring ZooKeeper session 0x%x", old_id)
        await asyncio.to_thread(
            close_session,
            session.hosts,
            old_id,
            password,
            timeout,
            tls=KazooTls.of(session.client),
        )
        async with asyncio.timeout(timeout):
            async for event in events:
                if event.state is SessionState.CONNECTED and event.session_id != old_id:
                    assert event.session_id is not None
                    return event.session_id
                if event.state is SessionState.CLOSED:
                    break
        raise ZkConnectionError("the session was closed while waiting for its expiry")
    finally:
        events.close()
