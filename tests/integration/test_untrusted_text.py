"""What participants wrote into ZooKeeper reaches the operator's terminal escaped:
``discovery status`` and ``discovery maint list`` against a real ZooKeeper and Redis,
with a data server's reason holding an escape sequence and a fake line, and marker
nodes with bidi overrides in their names and C1 controls in their reasons."""

from __future__ import annotations

import asyncio
import json
import unicodedata

import pytest

from discovery.testing import RedisServer
from discovery.tools import main as cli
from discovery.zk.paths import DATA_SERVERS_PATH, MAINTENANCE_PATH
from tests.integration.test_status import cluster_args, run_cli
from tests.support import SessionFactory, make_instance

HOSTILE = "\x1b[2J\nFAKE ROW"
SHOWN = "\\x1b[2J\\nFAKE ROW"
# ZooKeeper takes neither C0 nor C1 characters in a node's name, but a bidi override.
ODD_NAME = "ds-\u202eodd"
ODD_SHOWN = "ds-\\u202eodd"
# A marker's reason may not hold C0 controls or DEL; C1 ones (a CSI) and bidi pass.
ODD_REASON = "swap \x9b2J \u2067rack\u2069"
ODD_REASON_SHOWN = "swap \\x9b2J \\u2067rack\\u2069"


def _hidden(text: str) -> list[str]:
    return [
        c
        for c in text.replace("\n", "")
        if unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp")
    ]


async def _register_hostile(make_session: SessionFactory) -> None:
    session = await make_session()
    evil = make_instance("ds-evil", 9501).with_state("draining", HOSTILE)
    await session.create(
        f"{DATA_SERVERS_PATH}/ds-evil", evil.to_json(), ephemeral=True, makepath=True
    )
    marker = json.dumps({"reason": ODD_REASON, "by": "ops"}, ensure_ascii=False).encode()
    await session.create(f"{MAINTENANCE_PATH}/ds-good", marker, makepath=True)
    await session.create(f"{MAINTENANCE_PATH}/{ODD_NAME}", marker)


async def test_status_shows_a_hostile_reason_escaped_on_its_servers_line(
    zk_hosts: str, redis_server: RedisServer, redis_prefix: str, make_session: SessionFactory
) -> None:
    await _register_hostile(make_session)
    args = cluster_args(zk_hosts, redis_server.url, redis_prefix)
    code, out, err = await run_cli(*args)
    assert code == 1, err  # nothing is published: degraded
    assert not _hidden(out), [line for line in out.splitlines() if _hidden(line)]
    lines = out.splitlines()
    (server,) = [line for line in lines if line.startswith("    ds-evil ")]
    assert server.endswith(f"draining ({SHOWN})  [not published]"), server
    assert not any("FAKE ROW" in line and "ds-evil" not in line for line in lines)
    # The maintenance table: the odd name escaped, and measured as shown.
    start = lines.index("maintenance (2):")
    rows = lines[start + 1 : start + 3]
    assert rows[0].startswith(f"  ds-good{' ' * (len(ODD_SHOWN) - len('ds-good'))}  not registered")
    assert rows[1].startswith(f"  {ODD_SHOWN}  not registered  UNREADABLE marker (bad_name")
    assert ODD_REASON_SHOWN in rows[0]

    # The JSON document keeps the exact text (json.dumps escapes it in its own way).
    code, out, err = await run_cli(*args, "--json")
    assert code == 1, err
    assert not _hidden(out)
    document = json.loads(out)
    servers = [s for shard in document["data_servers"]["shards"] for s in shard["servers"]]
    assert [s["reason"] for s in servers if s["id"] == "ds-evil"] == [HOSTILE]
    markers = {m["id"]: m for m in document["maintenance"]["markers"]}
    assert markers["ds-good"]["reason"] == ODD_REASON
    assert ODD_NAME in markers


async def test_maint_list_shows_marker_names_and_reasons_escaped(
    zk_hosts: str, make_session: SessionFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    await _register_hostile(make_session)
    capsys.readouterr()
    code = await asyncio.to_thread(
        cli.main, ["--log-level", "ERROR", "maint", "list", "--zk", zk_hosts]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert not _hidden(out)
    lines = out.splitlines()
    assert lines[0] == "maintenance markers (2):"
    good = f"  ds-good{' ' * (len(ODD_SHOWN) - len('ds-good'))}  not registered  "
    assert lines[1].startswith(good), lines
    assert lines[1].endswith(f"by ops: {ODD_REASON_SHOWN}")
    assert lines[2].startswith(f"  {ODD_SHOWN}  not registered  UNREADABLE (bad_name")
