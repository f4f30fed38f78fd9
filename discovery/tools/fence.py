"""``discovery fence``: check the live list's fence against ZooKeeper, and repair it.

``check`` is read-only; ``repair`` resets a poisoned fence atomically, and only if it still
holds what was checked (``--force``: whatever the verdict; dangerous). Exit status as
:mod:`discovery.tools.exitcodes`; 1: poisoned (``check``), nothing written (``repair``).

Operating: docs/operating.md, "``discovery fence``".
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
from typing import Any, Final

from discovery.cli.entrypoint import add_verbose_flag
from discovery.cli.options import (
    COMMON_OPTIONS,
    ZK_OPTIONS,
    Option,
    add_log_level_override,
    add_options,
    redis_config,
    zk_config,
)
from discovery.config import ClusterConfig, ZkConfig, redact_url
from discovery.errors import (
    DiscoveryError,
    StoreAccessError,
    StoreError,
    ZkAuthError,
    ZkError,
)
from discovery.livelist.admin import LiveListAdmin, Repaired, StoredFence
from discovery.livelist.open import default_schemes, open_store
from discovery.safetext import escape_controls
from discovery.zk.epochs import EpochVerdict, FenceCheck, highest_possible_epoch
from discovery.zk.paths import SEARCH_ELECTION_PATH
from discovery.zk.session import ZkSession

from .exitcodes import (
    EPILOG,
    EXIT_ATTENTION,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
)
from .maint import default_by
from .status.model import Contender
from .status.reader import read_contenders

__all__ = ["EXIT_POISONED", "FenceReport", "add_parser", "run"]

PROG: Final = "discovery fence"
#: ``--zk-connect-timeout`` default: an operator at a prompt wants an answer in seconds.
CONNECT_TIMEOUT: Final = 5.0
#: Connect and read timeout for the store (Redis: its sockets); no retries.
STORE_TIMEOUT: Final = 2.0
#: ``check``: the fence is poisoned; ``repair``: refused, it is not.
EXIT_POISONED: Final = EXIT_ATTENTION
_EPILOG: Final = (
    "exit status: 0 fine / repaired; 1 check: poisoned, repair: nothing written (not "
    "poisoned, see --force, or P:meta changed meanwhile: run it again); " + EPILOG
)
# The settings that concern this command: ZooKeeper, Redis and the cluster name.
_SKIPPED = frozenset({"--log-level", "--admin-token"})


@dataclasses.dataclass(frozen=True)
class FenceReport:
    """What a check found: the stored fence, the leader, ZooKeeper's bound, and what the
    store calls its fence record (``<prefix>:meta`` if not given)."""

    prefix: str
    stored: StoredFence
    leader: Contender | None
    highest: int
    record: str = ""

    @property
    def meta_name(self) -> str:
        return self.record or f"{self.prefix}:meta"

    @property
    def check(self) -> FenceCheck | None:
        meta = self.stored.meta
        if meta is None:
            return None
        return FenceCheck(meta.epoch, self.leader.czxid if self.leader else 0, self.highest)

    @property
    def verdict(self) -> str:
        if self.stored.problem is not None:
            return "malformed"
        check = self.check
        return "missing" if check is None else check.verdict.value

    @property
    def poisoned(self) -> bool:
        return self.verdict == EpochVerdict.IMPOSSIBLE.value

    def repair_epoch(self) -> int:
        """The epoch a repair stores: one below the leader's, so its next write passes
        the fence and its predecessors' stay refused (0 without a leader)."""
        return max(0, self.leader.czxid - 1) if self.leader is not None else 0

    def to_dict(self) -> dict[str, Any]:
        meta = self.stored.meta
        return {
            "prefix": self.prefix,
            "meta": None
            if meta is None
            else {
                "epoch": meta.epoch,
                "version": meta.version,
                "leader": meta.leader,
                "published_at": meta.published_at,
                "count": meta.count,
                "fence": meta.fence,
            },
            "problem": self.stored.problem,
            "leader": self.leader.to_dict() if self.leader is not None else None,
            "highest_possible_epoch": self.highest,
            "verdict": self.verdict,
        }


# -- reading -------------------------------------------------------------------------------


async def collect(session: ZkSession, store: LiveListAdmin) -> FenceReport:
    """Read the fence (``P:meta``), then ZooKeeper's bound and leader (in that order: a
    leader that published before the store's read is covered by the bound read after it).

    Raises:
        ZkError, StoreError, StoreAccessError: a read failed.
    """
    stored = await store.read_fence()
    highest = await highest_possible_epoch(session, SEARCH_ELECTION_PATH)
    contenders = await read_contenders(session, SEARCH_ELECTION_PATH)
    leader = contenders[0] if contenders else None
    return FenceReport(store.prefix, stored, leader, highest, store.names.meta)


def describe(report: FenceReport) -> list[str]:
    """The check's verdict in a few lines of text."""
    record = report.meta_name
    meta, leader = report.stored.meta, report.leader
    lines = []
    if report.stored.problem is not None:
        lines.append(f"{record} is malformed: {report.stored.problem}")
    elif meta is None:
        lines.append(f"{record} is missing: nothing is published (or Redis lost it)")
    else:
        lines.append(
            f"{record} holds epoch {meta.epoch} version {meta.version} (leader "
            f"{meta.leader!r}, fence generation {meta.fence})"
        )
    who = f"leader {leader.id!r} with epoch {leader.czxid}" if leader else "no leader"
    lines.append(
        f"ZooKeeper: {who}; epochs issued up to {report.highest} (the pzxid of "
        f"{SEARCH_ELECTION_PATH})"
    )
    verdict = report.verdict
    if verdict == "impossible":
        assert meta is not None
        lines.append(
            f"POISONED: epoch {meta.epoch} is above every epoch ZooKeeper has issued, so "
            "no leader wrote it. The leader holds its term without publishing and every "
            "search server is pinned to this list. Repair it: `discovery fence repair` "
            "with the same flags."
        )
    elif verdict == "possible":
        lines.append(
            "ok: the stored epoch is above the leader's but within what ZooKeeper has "
            "issued: a newer leader may hold it (this one then resigns), or the next "
            "leaders' epochs overtake it. No repair needed."
        )
    elif verdict == "ok":
        lines.append("ok: the leader's writes pass the fence.")
    else:
        lines.append(
            "ok: no fence to repair; the leader's next publish (within its heartbeat) "
            f"writes {record} anew, and search servers keep their list meanwhile."
        )
    return lines


# -- the subcommand --------------------------------------------------------------------------


def _options() -> tuple[Option, ...]:
    zk = tuple(
        dataclasses.replace(o, default=CONNECT_TIMEOUT) if o.flag == "--zk-connect-timeout" else o
        for o in ZK_OPTIONS
    )
    return (*zk, *(o for o in COMMON_OPTIONS if o.flag not in _SKIPPED))


def _common(parser: argparse.ArgumentParser) -> None:
    add_options(parser, _options())
    add_log_level_override(parser)
    add_verbose_flag(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def add_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """Register ``fence`` (with ``check`` and ``repair``) on the subparsers."""
    parser = subparsers.add_parser(
        "fence",
        help="check the live list's fence against ZooKeeper, or repair a poisoned one",
        description=(
            "The live list's fence is the epoch in Redis (P:meta): a leader's write with "
            "a lower one is refused, and search servers never go back to a lower one. An "
            "epoch no leader can hold (above ZooKeeper's election pzxid) stops every "
            "leader and pins every reader; the leader then holds its term without "
            "publishing (metric discovery_leader_fence_poisoned, alert "
            "DiscoveryFencePoisoned)."
        ),
        epilog=_EPILOG,
    )
    actions = parser.add_subparsers(dest="fence_action", metavar="ACTION", required=True)
    check = actions.add_parser(
        "check",
        help="compare the stored epoch with ZooKeeper's (read-only)",
        description=(
            "Read P:meta, then ZooKeeper, and say whether the stored epoch is one a "
            "leader can hold. Exit status 1 if it is not (run `discovery fence repair`)."
        ),
        epilog=_EPILOG,
    )
    _common(check)
    repair = actions.add_parser(
        "repair",
        help="reset a poisoned fence so that the leader publishes again",
        description=(
            "If the stored epoch is one no leader can hold, reset the fence atomically: "
            "epoch one below the leader's, version 1, and a new fence generation, which "
            "makes every search server take the stored list again. The leader publishes "
            "at its next try of the fence (within the search servers' "
            "--fence-recheck-max). Writes with the publishing credentials."
        ),
        epilog=_EPILOG,
    )
    repair.add_argument(
        "--force",
        action="store_true",
        help="repair even if the stored epoch is one a leader can hold. DANGEROUS: older "
        "leaders' writes pass the fence until the leader publishes again, and every search "
        "server takes the stored list whatever its version",
    )
    repair.add_argument(
        "--by",
        metavar="WHO",
        default=None,
        help="who repairs, written to P:meta's leader field (default: user@host)",
    )
    _common(repair)
    parser.set_defaults(func=run)
    return parser


def _err(message: str) -> None:
    print(f"{PROG}: {escape_controls(message)}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    """Run ``check`` or ``repair``; see the module docstring for the exit status."""
    try:
        zk = dataclasses.replace(zk_config(args), operation_timeout=args.zk_connect_timeout)
        cluster = ClusterConfig(
            cluster=args.cluster, redis_url=args.redis, redis=redis_config(args)
        )
    except DiscoveryError as exc:  # ConfigError, naming the flag
        _err(str(exc))
        return EXIT_USAGE
    store_where = redact_url(cluster.store_url)
    backend = default_schemes().backend(cluster)
    try:
        return asyncio.run(_run(args, zk, cluster))
    except ZkAuthError as exc:
        _err(f"ZooKeeper at {zk.hosts} refused: {exc} (check --zk-auth)")
        return EXIT_REFUSED
    except ZkError as exc:
        _err(f"cannot use ZooKeeper at {zk.hosts}: {' '.join(str(exc).split())}")
        return EXIT_UNREACHABLE
    except StoreAccessError as exc:
        credentials = (
            "--redis-publish-username / --redis-publish-password"
            if args.fence_action == "repair"
            else "--redis-username / --redis-password"
        )
        _err(f"{backend} at {store_where} refused: {exc} (check {credentials})")
        return EXIT_REFUSED
    except StoreError as exc:
        _err(f"cannot use {backend} at {store_where}: {' '.join(str(exc).split())}")
        return EXIT_UNREACHABLE


async def _run(args: argparse.Namespace, zk: ZkConfig, cluster: ClusterConfig) -> int:
    session = ZkSession.from_config(zk)
    # The reading credentials for the check; the publishing ones write the repair.
    # Answer now or say it cannot: no retries.
    store = open_store(
        cluster,
        read_only=args.fence_action == "check",
        timeout=STORE_TIMEOUT,
        retry=False,
    )
    try:
        await session.start()
        report = await collect(session, store.admin)
        if args.fence_action == "check":
            _print(args, report, None)
            return EXIT_POISONED if report.poisoned else EXIT_OK
        if not (report.poisoned or args.force):
            _print(args, report, None)
            _err(
                f"refusing to repair: the fence is {report.verdict}, not poisoned (a "
                "leader can hold it, or there is none); --force repairs anyway, which is "
                "dangerous (see --help)"
            )
            return EXIT_POISONED
        repaired = await store.admin.repair_fence(
            report.stored,
            epoch=report.repair_epoch(),
            by=args.by if args.by is not None else default_by(),
        )
        _print(args, report, repaired)
        if repaired is None:
            _err(
                f"{report.meta_name} changed since it was checked; "
                "nothing was written: run the command again"
            )
            return EXIT_ATTENTION
        return EXIT_OK
    finally:
        await store.aclose()
        await session.aclose()


def _print(args: argparse.Namespace, report: FenceReport, repaired: Repaired | None) -> None:
    if args.json:
        document = report.to_dict()
        if args.fence_action == "repair":
            document["repaired"] = dataclasses.asdict(repaired) if repaired else None
        print(json.dumps(document, sort_keys=True, indent=2), flush=True)
        return
    # The stored record was written by whoever could write the store: its leader's
    # name, or why it is malformed, shown escaped (no escape sequence, no extra line).
    for line in describe(report):
        print(escape_controls(line))
    if repaired is not None:
        print(
            f"REPAIRED: the fence now holds epoch {repaired.epoch} version 1 with fence "
            f"generation {repaired.generation} ({repaired.count} servers kept); search "
            "servers take this list now, and the leader publishes again at its next try "
            "of the fence (within --fence-recheck-max, 30 s by default)."
        )
    sys.stdout.flush()
