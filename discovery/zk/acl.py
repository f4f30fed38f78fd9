"""ZooKeeper access control at run time: the rights each server needs, checked at start-up.

:func:`check_access` tries them, since ZooKeeper takes any digest password as another
identity: a wrong password fails the start, not later writes. ``zk-init`` sets the ACLs.

Design: docs/design/security.md, "ZooKeeper access control".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from kazoo.security import ACL, Permissions

from discovery.errors import (
    ZkAuthError,
    ZkError,
    ZkNoNodeError,
)
from discovery.zk.paths import (
    DATA_SERVERS_PATH,
    MAINTENANCE_PATH,
    SEARCH_ELECTION_PATH,
    SEARCH_MEMBERS_PATH,
)
from discovery.zk.session import ZkSession

__all__ = [
    "ADMIN",
    "ALL",
    "CREATE",
    "DATA_SERVER_ACCESS",
    "DELETE",
    "READ",
    "SEARCH_SERVER_ACCESS",
    "WRITE",
    "Access",
    "check_access",
    "describe_acl",
    "perm_names",
]

READ: Final = Permissions.READ
WRITE: Final = Permissions.WRITE
CREATE: Final = Permissions.CREATE
DELETE: Final = Permissions.DELETE
ADMIN: Final = Permissions.ADMIN
ALL: Final = Permissions.ALL

_PERM_NAMES = ((READ, "READ"), (WRITE, "WRITE"), (CREATE, "CREATE"), (DELETE, "DELETE"))


def perm_names(perms: int) -> str:
    """``READ|CREATE`` style names of a permission mask (``ALL`` for all five)."""
    if perms & ALL == ALL:
        return "ALL"
    names = [name for bit, name in _PERM_NAMES if perms & bit]
    if perms & ADMIN:
        names.append("ADMIN")
    return "|".join(names) or "none"


def describe_acl(acl: Iterable[ACL]) -> list[str]:
    """``scheme:user:PERMS`` per entry (digest hashes left out), for people."""
    out = []
    for entry in acl:
        who = entry.id.id.split(":", 1)[0] if entry.id.scheme == "digest" else entry.id.id
        out.append(f"{entry.id.scheme}:{who}:{perm_names(entry.perms)}")
    return out


# -- the start-up check -----------------------------------------------------------------


@dataclass(frozen=True)
class Access:
    """A right a server needs: ``perms`` on ``path``, in order to ``purpose``."""

    path: str
    perms: int
    purpose: str


#: What a data server needs (its agent checks it at start-up).
DATA_SERVER_ACCESS: Final = (Access(DATA_SERVERS_PATH, CREATE, "register data servers"),)
#: What a search server needs.
SEARCH_SERVER_ACCESS: Final = (
    Access(SEARCH_ELECTION_PATH, CREATE | DELETE, "take part in the leader election"),
    Access(SEARCH_MEMBERS_PATH, CREATE | DELETE, "register search-server members"),
    Access(DATA_SERVERS_PATH, READ, "read the data servers"),
    Access(MAINTENANCE_PATH, READ, "read the operators' maintenance markers"),
)


async def _rights(session: ZkSession, need: Access) -> int:
    """The rights of ``need.perms`` that ``session`` really has, found out by trying
    (see :meth:`ZkSession.child_rights`): nothing is changed."""
    granted = 0
    if need.perms & (CREATE | DELETE):
        granted |= await session.child_rights(need.path)
    if need.perms & READ:
        try:
            await session.get_children(need.path)
        except ZkAuthError:
            pass
        else:
            granted |= READ
    return granted


async def check_access(session: ZkSession, needs: Iterable[Access]) -> None:
    """Fail at start-up, with a message naming the cause, if this session lacks a
    right it needs on a node that exists.

    The rights are tried (an aborted transaction, a read), not computed from the ACL:
    ZooKeeper shows digest password hashes only to holders of ADMIN, and accepts any
    password when a session authenticates, so trying is the only way to tell a wrong
    password. A missing node passes: it is created when needed, with our own ACL (a
    cluster without zk-init).

    Raises:
        ZkAuthError: the ACL names our digest user with the rights we need but
            ZooKeeper refuses them to us (a wrong password), or the ACL does not
            grant our identity those rights.
        ZkError: ZooKeeper could not be read.
    """
    users = sorted({ident.split(":", 1)[0] for ident in session.identities})
    who = "identity " + ", ".join(map(repr, users)) if users else "no --zk-auth"
    for need in needs:
        try:
            missing = need.perms & ~await _rights(session, need)
        except ZkNoNodeError:
            continue
        if not missing:
            continue
        try:
            acl = await session.get_acls(need.path)
        except ZkError:
            acl = []
        named = 0
        for entry in acl:
            if entry.id.scheme == "digest" and entry.id.id.split(":", 1)[0] in users:
                named |= entry.perms
        if named & missing == missing:
            raise ZkAuthError(
                f"wrong password for ZooKeeper digest user {users[0]!r} (--zk-auth / "
                f"DISCOVERY_ZK_AUTH): the ACL of {need.path} grants that user "
                f"{perm_names(missing)}, but ZooKeeper refuses it this password, so it "
                f"could not {need.purpose}"
            )
        raise ZkAuthError(
            f"{who} may not {need.purpose}: the ACL of {need.path} ({describe_acl(acl)}) "
            f"does not grant it {perm_names(missing)}; set --zk-auth / DISCOVERY_ZK_AUTH to "
            "an identity that `discovery zk-init` granted the role"
        )
