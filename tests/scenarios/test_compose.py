"""docker-compose.yml: valid for docker-compose, and every command in it is one we accept.

Nothing runs in containers here (CI has no Docker engine; `make compose-check` runs the
file for real, deploy/compose_check.py). What is checked:
``docker-compose config`` accepts the file; each service that runs one of our console
scripts has an argv (``entrypoint`` + ``command``) that the script's real parser and
settings accept with the service's environment applied (and its secrets: made by
``make compose-secrets``'s own code in a temporary directory, each service seeing only
the ones it mounts); the topology adds up to the demo's: 3 ZooKeeper nodes, 100 data
servers, 3 search servers, one load generator, Prometheus scraping all of them, the
README pointing at the right ports; and the credentials: nothing published beyond the
host's loopback, zk-init alone holding the ZooKeeper admin identity and running before
every server, each server holding its role's identity (the one zk-init grants that
role), Redis and the sentinels requiring passwords that match what the search servers
hold.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from data_server.config import DataServerConfig, FleetConfig
from data_server.config import build_fleet_parser as build_fleet_parser
from data_server.loadgen import build_loadgen_parser
from discovery.livelist.redis.conn import publisher_acl_rules, reader_acl_rules
from discovery.tools.zkdigest import DigestId
from discovery.tools.zkinit import secrets as zk_init_secrets
from search_server.config import SearchServerConfig
from tests.scenarios import composefile as cf
from tests.scenarios.composefile import APP_IMAGE, ROOT

DATA_SERVERS = 100
SEARCH_SERVERS = 3
ZK_NODES = 3


@pytest.fixture(scope="module")
def compose(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return cf.load(tmp_path_factory)


def test_compose_file_is_valid(compose: dict[str, Any]) -> None:
    assert cf.processes(compose), "no service runs data-server, search-server or discovery"


def test_every_image_is_built_here(compose: dict[str, Any]) -> None:
    """No registry is needed: every service builds its image from a Dockerfile here."""
    for name, service in cf.services(compose).items():
        assert "build" in service, f"service {name} pulls {cf.image(service)!r} from a registry"
        assert cf.image(service).endswith(":local"), f"service {name}: image {cf.image(service)}"
        assert (ROOT / cf.built_from(service)).is_file(), (
            f"service {name}: {cf.built_from(service)}"
        )


def test_services_built_from_this_project_run_our_scripts(compose: dict[str, Any]) -> None:
    scripts = cf.scripts()
    for name, service in cf.services(compose).items():
        if cf.image(service) == APP_IMAGE:
            argv = cf.argv(service)
            assert argv, f"service {name}: no command (the image's default is only --help)"
            assert argv[0] in scripts, f"service {name}: runs {argv[0]!r}, not one of {scripts}"


def test_every_command_is_accepted_by_our_parsers(compose: dict[str, Any]) -> None:
    checked = [p.service for p in cf.processes(compose) if p.kind != "data-server loadgen"]
    for process in cf.processes(compose):
        if process.kind != "data-server loadgen":
            cf.settings(process)
    assert checked


def test_loadgen_command_is_accepted(compose: dict[str, Any]) -> None:
    loadgens = cf.of_kind(compose, "data-server loadgen")
    assert len(loadgens) == 1, f"expected one load generator, got {[p.service for p in loadgens]}"
    (process,) = loadgens
    cf.parse(process, build_loadgen_parser, process.argv[2:])


# -- the topology --------------------------------------------------------------------------


@dataclass(frozen=True)
class DataServerSlot:
    service: str
    instance_id: str
    advertise: str
    host: str
    port: int
    shard: int
    replica: int


def _data_servers(compose: dict[str, Any]) -> list[DataServerSlot]:
    """Every data server the file starts, single or in a fleet, as its settings say."""
    slots: list[DataServerSlot] = []
    for process in cf.processes(compose):
        settings = cf.settings(process) if process.kind != "data-server loadgen" else None
        if isinstance(settings, FleetConfig):
            fleet_args = cf.parse(process, build_fleet_parser, process.argv[2:])
            # `--worker I` runs slice I of the fleet only; otherwise the whole fleet runs.
            indices = (
                range(settings.count)
                if fleet_args.worker is None
                else settings.worker_slice(fleet_args.worker)
            )
            servers = [settings.slot(i) for i in indices]
        elif isinstance(settings, DataServerConfig):
            servers = [settings]
        else:
            continue
        for server in servers:
            slots.append(
                DataServerSlot(
                    process.service,
                    server.instance_id or f"ds-{server.advertise}-{server.port}",
                    server.advertise,
                    server.host,
                    server.port,
                    server.shard,
                    server.replica,
                )
            )
    return slots


def _search_servers(compose: dict[str, Any]) -> list[tuple[str, SearchServerConfig]]:
    result = []
    for process in cf.of_kind(compose, "search-server"):
        settings = cf.settings(process)
        assert isinstance(settings, SearchServerConfig)
        result.append((process.service, settings))
    return result


def _reachable_names(compose: dict[str, Any], service: str) -> set[str]:
    """Names other containers resolve to this service: its name, hostname, aliases."""
    spec = cf.services(compose)[service]
    names = {service}
    if spec.get("hostname"):
        names.add(str(spec["hostname"]))
    networks = spec.get("networks")
    if isinstance(networks, dict):
        for net in networks.values():
            names.update((net or {}).get("aliases") or [])
    return names


def test_zookeeper_ensemble(compose: dict[str, Any]) -> None:
    zks = {
        n: s
        for n, s in cf.services(compose).items()
        if cf.image(s).startswith("search-discovery-zookeeper:")
    }
    assert len(zks) == ZK_NODES
    ids = set()
    for name, service in zks.items():
        assert cf.built_from(service) == "deploy/docker/zookeeper.Dockerfile", name
        env = cf.environment(service)
        ids.add(env["ZOO_MY_ID"])
        servers = env["ZOO_SERVERS"].split()
        assert sorted(s.split("=", 1)[1].split(":", 1)[0] for s in servers) == sorted(zks)
        # No client address: one there must match clientPortAddress (127.0.0.1 with TLS).
        assert not any(";" in s for s in servers), servers
        extra = env.get("ZOO_CFG_EXTRA", "").split()
        assert env.get("ZOO_MAX_CLIENT_CNXNS") == "0" or "maxClientCnxns=0" in extra, (
            f"{name}: a fleet container holds 50 sessions from one address; "
            "maxClientCnxns must be 0 (unlimited)"
        )
        whitelist = set(env.get("ZOO_4LW_COMMANDS_WHITELIST", "").split(","))
        assert {"ruok", "srvr", "mntr"} <= whitelist
        assert service.get("healthcheck"), f"{name}: no health check"
    assert ids == {"1", "2", "3"}

    # Every process of ours lists the whole ensemble (see docs/operating.md on --zk).
    for process in cf.processes(compose):
        settings = cf.settings(process) if process.kind != "data-server loadgen" else None
        if isinstance(settings, FleetConfig):
            settings = settings.template
        if isinstance(settings, DataServerConfig | SearchServerConfig):
            hosts_string = settings.zk.hosts
            hosts = {h.rsplit(":", 1)[0] for h in hosts_string.split("/", 1)[0].split(",")}
            assert hosts == set(zks), f"{process.service}: --zk {hosts_string}"


def test_redis_behind_sentinel(compose: dict[str, Any]) -> None:
    """A primary, its replica and 3 sentinels watching the primary; every process of
    ours finds the primary through all 3 sentinels, by the name they monitor."""
    redis = {
        n: s
        for n, s in cf.services(compose).items()
        if cf.image(s).startswith("search-discovery-redis:")
    }
    nodes = {
        n: cf.argv(s) for n, s in redis.items() if cf.argv(s)[:1] == ["redis-server-entrypoint"]
    }
    sentinels = {n: s for n, s in redis.items() if cf.argv(s)[:1] == ["redis-sentinel-entrypoint"]}
    assert len(nodes) == 2, sorted(redis)
    assert len(sentinels) == 3, sorted(redis)
    replicas = {
        n: argv[argv.index("--replicaof") + 1] for n, argv in nodes.items() if "--replicaof" in argv
    }
    (primary,) = set(nodes) - set(replicas)
    assert set(replicas.values()) == {primary}
    for name, argv in nodes.items():
        # Found by name after a restart or a failover: each announces its service name.
        assert argv[argv.index("--replica-announce-ip") + 1] == name
        assert cf.built_from(redis[name]) == "deploy/docker/redis.Dockerfile"
    names = set()
    for name, service in sentinels.items():
        assert cf.argv(service) == ["redis-sentinel-entrypoint"], name
        env = cf.environment(service)
        assert env["SENTINEL_MASTER_HOST"] == primary, name
        assert env["SENTINEL_ANNOUNCE"] == name
        assert int(env["SENTINEL_QUORUM"]) == 2
        names.add(env["SENTINEL_MASTER_NAME"])
    (monitored,) = names
    expected = {f"{n}:26379" for n in sentinels}
    for process in cf.processes(compose):
        settings = cf.settings(process) if process.kind != "data-server loadgen" else None
        if isinstance(settings, FleetConfig):
            continue  # data servers do not use Redis
        if isinstance(settings, SearchServerConfig):
            url = settings.cluster.redis_url
            match = re.fullmatch(r"redis\+sentinel://([^/]+)/([^/]+)(/\d+)?", url)
            assert match, f"{process.service}: --redis {url}"
            assert set(match.group(1).split(",")) == expected, url
            assert match.group(2) == monitored, url


def test_one_hundred_data_servers_with_distinct_ids_ports_and_shards(
    compose: dict[str, Any],
) -> None:
    slots = _data_servers(compose)
    assert len(slots) == DATA_SERVERS
    duplicate_ids = [i for i, n in Counter(s.instance_id for s in slots).items() if n > 1]
    assert not duplicate_ids, (
        f"instance ids registered by more than one container: {duplicate_ids[:5]}...; "
        "the second would be refused (the first owner keeps the node)"
    )
    assert len({(s.advertise, s.port) for s in slots}) == DATA_SERVERS
    assert len({(s.shard, s.replica) for s in slots}) == DATA_SERVERS
    for slot in slots:
        assert slot.host == "0.0.0.0", f"{slot.service}: listens on {slot.host} only"
        assert slot.advertise in _reachable_names(compose, slot.service), (
            f"{slot.service} advertises {slot.advertise!r}, which other containers cannot resolve"
        )
    per_container = Counter(s.service for s in slots)
    assert sorted(per_container.values()) == [50, 50], per_container
    # Each container holds a replica of every shard: stopping one keeps queries complete.
    shards = {
        service: {s.shard for s in slots if s.service == service} for service in per_container
    }
    assert len(set(map(frozenset, shards.values()))) == 1, shards


def test_three_search_servers_one_on_the_host(compose: dict[str, Any]) -> None:
    searches = _search_servers(compose)
    assert len(searches) == SEARCH_SERVERS
    assert len({s.server_id for _, s in searches}) == SEARCH_SERVERS
    for name, settings in searches:
        assert settings.server_id, f"{name}: no --id"
        assert settings.host == "0.0.0.0"
        assert settings.port == 8080
        assert settings.advertise in _reachable_names(compose, name)
    assert any(8080 in _published(compose, name) for name, _ in searches)


def test_one_load_generator_targets_every_search_server(compose: dict[str, Any]) -> None:
    (loadgen,) = cf.of_kind(compose, "data-server loadgen")
    argv = loadgen.argv
    targets = {argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--target"}
    expected = {f"http://{s.advertise}:{s.port}" for _, s in _search_servers(compose)}
    assert targets == expected
    assert "--rate" in argv


def _published(compose: dict[str, Any], service: str) -> dict[int, int]:
    """Container port -> host port."""
    result = {}
    for port in cf.services(compose)[service].get("ports") or []:
        if isinstance(port, dict):
            result[int(port["target"])] = int(port["published"])
        else:
            parts = str(port).split("/")[0].split(":")
            result[int(parts[-1])] = int(parts[-2] if len(parts) > 1 else parts[-1])
    return result


def _prometheus(compose: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    proms = [n for n, s in cf.services(compose).items() if "prometheus" in cf.image(s)]
    assert len(proms) == 1
    name = proms[0]
    for volume in cf.services(compose)[name].get("volumes") or []:
        if isinstance(volume, dict):
            source, target = volume.get("source"), volume.get("target")
        else:
            source, target, *_ = str(volume).split(":")
        if target == "/etc/prometheus/prometheus.yml":
            path = Path(str(source))
            path = path if path.is_absolute() else ROOT / path
            assert path.is_relative_to(ROOT / "deploy"), path
            return name, yaml.safe_load(path.read_text())
    pytest.fail(f"service {name} mounts no /etc/prometheus/prometheus.yml")


def test_prometheus_scrapes_every_search_and_data_server(compose: dict[str, Any]) -> None:
    _, config = _prometheus(compose)
    targets = set()
    for job in config["scrape_configs"]:
        assert "file_sd_configs" not in job, "only static targets are checked"
        if job.get("metrics_path", "/metrics") != "/metrics":
            continue  # an exporter's targets (test_prometheus_sees_zookeeper_and_redis)
        for static in job.get("static_configs") or []:
            targets.update(static["targets"])
    searches = {f"{s.advertise}:{s.port}" for _, s in _search_servers(compose)}
    data = {f"{s.advertise}:{s.port}" for s in _data_servers(compose)}
    assert len(data) == DATA_SERVERS
    assert searches - targets == set(), "search servers Prometheus does not scrape"
    assert data - targets == set(), "data servers Prometheus does not scrape"


def test_readme_docker_section(compose: dict[str, Any]) -> None:
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"^## Docker\n(.*?)(?=^## )", readme, re.S | re.M)
    assert match, "README.md has no '## Docker' section before the next section"
    section = match.group(1)
    assert "docker compose up" in section or "docker-compose up" in section
    prometheus, _ = _prometheus(compose)
    dashboard = next(
        _published(compose, n)[8080]
        for n, _ in _search_servers(compose)
        if 8080 in _published(compose, n)
    )
    assert f"http://localhost:{dashboard}/" in section
    assert f"http://localhost:{_published(compose, prometheus)[9090]}" in section


DOCKERFILES = [
    "Dockerfile",
    "deploy/docker/zookeeper.Dockerfile",
    "deploy/docker/redis.Dockerfile",
    "deploy/docker/prometheus.Dockerfile",
]


@pytest.mark.parametrize("path", DOCKERFILES)
def test_images_start_from_debian_bookworm_slim_and_drop_root(path: str) -> None:
    dockerfile = (ROOT / path).read_text()
    assert re.search(r"^ARG BASE_IMAGE=debian:bookworm-slim$", dockerfile, re.M), path
    froms = re.findall(r"^FROM\s+(\S+)", dockerfile, re.M)
    assert froms, path
    assert froms[0] == "${BASE_IMAGE}", froms
    users = re.findall(r"^USER\s+(\S+)", dockerfile, re.M)
    assert users, f"{path}: the image must set a USER"
    assert users[-1] not in ("root", "0"), f"{path}: the image must not run as root"
    for copied in re.findall(r"^COPY\s+(\S+)", dockerfile, re.M):
        assert (ROOT / copied).exists(), f"{path}: COPY {copied}: no such file"


def test_servers_come_from_the_debian_packages_the_tests_use() -> None:
    """The Makefile's Debian packages (what `make test` runs) provide the same jars and
    binaries the images install: ZooKeeper's jar, redis-server, redis-sentinel, prometheus."""
    makefile = (ROOT / "Makefile").read_text()
    packages = set(re.search(r"^DEB_PACKAGES := (.*?)(?<!\\)$", makefile, re.M | re.S)[1].split())
    assert {"zookeeper", "redis-server", "redis-sentinel", "prometheus"} <= packages
    # Debian's zookeeper package depends on libzookeeper-java, the jar the fixtures run.
    assert "libzookeeper-java" in (ROOT / "deploy/docker/zookeeper.Dockerfile").read_text()
    redis = (ROOT / "deploy/docker/redis.Dockerfile").read_text()
    assert "redis-server" in redis
    assert "redis-sentinel" in redis
    assert re.search(
        r"install .*\bprometheus\b", (ROOT / "deploy/docker/prometheus.Dockerfile").read_text()
    )


def test_app_image_installs_from_the_wheelhouse_without_an_index() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    installs = re.findall(r"pip install [^\n&;]*", dockerfile)
    assert any("--no-index --find-links /tmp/wheels" in i for i in installs), installs
    assert not any("[dev]" in i or "-e " in i for i in installs), installs
    # Debian's own Python: the interpreter whose markers the wheelhouse is made for.
    assert re.search(r"apt-get install .*python3 python3-venv", dockerfile, re.S)
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".venv", ".git", "bench/results"} <= ignored
    assert any("__pycache__" in line for line in ignored)


def test_prometheus_sees_zookeeper_and_redis(compose: dict[str, Any]) -> None:
    """The ZooKeeper exporter reads every member and is scraped; the Redis exporter is
    asked for every Redis node and sentinel by name (multi-target)."""
    services = cf.services(compose)
    _, config = _prometheus(compose)
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}

    zks = {n for n, s in services.items() if cf.image(s).startswith("search-discovery-zookeeper:")}
    (exporter,) = [p for p in cf.processes(compose) if p.argv[:2] == ["discovery", "zk-exporter"]]
    args = cf.settings(exporter)
    hosts = {h.rsplit(":", 1)[0] for h in str(args.zk).split("/", 1)[0].split(",")}
    assert hosts == zks
    port = args.port
    zk_targets = {t for static in jobs["zookeeper"]["static_configs"] for t in static["targets"]}
    assert zk_targets == {f"{exporter.service}:{port}"}

    redis = {
        n: cf.argv(s)
        for n, s in services.items()
        if cf.image(s).startswith("search-discovery-redis:")
    }
    (redis_exporter,) = [
        n for n, argv in redis.items() if argv[:1] == ["redis-exporter-entrypoint"]
    ]
    argv = redis[redis_exporter]
    listen = argv[argv.index("-web.listen-address") + 1]
    expected = {
        f"redis://{n}:26379" if argv[:1] == ["redis-sentinel-entrypoint"] else f"redis://{n}:6379"
        for n, argv in redis.items()
        if n != redis_exporter
    }
    job = jobs["redis"]
    assert job["metrics_path"] == "/scrape"
    assert {t for static in job["static_configs"] for t in static["targets"]} == expected
    relabels = {r.get("target_label"): r for r in job["relabel_configs"]}
    assert relabels["__param_target"]["source_labels"] == ["__address__"]
    assert relabels["__address__"]["replacement"] == f"{redis_exporter}{listen}"


# -- credentials (issue 42) ------------------------------------------------------------


def test_nothing_is_published_beyond_the_hosts_loopback(compose: dict[str, Any]) -> None:
    published = 0
    for name, service in cf.services(compose).items():
        for port in service.get("ports") or []:
            if isinstance(port, dict):
                host_ip = str(port.get("host_ip", ""))
            else:
                parts = str(port).split("/")[0].split(":")
                host_ip = parts[0] if len(parts) == 3 else ""
            assert host_ip == "127.0.0.1", f"service {name} publishes {port!r} beyond loopback"
            published += 1
    assert published == 2  # the dashboard and Prometheus


def test_zk_init_runs_once_before_every_server_in_the_same_chroot(
    compose: dict[str, Any],
) -> None:
    process, args = cf.zk_init(compose)
    service = cf.services(compose)[process.service]
    assert service.get("restart") == "no", "a one-shot: restarted, it would run forever"
    zks = {n for n, s in cf.services(compose).items() if "zookeeper" in cf.image(s)}
    assert service["depends_on"] == {n: {"condition": "service_healthy"} for n in zks}
    assert args.zk.partition("/")[2], "zk-init needs the cluster's chroot"
    servers = cf.servers(compose)
    assert servers
    for server, settings in servers:
        condition = cf.services(compose)[server.service]["depends_on"].get(process.service)
        assert condition == {"condition": "service_completed_successfully"}, server.service
        zk = cf.template(settings).zk
        assert zk.hosts == args.zk, f"{server.service} and zk-init name other trees"


def test_only_zk_init_holds_the_admin_identity(compose: dict[str, Any]) -> None:
    process, args = cf.zk_init(compose)
    given = zk_init_secrets(args)  # the files it is given parse, as zk-init parses them
    admin = given.admin_auth
    files = cf.secret_files(compose)
    for name, service in cf.services(compose).items():
        mounted = set(cf.mounted(service).values())
        env = cf.environment(service)
        holds = [
            secret for secret in mounted if admin.partition(":")[2] in files[secret].read_text()
        ]
        if name == process.service:
            assert holds, "zk-init does not hold the admin identity it authenticates with"
            continue
        assert not holds, f"service {name} mounts the ZooKeeper admin identity: {holds}"
        assert not any(k.startswith("DISCOVERY_ZK_ADMIN_AUTH") for k in env), name
    # zk-init grants the roles by their hashes: it holds no server's password.
    for secret in process.secrets:
        text = files[secret].read_text()
        for role in ("zk_data", "zk_search"):
            assert files[role].read_text().strip().partition(":")[2] not in text, secret


def test_every_server_holds_its_roles_zookeeper_identity_as_granted(
    compose: dict[str, Any],
) -> None:
    """Fleets and data servers the data identity, search servers the search identity,
    each one zk-init grants that role; from a file, never in the environment."""
    _, args = cf.zk_init(compose)
    granted = zk_init_secrets(args)
    roles = {"data": granted.data, "search": granted.search}
    seen = set()
    for process, settings in cf.servers(compose):
        role = "search" if process.kind == "search-server" else "data"
        zk = cf.template(settings).zk
        assert zk.auth is not None, f"{process.service} has no ZooKeeper identity"
        assert "DISCOVERY_ZK_AUTH" not in process.env, f"{process.service}: not from a file"
        assert "--zk-auth" not in process.argv, f"{process.service}: not from a file"
        assert DigestId.parse(zk.auth) in roles[role], (process.service, role)
        other = "data" if role == "search" else "search"
        assert DigestId.parse(zk.auth) not in roles[other], process.service
        seen.add(role)
    assert seen == {"data", "search"}


def _acl_users(path: Path) -> dict[str, str]:
    """user -> the rest of its ``user NAME reset on #HASH RULES`` line."""
    users = {}
    for line in path.read_text().splitlines():
        word, name, rest = line.split(" ", 2)
        assert word == "user", line
        users[name] = rest
    return users


def _hash_of(rules: str) -> str:
    (digest,) = [word[1:] for word in rules.split() if word.startswith("#")]
    return digest


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_redis_and_the_sentinels_require_the_passwords_the_search_servers_hold(
    compose: dict[str, Any],
) -> None:
    services = cf.services(compose)
    files = cf.secret_files(compose)
    redis = {n: s for n, s in services.items() if cf.image(s).startswith("search-discovery-redis:")}
    for name, service in redis.items():
        argv = cf.argv(service)
        assert "protected-mode" not in " ".join(argv).replace("--", ""), name
    entrypoints = ROOT / "deploy" / "docker"
    for script in ("redis-server-entrypoint.sh", "redis-sentinel-entrypoint.sh"):
        text = (entrypoints / script).read_text()
        assert "protected-mode yes" in text, script
        assert "protected-mode no" not in text, script
    assert "--protected-mode" not in (entrypoints / "redis.Dockerfile").read_text()

    nodes = [n for n, s in redis.items() if cf.argv(s)[:1] == ["redis-server-entrypoint"]]
    sentinels = [n for n, s in redis.items() if cf.argv(s)[:1] == ["redis-sentinel-entrypoint"]]
    assert len(nodes) == 2
    assert len(sentinels) == 3
    for name in nodes:
        assert {"redis_users", "redis_replica"} <= set(cf.mounted(redis[name]).values()), name
    for name in sentinels:
        mounted = set(cf.mounted(redis[name]).values())
        assert {"sentinel_admin", "sentinel_users", "redis_sentinel"} <= mounted, name
    users = _acl_users(files["redis_users"])
    assert "nopass" not in users["default"]
    assert _hash_of(users["default"])
    # Replication and Sentinel's link use users whose passwords the nodes/sentinels hold.
    assert _hash_of(users["replica"]) == _sha256(files["redis_replica"].read_text().strip())
    assert _hash_of(users["sentinel"]) == _sha256(files["redis_sentinel"].read_text().strip())

    sentinel_users = _acl_users(files["sentinel_users"])
    searches = _search_servers(compose)
    assert searches
    for name, settings in searches:
        cluster, redis_settings = settings.cluster, settings.cluster.redis
        prefix = cluster.redis_prefix
        assert redis_settings.username == "reader"
        assert redis_settings.password
        assert redis_settings.publish_username == "publisher"
        assert redis_settings.publish_password
        assert redis_settings.sentinel_username == "discovery"
        assert redis_settings.sentinel_password
        assert _hash_of(users["reader"]) == _sha256(redis_settings.password), name
        assert _hash_of(users["publisher"]) == _sha256(redis_settings.publish_password), name
        assert users["reader"].endswith(reader_acl_rules(prefix)), name
        assert users["publisher"].endswith(publisher_acl_rules(prefix)), name
        sentinel = sentinel_users["discovery"]
        assert _hash_of(sentinel) == _sha256(redis_settings.sentinel_password), name
        assert "+sentinel|get-master-addr-by-name" in sentinel
        assert not any(w in sentinel for w in ("+@all", "+sentinel|set", "+sentinel|failover"))


def test_publishing_and_admin_credentials_stay_where_they_belong(
    compose: dict[str, Any],
) -> None:
    """The Redis publisher password only in search servers (any may lead); no Redis
    credential in a data server; the Redis admin password in no container at all."""
    searches = {name for name, _ in _search_servers(compose)}
    for name, service in cf.services(compose).items():
        mounted = set(cf.mounted(service).values())
        assert "redis_admin" not in mounted, name
        if name not in searches:
            assert "redis_publisher" not in mounted, name
            assert "redis_reader" not in mounted, name
    for process, settings in cf.servers(compose):
        if process.kind != "search-server":
            redis = cf.template(settings).cluster.redis
            assert redis.password is None, process.service
            assert redis.publish_password is None, process.service


def test_search_servers_admit_data_servers_on_the_compose_network_only(
    compose: dict[str, Any],
) -> None:
    ((subnet,),) = [[c["subnet"] for c in compose["networks"]["default"]["ipam"]["config"]]]
    network = ipaddress.ip_network(subnet)
    # The range reserved for network tests, away from the /24s their labs take first.
    assert network.subnet_of(ipaddress.ip_network("198.18.0.0/15"))
    assert not network.subnet_of(ipaddress.ip_network("198.18.0.0/17"))
    for name, settings in _search_servers(compose):
        assert settings.allowed_networks.networks == (network,), name


def test_every_declared_secret_is_made_and_mounted_somewhere(compose: dict[str, Any]) -> None:
    files = cf.secret_files(compose)
    assert files, "no secrets declared"
    for name, path in files.items():
        assert path.is_file(), f"secret {name}: make compose-secrets makes no {path.name}"
    mounted = {s for service in cf.services(compose).values() for s in cf.mounted(service).values()}
    assert mounted == set(files), set(files) ^ mounted
    ignored = (ROOT / ".gitignore").read_text().split()
    assert "deploy/compose/secrets/" in ignored
    assert "deploy/compose/secrets" in (ROOT / ".dockerignore").read_text().split()
