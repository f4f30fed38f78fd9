"""The demo topology's CPU, container by container, at the compose check's steady load.

Usage: ``python bench/bench_compose_cpu.py [--project NAME] [--seconds 60] [--rate 20]
[--label after] [--up] [--down]``. The project must be running (``docker compose -p NAME
up -d``), or pass ``--up`` (and ``--down`` to remove it at the end). Waits until search-1
lists the 100 data servers as serving, then sends ``--rate`` queries a second more through
all three search servers from the load generator's container (the check's own 20 q/s,
beside the topology's 20), and reads every container's CPU (cgroup ``cpuacct.usage``)
and the host's busy time (``/proc/stat``) at the start and end of ``--seconds``. Prints
the table in cores, and writes ``bench/results/compose_cpu-<label>.json``.

The question it answers (issue 40, item 1): how much of this 2-core machine the
topology itself uses at steady load, before a drain or a restart asks for more.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, write_results

CGROUP = Path("/sys/fs/cgroup/cpuacct/docker")
CGROUP_V2 = Path("/sys/fs/cgroup/system.slice")


def docker(*args: str, timeout: float = 60) -> str:
    return subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, check=True
    ).stdout


def containers(project: str) -> dict[str, str]:
    """Full container id by compose service."""
    listed = docker(
        "ps",
        "--no-trunc",
        "--filter",
        f"label=com.docker.compose.project={project}",
        "--format",
        '{{.ID}} {{.Label "com.docker.compose.service"}}',
    )
    return {name: cid for cid, name in (line.split() for line in listed.splitlines() if line)}


def cpu_ns(cid: str) -> int:
    v1 = CGROUP / cid / "cpuacct.usage"
    if v1.exists():
        return int(v1.read_text())
    stat = CGROUP_V2 / f"docker-{cid}.scope" / "cpu.stat"
    for line in stat.read_text().splitlines():
        key, value = line.split()
        if key == "usage_usec":
            return int(value) * 1000
    raise RuntimeError(f"no CPU accounting found for container {cid[:12]}")


def host_busy() -> tuple[float, float]:
    """(busy, total) seconds of every CPU since boot."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    total = sum(fields[:8])
    return (total - idle) / 100, total / 100


def serving(port: int = 8080) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/cluster", timeout=2) as answer:
            view = json.load(answer)
    except OSError:
        return 0
    return sum(1 for s in view["servers"] if s["state"] == "serving")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--project", default="search-discovery")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=20.0, help="queries/s beyond the demo's")
    parser.add_argument("--label", default="now")
    parser.add_argument("--settle", type=float, default=20.0, help="seconds after 100 serving")
    parser.add_argument("--up", action="store_true")
    parser.add_argument("--down", action="store_true")
    args = parser.parse_args()
    compose = ["docker-compose", "-p", args.project]
    if args.up:
        subprocess.run([*compose, "up", "-d"], cwd=ROOT, check=True, capture_output=True)
    try:
        deadline = time.monotonic() + 300
        while serving() < 100:
            if time.monotonic() > deadline:
                print("search-1 never listed 100 serving", file=sys.stderr)
                return 1
            time.sleep(1)
        time.sleep(args.settle)  # start-up indexing and warm-up behind us
        ids = containers(args.project)
        load = None
        if args.rate > 0:
            load = subprocess.Popen(
                [
                    "docker", "exec", ids["loadgen"], "data-server", "loadgen",
                    "--rate", str(args.rate), "--duration", str(args.seconds + 5),
                    "--report-interval", "1000",
                    *(f"--target=http://search-{i}:8080" for i in (1, 2, 3)),
                ],
                stdout=subprocess.DEVNULL,
            )  # fmt: skip
            time.sleep(3)
        before = {name: cpu_ns(cid) for name, cid in ids.items()}
        busy0, total0 = host_busy()
        started = time.monotonic()
        time.sleep(args.seconds)
        elapsed = time.monotonic() - started
        after = {name: cpu_ns(cid) for name, cid in ids.items()}
        busy1, total1 = host_busy()
        if load is not None:
            load.wait(timeout=60)
    finally:
        if args.down:
            subprocess.run([*compose, "down", "-v"], cwd=ROOT, capture_output=True)
    cores = {n: (after[n] - before[n]) / 1e9 / elapsed for n in sorted(ids)}
    groups: dict[str, float] = {}
    for name, value in cores.items():
        group = name.rstrip("0123456789").rstrip("-")
        groups[group] = groups.get(group, 0.0) + value
    containers_total = sum(cores.values())
    host = (busy1 - busy0) / elapsed
    print(f"{'container':<16} {'cores':>6}")
    for name, value in sorted(cores.items(), key=lambda kv: -kv[1]):
        print(f"{name:<16} {value:6.3f}")
    print(f"{'containers':<16} {containers_total:6.3f}")
    print(f"{'host busy':<16} {host:6.3f}  (of {(total1 - total0) / elapsed:.2f})")
    write_results(
        ROOT / "bench" / "results" / f"compose_cpu-{args.label}.json",
        "compose_cpu",
        {"seconds": args.seconds, "extra_rate": args.rate, "project": args.project},
        cores=cores,
        groups=groups,
        containers_total=containers_total,
        host_busy=host,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
