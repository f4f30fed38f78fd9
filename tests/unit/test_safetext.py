"""What others wrote is printed escaped (``escape_controls``), by the function and by
the text report of ``discovery status`` built from a status without I/O."""

from __future__ import annotations

import argparse
import unicodedata

import pytest

from discovery.livelist.admin import Heartbeat, Published, StoredFence
from discovery.livelist.model import LiveList
from discovery.safetext import escape_controls
from discovery.tools import fence
from discovery.tools.status.format import format_text
from discovery.tools.status.model import ClusterStatus, Contender, compare
from discovery.zk.maintenance import MaintenanceMarker
from tests.support import make_instance

HOSTILE = "\x1b[2J\nFAKE ROW"

# Every kind the report must not pass through: C0 (ESC, CR, LF, TAB, BEL, NUL), DEL,
# C1 (NEL, CSI), the line and paragraph separators, the bidi embeddings, overrides,
# isolates and marks, zero-width and BOM, and a lone surrogate.
HIDDEN = [
    ("\x1b", "\\x1b"),
    ("\r", "\\r"),
    ("\n", "\\n"),
    ("\t", "\\t"),
    ("\x07", "\\x07"),
    ("\x00", "\\x00"),
    ("\x7f", "\\x7f"),
    ("\x85", "\\x85"),
    ("\x9b", "\\x9b"),
    ("\u2028", "\\u2028"),
    ("\u2029", "\\u2029"),
    *((chr(c), f"\\u{c:04x}") for c in range(0x202A, 0x202F)),
    *((chr(c), f"\\u{c:04x}") for c in range(0x2066, 0x206A)),
    ("\u200e", "\\u200e"),
    ("\u200b", "\\u200b"),
    ("\ufeff", "\\ufeff"),
    ("\ud800", "\\ud800"),
    ("\U000e0041", "\\U000e0041"),
]


def _hidden_left(text: str) -> list[str]:
    return [c for c in text if unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp")]


@pytest.mark.parametrize(("char", "shown"), HIDDEN, ids=[shown for _, shown in HIDDEN])
def test_every_control_bidi_and_separator_character_shows_as_its_escape(
    char: str, shown: str
) -> None:
    text = escape_controls(f"a{char}b")
    assert text == f"a{shown}b"
    assert not _hidden_left(text)


def test_printable_text_is_kept_and_escaping_twice_changes_nothing() -> None:
    for text in ("ds-1 offline (probe failed: timeout)", "zone eu-west-1b", "é 日本 …", "a\u00a0b"):
        assert escape_controls(text) == text
    once = escape_controls(HOSTILE + "\u202e\x85")
    assert once == "\\x1b[2J\\nFAKE ROW\\u202e\\x85"
    assert escape_controls(once) == once
    assert len(once.splitlines()) == 1


def _status(maintenance: dict[str, MaintenanceMarker] | None = None) -> ClusterStatus:
    """Two data servers, one draining with a hostile reason, all published; a leader
    whose election node holds an OSC 8 link; a bell in the publisher's name, a carriage
    return in the heartbeat's error, a bidi override in an invalid member's name."""
    registered = {
        "ds-a": make_instance("ds-a", 9001).with_state("draining", HOSTILE),
        "ds-b": make_instance("ds-b", 9002, shard=1),
    }
    live = LiveList(7, 3, "ss-0\x07", 1_700_000_000_000, registered)
    contenders = (Contender("ss-0\x1b]8;;http://evil/\x1b\\click\x1b]8;;\x1b\\", "n_1", 7),)
    heartbeat = Heartbeat(None, None, None, None, None, error="not valid JSON\rOVERWRITE")
    markers = maintenance or {}
    return ClusterStatus(
        zookeeper="zk:2181",
        redis="redis:6379/0",
        prefix="discovery:{t}",
        now_ms=1_700_000_001_000,
        contenders=contenders,
        search_servers={},
        search_servers_invalid={"ss-\u202ebad": "malformed: \r\nFAKE"},
        data_servers=registered,
        data_servers_invalid={},
        heartbeat=heartbeat,
        published=Published(live),
        differences=compare(registered, contenders, heartbeat, Published(live), markers),
        maintenance=markers,
    )


def test_the_status_report_shows_what_others_wrote_escaped_on_its_own_line() -> None:
    text = format_text(_status())
    assert not _hidden_left(text.replace("\n", ""))
    lines = text.split("\n")
    # The reason stays on its server's line, escaped; no line of its own.
    (server,) = [line for line in lines if line.lstrip().startswith("ds-a ")]
    assert server.endswith("draining (\\x1b[2J\\nFAKE ROW)"), server
    assert not any(line.startswith("FAKE ROW") for line in lines)
    assert "leader     ss-0\\x1b]8;;http://evil/\\x1b\\click\\x1b]8;;\\x1b\\  epoch 7" in text
    assert "heartbeat  unreadable: not valid JSON\\rOVERWRITE" in text
    assert "  invalid ss-\\u202ebad: malformed: \\r\\nFAKE" in text
    assert "by ss-0\\x07" in text


def test_marker_names_are_measured_escaped_so_the_columns_line_up() -> None:
    # Two marker nodes, one named with a bidi override: the "registered" column starts
    # at the same place on both lines, the escaped name's width counted.
    markers = {
        "ds-a": MaintenanceMarker("ds-a", "disk swap", 1_700_000_000_000, "ops"),
        "x\u202eevil": MaintenanceMarker("x\u202eevil", "bidi\u2066name", None, "ops\x9b"),
    }
    text = format_text(_status(markers))
    lines = text.split("\n")
    start = lines.index("maintenance (2):")
    rows = lines[start + 1 : start + 3]
    width = len("x\\u202eevil")  # as shown
    assert rows[0][2 + width :].startswith("  registered    ")
    assert rows[1][2 + width :].startswith("  not registered")
    assert rows[1].startswith("  x\\u202eevil  ")
    assert "bidi\\u2066name" in rows[1]
    assert "by ops\\x9b" in rows[1]


def test_fence_check_shows_a_malformed_records_problem_escaped(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Whoever could write the store wrote the record; why it is malformed quotes it.
    stored = StoredFence((b"x", b"1", None), None, problem="epoch " + HOSTILE)
    report = fence.FenceReport("discovery:{t}", stored, Contender("ss-0", "n_1", 7), 9)
    fence._print(argparse.Namespace(json=False, fence_action="check"), report, None)
    out = capsys.readouterr().out
    assert not _hidden_left(out.replace("\n", ""))
    assert (
        out.splitlines()[0]
        == f"discovery:{{t}}:meta is malformed: epoch {escape_controls(HOSTILE)}"
    )
