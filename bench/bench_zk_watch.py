"""Watching /data_servers: one-shot child watch + re-list, or a persistent recursive watch.

What the leader pays per change as the directory grows to N = 500, 5,000 and 50,000
children. Runs its own standalone ZooKeeper (the Debian 3.8 server, as the tests do).
A *writer* subprocess owns the N EPHEMERAL children (one session, ServiceInstance JSON
of about 350 bytes each, created with pipelined async creates) and makes the changes
when told; this process only watches, so its CPU time is the watcher's alone:

* **re-list** (the baseline, what :class:`~discovery.zk.membership.MembershipWatcher`
  does): a one-shot child watch; each event wakes one thread that re-lists with
  ``get_children`` (re-arming the watch) and diffs the names against the last list;
* **persistent**: :class:`~discovery.zk.watch.PersistentRecursiveWatch`, whose events
  name the child.

For each N, ``--changes`` single deletions (each child is re-created afterwards,
untimed, so N stays put) measure the wall time from the delete being sent to the
result in hand (the re-list's diff naming the child, or the event), the watcher
process's CPU time over that span, and the bytes its kazoo connection read (counted
at the socket). Then bursts of ``--burst`` deletions sent at once: time until the
watcher knows of every one, re-lists made, CPU and bytes; the re-list is run both
immediately on each event and with MembershipWatcher's 50 ms coalescing window.
The ZooKeeper JVM's own CPU time is read from /proc for each phase.

Prints tables and writes ``bench/results/zk_watch.json``.

    .venv/bin/python bench/bench_zk_watch.py [--quick] [--sizes 500 5000 50000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from common import nearest_rank, write_results
from kazoo.client import KazooClient

from discovery.config import ZkConfig
from discovery.instance import InstancePayload, ServiceInstance
from discovery.testing import ZooKeeperEnsemble
from discovery.zk.membership import MembershipChange, MembershipSubscription, MembershipWatcher
from discovery.zk.session import ZkSession
from discovery.zk.watch import DELETED, PersistentRecursiveWatch

log = logging.getLogger("bench_zk_watch")
RESULTS = Path(__file__).resolve().parent / "results" / "zk_watch.json"
SESSION_TIMEOUT = 30.0
WAIT = 60.0
BATCH = 2000
COALESCE_WINDOW = 0.05  # MembershipWatcher's default
CLK_TCK = os.sysconf("SC_CLK_TCK")


def child_name(index: int) -> str:
    """A data server id as long as a real default one (``ds-<host>-<port>``)."""
    return f"ds-ip-10-{index // 62500 % 256}-{index // 250 % 250}-{index % 250}.ec2.internal-9001"


def child_data(index: int) -> bytes:
    payload = InstancePayload.from_dict(
        {
            "shard": index % 500,
            "replica": index // 500,
            "docs": 1_234_567,
            "version": "2024.06.1",
            "state": "serving",
            "@class": "com.example.search.discovery.DataServerPayload",
        }
    )
    address = f"10.{index // 62500 % 256}.{index // 250 % 250}.{index % 250}"
    return ServiceInstance.create(
        "data_servers", child_name(index), address, 9001, payload
    ).to_json()


# -- the writer subprocess ------------------------------------------------------------


def writer_main(hosts: str) -> int:
    """Owns the children; one JSON command per stdin line, one JSON answer per line."""
    client = KazooClient(hosts=hosts, timeout=SESSION_TIMEOUT)
    client.start(timeout=30)
    out = sys.stdout
    for line in sys.stdin:
        command = json.loads(line)
        op, path = command["op"], command.get("path", "")
        indexes: list[int] = command.get("indexes", [])
        answer: dict[str, Any] = {}
        if op == "populate":
            client.ensure_path(path)
            started = time.monotonic()
            count = command["count"]
            sizes = []
            for first in range(0, count, BATCH):
                batch = range(first, min(count, first + BATCH))
                data = [child_data(i) for i in batch]
                sizes += [len(d) for d in data]
                results = [
                    client.create_async(f"{path}/{child_name(i)}", d, ephemeral=True)
                    for i, d in zip(batch, data, strict=True)
                ]
                for result in results:
                    result.get(timeout=WAIT)
            answer = {"s": time.monotonic() - started, "data_bytes_mean": statistics.mean(sizes)}
        elif op in ("delete", "create"):
            targets = [f"{path}/{child_name(i)}" for i in indexes]
            sent = time.monotonic()
            if op == "delete":
                results = [client.delete_async(target) for target in targets]
            else:
                results = [
                    client.create_async(target, child_data(i), ephemeral=True)
                    for target, i in zip(targets, indexes, strict=True)
                ]
            for result in results:
                result.get(timeout=WAIT)
            answer = {"sent": sent, "acked": time.monotonic()}
        elif op == "quit":
            break
        out.write(json.dumps(answer) + "\n")
        out.flush()
    client.stop()
    client.close()
    return 0


class Writer:
    """The bench's side of the writer subprocess."""

    def __init__(self, hosts: str) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, __file__, "--writer", hosts],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def send(self, op: str, path: str = "", **fields: Any) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps({"op": op, "path": path, **fields}) + "\n")
        self._proc.stdin.flush()

    def answer(self) -> dict[str, Any]:
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError("the writer subprocess died")
        result: dict[str, Any] = json.loads(line)
        return result

    def call(self, op: str, path: str = "", **fields: Any) -> dict[str, Any]:
        self.send(op, path, **fields)
        return self.answer()

    def close(self) -> None:
        try:
            self.send("quit")
            self._proc.wait(30)
        except Exception:
            self._proc.kill()
            self._proc.wait()


# -- measuring ------------------------------------------------------------------------


class ByteCounter:
    """Counts every byte a kazoo client's connection reads from its socket."""

    def __init__(self, client: KazooClient) -> None:
        self.total = 0
        connection = client._connection
        original = connection._read

        def counting_read(length: int, timeout: float) -> bytes:
            data: bytes = original(length, timeout)
            self.total += len(data)
            return data

        connection._read = counting_read


def jvm_cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of a process so far (0 if unknown)."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class Relister:
    """The baseline watcher: a one-shot child watch and a re-list on every event.

    One thread re-lists (with the watch re-armed) when woken, like MembershipWatcher's
    refresh task: events during a re-list are folded into the next one, and with a
    ``window`` re-lists are at least that far apart (leading edge: the first change
    after a quiet spell is read at once).
    """

    def __init__(self, client: KazooClient, path: str, counter: ByteCounter, window: float):
        self._client = client
        self._path = path
        self._counter = counter
        self._window = window
        self._wake = threading.Event()
        self._cond = threading.Condition()
        self._stopped = False
        self.known: set[str] = set()
        self.relists: list[dict[str, Any]] = []
        self.first_event_at: float | None = None
        self._thread = threading.Thread(target=self._run, name="relister", daemon=True)

    def start(self) -> dict[str, float]:
        """The initial full list (also the cost of a resync); starts following."""
        started, cpu, read = time.monotonic(), time.process_time(), self._counter.total
        self.known = set(self._client.get_children(self._path, watch=self._on_event))
        figures = {
            "ms": (time.monotonic() - started) * 1000,
            "cpu_ms": (time.process_time() - cpu) * 1000,
            "bytes": self._counter.total - read,
        }
        self._thread.start()
        return figures

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()
        self._thread.join(WAIT)

    def _on_event(self, event: Any) -> None:  # kazoo's callback thread
        if self.first_event_at is None:
            self.first_event_at = time.monotonic()
        self._wake.set()

    def _run(self) -> None:
        last = -1e9
        while True:
            self._wake.wait()
            if self._stopped:
                return
            delay = last + self._window - time.monotonic()
            if delay > 0:
                time.sleep(delay)  # the coalescing window, as MembershipWatcher's
            self._wake.clear()
            last = started = time.monotonic()
            cpu = time.process_time()
            names = self._client.get_children(self._path, watch=self._on_event)
            current = set(names)
            removed, added = self.known - current, current - self.known
            done = time.monotonic()
            record = {
                "started": started,
                "done": done,
                "cpu_done": time.process_time(),
                "relist_cpu_s": time.process_time() - cpu,
                "bytes_done": self._counter.total,
                "removed": removed,
                "added": added,
                "names": len(names),
            }
            with self._cond:
                self.known = current
                self.relists.append(record)
                self._cond.notify_all()

    def wait(self, predicate: Callable[[Iterable[str]], bool]) -> dict[str, Any]:
        """Wait until ``predicate(known)`` holds; returns the re-list that made it so."""
        with self._cond:
            if not self._cond.wait_for(lambda: predicate(self.known), WAIT):
                raise TimeoutError("the re-list watcher did not catch up")
            return self.relists[-1]


class EventLog:
    """The persistent watch's callback: (arrival, kind, name, process CPU, bytes)."""

    def __init__(self, counter: ByteCounter) -> None:
        self._counter = counter
        self._cond = threading.Condition()
        self.events: list[tuple[float, str, str, float, int]] = []

    def __call__(self, kind: str, path: str) -> None:  # kazoo's callback thread
        name = path.rsplit("/", 1)[-1]
        entry = (time.monotonic(), kind, name, time.process_time(), self._counter.total)
        with self._cond:
            self.events.append(entry)
            self._cond.notify_all()

    def wait(
        self, kind: str, names: set[str], start: int
    ) -> list[tuple[float, str, str, float, int]]:
        """Wait for a ``kind`` event of every one of ``names`` (from index ``start``)."""

        def seen() -> bool:
            return names <= {e[2] for e in self.events[start:] if e[1] == kind}

        with self._cond:
            if not self._cond.wait_for(seen, WAIT):
                raise TimeoutError("the persistent watch did not deliver")
            return [e for e in self.events[start:] if e[1] == kind and e[2] in names]


def none_of(names: set[str]) -> Callable[[Iterable[str]], bool]:
    return lambda known: names.isdisjoint(known)


def all_of(names: set[str]) -> Callable[[Iterable[str]], bool]:
    return lambda known: names.issubset(known)


def removes(name: str) -> Callable[[MembershipChange], bool]:
    return lambda change: name in change.removed


def adds(name: str) -> Callable[[MembershipChange], bool]:
    return lambda change: name in change.added


def summary(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(statistics.median(values), 3),
        "p99": round(nearest_rank(values, 0.99), 3),
        "mean": round(statistics.fmean(values), 3),
        "max": round(max(values), 3),
    }


def cycle_costs(
    phase: tuple[float, int], counter: ByteCounter, cycles: int, gap: float
) -> dict[str, float]:
    """CPU and bytes of a whole phase per delete + re-create cycle, trailing work included
    (MembershipWatcher, say, publishes a removal before its coalesced re-list)."""
    time.sleep(gap)  # the last cycle's trailing work
    cpu0, bytes0 = phase
    return {
        "cycle_cpu_ms": round((time.process_time() - cpu0) * 1000 / cycles, 2),
        "cycle_bytes": round((counter.total - bytes0) / cycles),
    }


def measure_relist_singles(
    writer: Writer,
    path: str,
    relister: Relister,
    counter: ByteCounter,
    victims: list[int],
    zk_pid: int | None,
    gap: float,
) -> dict[str, Any]:
    wall: list[float] = []
    event_ms: list[float] = []
    relist_ms: list[float] = []
    cpu: list[float] = []
    relist_cpu: list[float] = []
    received: list[float] = []
    jvm0, phase = jvm_cpu_s(zk_pid), (time.process_time(), counter.total)
    for index in victims:
        time.sleep(gap)  # a quiet spell: a lone change, not part of a burst
        name = child_name(index)
        relister.first_event_at = None
        cpu0, bytes0 = time.process_time(), counter.total
        writer.send("delete", path, indexes=[index])
        record = relister.wait(none_of({name}))
        sent = writer.answer()["sent"]
        assert name in record["removed"]
        wall.append((record["done"] - sent) * 1000)
        if relister.first_event_at is not None:
            event_ms.append((relister.first_event_at - sent) * 1000)
        relist_ms.append((record["done"] - record["started"]) * 1000)
        cpu.append((record["cpu_done"] - cpu0) * 1000)
        relist_cpu.append(record["relist_cpu_s"] * 1000)
        received.append(record["bytes_done"] - bytes0)
        writer.call("create", path, indexes=[index])
        relister.wait(all_of({name}))
    cycles = len(victims)
    return {
        "wall_ms": summary(wall),
        "watch_event_ms": summary(event_ms),
        "relist_ms": summary(relist_ms),
        "cpu_ms": summary(cpu),
        "relist_cpu_ms": summary(relist_cpu),
        "bytes_received": summary([float(b) for b in received]),
        **cycle_costs(phase, counter, cycles, gap),
        "server_cpu_ms_per_cycle": round((jvm_cpu_s(zk_pid) - jvm0) * 1000 / cycles, 2),
    }


def measure_persistent_singles(
    writer: Writer,
    path: str,
    log_: EventLog,
    counter: ByteCounter,
    victims: list[int],
    zk_pid: int | None,
    gap: float,
) -> dict[str, Any]:
    wall, cpu, received = [], [], []
    jvm0, phase = jvm_cpu_s(zk_pid), (time.process_time(), counter.total)
    for index in victims:
        time.sleep(gap)  # a quiet spell: a lone change, not part of a burst
        name = child_name(index)
        start = len(log_.events)
        cpu0, bytes0 = time.process_time(), counter.total
        writer.send("delete", path, indexes=[index])
        (arrived, _, _, cpu_at, bytes_at), *_ = log_.wait(DELETED, {name}, start)
        sent = writer.answer()["sent"]
        wall.append((arrived - sent) * 1000)
        cpu.append((cpu_at - cpu0) * 1000)
        received.append(bytes_at - bytes0)
        start = len(log_.events)
        writer.call("create", path, indexes=[index])
        log_.wait("created", {name}, start)
    return {
        "wall_ms": summary(wall),
        "cpu_ms": summary(cpu),
        "bytes_received": summary([float(b) for b in received]),
        **cycle_costs(phase, counter, len(victims), gap),
        "server_cpu_ms_per_cycle": round((jvm_cpu_s(zk_pid) - jvm0) * 1000 / len(victims), 2),
    }


def measure_relist_burst(
    writer: Writer,
    path: str,
    relister: Relister,
    counter: ByteCounter,
    victims: list[int],
    zk_pid: int | None,
    gap: float,
) -> dict[str, Any]:
    time.sleep(gap)  # a quiet spell before the burst
    names = {child_name(i) for i in victims}
    relists0, cpu0, bytes0, jvm0 = (
        len(relister.relists),
        time.process_time(),
        counter.total,
        (jvm_cpu_s(zk_pid)),
    )
    writer.send("delete", path, indexes=victims)
    record = relister.wait(none_of(names))
    answer = writer.answer()
    result = {
        "all_known_ms": round((record["done"] - answer["sent"]) * 1000, 1),
        "writes_acked_ms": round((answer["acked"] - answer["sent"]) * 1000, 1),
        "lag_after_last_ack_ms": round((record["done"] - answer["acked"]) * 1000, 1),
        "relists": len(relister.relists) - relists0,
        "cpu_ms": round((record["cpu_done"] - cpu0) * 1000, 1),
        "bytes_received": record["bytes_done"] - bytes0,
        "server_cpu_ms": round((jvm_cpu_s(zk_pid) - jvm0) * 1000, 1),
    }
    writer.call("create", path, indexes=victims)
    relister.wait(all_of(names))
    return result


def measure_persistent_burst(
    writer: Writer,
    path: str,
    log_: EventLog,
    counter: ByteCounter,
    victims: list[int],
    zk_pid: int | None,
    gap: float,
) -> dict[str, Any]:
    time.sleep(gap)  # a quiet spell before the burst
    names = {child_name(i) for i in victims}
    start, cpu0, bytes0, jvm0 = (
        len(log_.events),
        time.process_time(),
        counter.total,
        (jvm_cpu_s(zk_pid)),
    )
    writer.send("delete", path, indexes=victims)
    events = log_.wait(DELETED, names, start)
    answer = writer.answer()
    last = max(events)
    result = {
        "all_known_ms": round((last[0] - answer["sent"]) * 1000, 1),
        "writes_acked_ms": round((answer["acked"] - answer["sent"]) * 1000, 1),
        "lag_after_last_ack_ms": round((last[0] - answer["acked"]) * 1000, 1),
        "relists": 0,
        "cpu_ms": round((last[3] - cpu0) * 1000, 1),
        "bytes_received": last[4] - bytes0,
        "server_cpu_ms": round((jvm_cpu_s(zk_pid) - jvm0) * 1000, 1),
    }
    start = len(log_.events)
    writer.call("create", path, indexes=victims)
    log_.wait("created", names, start)
    return result


class CountingSession(ZkSession):
    """A ZkSession that counts the ZooKeeper operations it issues (as bench_scale's)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ops: Counter[str] = Counter()

    async def call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self.ops[method.__name__.removesuffix("_async")] += 1
        return await super().call(method, *args, **kwargs)


async def _until(
    subscription: MembershipSubscription, done: Callable[[MembershipChange], bool]
) -> MembershipChange:
    async with asyncio.timeout(WAIT):
        async for change in subscription:
            if done(change):
                return change
    raise RuntimeError("the membership watcher closed")


async def measure_membership(
    hosts: str,
    writer: Writer,
    path: str,
    victims: list[int],
    bursts: list[list[int]],
    zk_pid: int | None,
    gap: float,
) -> dict[str, Any]:
    """The real MembershipWatcher (ZkSession, asyncio, per-child data watches, 50 ms
    coalescing): delete sent -> the change set naming the child published."""
    session = CountingSession.from_config(ZkConfig(hosts=hosts, session_timeout=SESSION_TIMEOUT))
    assert isinstance(session, CountingSession)
    await session.start()
    counter = ByteCounter(session.client)
    watcher = MembershipWatcher(session, path)
    try:
        started, cpu0 = time.monotonic(), time.process_time()
        await watcher.start()
        initial = {
            "ms": round((time.monotonic() - started) * 1000, 1),
            "cpu_ms": round((time.process_time() - cpu0) * 1000, 1),
            "members": len(watcher.members),
        }
        subscription = watcher.subscribe()
        await anext(subscription)  # the current view
        wall, cpu, received = [], [], []
        jvm0, phase = jvm_cpu_s(zk_pid), (time.process_time(), counter.total)
        lists0 = session.ops["get_children"]
        for index in victims:
            # A quiet spell: a lone change is read at once, not at the end of the
            # coalescing window that the previous re-creation opened.
            await asyncio.sleep(gap)
            name = child_name(index)
            cpu0, bytes0 = time.process_time(), counter.total
            writer.send("delete", path, indexes=[index])
            await _until(subscription, removes(name))
            done, cpu_done, bytes_done = time.monotonic(), time.process_time(), counter.total
            sent = (await asyncio.to_thread(writer.answer))["sent"]
            wall.append((done - sent) * 1000)
            cpu.append((cpu_done - cpu0) * 1000)
            received.append(float(bytes_done - bytes0))
            writer.send("create", path, indexes=[index])
            await _until(subscription, adds(name))
            await asyncio.to_thread(writer.answer)
        singles = {
            "initial_read": initial,
            "wall_ms": summary(wall),
            "cpu_ms": summary(cpu),
            "bytes_received": summary(received),
            **(await asyncio.to_thread(cycle_costs, phase, counter, len(victims), gap)),
            "cycle_relists": round((session.ops["get_children"] - lists0) / len(victims), 2),
            "server_cpu_ms_per_cycle": round((jvm_cpu_s(zk_pid) - jvm0) * 1000 / len(victims), 2),
        }
        runs = []
        for burst in bursts:
            await asyncio.sleep(gap)  # a quiet spell before the burst
            names = {child_name(i) for i in burst}
            cpu0, bytes0, jvm0 = time.process_time(), counter.total, jvm_cpu_s(zk_pid)
            lists0 = session.ops["get_children"]
            writer.send("delete", path, indexes=burst)
            await watcher.wait_until(none_of(names), WAIT)
            done, cpu_done, bytes_done = time.monotonic(), time.process_time(), counter.total
            answer = await asyncio.to_thread(writer.answer)
            runs.append(
                {
                    "all_known_ms": round((done - answer["sent"]) * 1000, 1),
                    "writes_acked_ms": round((answer["acked"] - answer["sent"]) * 1000, 1),
                    "lag_after_last_ack_ms": round((done - answer["acked"]) * 1000, 1),
                    "relists": session.ops["get_children"] - lists0,
                    "cpu_ms": round((cpu_done - cpu0) * 1000, 1),
                    "bytes_received": bytes_done - bytes0,
                    "server_cpu_ms": round((jvm_cpu_s(zk_pid) - jvm0) * 1000, 1),
                }
            )
            writer.send("create", path, indexes=burst)
            await watcher.wait_until(all_of(names), WAIT)
            await asyncio.to_thread(writer.answer)
        subscription.close()
        return {"single": singles, "burst": median_burst(runs)}
    finally:
        await watcher.aclose()
        await session.aclose()


def median_burst(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median time to know of every deletion, plus every run's time."""
    ordered = sorted(runs, key=lambda r: r["all_known_ms"])
    return {**ordered[len(ordered) // 2], "all_known_ms_runs": [r["all_known_ms"] for r in runs]}


def run_size(hosts: str, zk_pid: int | None, size: int, args: argparse.Namespace) -> dict[str, Any]:
    path = f"/bench/data_servers_{size}"
    writer = Writer(hosts)
    clients: list[KazooClient] = []
    try:
        populated = writer.call("populate", path, count=size)
        print(
            f"N={size}: created in {populated['s']:.1f} s "
            f"(data {populated['data_bytes_mean']:.0f} B each)",
            flush=True,
        )
        singles = list(range(0, size, max(1, size // args.changes)))[: args.changes]
        bursts = [
            [(size // 2 + r * args.burst + i) % size for i in range(args.burst)]
            for r in range(args.burst_runs)
        ]
        row: dict[str, Any] = {
            "children": size,
            "create_s": round(populated["s"], 1),
            "child_data_bytes": round(populated["data_bytes_mean"]),
            "child_name_bytes": len(child_name(size - 1)),
        }

        def client() -> tuple[KazooClient, ByteCounter]:
            c = KazooClient(hosts=hosts, timeout=SESSION_TIMEOUT)
            c.start(timeout=30)
            clients.append(c)
            return c, ByteCounter(c)

        # The baseline: one-shot child watch + re-list, immediately on each event.
        c, counter = client()
        relister = Relister(c, path, counter, window=0.0)
        row["full_list"] = {k: round(v, 1) for k, v in relister.start().items()}
        row["relist"] = measure_relist_singles(
            writer, path, relister, counter, singles, zk_pid, args.gap
        )
        row["relist_burst"] = median_burst(
            [
                measure_relist_burst(writer, path, relister, counter, b, zk_pid, args.gap)
                for b in bursts
            ]
        )
        relister.stop()
        # The same, coalesced like MembershipWatcher (bursts only: a lone change is
        # read at once either way).
        c, counter = client()
        relister = Relister(c, path, counter, window=COALESCE_WINDOW)
        relister.start()
        row["relist_coalesced_burst"] = median_burst(
            [
                measure_relist_burst(writer, path, relister, counter, b, zk_pid, args.gap)
                for b in bursts
            ]
        )
        relister.stop()
        # The persistent recursive watch.
        c, counter = client()
        events = EventLog(counter)
        watch = PersistentRecursiveWatch(c, path, events)
        watch.start()
        row["persistent"] = measure_persistent_singles(
            writer, path, events, counter, singles, zk_pid, args.gap
        )
        row["persistent_burst"] = median_burst(
            [
                measure_persistent_burst(writer, path, events, counter, b, zk_pid, args.gap)
                for b in bursts
            ]
        )
        watch.stop()
        # The real MembershipWatcher, for what a refresh costs beyond the re-list.
        membership = asyncio.run(
            measure_membership(hosts, writer, path, singles, bursts, zk_pid, args.gap)
        )
        row["membership"], row["membership_burst"] = membership["single"], membership["burst"]
        row["ratios"] = ratios(row)
        print_row(row)
        return row
    finally:
        writer.close()
        for c in clients:
            c.stop()
            c.close()


def ratios(row: dict[str, Any]) -> dict[str, float | None]:
    """Baseline / persistent (how many times the re-list costs more)."""

    def ratio(a: float, b: float) -> float | None:
        return round(a / b, 1) if b else None

    base, pers = row["relist"], row["persistent"]
    burst, cburst, pburst = (
        row["relist_burst"],
        row["relist_coalesced_burst"],
        row["persistent_burst"],
    )
    return {
        "wall_p50": ratio(base["wall_ms"]["p50"], pers["wall_ms"]["p50"]),
        "wall_p99": ratio(base["wall_ms"]["p99"], pers["wall_ms"]["p99"]),
        "cpu_p50": ratio(base["cpu_ms"]["p50"], pers["cpu_ms"]["p50"]),
        "bytes_p50": ratio(base["bytes_received"]["p50"], pers["bytes_received"]["p50"]),
        "server_cpu_per_cycle": ratio(
            base["server_cpu_ms_per_cycle"], pers["server_cpu_ms_per_cycle"]
        ),
        "burst_all_known": ratio(burst["all_known_ms"], pburst["all_known_ms"]),
        "burst_cpu": ratio(burst["cpu_ms"], pburst["cpu_ms"]),
        "burst_bytes": ratio(burst["bytes_received"], pburst["bytes_received"]),
        "coalesced_burst_all_known": ratio(cburst["all_known_ms"], pburst["all_known_ms"]),
        "coalesced_burst_cpu": ratio(cburst["cpu_ms"], pburst["cpu_ms"]),
        "coalesced_burst_bytes": ratio(cburst["bytes_received"], pburst["bytes_received"]),
        "membership_wall_p50": ratio(row["membership"]["wall_ms"]["p50"], pers["wall_ms"]["p50"]),
        "membership_cpu_p50": ratio(row["membership"]["cpu_ms"]["p50"], pers["cpu_ms"]["p50"]),
        "cycle_cpu": ratio(base["cycle_cpu_ms"], pers["cycle_cpu_ms"]),
        "cycle_bytes": ratio(base["cycle_bytes"], pers["cycle_bytes"]),
        "membership_cycle_cpu": ratio(row["membership"]["cycle_cpu_ms"], pers["cycle_cpu_ms"]),
        "membership_cycle_bytes": ratio(row["membership"]["cycle_bytes"], pers["cycle_bytes"]),
    }


def print_row(row: dict[str, Any]) -> None:
    full = row["full_list"]
    print(
        f"  full list: {full['ms']:.1f} ms, {full['cpu_ms']:.1f} ms CPU, "
        f"{full['bytes'] / 1024:.0f} KiB",
        flush=True,
    )
    for mode in ("relist", "persistent", "membership"):
        r = row[mode]
        print(
            f"  {mode:>10} single: p50 {r['wall_ms']['p50']:.2f} ms p99 {r['wall_ms']['p99']:.2f} "
            f"ms, CPU p50 {r['cpu_ms']['p50']:.2f} ms, rx p50 {r['bytes_received']['p50']:.0f} B, "
            f"server CPU {r['server_cpu_ms_per_cycle']:.2f} ms/cycle",
            flush=True,
        )
    for mode in ("relist_burst", "relist_coalesced_burst", "persistent_burst", "membership_burst"):
        r = row[mode]
        print(
            f"  {mode:>22}: all known {r['all_known_ms']:.1f} ms, {r['relists']} re-lists, "
            f"CPU {r['cpu_ms']:.1f} ms, rx {r['bytes_received'] / 1024:.0f} KiB",
            flush=True,
        )


def table(rows: list[dict[str, Any]], burst: int) -> None:
    print()
    header = (
        f"{'N':>6} | {'mode':<10} | {'p50 ms':>7} {'p99 ms':>7} | {'CPU ms':>6} {'/cycle':>7} | "
        f"{'rx B':>7} {'/cycle':>8} | {'ZK CPU ms/cycle':>15}"
    )
    print(
        "single deletion: wall and CPU from the delete sent to the result in hand (p50); "
        "/cycle: whole delete + re-create cycle, trailing work included"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        for mode in ("relist", "persistent", "membership"):
            r = row[mode]
            print(
                f"{row['children']:>6} | {mode:<10} | {r['wall_ms']['p50']:>7.2f} "
                f"{r['wall_ms']['p99']:>7.2f} | {r['cpu_ms']['p50']:>6.2f} "
                f"{r['cycle_cpu_ms']:>7.2f} | {r['bytes_received']['p50']:>7.0f} "
                f"{r['cycle_bytes']:>8.0f} | {r['server_cpu_ms_per_cycle']:>15.2f}"
            )
    print()
    header = (
        f"{'N':>6} | {'mode':<17} | {'all known ms':>12} {'lag ms':>7} | {'re-lists':>8} | "
        f"{'CPU ms':>7} | {'rx KiB':>8} | {'ZK CPU ms':>9}"
    )
    print(f"burst of {burst} deletions sent at once (median of the runs)")
    print(header)
    print("-" * len(header))
    for row in rows:
        for mode, label in (
            ("relist_burst", "re-list"),
            ("relist_coalesced_burst", "re-list 50ms win"),
            ("persistent_burst", "persistent"),
            ("membership_burst", "MembershipWatcher"),
        ):
            r = row[mode]
            print(
                f"{row['children']:>6} | {label:<17} | {r['all_known_ms']:>12.1f} "
                f"{r['lag_after_last_ack_ms']:>7.1f} | "
                f"{r['relists']:>8} | {r['cpu_ms']:>7.1f} | {r['bytes_received'] / 1024:>8.1f} | "
                f"{r['server_cpu_ms']:>9.1f}"
            )
    print()
    for row in rows:
        q = row["ratios"]
        print(
            f"N={row['children']}: re-list / persistent: wall p50 x{q['wall_p50']} p99 "
            f"x{q['wall_p99']}, CPU x{q['cpu_p50']} (per cycle x{q['cycle_cpu']}), bytes "
            f"x{q['bytes_p50']} (per cycle x{q['cycle_bytes']}), ZK CPU "
            f"x{q['server_cpu_per_cycle']}; burst: time x{q['burst_all_known']} (coalesced "
            f"x{q['coalesced_burst_all_known']}), CPU x{q['burst_cpu']} (coalesced "
            f"x{q['coalesced_burst_cpu']}), bytes x{q['burst_bytes']} (coalesced "
            f"x{q['coalesced_burst_bytes']}). MembershipWatcher / persistent: wall p50 "
            f"x{q['membership_wall_p50']}, CPU x{q['membership_cpu_p50']} (per cycle "
            f"x{q['membership_cycle_cpu']}), bytes per cycle x{q['membership_cycle_bytes']}"
        )


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--writer":
        return writer_main(sys.argv[2])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=None, help="values of N")
    parser.add_argument("--changes", type=int, default=50, help="single deletions per N")
    parser.add_argument("--burst", type=int, default=100, help="deletions per burst")
    parser.add_argument("--burst-runs", type=int, default=3, help="bursts per mode and N")
    parser.add_argument(
        "--gap", type=float, default=0.1, help="quiet seconds before each single change"
    )
    parser.add_argument("--quick", action="store_true", help="N = 500 and 5,000 only")
    args = parser.parse_args()
    if args.sizes is None:
        args.sizes = [500, 5000] if args.quick else [500, 5000, 50000]
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    started = time.monotonic()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-zk-watch-") as workdir:
        ensemble = ZooKeeperEnsemble(1, workdir, tick_time_ms=500)
        with ensemble:
            server = ensemble.servers[0]
            for size in args.sizes:
                rows.append(run_size(ensemble.hosts, server.pid, size, args))
    table(rows, args.burst)
    write_results(
        RESULTS,
        "zk_watch",
        vars(args),
        zookeeper="Debian 3.8.0, standalone, default jute.maxbuffer (0xfffff)",
        notes=(
            "relist: one-shot child watch + get_children (watch re-armed) + set diff per "
            "wake-up, as MembershipWatcher; persistent: discovery.zk.watch "
            "PersistentRecursiveWatch. wall_ms: from the writer subprocess sending the "
            "delete to the diff naming the child / the DELETED event in hand (same "
            "monotonic clock). cpu_ms: this (watcher-only) process's CPU time over that "
            "span, all threads. bytes_received: bytes the watcher's kazoo connection read "
            "over that span (framing included). watch_event_ms (relist): delete sent -> "
            "the one-shot child watch fired. server_cpu_ms_per_cycle: the ZooKeeper JVM's "
            "CPU per delete + re-create cycle, including that mode's reads (10 ms clock "
            "ticks: coarse at small N). p99 is nearest rank (with 50 changes, the largest). "
            "Bursts: time from sending the deletions (pipelined, one session) until the "
            "watcher knows of all of them; relist_coalesced_burst uses MembershipWatcher's "
            "50 ms coalescing window. full_list: the initial (and every resync's) "
            "get_children."
        ),
        rows=rows,
        wall_s=round(time.monotonic() - started, 1),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
