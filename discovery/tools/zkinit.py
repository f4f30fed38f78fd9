"""``discovery zk-init`` and ``discovery zk-digest``: lay out our tree with access control.

:func:`bootstrap` creates our nodes with the ACLs of three roles (:class:`AclLayout`), or
puts those ACLs back where they differ; :class:`DigestId` is one role's identity.

Design: docs/design/security.md, "ZooKeeper access control".
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import logging
import posixpath
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from kazoo.security import ACL, Id

from discovery.cli.entrypoint import add_verbose_flag
from discovery.cli.options import ZK_OPTIONS, Option, add_options
from discovery.config import ZkConfig
from discovery.errors import ConfigError, DiscoveryError, ZkAuthError, ZkError, ZkNodeExistsError
from discovery.zk.acl import ADMIN, ALL, CREATE, DELETE, READ, describe_acl
from discovery.zk.paths import (
    DATA_SERVERS_PATH,
    MAINTENANCE_PATH,
    SEARCH_ELECTION_PATH,
    SEARCH_MEMBERS_PATH,
)
from discovery.zk.session import ZkSession

from .exitcodes import EPILOG, EXIT_OK, EXIT_REFUSED, EXIT_UNREACHABLE, EXIT_USAGE

__all__ = [
    "ZK_INIT_OPTIONS",
    "AclLayout",
    "DigestId",
    "NodeResult",
    "add_digest_parser",
    "add_parser",
    "bootstrap",
    "credentials",
    "identity_list",
    "run",
    "run_digest",
    "split_chroot",
]

log = logging.getLogger(__name__)

PROG: Final = "discovery zk-init"

_HASHED_PREFIX = "digest:"
_WORLD = Id("world", "anyone")


@dataclass(frozen=True)
class DigestId:
    """A ZooKeeper digest identity: a user and ``base64(sha1(user:password))``."""

    user: str
    hash: str

    @classmethod
    def from_password(cls, user: str, password: str) -> DigestId:
        digest = hashlib.sha1(f"{user}:{password}".encode()).digest()
        return cls(user, base64.b64encode(digest).decode("ascii"))

    @classmethod
    def parse(cls, text: str) -> DigestId:
        """``user:password`` (hashed here) or ``digest:user:HASH`` (already hashed).

        The hashed form lets an operator grant a role without knowing its password.

        Raises:
            ValueError: not one of the two forms.
        """
        text = text.strip()
        if text.startswith(_HASHED_PREFIX):
            user, sep, digest = text[len(_HASHED_PREFIX) :].partition(":")
            if not (user and sep) or not _is_sha1_base64(digest):
                raise ValueError(
                    f"expected digest:USER:HASH with a base64 SHA-1 HASH, got {text!r}"
                )
            return cls(user, digest)
        user, sep, password = text.partition(":")
        if not (user and sep and password):
            raise ValueError(f"expected USER:PASSWORD or digest:USER:HASH, got {_masked(text)!r}")
        return cls.from_password(user, password)

    @property
    def id(self) -> str:
        """The id as ZooKeeper stores it in an ACL: ``user:hash``."""
        return f"{self.user}:{self.hash}"

    def acl(self, perms: int) -> ACL:
        return ACL(perms, Id("digest", self.id))

    def __str__(self) -> str:
        return f"{_HASHED_PREFIX}{self.id}"


def _is_sha1_base64(text: str) -> bool:
    try:
        return len(base64.b64decode(text, validate=True)) == 20
    except ValueError:
        return False


def _masked(text: str) -> str:
    user, sep, _ = text.partition(":")
    return f"{user}:***" if sep else text


def identity_list(text: str) -> tuple[DigestId, ...]:
    """argparse type: comma-separated identities (see :meth:`DigestId.parse`)."""
    items = [item for item in text.split(",") if item.strip()]
    if not items:
        raise argparse.ArgumentTypeError("expected at least one identity")
    try:
        return tuple(DigestId.parse(item) for item in items)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def credentials(text: str) -> str:
    """argparse type: ``USER:PASSWORD`` to authenticate with (not the hashed form)."""
    if text.startswith(_HASHED_PREFIX):
        raise argparse.ArgumentTypeError(
            "expected USER:PASSWORD to authenticate with, not a digest:USER:HASH"
        )
    try:
        DigestId.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


# -- the layout -------------------------------------------------------------------------


@dataclass(frozen=True)
class AclLayout:
    """Who gets which rights on our tree (see the module docstring for the table).

    Raises:
        ConfigError: a role is empty, or one digest user appears in two roles (a data
            server holding the search identity could take part in the election).
    """

    admin: DigestId
    data: tuple[DigestId, ...]
    search: tuple[DigestId, ...]

    def __post_init__(self) -> None:
        if not self.data or not self.search:
            raise ConfigError("both --data-identities and --search-identities are required")
        roles = {"admin": (self.admin,), "data": self.data, "search": self.search}
        seen: dict[str, str] = {}
        for role, ids in roles.items():
            for digest_id in ids:
                other = seen.setdefault(digest_id.user, role)
                if other != role:
                    raise ConfigError(
                        f"digest user {digest_id.user!r} is named for both the {other} and "
                        f"the {role} role; each role needs users of its own"
                    )

    def _acl(self, data: int, search: int) -> list[ACL]:
        acl = [self.admin.acl(ALL)]
        if data:
            acl += [digest_id.acl(data) for digest_id in self.data]
        if search:
            acl += [digest_id.acl(search) for digest_id in self.search]
        acl.append(ACL(READ, _WORLD))
        return acl

    @property
    def root_acl(self) -> list[ACL]:
        """The chroot node's ACL (also given to chroot ancestors that zk-init creates)."""
        return self._acl(0, 0)

    def nodes(self) -> list[tuple[str, list[ACL]]]:
        """Our directories (relative to the chroot), parents first, with their ACLs."""
        return [
            (DATA_SERVERS_PATH, self._acl(CREATE | READ, READ)),
            (posixpath.dirname(SEARCH_ELECTION_PATH), self._acl(0, READ)),
            (SEARCH_ELECTION_PATH, self._acl(0, CREATE | DELETE | READ)),
            (SEARCH_MEMBERS_PATH, self._acl(0, CREATE | DELETE | READ)),
            # Operators' markers, set with the admin identity; the leader only reads.
            (MAINTENANCE_PATH, self._acl(0, READ)),
        ]


@dataclass(frozen=True)
class NodeResult:
    """What :func:`bootstrap` did to one node: ``created``, ``fixed`` or ``unchanged``."""

    path: str
    action: str
    acl: tuple[ACL, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "action": self.action, "acl": describe_acl(self.acl)}


def _acl_key(acl: Iterable[ACL]) -> set[tuple[int, str, str]]:
    return {(entry.perms, entry.id.scheme, entry.id.id) for entry in acl}


def split_chroot(hosts: str) -> tuple[str, str]:
    """``("h1:p1,h2:p2", "/chroot")`` from a kazoo hosts string; the chroot may be ``""``."""
    servers, slash, chroot = hosts.partition("/")
    chroot = posixpath.normpath("/" + chroot).rstrip("/") if slash else ""
    return servers, chroot


async def bootstrap(session: ZkSession, layout: AclLayout, chroot: str) -> list[NodeResult]:
    """Create our directories with the layout's ACLs, or set those ACLs where they differ.

    ``session`` must be connected *without* a chroot and authenticated as
    ``layout.admin``; ``chroot`` is the cluster's chroot (``""`` for none). Idempotent:
    a second run changes nothing, and a run after someone altered an ACL puts it back.
    Children (servers' ephemeral nodes, election nodes) are not touched.

    Raises:
        ZkAuthError: a node exists whose ACL gives the admin identity no ADMIN right
            (created before zk-init by another identity); the message says what to do.
        ZkError: ZooKeeper refused or could not be reached.
    """
    results: list[NodeResult] = []
    if chroot:
        parent = posixpath.dirname(chroot)
        if parent != "/":
            await session.ensure_path(parent, acl=layout.root_acl)
        results.append(await _ensure(session, layout, chroot, layout.root_acl))
    for path, acl in layout.nodes():
        results.append(await _ensure(session, layout, (chroot + path) or "/", acl))
    return results


async def _ensure(session: ZkSession, layout: AclLayout, path: str, acl: list[ACL]) -> NodeResult:
    try:
        await session.create(path, b"", acl=acl)
    except ZkNodeExistsError:
        pass
    else:
        log.info("created %s with ACL %s", path, describe_acl(acl))
        return NodeResult(path, "created", tuple(acl))
    current = await session.get_acls(path)
    if _acl_key(current) == _acl_key(acl):
        return NodeResult(path, "unchanged", tuple(acl))
    try:
        await session.set_acls(path, acl)
    except ZkAuthError as exc:
        admin = layout.admin
        # The hash shows as "x" without ADMIN; an entry for our user that has ADMIN
        # and still refuses us can only be another password.
        if any(
            entry.id.scheme == "digest"
            and entry.id.id.split(":", 1)[0] == admin.user
            and entry.perms & ADMIN
            for entry in current
        ):
            raise ZkAuthError(
                f"wrong password for the admin user {admin.user!r} (--admin-auth / "
                f"DISCOVERY_ZK_ADMIN_AUTH): the ACL of {path} names that user with another "
                "password, so ZooKeeper refuses to change it"
            ) from exc
        raise ZkAuthError(
            f"cannot set the ACL of {path}: the admin identity {layout.admin.user!r} has no "
            f"ADMIN right on it (its ACL is {describe_acl(current)}). It was created by "
            "another identity, probably before zk-init: set its ACL with that identity or "
            "ZooKeeper's super user, or delete it while no server runs, then run zk-init again"
        ) from exc
    log.info("set the ACL of %s from %s to %s", path, describe_acl(current), describe_acl(acl))
    return NodeResult(path, "fixed", tuple(acl))


# -- the zk-init subcommand -------------------------------------------------------------

ZK_INIT_OPTIONS: tuple[Option, ...] = (
    # zk-init authenticates with --admin-auth, never with the servers' credentials.
    *(o for o in ZK_OPTIONS if o.flag not in ("--zk-auth", "--zk-auth-file")),
    Option(
        "--admin-auth",
        "DISCOVERY_ZK_ADMIN_AUTH",
        "admin digest credentials USER:PASSWORD (required): zk-init authenticates with "
        "them, and they get all rights on our nodes. A flag is visible in ps: prefer "
        "the variable",
        type=credentials,
        metavar="USER:PASSWORD",
    ),
    Option(
        "--data-identities",
        "DISCOVERY_ZK_DATA_IDENTITIES",
        "comma-separated identities data servers use (--zk-auth), each USER:PASSWORD or "
        "digest:USER:HASH (required); they may create, never delete, under /data_servers",
        type=identity_list,
        metavar="IDS",
    ),
    Option(
        "--search-identities",
        "DISCOVERY_ZK_SEARCH_IDENTITIES",
        "comma-separated identities search servers use, as for --data-identities "
        "(required); they hold the election and list the members",
        type=identity_list,
        metavar="IDS",
    ),
)


def add_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """Register ``zk-init`` on the ``discovery`` command's subparsers; returns its parser."""
    parser = subparsers.add_parser(
        "zk-init",
        help="create our ZooKeeper nodes with access control (digest ACLs); idempotent",
        description=(
            "Create /data_servers, /search_servers/{election,members} and /maintenance (under "
            "the chroot of --zk) with ACLs for three roles: the admin (all rights, and the "
            "only one that may set maintenance markers), data servers "
            "(create only: a data server removes its node by ending its session), search "
            "servers (hold the election); everyone may read. Existing nodes get their ACLs "
            "set, so running it again repairs them."
        ),
        epilog="exit status: 0 done; " + EPILOG,
    )
    add_options(parser, ZK_INIT_OPTIONS)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    add_verbose_flag(parser)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Bootstrap the tree named by ``args``; see :func:`add_parser` for exit codes."""
    missing = [
        f"{option.flag} / {option.env}"
        for option in ZK_INIT_OPTIONS
        if option.flag in ("--admin-auth", "--data-identities", "--search-identities")
        and getattr(args, option.dest) is None
    ]
    if missing:
        print(f"{PROG}: required: {', '.join(missing)}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    try:
        layout = AclLayout(
            DigestId.parse(args.admin_auth), args.data_identities, args.search_identities
        )
        servers, chroot = split_chroot(args.zk)
        zk = ZkConfig(
            hosts=servers,
            session_timeout=args.session_timeout,
            connect_timeout=args.zk_connect_timeout,
            auth=args.admin_auth,
        )
    except DiscoveryError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    if not chroot:
        print(
            f"{PROG}: warning: --zk names no chroot; the ZooKeeper root keeps its ACL, so "
            "whoever may delete its children could remove an empty /data_servers and "
            "re-create it; give each cluster a chroot (HOSTS/name)",
            file=sys.stderr,
            flush=True,
        )
    try:
        results = asyncio.run(_bootstrap(zk, layout, chroot))
    except ZkError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr, flush=True)
        return EXIT_REFUSED if isinstance(exc, ZkAuthError) else EXIT_UNREACHABLE
    if args.json:
        document = {"chroot": chroot, "nodes": [r.to_dict() for r in results]}
        print(json.dumps(document, indent=2, sort_keys=True), flush=True)
    else:
        for result in results:
            print(f"{result.action:<9} {result.path}  {' '.join(describe_acl(result.acl))}")
    return EXIT_OK


async def _bootstrap(zk: ZkConfig, layout: AclLayout, chroot: str) -> list[NodeResult]:
    session = ZkSession.from_config(zk)
    try:
        await session.start()
        return await bootstrap(session, layout, chroot)
    finally:
        await session.aclose()


# -- the zk-digest subcommand -----------------------------------------------------------


def add_digest_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """Register ``zk-digest``: print ``digest:USER:HASH`` for ``USER:PASSWORD`` on stdin."""
    parser = subparsers.add_parser(
        "zk-digest",
        help="print the digest:USER:HASH form of USER:PASSWORD lines read from stdin",
        description=(
            "Read USER:PASSWORD lines from stdin (not the command line, which ps shows) "
            "and print each as digest:USER:HASH, the form zk-init accepts in "
            "--data-identities and --search-identities without the password."
        ),
    )
    parser.set_defaults(func=run_digest)
    return parser


def run_digest(args: argparse.Namespace) -> int:
    status = 0
    for line in sys.stdin.read().splitlines():
        if not line.strip():
            continue
        try:
            print(DigestId.parse(line), flush=True)
        except ValueError as exc:
            print(f"discovery zk-digest: {exc}", file=sys.stderr, flush=True)
            status = 2
    return status
