"""Start-up time and memory per simulated data server: fleet mode vs one process each.

Runs a real local ZooKeeper (``DevCluster``), then

* the fleet: ``data-server fleet --count N --procs P`` (default 100 in 2 processes),
* the baseline: ``--baseline-count`` separate ``data-server`` processes (default 10),

and for each measures the time from launch until every server is registered in
ZooKeeper, the resident memory (RSS) of the server processes once all are up, the
threads they run, and the time from SIGTERM until every node is gone. Prints a table
and writes ``bench/results/fleet.json``.

    .venv/bin/python bench/bench_fleet.py [--count 100] [--procs 2] [--docs 2000]
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import machine
from kazoo.client import KazooClient

from discovery.testing import DevCluster

RESULTS = Path(__file__).resolve().parent / "results" / "fleet.json"
AGENT_FLAGS = ["--drain-grace", "0.5", "--log-level", "WARNING", "--session-timeout", "10"]


def _descendants(pid: int) -> list[int]:
    children: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid:
            child = int(entry.name)
            children.append(child)
            children.extend(_descendants(child))
    return children


def _status_field(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _usage(pids: list[int]) -> tuple[float, int]:
    """(RSS in MiB, threads) summed over ``pids``."""
    rss_kib = threads = 0
    for pid in pids:
        try:
            rss_kib += _status_field(pid, "VmRSS")
            threads += _status_field(pid, "Threads")
        except OSError:
            pass
    return rss_kib / 1024, threads


def _wait_count(zk: KazooClient, predicate: Any, timeout: float) -> float:
    started = time.monotonic()
    deadline = started + timeout
    while time.monotonic() < deadline:
        children = zk.get_children("/data_servers") if zk.exists("/data_servers") else []
        if predicate(len(children)):
            return time.monotonic() - started
        time.sleep(0.05)
    raise TimeoutError("servers did not reach the expected count")


def _run(name: str, commands: list[list[str]], count: int, zk: KazooClient) -> dict[str, Any]:
    launched = time.monotonic()
    processes = [subprocess.Popen(command) for command in commands]
    try:
        startup = _wait_count(zk, lambda n: n == count, timeout=300)
        time.sleep(2)  # let start-up garbage settle before reading RSS
        pids = [p.pid for p in processes]
        pids += [child for p in processes for child in _descendants(p.pid)]
        rss_mib, threads = _usage(pids)
        stopping = time.monotonic()
        for process in processes:
            process.send_signal(signal.SIGTERM)
        _wait_count(zk, lambda n: n == 0, timeout=120)
        deregistered = time.monotonic() - stopping
        codes = [process.wait(timeout=60) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    result = {
        "servers": count,
        "processes": len(pids),
        "startup_s": round(startup, 2),
        "startup_per_server_ms": round(startup / count * 1000, 1),
        "rss_mib": round(rss_mib, 1),
        "rss_per_server_mib": round(rss_mib / count, 2),
        "threads": threads,
        "deregister_all_s": round(deregistered, 2),
        "exit_codes_ok": all(code == 0 for code in codes),
        "wall_s": round(time.monotonic() - launched, 2),
    }
    print(f"{name:>9}: " + ", ".join(f"{k}={v}" for k, v in result.items()), flush=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--docs", type=int, default=2000)
    parser.add_argument("--baseline-count", type=int, default=10)
    args = parser.parse_args()

    with DevCluster(tick_time_ms=500) as cluster:
        hosts = cluster.info()["zk"]
        zk = KazooClient(hosts=hosts)
        zk.start()
        try:
            common = ["--zk", hosts, "--docs", str(args.docs), *AGENT_FLAGS]
            fleet = _run(
                "fleet",
                [
                    [
                        *(sys.executable, "-m", "data_server.cli", "fleet", *common),
                        *("--count", str(args.count), "--procs", str(args.procs)),
                        *("--base-port", "0"),
                    ]
                ],
                args.count,
                zk,
            )
            baseline = _run(
                "baseline",
                [
                    [
                        *(sys.executable, "-m", "data_server.cli", *common),
                        *("--port", "0", "--id", f"ds-base-{i}", "--shard", str(i)),
                    ]
                    for i in range(args.baseline_count)
                ],
                args.baseline_count,
                zk,
            )
        finally:
            zk.stop()
            zk.close()

    ratio = baseline["rss_per_server_mib"] / fleet["rss_per_server_mib"]
    print(f"memory per server: one process each uses {ratio:.1f}x the fleet's", flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "benchmark": "fleet",
                "parameters": vars(args),
                "machine": machine(),
                "fleet": fleet,
                "baseline_one_process_each": baseline,
                "rss_per_server_ratio_baseline_over_fleet": round(ratio, 2),
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
