"""Fault injection against a real ZooKeeper, for tests and demos.

:func:`expire_session` makes the *server* expire a live session on demand, the way
ZooKeeper's own tests do it: a second client attaches to the same session id and
password, which takes the session's connection away from the victim, and then closes
the session. The server deletes the session's ephemeral nodes at once, and the
victim's kazoo client learns of the expiry on its next reconnect (LOST, then a new
session). Unlike a client-side simulation, other clients really see the nodes go.
"""

from __future__ import annotations

import asyncio
import logging

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException

from discovery.errors import DevClusterError
from discovery.zk import SessionState, ZkSession

__all__ = ["expire_session"]

log = logging.getLogger(__name__)


def _close_session(hosts: str, session_id: int, password: bytes, timeout: float) -> None:
    # No chroot: kazoo would check it with a read, a round trip during which the victim
    # can reconnect and take its session back.
    servers = hosts.split("/", 1)[0]
    intruder = KazooClient(hosts=servers, client_id=(session_id, password), timeout=timeout)
    try:
        try:
            intruder.start(timeout=timeout)
        except KazooException as exc:
            raise DevClusterError(f"could not attach to session 0x{session_id:x}: {exc!r}") from exc
        if intruder.client_id is None or intruder.client_id[0] != session_id:
            raise DevClusterError(
                f"could not attach to session 0x{session_id:x} (already expired?)"
            )
    finally:
        # stop() sends closeSession for the shared session: the server expires it.
        intruder.stop()
        intruder.close()


async def expire_session(session: ZkSession, timeout: float = 30.0) -> int:
    """Expire ``session`` on the server and wait until it is connected on a new one.

    Fault injection (tests, chaos runs): a second client attaches to the same session
    id and password, which takes the session's connection away, and then closes the
    session, so the server deletes its ephemeral nodes at once, as on a real expiry.

    Returns the new session id.

    Raises:
        DevClusterError: the session could not be expired.
        TimeoutError: the victim did not see LOST and a new session within ``timeout``.
    """
    client_id = session.client.client_id
    if client_id is None or not session.connected:
        raise DevClusterError("the session is not connected; nothing to expire")
    old_id, password = client_id
    events = session.subscribe()
    try:
        log.info("expiring ZooKeeper session 0x%x", old_id)
        await asyncio.to_thread(_close_session, session.hosts, old_id, password, timeout)
        async with asyncio.timeout(timeout):
            async for event in events:
                if event.state is SessionState.CONNECTED and event.session_id != old_id:
                    assert event.session_id is not None
                    return event.session_id
                if event.state is SessionState.CLOSED:
                    break
        raise DevClusterError("the session was closed while waiting for its expiry")
    finally:
        events.close()
