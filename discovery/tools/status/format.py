"""The text report of ``discovery status`` (the ``--json`` document is
:meth:`~discovery.tools.status.model.ClusterStatus.to_dict`).

Much of what it shows was written by others (a data server's reason, an election
node's id, a marker, the published list): every line goes through
:func:`~discovery.safetext.escape_controls`, so none can steer the terminal or add
lines of its own, and what is padded into a column is escaped before it is measured.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Final

from discovery.instance import DEFAULT_WEIGHT, ServiceInstance
from discovery.safetext import escape_controls
from discovery.zk.maintenance import apply_marker

from .model import ClusterStatus, by_id

__all__ = ["LIST_AT_MOST", "PROBLEMS_SHOWN", "format_text"]

#: Data servers listed one per line without ``--all``; a larger cluster is summarised.
LIST_AT_MOST: Final = 100
#: Servers in need of a look listed in a summary; the rest are counted.
PROBLEMS_SHOWN: Final = 50


def _when(ms: int) -> str:
    stamp = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond // 1000:03d}Z"


def _seconds(ms: int) -> str:
    return f"{ms / 1000:.1f}s"


def _plain(value: object) -> str:
    return json.dumps(value) if isinstance(value, bool) or value is None else str(value)


def _state(instance: ServiceInstance) -> str:
    state = instance.payload.state.value
    if not instance.enabled and state == "serving":
        state += " (disabled)"
    if instance.payload.reason:
        state += f" ({instance.payload.reason})"
    return state


def _placement(instance: ServiceInstance) -> str:
    # Only what is set: most clusters have neither zones, weights nor groups, and
    # their lines stay as they were.
    payload = instance.payload
    zone = f"  zone {payload.zone}" if payload.zone is not None else ""
    weight = f"  weight {payload.weight}" if payload.weight != DEFAULT_WEIGHT else ""
    group = f"  group {payload.group}" if payload.group is not None else ""
    return zone + weight + group


def _some(values: Sequence[object], shown: int = 20) -> str:
    """``values`` joined by commas, the first ``shown`` of them and how many more."""
    text = ", ".join(str(v) for v in values[:shown])
    return text + (f" … and {len(values) - shown} more" if len(values) > shown else "")


def _report(lines: list[str]) -> str:
    """The lines as the report: each escaped as a whole, so that a newline inside one
    (a reason's, say) shows as ``\\n`` instead of starting a line of its own."""
    return "\n".join(escape_controls(line) for line in lines)


def _more(count: int, cap: int | None, indent: str) -> list[str]:
    """The line saying how many were not listed (none when all were)."""
    if cap is None or count <= cap:
        return []
    return [f"{indent}… and {count - cap} more (--all or --json lists them all)"]


def format_text(status: ClusterStatus, *, every_server: bool | None = None) -> str:
    """The compact, human-readable report (the command's output without ``--json``).

    Every data server has a line when ``every_server``, or (None) when there are at
    most :data:`LIST_AT_MOST`; otherwise the report summarises them by state and shard
    and lists those that need a look (not serving, in maintenance, not as published),
    the first :data:`PROBLEMS_SHOWN`. Long lists of ids are cut the same way; the
    ``--json`` document always has every one.
    """
    health = status.health
    verdict = "healthy" if health.healthy else "degraded: " + ", ".join(health.problems)
    lines: list[str] = [
        f"cluster {status.prefix}  zookeeper {status.zookeeper}  redis {status.redis}",
        f"health     {verdict}",
    ]
    leader = status.leader
    if leader is None:
        lines.append("leader     none (no search server in the election)")
    else:
        count = len(status.contenders)
        contenders = f"{count} contender" + ("" if count == 1 else "s")
        lines.append(f"leader     {leader.id}  epoch {leader.czxid}  ({contenders})")
    heartbeat = status.heartbeat
    if heartbeat is None:
        lines.append("heartbeat  missing: no leader is publishing")
    elif heartbeat.error is not None:
        lines.append(f"heartbeat  unreadable: {heartbeat.error}")
    else:
        ttl = (
            "no expiry" if heartbeat.ttl_ms is None else f"expires in {_seconds(heartbeat.ttl_ms)}"
        )
        lines.append(
            f"heartbeat  {heartbeat.leader}  epoch {heartbeat.epoch}  version {heartbeat.version}"
            f"  {ttl}"
        )
    live = status.published.live
    if live is None:
        lines.append(f"published  {status.published.error}")
    else:
        age = status.published_age_ms or 0
        lines.append(
            f"published  version {live.version}  epoch {live.epoch}  by {live.leader}  "
            f"at {_when(live.published_at)}  age {_seconds(age)}  {len(live.servers)} servers"
        )
        lines.extend(f"           skipped {problem}" for problem in status.published.skipped)
    members = ", ".join(f"{i.id} ({i.address}:{i.port})" for i in by_id(status.search_servers))
    lines.append(f"search servers ({len(status.search_servers)}): {members or '-'}")
    lines.extend(f"  invalid {k}: {v}" for k, v in sorted(status.search_servers_invalid.items()))

    shards = status.shards()
    diff = status.differences
    unpublished = set(diff.registered_not_published)
    mismatched = {m.id for m in diff.mismatched}
    states = status.states()
    counted = ", ".join(f"{n} {state}" for state, n in states.items() if n)
    lines.append(
        f"data servers ({len(status.data_servers)} in {len(shards)} shards)"
        + (f": {counted}" if counted else ":")
    )
    summary = status.summary
    lines.append(
        f"  shards ({summary.source} list): {summary.total}, {summary.all_live} with every "
        f"replica live, {summary.some_not_live} with some not live, "
        f"{len(summary.no_live_replica)} with no live replica"
    )
    if summary.no_live_replica:
        lines.append(f"  no live replica: shard {_some(summary.no_live_replica)}")
    every = len(status.data_servers) <= LIST_AT_MOST if every_server is None else every_server
    # Ids are checked names (no control characters), so their length is their width.
    width = max((len(i) for i in status.data_servers), default=0)

    def server_line(instance: ServiceInstance) -> str:
        note = ""
        if instance.id in unpublished:
            note = "  [not published]"
        elif instance.id in mismatched:
            note = "  [differs from published]"
        address = f"{instance.address}:{instance.port}"
        marker = status.maintenance.get(instance.id)
        if marker is not None:
            # What the leader publishes: the operator's marker over the registration.
            instance = apply_marker(instance, marker)
        shard = "" if every else f"  shard {instance.payload.shard}"
        return (
            f"    {instance.id:<{width}}  {address:<21}{shard}  r{instance.payload.replica}"
            f"{_placement(instance)}  {_state(instance)}{note}"
        )

    if every:
        for shard, servers in shards.items():
            lines.append(f"  shard {shard}")
            lines.extend(server_line(instance) for instance in servers)
    else:
        # Thousands of lines help nobody: the servers that need a look, and a way to
        # see the rest.
        notable = [
            instance
            for servers in shards.values()
            for instance in servers
            if instance.id in unpublished
            or instance.id in mismatched
            or instance.id in status.maintenance
            or not instance.routable
        ]
        lines.append(
            f"  not serving, or not as published ({len(notable)}"
            + (f"; the first {PROBLEMS_SHOWN}" if len(notable) > PROBLEMS_SHOWN else "")
            + "; --all lists every server):"
        )
        lines.extend(server_line(instance) for instance in notable[:PROBLEMS_SHOWN])
    cap = None if every else PROBLEMS_SHOWN
    if status.data_servers_invalid:
        invalid = sorted(status.data_servers_invalid.items())
        lines.append(f"  invalid ({len(invalid)})")
        lines.extend(f"    {k}: {v}" for k, v in invalid[:cap])
        lines.extend(_more(len(invalid), cap, "    "))
    shared = status.shared_targets()
    if shared:
        # Squatting, or two servers given one address: either way not what was meant.
        lines.append("  one address claimed by several ids (squatting, or a misconfiguration)")
        lines.extend(
            f"    {target}: {_some(ids) if cap else ', '.join(ids)}"
            for target, ids in list(shared.items())[:cap]
        )
        lines.extend(_more(len(shared), cap, "    "))
    if status.maintenance:
        lines.append(f"maintenance ({len(status.maintenance)}):")
        # Marker nodes are named by whoever wrote them: measured as they will show.
        keys = {key: escape_controls(key) for key in status.maintenance}
        width = max(len(shown) for shown in keys.values())
        for key in sorted(status.maintenance)[:cap]:
            marker = status.maintenance[key]
            where = "registered" if key in status.data_servers else "not registered"
            if marker.readable:
                when = "?" if marker.set_at is None else _when(marker.set_at)
                detail = f"{marker.reason}  (set {when} by {marker.by or '?'})"
            else:
                detail = f"UNREADABLE marker ({marker.problem}): applied anyway"
            lines.append(f"  {keys[key]:<{width}}  {where:<14}  {detail}")
        lines.extend(_more(len(status.maintenance), cap, "  "))

    if diff.in_sync:
        lines.append("differences: none")
        return _report(lines)
    lines.append("differences:")
    if diff.no_leader:
        lines.append("  no leader elected")
    if diff.heartbeat_missing:
        lines.append("  heartbeat missing: no leader is publishing")
    if diff.published_missing:
        lines.append(f"  published list {status.published.error}")
    lines.extend(f"  leader mismatch: {m}" for m in diff.leader_mismatch)
    if diff.registered_not_published:
        lines.append(f"  registered, not published: {_some(diff.registered_not_published)}")
    if diff.published_not_registered:
        lines.append(f"  published, not registered: {_some(diff.published_not_registered)}")
    for mismatch in diff.mismatched[:cap]:
        changes = ", ".join(
            f"{name} {_plain(registered)} -> {_plain(published)}"
            for name, (registered, published) in sorted(mismatch.fields.items())
        )
        lines.append(f"  differs {mismatch.id} (registered -> published): {changes}")
    lines.extend(_more(len(diff.mismatched), cap, "  "))
    return _report(lines)
