"""``make compose-check``: run docker-compose.yml for real and check what users rely on.

Usage: ``python deploy/compose_check.py [--compose "docker compose"] [--project NAME]
[--report PATH] [--keep] [--demo-rate 5]``. ``make compose-check`` builds the images first
(``make image``).

Load: each phase judges its own 20 queries a second; the topology's own load generator
runs beside them at ``--demo-rate`` (``LOADGEN_RATE``, default 5, unjudged), 25 q/s in
all. Issue 21 set the check at the demo's 20 plus 20; on a machine where that steady
load alone takes 1.7 of the 2 cores (measured for every version from issue 40's end
on, docs/BENCHMARKS.md, "The check's load"), the drain and the restarts judged there
measure the machine's saturation, not the routing. ``--demo-rate 20`` runs issue 21's.

Phases, each a row of the summary table; the exit status is 1 if any row missed:

1. **up** - ``up -d``; all 3 search servers list the 100 data servers as serving.
   **access** - what the credentials shut: from inside the compose network, Redis and
   the sentinels refuse a client without a password; ZooKeeper's plaintext port is
   closed on every member, its TLS port refuses a client without a certificate, its
   election port refuses a client certificate (of the clients' CA), and a client with
   a certificate but no digest identity may not write under the chroot (zk-init ran);
   the host publishes Prometheus and the dashboard on its loopback only.
2. **queries** - queries through all 3 search servers: every one complete.
3. **drain** - ``stop`` one fleet container under load: its 50 servers drain (routing
   stops first) and leave every search server's list, the container exits 0 within its
   grace, and no query fails or comes back partial meanwhile.
4. **leader kill** - SIGKILL the leader's container: another search server leads with a
   higher epoch, and the survivors answer every query meanwhile.
5. **restore** - start both again: 100 serving on all 3 search servers again.
6. **redis failover** - ``stop`` the Redis primary under load: the sentinels promote
   the replica, every search server reads a confirmed list from it again, no query
   fails or comes back partial meanwhile, and the old primary, started again, rejoins
   as a replica of the new one.
7. **deploy day** - a rolling restart under load (issue 23, item 4): ``stop`` (SIGTERM,
   then the stop grace) and ``start`` search-1, search-2 and search-3 one by one, each
   time waiting until every search server lists the 100 serving again under one
   leader, while the queries go only to the other two (as a load balancer takes out a
   server being restarted); then each fleet container the same way (a batch of 50 data
   servers that drain on SIGTERM, every shard keeping its replica in the other fleet),
   the queries going to all three. Every container exits 0, and of all the queries
   sent meanwhile none fails and fewer than 1 % come back partial.
8. **prometheus** - every scrape target ``up`` through Prometheus's HTTP API (the
   ZooKeeper and Redis exporters' included), the exporters reporting every ZooKeeper
   member answering with one leader and both Redis nodes up, and the alert rules loaded.
9. **down** - ``down -v``: no container, network or volume of the project left.

The search servers' views come from their ``/cluster`` and the primary's name from
Sentinel, read inside the load generator's container (on the compose network) by one
long-lived observer process (given the sentinels' read-only ``discovery`` user's password
and the ZooKeeper client certificate made for it, ``zk_client_check``, from
deploy/compose/secrets/ over its stdin: the container itself holds no secret);
queries are ``data-server loadgen --json`` run there
too, and each fault waits for 40 answered queries first. Nothing here sleeps to
synchronise: every wait polls a condition against a deadline.

Compose itself runs only ``up``, ``start`` (restore) and ``down``, with no queries being
judged. Every fault, restart, probe and ``exec`` under load goes through the ``docker`` CLI to
the container compose created (found by compose's labels), because ``docker-compose``
1.x is a Python program that takes about half a core for half a second per command:
on a 2-core machine the check's own ``start`` of a Redis container starved the data
servers under test and cost 40 queries their deadline.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# make compose-secrets (deploy/compose_secrets.py)
SECRETS = ROOT / "deploy" / "compose" / "secrets"
SEARCH_SERVERS = ("search-1", "search-2", "search-3")
FLEETS = {"fleet-1": 50, "fleet-2": 50}
DATA_SERVERS = sum(FLEETS.values())
# Queries a second: those the check sends and judges in each phase, and the rate it
# gives the topology's own load generator (unjudged) unless LOADGEN_RATE says otherwise.
CHECK_RATE = 20
DEMO_RATE = 5.0
PROMETHEUS = "http://127.0.0.1:9090"
# Published on the host, and only on its loopback: service -> container port.
PUBLISHED = {"search-1": 8080, "prometheus": 9090}
ZK_MEMBERS = ("zk1", "zk2", "zk3")
# Clients over TLS only (docker-compose.yml); 2181 answers on each member's loopback only.
ZK_SECURE_PORT = 2281
ZK_PLAINTEXT_PORT = 2181
ZK_ELECTION_PORT = 3888
ZK_HOSTS = ",".join(f"{member}:{ZK_SECURE_PORT}" for member in ZK_MEMBERS)
ZK_CHROOT = "/demo"
# zk-init's ACL of /data_servers, as an anonymous client sees it (scheme:user:perms):
# admin ALL, data CREATE|READ, search READ, world READ.
ZK_DATA_SERVERS_ACL = ["digest:admin:31", "digest:data:5", "digest:search:1", "world:anyone:1"]
ZOOKEEPERS = 3
REDIS_NODES = ("redis-1", "redis-2")
SENTINELS = 3
# search servers + data servers + Prometheus itself + the ZooKeeper exporter + one
# redis-exporter target per Redis node and sentinel (deploy/prometheus.yml)
TARGETS = len(SEARCH_SERVERS) + DATA_SERVERS + 1 + 1 + len(REDIS_NODES) + SENTINELS
ALERT_RULES = 12
# The deploy day's stated outcome: no query fails, fewer than this share come back partial.
DEPLOY_PARTIAL_LIMIT = 0.01
# What the exporters must report once all is up: every ZooKeeper member answering mntr,
# one of them leader, and both Redis nodes reachable.
INFRASTRUCTURE = {
    "sum(zookeeper_up)": ZOOKEEPERS,
    'count(zookeeper_server_state{state="leader"})': 1,
    'sum(redis_up{instance=~"redis://redis-.*"})': len(REDIS_NODES),
}

# Runs inside the load generator's container for the whole check, so that polling costs
# one HTTP request per search server, not a `docker compose exec` (a second of CPU on a
# small machine, enough to stall the data servers under test). One JSON request per
# line on stdin, one JSON answer per line on stdout.
_OBSERVER = r"""
import atexit, collections, json, os, shutil, socket, ssl, sys, tempfile, urllib.request
import redis
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

# The first line: the sentinels' client credentials and a ZooKeeper client certificate
# (never in the container otherwise; the certificate in a private directory, removed
# at exit).
AUTH = json.loads(sys.stdin.readline())
TLS_DIR = tempfile.mkdtemp(prefix="compose-check-")
atexit.register(shutil.rmtree, TLS_DIR, True)
ZK_TLS = {}
for name, text in AUTH.pop("zk_tls").items():
    ZK_TLS[name] = os.path.join(TLS_DIR, name)
    with open(ZK_TLS[name], "w", encoding="ascii") as f:
        f.write(text)

def views(names):
    out = {}
    for name in names:
        try:
            with urllib.request.urlopen(f"http://{name}:8080/cluster", timeout=2) as r:
                view = json.load(r)
        except Exception as exc:
            out[name] = {"error": str(exc)}
            continue
        serving = [s for s in view["servers"] if s["state"] == "serving" and s["enabled"]]
        out[name] = {
            "leader": view["leader"], "epoch": view["epoch"], "version": view["version"],
            "redis_connected": view["redis_connected"], "age_ms": view["age_ms"],
            "source": view["source"], "listed": len(view["servers"]), "serving": len(serving),
            "by_address": dict(collections.Counter(s["address"] for s in view["servers"])),
        }
    return out

def sentinel(host, call):
    client = redis.Redis(
        host=host, port=26379, socket_timeout=2, decode_responses=True,
        username=AUTH["username"], password=AUTH["password"],
    )
    try:
        return call(client)
    finally:
        client.close()

def master(host, name):
    found = sentinel(host, lambda c: c.sentinel_get_master_addr_by_name(name))
    return found[0] if found else None

def replicas(host, name):
    found = sentinel(host, lambda c: c.sentinel_slaves(name))
    return [
        r["ip"] for r in found
        if not r.get("is_sdown") and not r.get("is_odown") and not r.get("is_disconnected")
    ]

def refused(host, port):
    # A client without credentials: Redis and the sentinels must refuse it.
    client = redis.Redis(host=host, port=port, socket_timeout=2)
    try:
        client.ping()
        return "answered PING"
    except redis.AuthenticationError:
        return True
    except redis.RedisError as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        client.close()

def zk_refused(hosts, paths, layout):
    # A ZooKeeper client with a certificate but no digest identity may read but not
    # create under our nodes; the ACL of `layout` (users shown, hashes not) says whether
    # zk-init made it.
    zk = KazooClient(
        hosts=hosts, timeout=5, use_ssl=True, ca=ZK_TLS["ca"], certfile=ZK_TLS["cert"],
        keyfile=ZK_TLS["key"], verify_certs=True, check_hostname=True,
    )
    zk.start(timeout=10)
    try:
        out = {}
        for path in paths:
            try:
                zk.create(path + "/intruder", b"{}", ephemeral=True)
                out[path] = "created"
            except NoAuthError:
                out[path] = True
        acl, _ = zk.get_acls(layout)
        out["acl"] = sorted(f"{a.id.scheme}:{a.id.id.split(':')[0]}:{a.perms}" for a in acl)
        return out
    finally:
        zk.stop()
        zk.close()

def closed(host, port):
    # Nothing listening there for other containers.
    try:
        socket.create_connection((host, port), timeout=3).close()
    except ConnectionRefusedError:
        return True
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "accepted a connection"

def tls_refused(host, port, context):
    # A handshake then a four-letter word: refused if either fails or the server closes
    # the connection (TLS 1.3 reports a refused client certificate only after the
    # handshake); answered or left waiting: accepted.
    try:
        with socket.create_connection((host, port), timeout=3) as raw:
            with context.wrap_socket(raw, server_hostname=host) as sock:
                sock.sendall(b"srvr")
                answer = sock.recv(64)
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return "accepted the handshake, and waits"
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    return True if not answer else f"answered {answer[:20]!r}"

def zk_transport(members, plaintext, secure, election):
    # No client certificate: ZooKeeper's secure port must refuse us (chain and name of
    # the server verified, so that a refusal is the server's).
    anonymous = ssl.create_default_context(cafile=ZK_TLS["ca"])
    # A client certificate on the election port: the quorum's CA did not sign it.
    peer = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    peer.check_hostname = False
    peer.verify_mode = ssl.CERT_NONE
    peer.load_cert_chain(ZK_TLS["cert"], ZK_TLS["key"])
    out = {}
    for member in members:
        out[f"{member}:{plaintext} closed"] = closed(member, plaintext)
        out[f"{member}:{secure} without a certificate"] = tls_refused(member, secure, anonymous)
        out[f"{member}:{election} with a client certificate"] = tls_refused(
            member, election, peer
        )
    return out

for line in sys.stdin:
    request = json.loads(line)
    try:
        if request["op"] == "views":
            answer = views(request["names"])
        elif request["op"] == "refused":
            answer = {f"{h}:{p}": refused(h, p) for h, p in request["targets"]}
        elif request["op"] == "zk_refused":
            answer = zk_refused(request["hosts"], request["paths"], request["layout"])
        elif request["op"] == "zk_transport":
            answer = zk_transport(
                request["members"], request["plaintext"], request["secure"], request["election"]
            )
        elif request["op"] == "master":
            answer = master(request["sentinel"], request["name"])
        else:
            answer = replicas(request["sentinel"], request["name"])
    except Exception as exc:
        answer = {"error": str(exc)}
    print(json.dumps(answer, default=str), flush=True)
"""


class Observer:
    """The observer script above, in the load generator's container, asked over a pipe."""

    def __init__(self, container: str) -> None:
        self._proc = subprocess.Popen(
            ["docker", "exec", "-i", container, "python", "-u", "-c", _OBSERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._proc.stdin is not None
        password = (SECRETS / "sentinel_discovery").read_text().strip()
        zk_tls = {
            "ca": (SECRETS / "zk_ca.crt").read_text(),
            "cert": (SECRETS / "zk_client_check.crt").read_text(),
            "key": (SECRETS / "zk_client_check.key").read_text(),
        }
        first = {"username": "discovery", "password": password, "zk_tls": zk_tls}
        self._proc.stdin.write(json.dumps(first))
        self._proc.stdin.write("\n")
        self._proc.stdin.flush()

    def ask(self, request: dict[str, Any]) -> Any:
        assert self._proc.stdin is not None
        assert self._proc.stdout is not None
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError("the observer in the load generator's container is gone")
        return json.loads(line)

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


@dataclass
class Row:
    phase: str
    ok: bool
    result: str
    seconds: float


@dataclass
class Check:
    compose: list[str]
    project: str
    # The topology's own load generator's rate (LOADGEN_RATE), beside the check's.
    demo_rate: float = DEMO_RATE
    rows: list[Row] = field(default_factory=list)
    observer: Observer | None = None
    # The search server whose container the leader-kill phase killed, until restored.
    killed: str | None = None
    # Container id by service, read from compose's labels after ``up``.
    containers: dict[str, str] = field(default_factory=dict)

    @property
    def running_search_servers(self) -> tuple[str, ...]:
        return tuple(name for name in SEARCH_SERVERS if name != self.killed)

    # -- plumbing ------------------------------------------------------------------------

    def run(self, *args: str, timeout: float = 300, check: bool = True) -> str:
        command = [*self.compose, "-p", self.project, *args]
        done = subprocess.run(
            command,
            cwd=ROOT,
            env={**os.environ, "LOADGEN_RATE": f"{self.demo_rate:g}"},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"{shlex.join(command)} failed:\n{done.stderr.strip()[-2000:]}")
        return done.stdout

    def container(self, service: str) -> str:
        """The id of ``service``'s container (one ``docker ps`` for all, then kept)."""
        if service not in self.containers:
            listed = docker(
                "ps",
                "-a",
                "--filter",
                f"label=com.docker.compose.project={self.project}",
                "--format",
                '{{.ID}} {{.Label "com.docker.compose.service"}}',
            )
            self.containers = {
                name: cid for cid, name in (line.split() for line in listed.splitlines() if line)
            }
        return self.containers[service]

    def views(self, names: tuple[str, ...] = SEARCH_SERVERS) -> dict[str, dict[str, Any]]:
        if self.observer is None:
            self.observer = Observer(self.container("loadgen"))
        views: dict[str, dict[str, Any]] = self.observer.ask({"op": "views", "names": names})
        return views

    def master(self) -> str | None:
        """The primary Redis as sentinel-1 names it."""
        assert self.observer is not None
        found = self.observer.ask({"op": "master", "sentinel": "sentinel-1", "name": "discovery"})
        return found if isinstance(found, str) else None

    def replicas(self) -> list[str]:
        """The replicas sentinel-1 sees up and linked, by name."""
        assert self.observer is not None
        found = self.observer.ask({"op": "replicas", "sentinel": "sentinel-1", "name": "discovery"})
        return found if isinstance(found, list) else []

    def record(self, phase: str, ok: bool, result: str, started: float) -> bool:
        row = Row(phase, ok, result, round(time.monotonic() - started, 1))
        self.rows.append(row)
        print(f"[{'ok' if ok else 'MISS'}] {phase}: {result} ({row.seconds} s)", flush=True)
        return ok

    def start_queries(
        self, targets: tuple[str, ...], rate: float, duration: float | None
    ) -> Queries:
        """Queries to ``targets`` for ``duration`` s, or (None) until :meth:`Queries.stop`."""
        loadgen = ["data-server", "loadgen", "--json", "--rate", str(rate)]
        if duration is not None:
            loadgen += ["--duration", str(duration)]
        for name in targets:
            loadgen += ["--target", f"http://{name}:8080"]
        container = self.container("loadgen")
        if duration is not None:
            return Queries(["docker", "exec", container, *loadgen])
        # Its pid first (exec keeps it), so that stop() can SIGTERM it in the container:
        # the load generator then waits for its queries in flight and exits.
        script = f'echo "pid $$"; exec {shlex.join(loadgen)}'
        return Queries(["docker", "exec", container, "sh", "-c", script], container=container)

    # -- phases --------------------------------------------------------------------------

    def up(self) -> bool:
        started = time.monotonic()
        self.run("up", "-d", timeout=600)
        self.containers = {}
        ok, views = wait_for(lambda: all_serving(self.views(), DATA_SERVERS), 240)
        return self.record(
            "up", ok, f"3 search servers list {describe_serving(views)} serving", started
        )

    def access(self) -> bool:
        """Anonymous clients refused everywhere; ports published on loopback only."""
        started = time.monotonic()
        assert self.observer is not None
        targets = [[name, 6379] for name in REDIS_NODES]
        targets += [[f"sentinel-{i}", 26379] for i in range(1, SENTINELS + 1)]
        redis = self.observer.ask({"op": "refused", "targets": targets})
        paths = [ZK_CHROOT, f"{ZK_CHROOT}/data_servers", f"{ZK_CHROOT}/search_servers/election"]
        zk = self.observer.ask(
            {"op": "zk_refused", "hosts": ZK_HOSTS, "paths": paths, "layout": paths[1]}
        )
        transport = self.observer.ask(
            {
                "op": "zk_transport",
                "members": ZK_MEMBERS,
                "plaintext": ZK_PLAINTEXT_PORT,
                "secure": ZK_SECURE_PORT,
                "election": ZK_ELECTION_PORT,
            }
        )
        shut = (
            isinstance(transport, dict)
            and len(transport) == 3 * len(ZK_MEMBERS)
            and all(v is True for v in transport.values())
        )
        ports = {
            service: docker("port", self.container(service), f"{port}/tcp").split()
            for service, port in PUBLISHED.items()
        }
        loopback = {
            service: bool(bound) and all(b.startswith("127.0.0.1:") for b in bound)
            for service, bound in ports.items()
        }
        ok = (
            isinstance(redis, dict)
            and len(redis) == len(targets)
            and all(v is True for v in redis.values())
            and isinstance(zk, dict)
            and all(zk.get(p) is True for p in paths)
            and zk.get("acl") == ZK_DATA_SERVERS_ACL
            and shut
            and all(loopback.values())
        )
        refused = [k for k, v in (redis.items() if isinstance(redis, dict) else ()) if v is True]
        return self.record(
            "access",
            ok,
            f"anonymous clients refused by {len(refused)} of {len(targets)} Redis nodes and "
            f"sentinels ({redis if not ok else 'all'}); ZooKeeper's plaintext port closed, "
            f"TLS without a certificate and the election port with a client certificate "
            f"refused ({transport if not shut else f'all {len(ZK_MEMBERS)} members'}); "
            f"creates without an identity under {', '.join(paths)}: {zk}; published {ports}",
            started,
        )

    def queries(self) -> bool:
        started = time.monotonic()
        q = self.start_queries(SEARCH_SERVERS, rate=CHECK_RATE, duration=10)
        outcomes, total, clean = q.settle()
        ok = clean and total >= 150
        return self.record("queries", ok, f"{describe(outcomes)} of {total}", started)

    def drain(self, fleet: str = "fleet-2") -> bool:
        started = time.monotonic()
        remaining = DATA_SERVERS - FLEETS[fleet]
        q = self.start_queries(SEARCH_SERVERS, rate=CHECK_RATE, duration=25)
        q.wait_answered()
        stop_started = time.monotonic()
        # `docker stop` without --time waits the container's stop_grace_period.
        docker("stop", self.container(fleet), timeout=120)
        stop_seconds = time.monotonic() - stop_started
        exit_code = self.container_exit_code(fleet)

        def gone() -> tuple[bool, dict[str, Any]]:
            views = self.views()
            done = all(
                v.get("listed") == remaining and fleet not in v.get("by_address", {})
                for v in views.values()
            )
            return done, views

        left, views = wait_for(gone, 60)
        outcomes, total, clean = q.settle()
        ok = left and clean and exit_code == 0
        return self.record(
            "drain",
            ok,
            f"`stop {fleet}`: exited {exit_code} after {stop_seconds:.1f} s, "
            f"{describe_serving(views)} left listed; queries meanwhile {describe(outcomes)} "
            f"of {total}{q.misses_after(stop_started)}",
            started,
        )

    def leader_kill(self) -> tuple[bool, str | None]:
        started = time.monotonic()
        before = self.views()
        leaders = {v.get("leader") for v in before.values()}
        epochs = {v.get("epoch") for v in before.values()}
        if len(leaders) != 1 or len(epochs) != 1:
            self.record("leader kill", False, f"no agreed leader before: {before}", started)
            return False, None
        leader, epoch = leaders.pop(), epochs.pop()
        if leader not in SEARCH_SERVERS or not isinstance(epoch, int):
            detail = f"leader {leader!r} (epoch {epoch!r}) is not a service's"
            self.record("leader kill", False, detail, started)
            return False, None
        survivors = tuple(name for name in SEARCH_SERVERS if name != leader)
        q = self.start_queries(survivors, rate=CHECK_RATE, duration=30)
        q.wait_answered()
        killed_at = time.monotonic()
        docker("kill", "--signal", "SIGKILL", self.container(leader))
        self.killed = leader
        ok, views = wait_for(lambda: agreed_new_leader(self.views(survivors), leader, epoch), 60)
        took = time.monotonic() - killed_at
        outcomes, total, clean = q.settle()
        new = next(iter(views.values())) if views else {}
        return self.record(
            "leader kill",
            ok and clean,
            f"SIGKILL {leader} (epoch {epoch}): {new.get('leader')} leads with epoch "
            f"{new.get('epoch')} after {took:.1f} s; survivors' queries {describe(outcomes)} "
            f"of {total}{q.misses_after(killed_at)}",
            started,
        ), leader

    def redis_failover(self, primary: str = "redis-1", replica: str = "redis-2") -> bool:
        started = time.monotonic()

        master = self.master
        before = master()
        if before != primary:
            self.record("redis failover", False, f"primary is {before!r}, not {primary}", started)
            return False
        running = self.running_search_servers
        q = self.start_queries(running, rate=CHECK_RATE, duration=40)
        q.wait_answered()
        stopped_at = time.monotonic()
        docker("stop", self.container(primary))

        def promoted_replica() -> tuple[bool, str | None]:
            now = master()
            return now == replica, now

        promoted, after = wait_for(promoted_replica, 60)
        promoted_after = time.monotonic() - stopped_at

        def confirmed() -> tuple[bool, dict[str, Any]]:
            views = self.views(running)
            done = all(
                v.get("redis_connected")
                and v.get("source") == "redis"
                and v.get("age_ms") is not None
                and v["age_ms"] < 5000
                for v in views.values()
            )
            return done, views

        fresh, views = wait_for(confirmed, 60)
        outcomes, total, clean = q.settle()
        ages = "/".join(str(v.get("age_ms")) for v in views.values()) if views else "?"
        # The old primary comes back as a replica of the new one, not a second primary.
        docker("start", self.container(primary))
        rejoined, _replicas = wait_for(lambda: (primary in self.replicas(), None), 60)
        return self.record(
            "redis failover",
            promoted and fresh and clean and rejoined,
            f"`stop {primary}`: sentinels name {after} primary after {promoted_after:.1f} s; "
            f"lists confirmed {ages} ms ago; queries meanwhile {describe(outcomes)} of {total}"
            f"{q.misses_after(stopped_at)}; "
            f"{primary} restarted: {'a replica' if rejoined else 'NOT a replica'} of {after}",
            started,
        )

    def deploy_day(self) -> bool:
        """Restart every search server, then every fleet, gracefully and one by one,
        under load: no query may fail, fewer than 1 % come back partial."""
        started = time.monotonic()
        outcomes: Counter[str] = Counter()
        missing: Counter[str] = Counter()
        steps: list[str] = []
        ok = True
        restarts: list[tuple[str, tuple[str, ...], Callable[[], tuple[bool, Any]] | None]] = [
            (name, tuple(other for other in SEARCH_SERVERS if other != name), None)
            for name in SEARCH_SERVERS
        ]
        for fleet, count in FLEETS.items():

            def gone(fleet: str = fleet, count: int = count) -> tuple[bool, dict[str, Any]]:
                views = self.views()
                done = all(
                    v.get("listed") == DATA_SERVERS - count and fleet not in v.get("by_address", {})
                    for v in views.values()
                )
                return done, views

            restarts.append((fleet, SEARCH_SERVERS, gone))
        for name, targets, left_when in restarts:
            q = self.start_queries(targets, rate=CHECK_RATE, duration=None)
            restarted, step = self._restart_under_load(name, q, left_when)
            outcomes += q.outcomes
            missing += q.missing
            ok = ok and restarted
            steps.append(step)
            print(f"  deploy day: {step}; queries {describe(q.outcomes)}", flush=True)
        total = sum(outcomes.values())
        partial = outcomes.get("partial", 0)
        failed = total - outcomes.get("ok", 0) - partial
        share = partial / total if total else 0.0
        ok = ok and total > 0 and failed == 0 and share < DEPLOY_PARTIAL_LIMIT
        why = " ".join(f"{k} {v}" for k, v in sorted(missing.items()) if v)
        return self.record(
            "deploy day",
            ok,
            f"queries {describe(outcomes)} of {total}: {failed} failed, {partial} partial "
            f"({share * 100:.2f} %, limit {DEPLOY_PARTIAL_LIMIT * 100:g} %)"
            f"{'; shards ' + why if why else ''}; " + "; ".join(steps),
            started,
        )

    def _restart_under_load(
        self,
        name: str,
        q: Queries,
        left_when: Callable[[], tuple[bool, Any]] | None,
    ) -> tuple[bool, str]:
        """``docker stop`` (SIGTERM, then the container's grace) and start ``name`` while
        ``q`` runs; for a fleet, ``left_when`` says it has left every list before it
        comes back. Done when every search server serves all the data servers again
        under one leader. Returns whether all of that held, and a line saying so."""
        q.wait_answered()
        stop_started = time.monotonic()
        # `docker stop` without --time waits the container's stop_grace_period.
        docker("stop", self.container(name), timeout=120)
        stopped = time.monotonic() - stop_started
        exit_code = self.container_exit_code(name)
        left, left_text = True, ""
        if left_when is not None:
            left, _ = wait_for(left_when, 60)
            left_text = "left every list, " if left else "NOT out of every list, "
        docker("start", self.container(name))

        def settled() -> tuple[bool, dict[str, Any]]:
            """100 serving on every search server, and all naming one leader."""
            views = self.views()
            done, _ = all_serving(views, DATA_SERVERS)
            leaders = {v.get("leader") for v in views.values()}
            return done and (len(leaders) == 1 and None not in leaders), views

        # A fleet brings half the data servers back at once: more time than one server.
        back, views = wait_for(settled, 120 if left_when is None else 240)
        took = time.monotonic() - stop_started
        q.stop()
        return back and left and exit_code == 0, (
            f"{name} exited {exit_code} after {stopped:.1f} s, {left_text}"
            f"{describe_serving(views)} serving {took:.1f} s after the stop"
            f"{q.misses_after(stop_started)}"
        )

    def restore(self, services: list[str]) -> bool:
        started = time.monotonic()
        self.run("start", *services, timeout=300)
        self.killed = None
        ok, views = wait_for(lambda: all_serving(self.views(), DATA_SERVERS), 180)
        return self.record(
            "restore",
            ok,
            f"`start {' '.join(services)}`: 3 search servers list {describe_serving(views)} "
            "serving",
            started,
        )

    def prometheus(self) -> bool:
        started = time.monotonic()

        def targets() -> tuple[bool, Counter[str]]:
            data = http_json(f"{PROMETHEUS}/api/v1/targets?state=active")["data"]
            health = Counter(t["health"] for t in data["activeTargets"])
            return health["up"] == TARGETS and sum(health.values()) == TARGETS, health

        def infrastructure() -> tuple[bool, dict[str, float | None]]:
            seen = {expr: prometheus_value(expr) for expr in INFRASTRUCTURE}
            return seen == {k: float(v) for k, v in INFRASTRUCTURE.items()}, seen

        ok, health = wait_for(targets, 120)
        seen_ok, seen = wait_for(infrastructure, 60)
        groups = http_json(f"{PROMETHEUS}/api/v1/rules?type=alert")["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        firing = sorted({r["name"] for r in rules if r.get("state") == "firing"})
        ok = ok and seen_ok and len(rules) == ALERT_RULES
        figures = (
            ", ".join(f"{k} = {'absent' if v is None else f'{v:g}'}" for k, v in seen.items())
            if isinstance(seen, dict)
            else str(seen)  # the last error, if Prometheus never answered
        )
        return self.record(
            "prometheus",
            ok,
            f"targets {dict(health or {})} of {TARGETS}; {figures}; {len(rules)} alert rules "
            "loaded" + (f", firing: {', '.join(firing)}" if firing else ", none firing"),
            started,
        )

    def down(self) -> bool:
        started = time.monotonic()
        if self.observer is not None:
            self.observer.close()
            self.observer = None
        self.run("down", "-v", "--remove-orphans", timeout=300)
        label = f"label=com.docker.compose.project={self.project}"
        left = {
            kind: docker(*cmd, "--filter", label, "-q").split()
            for kind, cmd in (
                ("containers", ("ps", "-a")),
                ("networks", ("network", "ls")),
                ("volumes", ("volume", "ls")),
            )
        }
        ok = not any(left.values())
        return self.record(
            "down",
            ok,
            "`down -v`: " + ", ".join(f"{len(v)} {k}" for k, v in left.items()) + " left",
            started,
        )

    def container_exit_code(self, service: str) -> int | None:
        state = json.loads(
            docker("inspect", "--format", "{{json .State}}", self.container(service))
        )
        return None if state.get("Running") else int(state["ExitCode"])


class Queries:
    """``data-server loadgen --json`` in the load generator's container, read as it runs."""

    def __init__(self, command: list[str], *, container: str | None = None) -> None:
        # With a container, the command prints "pid N" first: the load generator's pid
        # in it, for stop().
        self._container = container
        self._pid: str | None = None
        self._pid_known = threading.Event()
        if container is None:
            self._pid_known.set()
        self.outcomes: Counter[str] = Counter()
        # When (our monotonic clock) each answer that was not a complete one arrived.
        self.misses: list[float] = []
        # Shards missing from the partial answers, by why (the search server's counts).
        self.missing: Counter[str] = Counter()
        self._answered = threading.Condition()
        self._proc = subprocess.Popen(
            command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            if not self._pid_known.is_set() and line.startswith("pid "):
                self._pid = line.split()[1]
                self._pid_known.set()
                continue
            try:
                record = json.loads(line)
                outcome = record["outcome"]
            except (ValueError, KeyError, TypeError):
                continue
            shards = record.get("shards")
            with self._answered:
                self.outcomes[outcome] += 1
                if outcome != "ok":
                    self.misses.append(time.monotonic())
                if isinstance(shards, dict):
                    for why in ("failed", "timed_out", "cut"):
                        if isinstance(shards.get(why), int):
                            self.missing[why] += shards[why]
                self._answered.notify_all()

    def wait_answered(self, count: int = 40, timeout: float = 30) -> None:
        """Until ``count`` queries are answered: the load generator's own start-up (a
        Python process in a container) is over before the fault, not part of it."""
        with self._answered:
            if not self._answered.wait_for(lambda: sum(self.outcomes.values()) >= count, timeout):
                raise RuntimeError(f"the load generator answered fewer than {count} queries")

    def wait(self, timeout: float = 120) -> Counter[str]:
        self._proc.wait(timeout)
        self._reader.join(timeout)
        return self.outcomes

    def stop(self, timeout: float = 30) -> Counter[str]:
        """SIGTERM the open-ended load generator in its container (it waits for its
        queries in flight, which are counted) and return the outcomes."""
        if self._container is None:
            raise RuntimeError("only an open-ended load generator (no duration) is stopped")
        if not self._pid_known.wait(timeout) or self._pid is None:
            raise RuntimeError("the load generator never said its pid")
        # The shell's kill: the image has no kill executable (procps).
        docker("exec", self._container, "sh", "-c", f"kill -TERM {self._pid}")
        return self.wait(timeout)

    def settle(self) -> tuple[Counter[str], int, bool]:
        """Wait for the end; the outcomes, their total, and whether every one was complete."""
        outcomes = self.wait()
        total = sum(outcomes.values())
        return outcomes, total, total > 0 and outcomes.get("ok", 0) == total

    def misses_after(self, fault_at: float) -> str:
        """When the incomplete answers came, relative to the fault, and the shards they
        missed: `` (+0.8..+1.3 s after the fault; shards timed_out 12)``."""
        if not self.misses:
            return ""
        first, last = self.misses[0] - fault_at, self.misses[-1] - fault_at
        why = " ".join(f"{k} {v}" for k, v in sorted(self.missing.items()) if v)
        return f" ({first:+.1f}..{last:+.1f} s after the fault{'; shards ' + why if why else ''})"


def wait_for(probe: Callable[[], Any], timeout: float, interval: float = 1.0) -> tuple[bool, Any]:
    """Poll ``probe`` (returning ``(done, detail)`` or a detail that is truthy when done)
    until it is done or ``timeout`` passes; return whether it was and the last detail."""
    deadline = time.monotonic() + timeout
    detail: Any = None
    while True:
        try:
            result = probe()
        except Exception as exc:  # a container still starting: keep polling
            result = (False, f"{type(exc).__name__}: {exc}")
        done, detail = result if isinstance(result, tuple) else (bool(result), result)
        if done or time.monotonic() >= deadline:
            return done, detail
        time.sleep(interval)  # polling interval, not synchronisation


def all_serving(views: dict[str, dict[str, Any]], count: int) -> tuple[bool, dict[str, Any]]:
    return all(v.get("serving") == count == v.get("listed") for v in views.values()), views


def agreed_new_leader(
    views: dict[str, dict[str, Any]], old: str, epoch: int
) -> tuple[bool, dict[str, Any]]:
    leaders = {v.get("leader") for v in views.values()}
    epochs = {v.get("epoch") for v in views.values()}
    newest = next(iter(epochs), None)
    done = (
        len(leaders) == 1
        and len(epochs) == 1
        and leaders != {old}
        and None not in leaders
        and isinstance(newest, int)
        and newest > epoch
    )
    return done, views


def describe_serving(views: Any) -> str:
    if not isinstance(views, dict):
        return str(views)
    return "/".join(str(v.get("serving", v.get("listed", v.get("error")))) for v in views.values())


def describe(outcomes: Counter[str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())) or "none"


def http_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


def prometheus_value(expr: str) -> float | None:
    """The value of an instant query that yields one sample (None for no sample)."""
    query = urllib.parse.urlencode({"query": expr})
    result = http_json(f"{PROMETHEUS}/api/v1/query?{query}")["data"]["result"]
    return float(result[0]["value"][1]) if len(result) == 1 else None


def docker(*args: str, timeout: float = 60) -> str:
    """``docker ARGS``'s output; RuntimeError with the command and its stderr if it fails."""
    done = subprocess.run(
        ["docker", *args], capture_output=True, text=True, check=False, timeout=timeout
    )
    if done.returncode != 0:
        command = shlex.join(["docker", *args])
        raise RuntimeError(f"{command} failed:\n{done.stderr.strip()[-2000:]}")
    return done.stdout


def default_compose() -> str:
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, check=False)
    if probe.returncode == 0:
        return "docker compose"
    if shutil.which("docker-compose"):
        return "docker-compose"
    sys.exit("compose-check: neither `docker compose` nor `docker-compose` is installed")


def table(rows: list[Row]) -> str:
    lines = ["| phase | result | seconds | |", "|---|---|---|---|"]
    lines += [
        f"| {r.phase} | {r.result} | {r.seconds} | {'ok' if r.ok else 'MISS'} |" for r in rows
    ]
    return "\n".join(lines)


def _positive_rate(text: str) -> float:
    try:
        rate = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not rate > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text!r}")
    return rate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--compose", help="the compose command (default: docker compose, else docker-compose)"
    )
    parser.add_argument("--project", default="discovery-check", help="compose project name")
    parser.add_argument("--report", type=Path, help="also write the rows as JSON here")
    parser.add_argument("--keep", action="store_true", help="leave the topology up at the end")
    parser.add_argument(
        "--demo-rate",
        type=_positive_rate,
        default=os.environ.get("LOADGEN_RATE", str(DEMO_RATE)),
        help="queries/s of the topology's own load generator during the check, beside "
        f"the check's {CHECK_RATE} (issue 21's load: 20) [env LOADGEN_RATE; default "
        f"{DEMO_RATE:g}]",
    )
    args = parser.parse_args(argv)

    if not (SECRETS / "sentinel_discovery").is_file():
        sys.exit(f"compose-check: no secrets in {SECRETS}: run `make compose-secrets` first")
    check = Check(shlex.split(args.compose or default_compose()), args.project, args.demo_rate)
    print(
        f"compose-check: {CHECK_RATE} queries/s judged in each phase, beside the "
        f"topology's own load generator at {args.demo_rate:g}/s",
        flush=True,
    )
    started = time.monotonic()
    try:
        if check.up() and check.access() and check.queries():
            check.drain()
            _ok, leader = check.leader_kill()
            check.restore(["fleet-2", *([leader] if leader else [])])
            check.redis_failover()
            check.deploy_day()
            check.prometheus()
    except Exception as exc:
        check.record("error", False, str(exc).splitlines()[0], started)
        raise
    finally:
        if not args.keep:
            check.down()
        print()
        print(table(check.rows))
        if args.report:
            args.report.parent.mkdir(parents=True, exist_ok=True)
            args.report.write_text(json.dumps([asdict(r) for r in check.rows], indent=2) + "\n")
    return 0 if check.rows and all(r.ok for r in check.rows) else 1


if __name__ == "__main__":
    sys.exit(main())
