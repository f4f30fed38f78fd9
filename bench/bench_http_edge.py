"""The HTTP edge (:mod:`discovery.httpedge`): its cost per request, and what it buys
against slow clients, each against aiohttp served as before (``TCPSite``) in the same run.

Each variant is a child process serving the same application (``json_app`` with one
small JSON handler, as the servers build theirs) on uvloop:

* ``plain``: ``web.TCPSite``, no guard: the servers before issue 21;
* ``guarded``: :class:`~discovery.httpedge.HeaderGuard` with the servers' defaults
  (10 s header timeout, 256 connections waiting for headers at most).

Two measurements per variant:

* **cost**: ``--requests`` requests over ``--connections`` keep-alive connections;
  the server's CPU per request (from ``/proc/<pid>/stat``, the client's excluded) and
  the rate; the variants take turns for ``--rounds`` rounds, medians reported;
* **slowloris**: the child may open ``--fd-limit`` files; ``--slow`` connections
  send a partial request head and trickle a byte a second (reconnecting when closed),
  while a normal client sends ``--probes`` requests, each on a new connection, with a
  2 s timeout: how many are answered, and how fast.

    .venv/bin/python bench/bench_http_edge.py [--quick] [--requests 20000]
        [--connections 8] [--rounds 5] [--slow 1200] [--fd-limit 1024] [--probes 200]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from common import process_cpu_seconds, quick_defaults, summary_ms, write_results

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "http_edge.json"
VARIANTS = ("plain", "guarded")
REQUEST = b"GET /ping HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


# -- the child: one server ---------------------------------------------------------------


async def _serve(variant: str, port: int) -> None:
    from aiohttp import web
    from prometheus_client import CollectorRegistry

    from discovery.config import HttpEdgeConfig
    from discovery.http import json_app
    from discovery.httpedge import KEEPALIVE_TIMEOUT, HeaderGuard

    registry = CollectorRegistry()
    guard = HeaderGuard(HttpEdgeConfig(), registry=registry) if variant == "guarded" else None
    app = json_app(registry, middlewares=[guard.middleware] if guard is not None else [])

    async def ping(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app.router.add_get("/ping", ping)
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=KEEPALIVE_TIMEOUT)
    await runner.setup()
    if guard is not None:
        await guard.listen(runner, "127.0.0.1", port)
    else:
        await web.TCPSite(runner, "127.0.0.1", port).start()
    print("ready", flush=True)
    await asyncio.Event().wait()


def serve_main(variant: str, port: int, fd_limit: int | None) -> None:
    if fd_limit is not None:
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, hard))
    import uvloop

    uvloop.run(_serve(variant, port))


# -- the parent: load and slow clients ---------------------------------------------------


async def _start(variant: str, port: int, fd_limit: int | None) -> asyncio.subprocess.Process:
    argv = [str(Path(__file__)), "--serve", variant, "--port", str(port)]
    if fd_limit is not None:
        argv += ["--fd-limit", str(fd_limit)]
    process = await asyncio.create_subprocess_exec(
        sys.executable, *argv, stdout=asyncio.subprocess.PIPE, cwd=ROOT
    )
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), 30)
    if line.strip() != b"ready":
        raise RuntimeError(f"the {variant} server did not start: {line!r}")
    return process


async def _stop(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        process.kill()
        await process.wait()


async def _response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    length = next(int(x.split(b":")[1]) for x in lines if x.lower().startswith(b"content-length"))
    await reader.readexactly(length)
    return int(lines[0].split()[1])


async def _cost(port: int, pid: int, requests: int, connections: int) -> dict[str, Any]:
    async def client(count: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(count):
            writer.write(REQUEST)
            assert await _response(reader) == 200
        writer.close()

    share = requests // connections
    await client(200)  # warm-up
    cpu, wall = process_cpu_seconds(pid), time.perf_counter()
    await asyncio.gather(*(client(share) for _ in range(connections)))
    wall = time.perf_counter() - wall
    cpu_after = process_cpu_seconds(pid)
    assert cpu is not None
    assert cpu_after is not None
    done = share * connections
    return {
        "requests": done,
        "server_cpu_us_per_request": round((cpu_after - cpu) / done * 1e6, 1),
        "requests_per_s": round(done / wall),
    }


async def _slowloris(port: int, slow: int, probes: int) -> dict[str, Any]:
    stop = asyncio.Event()
    closed = 0

    async def slow_client() -> None:
        nonlocal closed
        while not stop.is_set():
            try:
                async with asyncio.timeout(5):
                    _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"GET /ping HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
                while not stop.is_set():
                    await writer.drain()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), 1.0)
                    writer.write(b"x")
            except (OSError, TimeoutError):
                closed += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.1)

    attackers = [asyncio.create_task(slow_client()) for _ in range(slow)]
    await asyncio.sleep(2.0)  # ok-sleep: the attack settles in before the normal client
    latencies: list[float] = []
    answered = 0
    for _ in range(probes):
        started = time.perf_counter()
        try:
            async with asyncio.timeout(2):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(REQUEST)
                if await _response(reader) == 200:
                    answered += 1
                    latencies.append((time.perf_counter() - started) * 1000)
                writer.close()
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            pass
    stop.set()
    await asyncio.gather(*attackers, return_exceptions=True)
    return {
        "slow_clients": slow,
        "probes": probes,
        "answered": answered,
        "slow_connections_cut": closed,
        **(summary_ms(latencies) if latencies else {}),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from discovery.testing.ports import free_port

    rows: dict[str, Any] = {variant: {"cost_rounds": []} for variant in VARIANTS}
    # Cost: the variants take turns, so that a slow spell of the machine hits both.
    for round_ in range(args.rounds):
        for variant in VARIANTS if round_ % 2 == 0 else VARIANTS[::-1]:
            process = await _start(variant, port := free_port(), None)
            try:
                cost = await _cost(port, process.pid, args.requests, args.connections)
            finally:
                await _stop(process)
            rows[variant]["cost_rounds"].append(cost)
            print(f"round {round_ + 1} {variant}: {cost}", flush=True)
    for variant in VARIANTS:
        rounds = rows[variant]["cost_rounds"]
        rows[variant]["server_cpu_us_per_request"] = statistics.median(
            r["server_cpu_us_per_request"] for r in rounds
        )
        rows[variant]["requests_per_s"] = statistics.median(r["requests_per_s"] for r in rounds)
        process = await _start(variant, port := free_port(), args.fd_limit)
        try:
            rows[variant]["slowloris"] = await _slowloris(port, args.slow, args.probes)
        finally:
            await _stop(process)
        print(variant, rows[variant]["slowloris"], flush=True)
    cpu = {v: rows[v]["server_cpu_us_per_request"] for v in VARIANTS}
    ratio = cpu["guarded"] / cpu["plain"]
    print(
        f"\nserver CPU per request (median of {args.rounds}): plain {cpu['plain']} us, "
        f"guarded {cpu['guarded']} us ({ratio:.2f}x)"
    )
    for variant in VARIANTS:
        s = rows[variant]["slowloris"]
        print(
            f"{variant:8s} under {s['slow_clients']} slow clients (fd limit {args.fd_limit}): "
            f"{s['answered']}/{s['probes']} normal requests answered, "
            f"p50 {s.get('p50_ms', '-')} ms, p99 {s.get('p99_ms', '-')} ms"
        )
    return {"rows": rows, "guarded_cpu_ratio": round(ratio, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run")
    parser.add_argument("--requests", type=int)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--slow", type=int)
    parser.add_argument("--fd-limit", type=int, default=1024)
    parser.add_argument("--probes", type=int)
    parser.add_argument("--serve", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve_main(args.serve, args.port, args.fd_limit if "--fd-limit" in sys.argv else None)
        return
    quick_defaults(
        args,
        args.quick,
        requests=(20_000, 4000),
        rounds=(5, 1),
        slow=(1200, 1200),
        probes=(200, 50),
    )
    result = asyncio.run(run(args))
    write_results(
        RESULTS,
        "http_edge",
        {
            k: getattr(args, k)
            for k in ("requests", "connections", "rounds", "slow", "fd_limit", "probes")
        },
        **result,
    )


if __name__ == "__main__":
    main()
