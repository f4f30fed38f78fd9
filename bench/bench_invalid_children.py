"""Malformed children under /data_servers: what they cost the leader's MembershipWatcher.

Issue 21, item 7: the leader's bookkeeping of invalid children must be linear, "50,000
malformed children cost at most 1 s on the leader". Runs its own standalone ZooKeeper
(the Debian server, through discovery.testing, as the tests do). For N = 500 (the
baseline) and 50,000 malformed children in a directory of their own (a quarter each: a
document cut short, so not JSON; a string where ``port``'s integer belongs; an ``id``
other than the znode's name; a persistent node whose document says ``serviceType
DYNAMIC``) beside 100 valid (ephemeral) registrations:

* **read**: ZooKeeper's part alone, as the watcher's full read does it: the list of
  children, then :func:`discovery.zk.multiread.read_many` (multiRead) of every child; wall
  time and this process's CPU time (kazoo's threads included);
* **decode**: :func:`discovery.zk.membership.decode_child` of every child read, CPU (what
  every child costs, valid or not);
* **full refresh**: a real ``MembershipWatcher`` started on the directory (list, read,
  decode, bookkeeping, first change set): wall, CPU, the longest stretch the event loop
  ran nothing else (a 5 ms heartbeat task's largest lateness), and the log records the
  watcher wrote. "Beyond the read" is the full refresh minus the read;
* **single changes**, with the N malformed children present: a valid child added and
  removed, a malformed child added, fixed (a PERMANENT document), broken again and
  removed; wall time from the write sent to the change set in hand, and the watcher's
  own refresh time (its ``discovery_membership_refresh_seconds``, the one child's read
  included);
* **reference**: the same read and full refresh of a directory of 50,000 valid
  registrations and no malformed one (what a healthy fleet of that size costs);
* **old vs new bookkeeping**, without ZooKeeper: the same decoded children handed to the
  current watcher and to the watcher of 17279ab (``bench/legacy_membership.py``), whose
  full refresh copied the invalid dict once per skipped child: CPU of one full refresh
  (median of 3) at n = 500 to 20,000 malformed children and of the current one at
  50,000 (the old one is quadratic: extrapolated there, as it would take many seconds
  per run), then of one more malformed child added and removed among 50,000.

Log records are counted by a handler on ``discovery.zk.membership`` (created, not written
out: the old code's 50,000 lines would also have cost their I/O). Prints the figures and
writes ``bench/results/invalid_children.json``; about a minute and a half.

    .venv/bin/python bench/bench_invalid_children.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

from common import write_results
from kazoo.client import KazooClient
from legacy_membership import LegacyMembershipWatcher
from prometheus_client import CollectorRegistry

from discovery.config import ZkConfig
from discovery.instance import InstancePayload, ServiceInstance
from discovery.testing import ZooKeeperEnsemble
from discovery.zk.memberread import ChildReader
from discovery.zk.membership import (
    MembershipChange,
    MembershipSubscription,
    MembershipWatcher,
    decode_child,
)
from discovery.zk.multiread import read_many
from discovery.zk.session import ZkSession

RESULTS = Path(__file__).resolve().parent / "results" / "invalid_children.json"
SESSION_TIMEOUT = 30.0
VALID = 100
BATCH = 2000
WAIT = 60.0
GAP = 0.08  # quiet seconds before each single change (the coalescing window is 0.05)
BOUND_MS = 1000.0  # the bound for 50,000 malformed children
REPEATS = 3  # full refreshes per size in the bookkeeping comparison (median reported)


def child_name(index: int, kind: str) -> str:
    """A data server id as long as a real default one (``ds-<host>-<port>``)."""
    host = f"ip-10-{index // 62500 % 256}-{index // 250 % 250}-{index % 250}"
    return f"ds-{kind}-{host}.ec2.internal-9001"


def document(name: str, index: int, service_type: str = "DYNAMIC") -> dict[str, Any]:
    payload = InstancePayload.from_dict(
        {
            "shard": index % 500,
            "replica": index // 500 % 3,
            "docs": 1_234_567,
            "version": "2024.06.1",
            "state": "serving",
        }
    )
    address = f"10.{index // 62500 % 256}.{index // 250 % 250}.{index % 250}"
    instance = ServiceInstance.create("data_servers", name, address, 9001, payload)
    return {**instance.to_dict(), "serviceType": service_type}


def encode(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def malformed(index: int) -> tuple[str, bytes]:
    """Child ``index``'s name and bad data: one of four kinds in turn."""
    name = child_name(index, "bad")
    doc = document(name, index)
    kind = index % 4
    if kind == 0:
        return name, encode(doc)[:150]  # cut short: not JSON
    if kind == 1:
        doc["port"] = "9001"  # a string where an integer belongs
    elif kind == 2:
        doc["id"] = child_name(index, "other")  # another server's id
    # kind 3: a well-formed DYNAMIC document, but in a persistent node
    return name, encode(doc)


EXPECTED_REASONS = {0: "malformed", 1: "malformed", 2: "id_mismatch", 3: "persistent_dynamic"}


def populate(hosts: str, path: str, count: int, valid: int) -> tuple[KazooClient, float]:
    """Create ``count`` malformed (persistent) and ``valid`` valid (ephemeral) children
    with pipelined async creates; the client owns the ephemeral ones."""
    client = KazooClient(hosts=hosts, timeout=SESSION_TIMEOUT)
    client.start(timeout=30)
    client.ensure_path(path)
    started = time.monotonic()
    for first in range(0, count, BATCH):
        results = [
            client.create_async(f"{path}/{name}", data)
            for name, data in map(malformed, range(first, min(count, first + BATCH)))
        ]
        for result in results:
            result.get(timeout=WAIT)
    for first in range(0, valid, BATCH):
        results = [
            client.create_async(f"{path}/{name}", encode(document(name, i)), ephemeral=True)
            for i, name in (
                (i, child_name(i, "ok")) for i in range(first, min(valid, first + BATCH))
            )
        ]
        for result in results:
            result.get(timeout=WAIT)
    return client, time.monotonic() - started


class RecordCounter(logging.Handler):
    """Counts the records of ``discovery.zk.membership`` (never writes them out)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


class StallMonitor:
    """The longest the event loop went without running this task when it was due."""

    def __init__(self, period: float = 0.005) -> None:
        self._period = period
        self.worst = 0.0
        self._task: asyncio.Task[None] | None = None

    def __enter__(self) -> StallMonitor:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self._period
            await asyncio.sleep(self._period)
            self.worst = max(self.worst, loop.time() - due)


def ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def summary(values_ms: list[float]) -> dict[str, float]:
    ordered = sorted(values_ms)
    return {
        "p50_ms": round(statistics.median(ordered), 2),
        "max_ms": round(ordered[-1], 2),
        "mean_ms": round(statistics.fmean(ordered), 2),
    }


async def until(
    subscription: MembershipSubscription, done: Callable[[MembershipChange], bool]
) -> MembershipChange:
    async with asyncio.timeout(WAIT):
        async for change in subscription:
            if done(change):
                return change
    raise RuntimeError("the membership watcher closed")


async def measure_zookeeper(
    hosts: str, path: str, count: int, valid: int, cycles: int, records: RecordCounter
) -> dict[str, Any]:
    """Read, decode, full refresh and single changes against the real ZooKeeper."""
    config = ZkConfig(hosts=hosts, session_timeout=SESSION_TIMEOUT)
    session, writer = ZkSession.from_config(config), ZkSession.from_config(config)
    await asyncio.gather(session.start(), writer.start())
    try:
        # ZooKeeper's part, as the watcher's full read does it: list, then multiRead.
        wall0, cpu0 = time.perf_counter(), time.process_time()
        names = await session.get_children(path)
        listed = time.perf_counter(), time.process_time()
        paths = [f"{path}/{name}" for name in sorted(names)]
        raw = await read_many(session, paths)
        wall1, cpu1 = time.perf_counter(), time.process_time()
        read = {
            "wall_ms": ms(wall1 - wall0),
            "cpu_ms": ms(cpu1 - cpu0),
            "list_wall_ms": ms(listed[0] - wall0),
            "multiread_wall_ms": ms(wall1 - listed[0]),
        }
        names = sorted(names)
        cpu0 = time.process_time()
        reasons: Counter[str] = Counter()
        for name, entry in zip(names, raw, strict=True):
            assert entry is not None
            decoded = decode_child(name, *entry)
            reasons[decoded.split(":", 1)[0] if isinstance(decoded, str) else "valid"] += 1
        decode_ms = ms(time.process_time() - cpu0)
        expected = Counter(EXPECTED_REASONS[i % 4] for i in range(count))
        assert reasons == {**expected, "valid": valid}, reasons
        del raw

        registry = CollectorRegistry()
        watcher = MembershipWatcher(session, path, registry=registry)
        records.count = 0
        with StallMonitor() as stalls:
            await asyncio.sleep(0.05)  # the monitor's first beat
            wall0, cpu0 = time.perf_counter(), time.process_time()
            await watcher.start()
            wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
            await asyncio.sleep(0.05)
        assert len(watcher.invalid) == count
        assert len(watcher.members) == valid
        full = {
            "wall_ms": ms(wall),
            "cpu_ms": ms(cpu),
            "max_loop_stall_ms": ms(stalls.worst),
            "log_records": records.count,
        }
        beyond = {
            "wall_ms": round(full["wall_ms"] - read["wall_ms"], 2),
            "cpu_ms": round(full["cpu_ms"] - read["cpu_ms"], 2),
        }
        try:
            singles = await single_changes(watcher, writer, registry, path, cycles)
        finally:
            await watcher.aclose()
        return {
            "children": len(names),
            "malformed": count,
            "valid": valid,
            "reasons": dict(reasons),
            "read": read,
            "decode_cpu_ms": decode_ms,
            "full_refresh": full,
            "beyond_read": beyond,
            "single_changes": singles,
        }
    finally:
        await asyncio.gather(session.aclose(), writer.aclose())


async def single_changes(
    watcher: MembershipWatcher,
    writer: ZkSession,
    registry: CollectorRegistry,
    path: str,
    cycles: int,
) -> dict[str, Any]:
    """Each kind of change ``cycles`` times: wall (write sent -> change set in hand) and
    the watcher's refresh time for it."""
    if not cycles:
        return {}
    subscription = watcher.subscribe()
    await anext(subscription)  # the current view

    def refresh_sum() -> float:
        return registry.get_sample_value("discovery_membership_refresh_seconds_sum") or 0.0

    wall: dict[str, list[float]] = {}
    refresh: dict[str, list[float]] = {}

    async def step(
        kind: str, write: Callable[[], Awaitable[Any]], done: Callable[[MembershipChange], bool]
    ) -> None:
        await asyncio.sleep(GAP)  # a quiet spell: a lone change is read at once
        refreshed = refresh_sum()
        sent = time.perf_counter()
        await write()
        await until(subscription, done)
        wall.setdefault(kind, []).append((time.perf_counter() - sent) * 1000)
        refresh.setdefault(kind, []).append((refresh_sum() - refreshed) * 1000)

    for cycle in range(cycles):
        index = 900_000 + cycle
        good, bad = child_name(index, "new"), child_name(index, "newbad")
        good_data = encode(document(good, index))
        fixed = encode(document(bad, index, service_type="PERMANENT"))
        broken = encode({**document(bad, index, "PERMANENT"), "port": "9001"})
        steps = [
            (
                "valid added",
                partial(writer.create, f"{path}/{good}", good_data, ephemeral=True),
                partial(added, good),
            ),
            ("valid removed", partial(writer.delete, f"{path}/{good}"), partial(removed, good)),
            # good's document in another node: an id mismatch
            (
                "malformed added",
                partial(writer.create, f"{path}/{bad}", good_data),
                partial(skipped, bad),
            ),
            ("malformed fixed", partial(writer.set, f"{path}/{bad}", fixed), partial(added, bad)),
            (
                "fixed broken again",
                partial(writer.set, f"{path}/{bad}", broken),
                partial(broke, bad),
            ),
            ("malformed removed", partial(writer.delete, f"{path}/{bad}"), partial(cleared, bad)),
        ]
        for kind, write, done in steps:
            await step(kind, write, done)
    subscription.close()
    return {
        kind: {"wall": summary(wall[kind]), "watcher_refresh": summary(refresh[kind])}
        for kind in wall
    }


def added(name: str, change: MembershipChange) -> bool:
    return name in change.added


def removed(name: str, change: MembershipChange) -> bool:
    return name in change.removed


def skipped(name: str, change: MembershipChange) -> bool:
    return name in change.invalid


def broke(name: str, change: MembershipChange) -> bool:
    return name in change.removed and name in change.invalid


def cleared(name: str, change: MembershipChange) -> bool:
    return name not in change.invalid


def stubbed(base: type[MembershipWatcher], reads: dict[str, Any]) -> MembershipWatcher:
    """A watcher of ``base`` whose ZooKeeper reads return ``reads`` (decoded already)."""

    class StubReader:
        async def names(self, watch: Any) -> list[str]:
            return list(reads)

        async def read_all(self, children: list[str], watch: Any) -> list[Any]:
            return [reads.get(child) for child in children]

    watcher = base(None, "/data_servers", registry=CollectorRegistry())  # type: ignore[arg-type]
    watcher._reader = StubReader()
    return watcher


async def measure_bookkeeping(
    hosts: str, path: str, sizes: list[int], old_sizes: list[int], records: RecordCounter
) -> dict[str, Any]:
    """CPU of the bookkeeping alone, current vs 17279ab, on the same decoded children."""
    session = ZkSession.from_config(ZkConfig(hosts=hosts, session_timeout=SESSION_TIMEOUT))
    await session.start()
    try:
        names = sorted(await session.get_children(path))
        raw = await read_many(session, [f"{path}/{name}" for name in names])
    finally:
        await session.aclose()
    decoder = ChildReader(None, path)  # type: ignore[arg-type]
    decoded = {
        name: decoder.decode(name, *entry)
        for name, entry in zip(names, raw, strict=True)
        if entry is not None
    }
    del raw
    bad = [name for name, read in decoded.items() if read[0] is None]
    good = {name: read for name, read in decoded.items() if read[0] is not None}
    full: list[dict[str, Any]] = []
    for size in sizes:
        reads = {**good, **{name: decoded[name] for name in bad[:size]}}
        row: dict[str, Any] = {"malformed": size}
        for label, base in (("new", MembershipWatcher), ("old", LegacyMembershipWatcher)):
            if label == "old" and size not in old_sizes:
                continue
            runs = []
            for _ in range(REPEATS):
                watcher = stubbed(base, reads)
                records.count = 0
                cpu0 = time.process_time()
                await watcher._refresh(True, True, set())
                runs.append(ms(time.process_time() - cpu0))
                assert len(watcher.invalid) == size
            row[f"{label}_cpu_ms"] = statistics.median(runs)
            row[f"{label}_cpu_ms_runs"] = runs
            row[f"{label}_log_records"] = records.count
        full.append(row)
        print(f"  bookkeeping, full refresh of {size} malformed: {row}", flush=True)

    # One more malformed child, then its removal, with all of ``bad`` already invalid.
    reads = {**good, **{name: decoded[name] for name in bad}}
    new = stubbed(MembershipWatcher, reads)
    await new._refresh(True, True, set())
    old = stubbed(LegacyMembershipWatcher, reads)
    assert isinstance(old, LegacyMembershipWatcher)
    old.legacy_view.seed(new._view)
    extra = decoded[bad[0]]
    single: dict[str, list[float]] = {}
    for watcher, label in ((new, "new"), (old, "old")):
        for i in range(20):
            child = f"ds-extra-{i}"
            reads[child] = extra
            cpu0 = time.process_time()
            await watcher._refresh(False, False, {child})
            single.setdefault(f"{label}_added", []).append((time.process_time() - cpu0) * 1000)
            del reads[child]
            cpu0 = time.process_time()
            await watcher._refresh(False, False, {child})
            single.setdefault(f"{label}_removed", []).append((time.process_time() - cpu0) * 1000)
        assert len(watcher.invalid) == len(bad)
    return {
        "full_refresh": full,
        "single_change_at": len(bad),
        "single_change_cpu": {kind: summary(values) for kind, values in single.items()},
    }


def extrapolate_old(full: list[dict[str, Any]], size: int) -> float | None:
    """The old bookkeeping's CPU at ``size``, from its largest measured size, as c * n**2."""
    measured = [row for row in full if "old_cpu_ms" in row]
    if not measured:
        return None
    last = max(measured, key=lambda row: row["malformed"])
    return round(last["old_cpu_ms"] * (size / last["malformed"]) ** 2, 0)


def print_row(row: dict[str, Any]) -> None:
    n = row["malformed"] or row["valid"]
    print(
        f"N={n}: read {row['read']['wall_ms']:.0f} ms ({row['read']['cpu_ms']:.0f} ms CPU), "
        f"decode {row['decode_cpu_ms']:.0f} ms CPU; full refresh "
        f"{row['full_refresh']['wall_ms']:.0f} ms ({row['full_refresh']['cpu_ms']:.0f} ms CPU, "
        "loop stall max "
        f"{row['full_refresh']['max_loop_stall_ms']:.0f} ms, "
        f"{row['full_refresh']['log_records']} log records); beyond the read "
        f"{row['beyond_read']['wall_ms']:.0f} ms ({row['beyond_read']['cpu_ms']:.0f} ms CPU)",
        flush=True,
    )
    for kind, figures in row["single_changes"].items():
        print(
            f"    {kind:<19} wall p50 {figures['wall']['p50_ms']:6.2f} ms max "
            f"{figures['wall']['max_ms']:6.2f}; watcher refresh p50 "
            f"{figures['watcher_refresh']['p50_ms']:5.2f} ms max "
            f"{figures['watcher_refresh']['max_ms']:5.2f}",
            flush=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=None, help="values of N")
    parser.add_argument("--cycles", type=int, default=10, help="single-change cycles per N")
    parser.add_argument("--quick", action="store_true", help="N = 500 and 5,000 only")
    args = parser.parse_args()
    if args.sizes is None:
        args.sizes = [500, 5000] if args.quick else [500, 50_000]
    old_sizes = [500, 1000, 2000] if args.quick else [500, 1000, 2000, 5000, 10_000, 20_000]
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    records = RecordCounter()
    membership_log = logging.getLogger("discovery.zk.membership")
    membership_log.addHandler(records)
    membership_log.propagate = False

    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="bench-invalid-") as workdir,
        ZooKeeperEnsemble(1, workdir, tick_time_ms=500) as ensemble,
    ):
        clients = []
        try:
            for size in args.sizes:
                path = f"/bench-{size}/data_servers"
                client, populate_s = populate(ensemble.hosts, path, size, VALID)
                clients.append(client)
                print(f"N={size}: created in {populate_s:.1f} s", flush=True)
                row = asyncio.run(
                    measure_zookeeper(ensemble.hosts, path, size, VALID, args.cycles, records)
                )
                row["populate_s"] = round(populate_s, 1)
                print_row(row)
                rows.append(row)
            largest = max(args.sizes)
            # The reference: as many valid registrations, no malformed one.
            path = f"/bench-valid-{largest}/data_servers"
            client, populate_s = populate(ensemble.hosts, path, 0, largest)
            clients.append(client)
            reference = asyncio.run(measure_zookeeper(ensemble.hosts, path, 0, largest, 0, records))
            reference["populate_s"] = round(populate_s, 1)
            print("reference, valid children only:")
            print_row(reference)
            bookkeeping_sizes = sorted(s for s in {*old_sizes, largest} if s <= largest)
            bookkeeping = asyncio.run(
                measure_bookkeeping(
                    ensemble.hosts,
                    f"/bench-{largest}/data_servers",
                    bookkeeping_sizes,
                    old_sizes,
                    records,
                )
            )
        finally:
            for client in clients:
                with contextlib.suppress(Exception):
                    client.stop()
                    client.close()
    largest_row = max(rows, key=lambda r: r["malformed"])
    old_extrapolated = extrapolate_old(bookkeeping["full_refresh"], largest_row["malformed"])
    bookkeeping["old_full_refresh_extrapolated_ms"] = {
        str(largest_row["malformed"]): old_extrapolated
    }
    print()
    print("bookkeeping alone (no ZooKeeper), CPU ms of one full refresh: new vs 17279ab")
    for row in bookkeeping["full_refresh"]:
        old = row.get("old_cpu_ms")
        ratio = f"x{old / row['new_cpu_ms']:.1f}" if old and row["new_cpu_ms"] else ""
        print(
            f"  {row['malformed']:>6}: new {row['new_cpu_ms']:8.1f} ms "
            f"({row['new_log_records']} log records)"
            + (f", old {old:9.1f} ms ({row['old_log_records']} log records) {ratio}" if old else "")
        )
    print(f"  old at {largest_row['malformed']}: ~{old_extrapolated} ms (extrapolated as n^2)")
    for kind, figures in bookkeeping["single_change_cpu"].items():
        print(
            f"  one change at {bookkeeping['single_change_at']} invalid, {kind}: "
            f"p50 {figures['p50_ms']:.3f} ms"
        )
    beyond, same = largest_row["beyond_read"], reference["beyond_read"]
    print(
        f"\nN={largest_row['malformed']} malformed: full refresh beyond the ZooKeeper read "
        f"{beyond['wall_ms']:.0f} ms wall, {beyond['cpu_ms']:.0f} ms CPU "
        f"(bound {BOUND_MS:.0f} ms); {reference['valid']} valid children: "
        f"{same['wall_ms']:.0f} ms wall, "
        f"{same['cpu_ms']:.0f} ms CPU"
    )
    write_results(
        RESULTS,
        "invalid_children",
        vars(args),
        zookeeper="Debian 3.8, standalone (discovery.testing), default jute.maxbuffer",
        notes=(
            "rows: one directory of N malformed children (persistent; a quarter each: a "
            "document cut short, port a string, an id other than the znode name, a "
            "persistent DYNAMIC document) and 100 valid ephemeral registrations. read: "
            "read_many (multiRead) of every child alone, wall and this process's CPU "
            "(kazoo threads included). decode_cpu_ms: decode_child of every child. "
            "full_refresh: MembershipWatcher.start() (list, multiRead, decode, "
            "bookkeeping, first change set); max_loop_stall_ms: a 5 ms heartbeat task's "
            "largest lateness; log_records: records of discovery.zk.membership created (not "
            "written out). beyond_read: full_refresh minus read. single_changes: with the "
            "N malformed children present, wall from the write sent (another session, "
            "same process) to the change set in hand, and the watcher's "
            "discovery_membership_refresh_seconds for it (the child's read included). "
            "bookkeeping: no ZooKeeper, the same decoded children handed to the current "
            "watcher (new) and to bench/legacy_membership.py, the watcher of 17279ab "
            "(old): CPU of one full refresh (list and reads stubbed; median of 3 runs), "
            "and of one more malformed child added then removed with all of them invalid "
            "(p50 of 20); the old full "
            "refresh at the largest N is extrapolated from its largest measured size as "
            "c * n^2."
        ),
        rows=rows,
        valid_reference=reference,
        bookkeeping=bookkeeping,
        bound_ms=BOUND_MS,
        wall_s=round(time.monotonic() - started, 1),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
