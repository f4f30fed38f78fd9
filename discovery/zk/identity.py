"""Who a ZooKeeper session is in digest ACLs, and the ACLs of the nodes it creates.

Ephemeral nodes get all rights for an owner identity invented for the process: no other
process, not even one holding the same credentials, can rewrite them.

Design: docs/design/security.md, "ZooKeeper access control".
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from kazoo.security import ACL, READ_ACL_UNSAFE, make_digest_acl, make_digest_acl_credential

from discovery.errors import ZkError

__all__ = ["AclIdentity"]


@dataclass(frozen=True)
class AclIdentity:
    """A session's digest identities and the ACLs it gives the nodes it creates.

    ``acl`` None is kazoo's default, open to all; ``ephemeral_acl`` None is the same
    as ``acl``. ``identities`` are the configured ones only (``user:base64(sha1(...))``),
    never the owner identity; ``auth_data`` is what the kazoo client presents, owner
    identity included.
    """

    acl: list[ACL] | None = None
    ephemeral_acl: list[ACL] | None = None
    identities: tuple[str, ...] = ()
    auth_data: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_auth(cls, auth: str | None) -> AclIdentity:
        """The identity for ``user:password`` digest credentials (None: none, open ACLs).

        A fresh owner identity each call: call it once per process's session.
        """
        if auth is None:
            return cls()
        user, password = auth.split(":", 1)
        # Writable only by us, readable by everyone: Java readers (Curator) and
        # operators can still list the cluster without our credentials.
        acl = [make_digest_acl(user, password, all=True), *READ_ACL_UNSAFE]
        # Our ephemeral nodes belong to this process alone: data servers may share
        # one credential, and one of them must not be able to rewrite another's
        # node. The password never leaves the process, and kazoo presents it again
        # on every reconnect and in every new session of this client.
        owner = f"{user}.{secrets.token_hex(6)}"
        owner_password = secrets.token_urlsafe(24)
        return cls(
            acl=acl,
            ephemeral_acl=[make_digest_acl(owner, owner_password, all=True), *READ_ACL_UNSAFE],
            identities=(make_digest_acl_credential(user, password),),
            auth_data=(("digest", auth), ("digest", f"{owner}:{owner_password}")),
        )

    def node_acl(self, *, ephemeral: bool, acl: Sequence[ACL] | None = None) -> list[ACL] | None:
        """The ACL a new node gets: ``acl`` if given, else the one for its kind."""
        if acl is not None:
            return list(acl)
        return self.ephemeral_acl if ephemeral and self.ephemeral_acl else self.acl

    def refusal(self, method: str, path: object, error: ZkError) -> str:
        """Explain a NOAUTH answer to ``method`` (a kazoo ``*_async`` name) on ``path``."""
        operation = method.removesuffix("_async")
        # ZooKeeper checks a create or delete against the parent's ACL, not the node's.
        where = " (a right on its parent)" if operation in ("create", "delete") else ""
        users = ", ".join(repr(i.split(":", 1)[0]) for i in self.identities)
        who = f"identity {users}" if users else "an unauthenticated session"
        return f"ZooKeeper refused {operation} of {path}{where} for {who}: {error}"
