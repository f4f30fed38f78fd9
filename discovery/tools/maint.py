"""``discovery maint``: operator maintenance that a restart cannot undo.

``set`` writes the PERSISTENT marker ``/maintenance/ID``, ``clear`` deletes it (idempotent),
``list`` shows them; only ZooKeeper is touched. Exit status as
:mod:`discovery.tools.exitcodes`: 0, 2, 3 or 4, never 1.

Operating: docs/operating.md, "``discovery maint``".
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import getpass
import json
import socket
import sys
from datetime import UTC, datetime
from typing import Any, Final

from discovery.cli.entrypoint import add_verbose_flag
from discovery.cli.options import (
    MEMBER_OPTIONS,
    ZK_OPTIONS,
    Option,
    add_log_level_override,
    add_options,
    zk_config,
)
from discovery.config import ZkConfig
from discovery.errors import (
    DiscoveryError,
    InvalidInstanceError,
    InvalidMarkerError,
    ZkAuthError,
    ZkBadVersionError,
    ZkError,
    ZkNodeExistsError,
    ZkNoNodeError,
)
from discovery.instance import ServiceInstance, validate_instance_id
from discovery.safetext import escape_controls
from discovery.zk.maintenance import (
    MAX_REASON_LENGTH,
    MaintenanceMarker,
    read_markers,
)
from discovery.zk.membership import decode_child
from discovery.zk.paths import DATA_SERVERS_PATH, MAINTENANCE_PATH
from discovery.zk.session import ZkSession

from .exitcodes import EPILOG, EXIT_OK, EXIT_REFUSED, EXIT_UNREACHABLE, EXIT_USAGE

__all__ = ["add_parser", "clear_marker", "list_markers", "run", "set_marker"]

PROG: Final = "discovery maint"
#: ``--zk-connect-timeout`` default: an operator at a prompt wants an answer in seconds.
CONNECT_TIMEOUT: Final = 5.0
_EPILOG: Final = "exit status: 0 done (clearing an absent marker is not an error); " + EPILOG


# -- argument types ------------------------------------------------------------------------


def instance_id(text: str) -> str:
    """argparse type: a data server's instance id (a znode name)."""
    try:
        return validate_instance_id(text)
    except InvalidInstanceError as exc:
        raise argparse.ArgumentTypeError(
            str(exc).removeprefix("invalid ServiceInstance: id: ")
        ) from None


def reason_text(text: str) -> str:
    """argparse type: a marker's reason (one line, not blank, bounded)."""
    try:
        MaintenanceMarker.create("x", text)
    except InvalidMarkerError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("reason ")) from None
    return text


def default_by() -> str:
    """Who sets a marker, unless ``--by`` says: ``user@host``."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no login name in a bare container
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


# -- the operations --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Registered:
    """What ``/data_servers/<id>`` holds now: absent, a node the leader skips (and
    why), or an instance."""

    present: bool
    instance: ServiceInstance | None = None
    skipped: str | None = None

    def describe(self, instance_id: str) -> str:
        if not self.present:
            return (
                f"{instance_id} is not registered now: the marker applies as soon as it registers"
            )
        if self.instance is None:
            return f"{instance_id} is registered, but the leader skips its node ({self.skipped})"
        i = self.instance
        return (
            f"{instance_id} is registered ({i.address}:{i.port}, shard {i.payload.shard}): the "
            "leader publishes it as maintenance and search servers stop sending it queries"
        )

    def to_dict(self) -> dict[str, Any]:
        i = self.instance
        return {
            "registered": self.present,
            "address": i.address if i else None,
            "port": i.port if i else None,
            "shard": i.payload.shard if i else None,
        }


async def registered(
    session: ZkSession, instance_id: str, *, allow_persistent: bool = False
) -> Registered:
    """Whether ``instance_id`` is registered under ``/data_servers``, and as what
    (``allow_persistent``: as a leader with ``--allow-persistent-members`` judges it)."""
    try:
        data, stat = await session.get(f"{DATA_SERVERS_PATH}/{instance_id}")
    except ZkNoNodeError:
        return Registered(False)
    # Judged as the leader judges it: a node it skips is not routed, marker or not.
    decoded = decode_child(instance_id, data, stat, allow_persistent=allow_persistent)
    if isinstance(decoded, str):
        return Registered(True, skipped=decoded)
    return Registered(True, decoded)


async def set_marker(
    session: ZkSession, marker: MaintenanceMarker, path: str = MAINTENANCE_PATH
) -> MaintenanceMarker | None:
    """Write ``marker`` (create, or replace an existing one); return the one it replaced.

    Raises:
        ZkError: ZooKeeper refused (:class:`ZkAuthError`: not the admin identity) or
            could not be reached.
    """
    node = f"{path}/{marker.instance_id}"
    while True:
        try:
            await session.create(node, marker.to_json(), makepath=True)
            return None
        except ZkNodeExistsError:
            pass
        try:
            data, stat = await session.get(node)
            await session.set(node, marker.to_json(), version=stat.version)
        except (ZkNoNodeError, ZkBadVersionError):
            continue  # cleared, or set by someone else, in between: from the start
        return MaintenanceMarker.parse(marker.instance_id, data)


async def clear_marker(
    session: ZkSession, instance_id: str, path: str = MAINTENANCE_PATH
) -> MaintenanceMarker | None:
    """Delete the marker of ``instance_id``; return it (None if there was none).

    Raises:
        ZkError: ZooKeeper refused or could not be reached.
    """
    node = f"{path}/{instance_id}"
    try:
        data, _stat = await session.get(node)
    except ZkNoNodeError:
        return None
    try:
        await session.delete(node)
    except ZkNoNodeError:
        return None  # cleared by someone else meanwhile
    return MaintenanceMarker.parse(instance_id, data)


async def list_markers(
    session: ZkSession, path: str = MAINTENANCE_PATH, *, allow_persistent: bool = False
) -> list[tuple[MaintenanceMarker, Registered]]:
    """Every marker (by id) with what is registered under its id now (judged as by
    :func:`registered`)."""
    markers = await read_markers(session, path)
    ids = sorted(markers)
    states = await asyncio.gather(
        *(registered(session, i, allow_persistent=allow_persistent) for i in ids)
    )
    return [(markers[i], state) for i, state in zip(ids, states, strict=True)]


# -- the subcommand --------------------------------------------------------------------------


def _options() -> tuple[Option, ...]:
    zk = tuple(
        dataclasses.replace(o, default=CONNECT_TIMEOUT) if o.flag == "--zk-connect-timeout" else o
        for o in ZK_OPTIONS
    )
    # Whether a marked id is registered is judged as the leader judges it.
    return (*zk, *MEMBER_OPTIONS)


def _common(parser: argparse.ArgumentParser) -> None:
    add_options(parser, _options())
    add_log_level_override(parser)
    add_verbose_flag(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.epilog = _EPILOG


def add_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """Register ``maint`` (with ``set``, ``clear``, ``list``) on the subparsers."""
    parser = subparsers.add_parser(
        "maint",
        help="put a data server in maintenance (no queries, through restarts) or take it out",
        description=(
            "Operator maintenance that a restart cannot undo: a persistent marker "
            f"{MAINTENANCE_PATH}/ID in ZooKeeper, which the leader applies: the server stays "
            "listed, as 'maintenance' with the reason, and gets no queries until the marker "
            "is cleared. With zk-init's ACLs, use the admin identity (--zk-auth)."
        ),
        epilog=_EPILOG,
    )
    actions = parser.add_subparsers(dest="maint_action", metavar="ACTION", required=True)

    set_parser = actions.add_parser(
        "set",
        help="put ID in maintenance, or replace its reason",
        description=(
            "Write the marker of ID (it may be set before ID ever registers). Setting it "
            "again replaces the reason."
        ),
    )
    set_parser.add_argument("id", type=instance_id, metavar="ID", help="the data server's id")
    set_parser.add_argument(
        "--reason",
        required=True,
        type=reason_text,
        metavar="TEXT",
        help=f"why (required; one line, at most {MAX_REASON_LENGTH} characters): published "
        "with the server and shown by `discovery status` and the dashboard",
    )
    set_parser.add_argument(
        "--by", metavar="WHO", default=None, help="who sets it (default: user@host)"
    )
    _common(set_parser)

    clear_parser = actions.add_parser(
        "clear",
        help="take ID out of maintenance",
        description=(
            "Delete the marker of ID: the leader publishes ID as registered again. No "
            "marker: nothing is changed, exit status 0."
        ),
    )
    clear_parser.add_argument("id", type=instance_id, metavar="ID", help="the data server's id")
    _common(clear_parser)

    list_parser = actions.add_parser(
        "list",
        help="show the maintenance markers",
        description="Every marker, with its reason, who set it and when, and whether its "
        "id is registered now.",
    )
    _common(list_parser)
    parser.set_defaults(func=run)
    return parser


def _when(ms: int | None) -> str:
    if ms is None:
        return "?"
    stamp = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%SZ")


def _err(message: str) -> None:
    print(f"{PROG}: {escape_controls(message)}", file=sys.stderr, flush=True)


def _say(line: str) -> None:
    # Markers and registrations are written by others (a reason, a node's name, why a
    # node is skipped): shown escaped, so that none can steer the terminal or add lines.
    print(escape_controls(line))


def run(args: argparse.Namespace) -> int:
    """Run one maintenance action; see the module docstring for the exit status."""
    try:
        zk = dataclasses.replace(zk_config(args), operation_timeout=args.zk_connect_timeout)
        marker = None
        if args.maint_action == "set":
            marker = MaintenanceMarker.create(
                args.id, args.reason, by=args.by if args.by is not None else default_by()
            )
    except DiscoveryError as exc:  # ConfigError, InvalidMarkerError
        _err(str(exc))
        return EXIT_USAGE
    try:
        return asyncio.run(_run(zk, args, marker))
    except ZkAuthError as exc:
        _err(
            f"ZooKeeper refused: {exc}. Maintenance markers are written with the admin "
            "identity that `discovery zk-init` set up: --zk-auth / DISCOVERY_ZK_AUTH"
        )
        return EXIT_REFUSED
    except ZkError as exc:
        _err(f"cannot use ZooKeeper at {zk.hosts}: {' '.join(str(exc).split())}")
        return EXIT_UNREACHABLE


async def _run(zk: ZkConfig, args: argparse.Namespace, marker: MaintenanceMarker | None) -> int:
    session = ZkSession.from_config(zk)
    try:
        await session.start()
        if args.maint_action == "set":
            assert marker is not None
            previous = await set_marker(session, marker)
            state = await registered(
                session, marker.instance_id, allow_persistent=args.allow_persistent_members
            )
            _report_set(args, marker, previous, state)
        elif args.maint_action == "clear":
            cleared = await clear_marker(session, args.id)
            _report_clear(args, args.id, cleared)
        else:
            markers = await list_markers(session, allow_persistent=args.allow_persistent_members)
            _report_list(args, markers)
    finally:
        await session.aclose()
    return EXIT_OK


def _report_set(
    args: argparse.Namespace,
    marker: MaintenanceMarker,
    previous: MaintenanceMarker | None,
    state: Registered,
) -> None:
    if args.json:
        document = {
            "action": "set",
            "id": marker.instance_id,
            "marker": marker.to_dict(),
            "previous": previous.to_dict() if previous is not None else None,
            **state.to_dict(),
        }
        print(json.dumps(document, sort_keys=True, indent=2), flush=True)
        return
    if previous is None:
        _say(f"{marker.instance_id}: maintenance set (reason: {marker.reason})")
    else:
        _say(
            f"{marker.instance_id}: was already in maintenance; reason replaced "
            f"(was: {previous.reason})"
        )
    _say(state.describe(marker.instance_id))
    sys.stdout.flush()


def _report_clear(
    args: argparse.Namespace, instance_id: str, cleared: MaintenanceMarker | None
) -> None:
    if args.json:
        document = {
            "action": "clear",
            "id": instance_id,
            "cleared": cleared is not None,
            "marker": cleared.to_dict() if cleared is not None else None,
        }
        print(json.dumps(document, sort_keys=True, indent=2), flush=True)
    elif cleared is None:
        _say(f"{instance_id}: not in maintenance (no marker); nothing to clear")
    else:
        _say(
            f"{instance_id}: maintenance cleared (was: {cleared.reason}); the leader "
            "publishes it as registered again"
        )
    sys.stdout.flush()


def _report_list(
    args: argparse.Namespace, markers: list[tuple[MaintenanceMarker, Registered]]
) -> None:
    if args.json:
        document = {"markers": [{**m.to_dict(), **state.to_dict()} for m, state in markers]}
        print(json.dumps(document, sort_keys=True, indent=2), flush=True)
        return
    if not markers:
        print("no data server is in maintenance", flush=True)
        return
    print(f"maintenance markers ({len(markers)}):")
    # Marker nodes are named by whoever wrote them: measured as they will show.
    ids = [escape_controls(m.instance_id) for m, _ in markers]
    width = max(len(shown) for shown in ids)
    for shown, (marker, state) in zip(ids, markers, strict=True):
        where = "registered" if state.present else "not registered"
        if marker.readable:
            detail = f"set {_when(marker.set_at)} by {marker.by or '?'}: {marker.reason}"
        else:
            detail = f"UNREADABLE ({marker.problem}); still applied"
        _say(f"  {shown:<{width}}  {where:<14}  {detail}")
    sys.stdout.flush()
