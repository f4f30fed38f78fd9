"""``discovery zk-init``: lay out our tree with access control.

:func:`bootstrap` creates our nodes with the ACLs of three roles (:class:`AclLayout`), or
puts those ACLs back where they differ; a role's identity is a
:class:`~discovery.tools.zkdigest.DigestId`. Every secret option has a ``-file`` twin,
and no message repeats a secret.

Design: docs/design/security.md, "ZooKeeper access control".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import posixpath
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from kazoo.security import ACL, Id

from discovery.cli.entrypoint import add_verbose_flag
from discovery.cli.options import ZK_OPTIONS, Option, add_options, read_secret, readable_file
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
from .zkdigest import DigestId, credentials, identity_list

__all__ = [
    "ZK_INIT_OPTIONS",
    "AclLayout",
    "NodeResult",
    "Secrets",
    "add_parser",
    "bootstrap",
    "run",
    "secrets",
    "split_chroot",
]

log = logging.getLogger(__name__)

PROG: Final = "discovery zk-init"

_WORLD = Id("world", "anyone")
_T = TypeVar("_T")


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
                f"wrong password for the admin user {admin.user!r} (--admin-auth(-file) / "
                f"DISCOVERY_ZK_ADMIN_AUTH[_FILE]): the ACL of {path} names that user with another "
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

# The three secrets, each a flag with a variable, and a -file twin with its own.
_ADMIN: Final = ("--admin-auth", "DISCOVERY_ZK_ADMIN_AUTH")
_DATA: Final = ("--data-identities", "DISCOVERY_ZK_DATA_IDENTITIES")
_SEARCH: Final = ("--search-identities", "DISCOVERY_ZK_SEARCH_IDENTITIES")


def _file_twin(flag: str, env: str, what: str) -> Option:
    return Option(
        f"{flag}-file",
        f"{env}_FILE",
        f"file holding {what} (one trailing newline ignored); instead of {flag}",
        type=readable_file,
        metavar="PATH",
    )


ZK_INIT_OPTIONS: tuple[Option, ...] = (
    # zk-init authenticates with --admin-auth, never with the servers' credentials.
    *(o for o in ZK_OPTIONS if o.flag not in ("--zk-auth", "--zk-auth-file")),
    # The secrets are strings here and parsed in run(): a bad value (from a variable
    # too) is then reported by its flag without being repeated, never by argparse.
    Option(
        *_ADMIN,
        "admin digest credentials USER:PASSWORD (required, or --admin-auth-file): zk-init "
        "authenticates with them, and they get all rights on our nodes. A flag is "
        "visible in ps: prefer the file or the variable",
        metavar="USER:PASSWORD",
    ),
    _file_twin(*_ADMIN, "the admin credentials USER:PASSWORD"),
    Option(
        *_DATA,
        "comma-separated identities data servers use (--zk-auth), each USER:PASSWORD or "
        "digest:USER:HASH (required, or --data-identities-file); they may create, never "
        "delete, under /data_servers",
        metavar="IDS",
    ),
    _file_twin(*_DATA, "the data servers' identities, one a line or comma-separated"),
    Option(
        *_SEARCH,
        "comma-separated identities search servers use, as for --data-identities "
        "(required, or --search-identities-file); they hold the election and list the "
        "members",
        metavar="IDS",
    ),
    _file_twin(*_SEARCH, "the search servers' identities, one a line or comma-separated"),
)


@dataclass(frozen=True)
class Secrets:
    """zk-init's secrets, each from its flag, its variable or its file (see :func:`secrets`).

    The repr shows users only: the admin's password and the identities' passwords or
    hashes never appear in it.
    """

    admin_auth: str
    data: tuple[DigestId, ...]
    search: tuple[DigestId, ...]

    def __repr__(self) -> str:
        admin = self.admin_auth.partition(":")[0] + ":***"
        data = [d.user for d in self.data]
        search = [d.user for d in self.search]
        return f"Secrets(admin_auth={admin!r}, data={data!r}, search={search!r})"


def _secret(
    args: argparse.Namespace, names: tuple[str, str], parse: Callable[[str], _T]
) -> _T | None:
    """One secret from its flag or variable, or from its file (read here, once), parsed.

    Raises:
        ConfigError: both given, the file unreadable or empty, or the value malformed;
            the message names the flag (or the file's flag and path), never the value.
    """
    flag, env = names
    dest = flag.removeprefix("--").replace("-", "_")
    path = getattr(args, f"{dest}_file")
    text = read_secret(getattr(args, dest), path, flag, env)
    if text is None:
        return None
    try:
        return parse(text)
    except argparse.ArgumentTypeError as exc:
        where = f"{flag} / {env}" if path is None else f"{flag}-file / {env}_FILE ({path!r})"
        raise ConfigError(f"{where}: {exc}") from None


def secrets(args: argparse.Namespace) -> Secrets:
    """The admin credentials and both roles' identities of a namespace parsed with
    :data:`ZK_INIT_OPTIONS`.

    Raises:
        ConfigError: one missing, given twice (flag and file), unreadable or malformed;
            naming the flags, never a secret.
    """
    admin = _secret(args, _ADMIN, credentials)
    data = _secret(args, _DATA, identity_list)
    search = _secret(args, _SEARCH, identity_list)
    missing = [
        f"{flag} or {flag}-file ({env}[_FILE])"
        for (flag, env), value in ((_ADMIN, admin), (_DATA, data), (_SEARCH, search))
        if value is None
    ]
    if admin is None or data is None or search is None:
        raise ConfigError(f"required: {', '.join(missing)}")
    return Secrets(admin, data, search)


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
    try:
        given = secrets(args)
        layout = AclLayout(DigestId.parse(given.admin_auth), given.data, given.search)
        servers, chroot = split_chroot(args.zk)
        zk = ZkConfig(
            hosts=servers,
            session_timeout=args.session_timeout,
            connect_timeout=args.zk_connect_timeout,
            auth=given.admin_auth,
            # The servers' --zk-tls flags: an ensemble serving clients over TLS only is
            # bootstrapped over TLS too, with zk-init's own client certificate.
            tls=args.zk_tls,
            tls_ca=args.zk_tls_ca,
            tls_cert=args.zk_tls_cert,
            tls_key=args.zk_tls_key,
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
