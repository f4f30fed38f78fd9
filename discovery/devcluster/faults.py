"""Fault injection against a real ZooKeeper, for tests and demos.

:func:`expire_session` makes the *server* expire a live session on demand, the way
ZooKeeper's own tests do it: a second client attaches to the same session id and
password, which takes the session's connection away from the victim, and then closes
the session. The server deletes the session's ephemeral nodes at once, and the
victim's kazoo client learns of the expiry on its next reconnect (LOST, then a new
session). Unlike a client-side simulation, other clients really see the nodes go.
"""

from __future__ import annotations

from ..zk import expire_session

__all__ = ["expire_session"]
