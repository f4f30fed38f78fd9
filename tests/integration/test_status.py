"""``discovery status`` against a real ZooKeeper, Redis, data servers and search servers."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
import uuid
from typing import Any

import pytest
import redis.asyncio as aioredis

from discovery.livelist.redis.layout import RedisKeys
from discovery.livelist.redis.publisher import LivePublisher
from discovery.livelist.redis.store import RedisLiveStore
from discovery.testing import RedisServer, free_port
from discovery.tools.main import build_parser
from discovery.tools.status import PROBLEMS, collect_status, format_text
from discovery.zk.paths import DATA_SERVERS_PATH, SEARCH_ELECTION_PATH, SEARCH_MEMBERS_PATH
from tests.support import (
    SCHEMAS,
    DataServerFactory,
    SearchServerFactory,
    SessionFactory,
    cluster_of,
    conforming,
    eventually,
    make_instance,
    reap,
    schema_errors,
    waited,
)

CLI_TIMEOUT = 60.0


async def run_cli(*args: str, log_level: str | None = "WARNING") -> tuple[int, str, str]:
    """``python -m discovery.tools.main status ARGS`` in a subprocess; (exit code, stdout, stderr).

    Asynchronous, so that the servers of the test keep running on this loop meanwhile.
    ``log_level`` None leaves the command's own default.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISCOVERY_")}
    level = ("--log-level", log_level) if log_level is not None else ()
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "discovery.tools.main", *level, "status", *args),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        out, err = await waited(
            process.communicate(),
            f"`discovery status {' '.join(args)}` to finish",
            timeout=CLI_TIMEOUT,
        )
    finally:
        await reap(process)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def cluster_args(zk_hosts: str, redis_url: str, redis_prefix: str) -> list[str]:
    cluster = cluster_of(redis_prefix)
    return ["--zk", zk_hosts, "--redis", redis_url, "--cluster", cluster]


def data_server_ids(document: dict[str, Any]) -> dict[str, int]:
    return {
        server["id"]: shard["shard"]
        for shard in document["data_servers"]["shards"]
        for server in shard["servers"]
    }


@pytest.mark.smoke
async def test_in_sync_cluster_shows_leader_epoch_servers_and_no_differences(
    zk_hosts: str,
    redis_server: RedisServer,
    redis_prefix: str,
    client: aioredis.Redis,
    make_session: SessionFactory,
    make_data_server: DataServerFactory,
    make_search_server: SearchServerFactory,
) -> None:
    data = [await make_data_server(shard=i, instance_id=f"ds-{i}") for i in range(2)]
    search = [await make_search_server(server_id=f"ss-{i}") for i in range(2)]

    def settled() -> bool:
        lists = [s.reader.current if s.reader else None for s in search]
        return any(s.is_leader for s in search) and all(
            live is not None and set(live.servers) == {"ds-0", "ds-1"} for live in lists
        )

    await eventually(settled, message="a leader, and both live lists hold both data servers")
    leader = next(s for s in search if s.is_leader)
    assert leader.election is not None
    assert leader.election.leadership is not None
    epoch = leader.election.leadership.epoch

    status = await collect_status(await make_session(), RedisLiveStore(client, redis_prefix).admin)
    document = conforming(status.to_dict(), "status")
    assert document["leader"]["id"] == leader.server_id
    assert document["leader"]["epoch"] == epoch
    assert document["contenders"][0]["id"] == leader.server_id
    assert {c["id"] for c in document["contenders"]} == {"ss-0", "ss-1"}
    assert {s["id"] for s in document["search_servers"]["servers"]} == {"ss-0", "ss-1"}
    assert data_server_ids(document) == {"ds-0": 0, "ds-1": 1}
    by_id = {s["id"]: s for shard in document["data_servers"]["shards"] for s in shard["servers"]}
    for server in data:
        assert by_id[server.instance_id]["port"] == server.port
        assert by_id[server.instance_id]["state"] == "serving"
    published = document["published"]
    assert published["present"] is True
    assert published["version"] > 0
    assert published["epoch"] == epoch
    assert published["leader"] == leader.server_id
    assert published["count"] == 2
    assert published["age_ms"] >= 0
    heartbeat = document["heartbeat"]
    assert heartbeat["leader"] == leader.server_id
    assert heartbeat["epoch"] == epoch
    assert heartbeat["ttl_ms"] > 0
    assert document["differences"] == {
        "in_sync": True,
        "registered_not_published": [],
        "published_not_registered": [],
        "mismatched": [],
        "no_leader": False,
        "heartbeat_missing": False,
        "published_missing": False,
        "leader_mismatch": [],
    }
    assert document["health"] == {"healthy": True, "problems": []}
    assert json.loads(json.dumps(document)) == document  # plain JSON all the way down

    # The command line, as an operator runs it: JSON, then text.
    args = cluster_args(zk_hosts, redis_server.url, redis_prefix)
    code, out, err = await run_cli(*args, "--json")
    assert code == 0, err
    cli_document = conforming(json.loads(out), "status")
    assert cli_document["leader"]["id"] == leader.server_id
    assert cli_document["leader"]["epoch"] == epoch
    assert data_server_ids(cli_document) == {"ds-0": 0, "ds-1": 1}
    assert cli_document["published"]["version"] > 0
    assert cli_document["differences"]["in_sync"] is True

    code, out, err = await run_cli(*args)
    assert code == 0, err
    assert "health     healthy" in out.splitlines()
    assert f"leader     {leader.server_id}  epoch {epoch}" in out
    lines = out.splitlines()
    shard0, shard1 = lines.index("  shard 0"), lines.index("  shard 1")
    assert "ds-0" in lines[shard0 + 1]
    assert "ds-1" in lines[shard1 + 1]
    assert f"127.0.0.1:{data[1].port}" in lines[shard1 + 1]
    assert "serving" in lines[shard1 + 1]
    assert lines[-1] == "differences: none"
    shards = "  shards (published list): 2, 2 with every replica live, 0 with some not live, "
    assert shards + "0 with no live replica" in lines

    # Told the cluster has three shards, it names the one with no server at all.
    # Degraded: exit status 1, and the verdict names the problem.
    code, out, err = await run_cli(*args, "--shards", "3")
    assert code == 1, err
    assert "  no live replica: shard 2" in out.splitlines()
    assert "health     degraded: no_live_replica" in out.splitlines()


async def test_differences_between_registered_and_published_are_listed(
    zk_hosts: str,
    redis_server: RedisServer,
    redis_prefix: str,
    client: aioredis.Redis,
    make_session: SessionFactory,
) -> None:
    # No search servers run: we play the registrations and the leader's publish ourselves.
    session = await make_session()
    registered = {
        "ds-a": make_instance("ds-a", 9001, shard=0),
        "ds-b": make_instance("ds-b", 9002, shard=1),
    }
    for instance in registered.values():
        await session.create(
            f"{DATA_SERVERS_PATH}/{instance.id}", instance.to_json(), ephemeral=True, makepath=True
        )
    publisher = LivePublisher(client, redis_prefix, leader_id="ss-old", epoch=7, heartbeat_ttl=60)
    published = {
        "ds-a": make_instance("ds-a", 9101, shard=0).with_state("draining", "drain"),
        "ds-c": make_instance("ds-c", 9003, shard=2),
    }
    version = await publisher.publish_full(published)

    status = await collect_status(session, RedisLiveStore(client, redis_prefix).admin)
    differences = conforming(status.to_dict(), "status")["differences"]
    assert differences["in_sync"] is False
    assert differences["registered_not_published"] == ["ds-b"]
    assert differences["published_not_registered"] == ["ds-c"]
    assert differences["mismatched"] == [
        {
            "id": "ds-a",
            "fields": {
                "enabled": {"registered": True, "published": False},
                "port": {"registered": 9001, "published": 9101},
                "state": {"registered": "serving", "published": "draining"},
            },
        }
    ]
    assert differences["no_leader"] is True  # nobody is in the election
    assert differences["heartbeat_missing"] is False
    assert differences["published_missing"] is False
    assert status.published.live is not None
    assert status.published.live.version == version
    assert status.published.live.epoch == 7
    text = format_text(status)
    assert "registered, not published: ds-b" in text
    assert "published, not registered: ds-c" in text
    assert (
        "differs ds-a (registered -> published): enabled true -> false, port 9001 -> 9101, "
        "state serving -> draining"
    ) in text
    (ds_b_line,) = [line for line in text.splitlines() if line.startswith("    ds-b ")]
    assert ds_b_line.endswith("[not published]")
    assert "differences: none" not in text

    # Two contenders join the election (as kazoo's recipe names its nodes): the first
    # leads with its node's czxid as epoch, which the published list does not match.
    nodes = [
        await session.create(
            f"{SEARCH_ELECTION_PATH}/{uuid.uuid4().hex}__lock__",
            name.encode(),
            ephemeral=True,
            sequence=True,
            makepath=True,
        )
        for name in ("ss-new", "ss-next")
    ]
    first = await session.exists(nodes[0])
    assert first is not None
    # The heartbeat runs out: nobody is publishing.
    await client.delete(RedisKeys(redis_prefix).leader)

    status = await collect_status(session, RedisLiveStore(client, redis_prefix).admin)
    document = conforming(status.to_dict(), "status")
    assert document["leader"]["id"] == "ss-new"
    assert document["leader"]["epoch"] == first.czxid
    assert [c["id"] for c in document["contenders"]] == ["ss-new", "ss-next"]
    assert document["heartbeat"] is None
    differences = document["differences"]
    assert differences["no_leader"] is False
    assert differences["heartbeat_missing"] is True
    assert differences["leader_mismatch"] == [
        f"published by 'ss-old' epoch 7, elected 'ss-new' epoch {first.czxid}"
    ]
    text = format_text(status)
    assert "heartbeat missing: no leader is publishing" in text
    assert "leader mismatch: published by 'ss-old' epoch 7" in text

    # The same through the command line: exit 1 (degraded), differences in the document.
    code, out, err = await run_cli(
        *cluster_args(zk_hosts, redis_server.url, redis_prefix), "--json"
    )
    assert code == 1, err
    assert conforming(json.loads(out), "status")["health"] == {
        "healthy": False,
        "problems": [
            "heartbeat_missing",
            "leader_mismatch",
            "registered_not_published",
            "published_not_registered",
            "mismatched",
            "no_live_replica",  # shard 0: its one server published as draining
        ],
    }
    cli_differences = conforming(json.loads(out), "status")["differences"]
    assert cli_differences["registered_not_published"] == ["ds-b"]
    assert cli_differences["published_not_registered"] == ["ds-c"]
    assert cli_differences["heartbeat_missing"] is True


async def test_malformed_children_and_snapshot_are_listed_not_fatal(
    zk_hosts: str,
    redis_server: RedisServer,
    redis_prefix: str,
    client: aioredis.Redis,
    make_session: SessionFactory,
) -> None:
    session = await make_session()
    good = make_instance("ds-ok", 9001, shard=3)
    children = {
        "ds-ok": good.to_json(),
        "not-json": b"{not json",
        "empty": b"",
        "wrong-id": make_instance("someone-else", 9002).to_json(),
        "no-port": json.dumps({**good.to_dict(), "id": "no-port", "port": None}).encode(),
    }
    for child, data in children.items():
        await session.create(f"{DATA_SERVERS_PATH}/{child}", data, makepath=True, ephemeral=True)
    # Persistent nodes outlive whatever wrote them: refused as the leader refuses them,
    # a STATIC one unless persistent members are allowed, a DYNAMIC one always.
    static = dataclasses.replace(make_instance("ds-static", 9003, shard=4), service_type="STATIC")
    await session.create(f"{DATA_SERVERS_PATH}/ds-static", static.to_json())
    squatter = make_instance("persistent-dyn", 9004)
    await session.create(f"{DATA_SERVERS_PATH}/persistent-dyn", squatter.to_json())
    await session.create(f"{SEARCH_MEMBERS_PATH}/ss-bad", b"[]", makepath=True)
    keys = RedisKeys(redis_prefix)
    await client.hset(keys.meta, mapping={"epoch": "garbage", "version": "1"})
    await client.set(keys.leader, b"{", px=60_000)

    store = RedisLiveStore(client, redis_prefix)
    allowed = await collect_status(session, store.admin, allow_persistent_members=True)
    assert data_server_ids(conforming(allowed.to_dict(), "status")) == {"ds-ok": 3, "ds-static": 4}
    status = await collect_status(session, store.admin)
    document = conforming(status.to_dict(), "status")
    assert data_server_ids(document) == {"ds-ok": 3}
    invalid = {entry["id"]: entry["reason"] for entry in document["data_servers"]["invalid"]}
    assert set(invalid) == {
        "not-json",
        "empty",
        "wrong-id",
        "no-port",
        "persistent-dyn",
        "ds-static",
    }
    assert invalid["persistent-dyn"].startswith("persistent_dynamic: serviceType DYNAMIC ")
    assert invalid["ds-static"].startswith("persistent: serviceType STATIC ")
    assert invalid["not-json"].startswith("malformed: ")
    assert "not valid JSON" in invalid["not-json"]
    assert invalid["wrong-id"].startswith("id_mismatch: ")
    assert "port" in invalid["no-port"]
    assert [e["id"] for e in document["search_servers"]["invalid"]] == ["ss-bad"]
    assert document["search_servers"]["count"] == 0
    assert document["published"]["present"] is False
    assert document["published"]["error"].startswith("invalid: ")
    assert document["heartbeat"]["error"].startswith("not valid JSON")
    assert document["differences"]["published_missing"] is True
    # Invalid children are not "registered": only the valid one is missing from the list.
    assert document["differences"]["registered_not_published"] == ["ds-ok"]
    text = format_text(status)
    assert "  invalid (6)\n    ds-static: persistent: serviceType STATIC " in text
    assert "heartbeat  unreadable: not valid JSON" in text

    assert "invalid_registrations" in status.health.problems
    code, out, err = await run_cli(*cluster_args(zk_hosts, redis_server.url, redis_prefix))
    assert code == 1, err
    assert "not-json: malformed:" in out
    assert "ds-static: persistent: serviceType STATIC " in out
    assert "published list invalid:" in out
    code, out, err = await run_cli(
        *cluster_args(zk_hosts, redis_server.url, redis_prefix),
        "--allow-persistent-members",
        "--json",
    )
    assert code == 1, err
    allowed_document = json.loads(out)
    assert data_server_ids(allowed_document) == {"ds-ok": 3, "ds-static": 4}


async def test_unreachable_zookeeper_exits_3_naming_it(redis_server: RedisServer) -> None:
    port = free_port()
    code, out, err = await run_cli(
        *("--zk", f"127.0.0.1:{port}", "--zk-connect-timeout", "1", "--redis", redis_server.url)
    )
    assert code == 3
    assert out == ""
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"discovery status: cannot reach ZooKeeper at 127.0.0.1:{port}: ")
    assert "Redis" not in last


async def test_unreachable_redis_exits_3_naming_it_without_its_password(zk_hosts: str) -> None:
    port = free_port()
    code, out, err = await run_cli(
        *("--zk", zk_hosts, "--redis", f"redis://:s3cret@127.0.0.1:{port}/0")
    )
    assert code == 3
    assert out == ""
    last = err.strip().splitlines()[-1]
    assert last.startswith(
        f"discovery status: cannot reach Redis at redis://:***@127.0.0.1:{port}/0"
    )
    assert "s3cret" not in err


def test_parser_options_and_log_level(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    args = parser.parse_args(["status"])
    assert args.zk_connect_timeout == 5.0  # shorter than a server's start-up bound
    assert args.json is False
    # The top-level --log-level is not overwritten by the subcommand's default...
    assert parser.parse_args(["--log-level", "DEBUG", "status"]).log_level == "DEBUG"
    # ... and may be given after the subcommand too.
    assert parser.parse_args(["status", "--log-level", "error"]).log_level == "ERROR"
    args = parser.parse_args(
        ["status", "--zk", "h:1/c", "--redis", "redis://r:2/0", "--cluster", "c1", "--json"]
    )
    assert (args.zk, args.redis, args.cluster, args.json) == ("h:1/c", "redis://r:2/0", "c1", True)
    with pytest.raises(SystemExit):
        parser.parse_args(["status", "--help"])
    help_text = capsys.readouterr().out
    for name in (
        "--zk ",
        "DISCOVERY_ZK_HOSTS",
        "--redis",
        "DISCOVERY_REDIS_URL",
        "--cluster",
        "--json",
        # What a script relies on, stated where it looks.
        "exit status: 0 healthy; 1 degraded",
        "no_live_replica",
        "2 bad arguments (the flag is named); 3 ZooKeeper or Redis could not be reached",
        "4 ZooKeeper or Redis refused (credentials or ACL",
    ):
        assert name in " ".join(help_text.split())


async def test_status_is_quiet_by_default_and_logs_connections_on_v(
    zk_hosts: str, redis_server: RedisServer, redis_prefix: str
) -> None:
    args = cluster_args(zk_hosts, redis_server.url, redis_prefix)
    code, out, err = await run_cli(*args, log_level=None)
    assert code == 1, err  # an empty cluster: no leader, nothing published
    assert "health     degraded: no_leader, heartbeat_missing, published_missing" in out
    # An operator asked a question: the answer, not kazoo's connection log.
    assert err == ""
    code, _, err_v = await run_cli("-v", *args, log_level=None)
    assert code == 1, err_v
    assert " INFO kazoo.client: Connecting to " in err_v
    assert " DEBUG " not in err_v
    code, _, err_vv = await run_cli("-vv", *args, log_level=None)
    assert code == 1, err_vv
    assert " DEBUG " in err_vv


async def test_one_address_claimed_by_several_ids_is_shown_as_a_squatting_sign(
    redis_prefix: str, client: aioredis.Redis, make_session: SessionFactory
) -> None:
    real, squatter = await make_session(), await make_session()
    await real.create(
        f"{DATA_SERVERS_PATH}/ds-real",
        make_instance("ds-real", 9301, address="10.0.0.7").to_json(),
        ephemeral=True,
        makepath=True,
    )
    # Another identity registering the real server's address under an id of its own.
    await squatter.create(
        f"{DATA_SERVERS_PATH}/ds-squat",
        make_instance("ds-squat", 9301, address="10.0.0.7").to_json(),
        ephemeral=True,
    )
    await squatter.create(
        f"{DATA_SERVERS_PATH}/ds-other",
        make_instance("ds-other", 9302, address="10.0.0.7").to_json(),
        ephemeral=True,
    )

    status = await collect_status(real, RedisLiveStore(client, redis_prefix).admin)
    assert conforming(status.to_dict(), "status")["data_servers"]["shared_targets"] == [
        {"target": "10.0.0.7:9301", "ids": ["ds-real", "ds-squat"]}
    ]
    text = format_text(status)
    assert "one address claimed by several ids" in text
    assert "    10.0.0.7:9301: ds-real, ds-squat" in text


async def test_with_shards_a_server_of_another_shard_is_reported_refused_with_the_reason(
    zk_hosts: str,
    redis_server: RedisServer,
    redis_prefix: str,
    client: aioredis.Redis,
    make_session: SessionFactory,
) -> None:
    """Issue 42: a node registered under a shard number the cluster does not have is
    refused by the leader and the search servers of that ``--shards``; ``discovery
    status --shards`` says so, with the reason, rather than counting a shard 999."""
    session = await make_session()
    for instance in (
        make_instance("ds-0", 9401, shard=0),
        make_instance("ds-1", 9402, shard=1),
        make_instance("ds-999", 9403, shard=999),
    ):
        await session.create(
            f"{DATA_SERVERS_PATH}/{instance.id}", instance.to_json(), ephemeral=True, makepath=True
        )
    admin = RedisLiveStore(client, redis_prefix).admin

    status = await collect_status(session, admin, expected_shards=2)
    document = conforming(status.to_dict(), "status")
    assert data_server_ids(document) == {"ds-0": 0, "ds-1": 1}
    [refused] = document["data_servers"]["invalid"]
    assert refused["id"] == "ds-999"
    assert refused["reason"].startswith("shard_out_of_range: shard 999 ")
    assert "refused" in refused["reason"]
    assert document["data_servers"]["shard_summary"]["total"] == 2
    assert "invalid_registrations" in status.health.problems
    # Not published by a leader of that --shards: no difference to report for it.
    assert "ds-999" not in status.differences.registered_not_published
    # Without --shards, shard 999 is one of the cluster's.
    unbounded = await collect_status(session, admin)
    assert data_server_ids(conforming(unbounded.to_dict(), "status"))["ds-999"] == 999

    args = cluster_args(zk_hosts, redis_server.url, redis_prefix)
    code, out, err = await run_cli(*args, "--shards", "2")
    assert code == 1, err
    assert "ds-999: shard_out_of_range: shard 999 " in out


def _large_status(shards: int, replicas: int, **overrides: Any) -> Any:
    """A status of ``shards`` x ``replicas`` registered and published data servers, made
    without I/O (the text report is a pure function of it)."""
    from discovery.livelist.model import LiveList
    from discovery.tools.status.model import ClusterStatus, Contender, Published, compare

    registered = {
        f"ds-{s:03d}-{r:02d}": make_instance(
            f"ds-{s:03d}-{r:02d}", 9000, address=f"10.1.{s}.{r + 1}", shard=s, replica=r
        )
        for s in range(shards)
        for r in range(replicas)
    }
    published = dict(overrides.pop("published", registered))
    registered = overrides.pop("registered", registered)
    live = LiveList(7, 3, "ss-0", 1_700_000_000_000, published)
    contenders = (Contender("ss-0", "x__lock__0000000001", 7),)
    status = ClusterStatus(
        zookeeper="zk:2181",
        redis="redis:6379/0",
        prefix="discovery:{t}",
        now_ms=1_700_000_001_000,
        contenders=contenders,
        search_servers={},
        search_servers_invalid={},
        data_servers=registered,
        data_servers_invalid={},
        heartbeat=None,
        published=Published(live),
        **overrides,
    )
    return dataclasses.replace(
        status, differences=compare(registered, contenders, None, Published(live))
    )


def test_a_large_cluster_is_summarised_by_state_and_shard_with_the_problems_listed() -> None:
    status = _large_status(60, 5, expected_shards=62)
    registered = dict(status.data_servers)
    # Shard 7 loses every live replica; shard 8 one; shards 60 and 61 have no server at all.
    for r in range(5):
        key = f"ds-007-{r:02d}"
        registered[key] = registered[key].with_state("draining", "deploy")
    registered["ds-008-01"] = registered["ds-008-01"].with_state("maintenance", "disk")
    status = _large_status(60, 5, expected_shards=62, registered=registered, published=registered)

    text = format_text(status)
    lines = text.splitlines()
    assert "data servers (300 in 60 shards): 294 serving, 5 draining, 1 maintenance" in lines
    assert (
        "  shards (published list): 62, 58 with every replica live, 1 with some not live, "
        "3 with no live replica"
    ) in lines
    assert "  no live replica: shard 7, 60, 61" in lines
    listed = [line for line in lines if line.startswith("    ds-")]
    assert [line.split()[0] for line in listed] == [f"ds-007-{r:02d}" for r in range(5)] + [
        "ds-008-01"
    ]
    assert "shard 7" in listed[0]
    assert "draining (deploy)" in listed[0]
    assert len(lines) < 30  # not one line per server

    # --all: every server, by shard, as a small cluster is shown.
    every = format_text(status, every_server=True).splitlines()
    assert "  shard 59" in every
    assert sum(1 for line in every if line.startswith("    ds-")) == 300

    summary = conforming(status.to_dict(), "status")["data_servers"]
    assert summary["states"] == {"serving": 294, "draining": 5, "maintenance": 1, "disabled": 0}
    assert summary["shard_summary"] == {
        "source": "published",
        "total": 62,
        "all_live": 58,
        "some_not_live": 1,
        "no_live_replica": [7, 60, 61],
    }


def test_long_difference_lists_are_cut_in_text_and_whole_in_json() -> None:
    full = _large_status(40, 5)
    # 120 registered servers the leader has not published (yet).
    published = {k: v for k, v in full.data_servers.items() if int(k[3:6]) < 16}
    status = _large_status(40, 5, published=published)
    text = format_text(status)
    line = next(x for x in text.splitlines() if x.startswith("  registered, not published: "))
    assert line.endswith("… and 100 more")
    differences = conforming(status.to_dict(), "status")["differences"]
    assert len(differences["registered_not_published"]) == 120
    assert "not serving, or not as published (120; the first 50;" in text


def test_shards_flag_is_checked_and_named() -> None:
    parser = build_parser()
    assert parser.parse_args(["status", "--shards", "500"]).shards == 500
    assert parser.parse_args(["status"]).shards == 0
    assert parser.parse_args(["status", "--all"]).all is True
    for bad in ("-1", "x", "100001"):
        with pytest.raises(SystemExit):
            parser.parse_args(["status", "--shards", bad])


def test_the_documented_schema_names_every_problem_and_rejects_undocumented_keys() -> None:
    schema = json.loads((SCHEMAS / "status.schema.json").read_text())
    health = schema["properties"]["health"]["properties"]["problems"]["items"]
    assert tuple(health["enum"]) == PROBLEMS  # the names scripts match on, in order
    document = conforming(_large_status(2, 2).to_dict(), "status")
    # A key the schema does not document, a state it does not know: both are caught.
    document["data_servers"]["shards"][0]["servers"][0]["colour"] = "red"
    document["published"]["servers"][0]["state"] = "sleeping"
    errors = schema_errors(document, "status")
    assert any("'colour' was unexpected" in e for e in errors), errors
    assert any("'sleeping' is not one of" in e for e in errors), errors
