"""``discovery zk-init``'s secrets: each has a ``-file`` twin (and its variables), and no
message ever repeats a password, whatever is wrong with the input.

Nothing here reaches ZooKeeper: every case fails (or is read) before zk-init connects.
The same secrets against a real ZooKeeper: tests/integration/test_acl.py.
"""

from __future__ import annotations

import argparse
import io
from collections.abc import Callable
from pathlib import Path

import pytest

from discovery.errors import ConfigError
from discovery.tools import main as cli
from discovery.tools.exitcodes import EXIT_USAGE
from discovery.tools.zkdigest import DigestId, credentials, identity_list
from discovery.tools.zkinit import secrets

PASSWORD = "k9-Secret-pw-7731"
ADMIN = f"admin:{PASSWORD}a"
DATA = f"data:{PASSWORD}d"
SEARCH = f"search:{PASSWORD}s"
# Where zk-init would connect if a case got that far: nothing listens on port 1.
NOWHERE = ["--zk", "127.0.0.1:1/test", "--zk-connect-timeout", "1"]


@pytest.fixture(autouse=True)
def _no_zk_init_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("ADMIN_AUTH", "DATA_IDENTITIES", "SEARCH_IDENTITIES"):
        for suffix in ("", "_FILE"):
            monkeypatch.delenv(f"DISCOVERY_ZK_{variable}{suffix}", raising=False)


def _namespace(argv: list[str]) -> argparse.Namespace:
    return cli.build_parser().parse_args(["zk-init", *NOWHERE, *argv])


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_every_secret_has_a_file_twin_read_once(tmp_path: Path) -> None:
    hashed_search = DigestId.parse(SEARCH)
    files = [
        "--admin-auth-file",
        _write(tmp_path, "admin", f"{ADMIN}\n"),
        "--data-identities-file",
        # One a line, or comma-separated, or both; blank lines ignored.
        _write(tmp_path, "data", f"{DATA}\nother:pw2,third:pw3\n\n"),
        "--search-identities-file",
        _write(tmp_path, "search", f"{hashed_search}\r\n"),
    ]
    given = secrets(_namespace(files))
    assert given.admin_auth == ADMIN
    assert given.data == (
        DigestId.parse(DATA),
        DigestId.parse("other:pw2"),
        DigestId.parse("third:pw3"),
    )
    assert given.search == (hashed_search,)
    # The same from the flags gives the same secrets.
    flags = ["--admin-auth", ADMIN, "--data-identities", f"{DATA},other:pw2,third:pw3"]
    flags += ["--search-identities", str(hashed_search)]
    assert secrets(_namespace(flags)) == given
    # Read when the secrets are built, not later.
    (tmp_path / "admin").write_text("admin:changed\n")
    assert given.admin_auth == ADMIN
    assert PASSWORD not in repr(given)
    assert "admin:***" in repr(given)


def test_the_file_twins_have_variables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISCOVERY_ZK_ADMIN_AUTH_FILE", _write(tmp_path, "a", ADMIN))
    monkeypatch.setenv("DISCOVERY_ZK_DATA_IDENTITIES_FILE", _write(tmp_path, "d", DATA))
    monkeypatch.setenv("DISCOVERY_ZK_SEARCH_IDENTITIES_FILE", _write(tmp_path, "s", SEARCH))
    given = secrets(_namespace([]))
    assert (given.admin_auth, given.data, given.search) == (
        ADMIN,
        (DigestId.parse(DATA),),
        (DigestId.parse(SEARCH),),
    )


def test_help_documents_every_file_twin(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["zk-init", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag in ("--admin-auth", "--data-identities", "--search-identities"):
        variable = "DISCOVERY_ZK_" + flag.removeprefix("--").replace("-", "_").upper()
        assert f"{flag}-file PATH" in text
        assert f"env {variable}_FILE" in text


# Bad inputs, each carrying the password somewhere: (name, argv, environment, files).
# A file's text is written to tmp_path/<name> and its flag given that path.
Case = tuple[str, list[str], dict[str, str], dict[str, str]]
GOOD = {"--admin-auth": ADMIN, "--data-identities": DATA, "--search-identities": SEARCH}


def _with(**changes: str) -> list[str]:
    """The good flags, with some replaced (``data_identities="..."``)."""
    values = dict(GOOD)
    for key, value in changes.items():
        values[f"--{key.replace('_', '-')}"] = value
    return [part for flag, value in values.items() for part in (flag, value)]


def _without(flag: str) -> list[str]:
    return [part for f, v in GOOD.items() if f != flag for part in (f, v)]


BAD: list[Case] = [
    ("admin without a colon", _with(admin_auth=PASSWORD), {}, {}),
    ("admin without a user", _with(admin_auth=f":{PASSWORD}"), {}, {}),
    ("admin hashed", _with(admin_auth=f"digest:admin:{PASSWORD}"), {}, {}),
    ("a password where a hash belongs", _with(data_identities=f"digest:data:{PASSWORD}"), {}, {}),
    ("a hash without a user", _with(data_identities=f"digest::{PASSWORD}"), {}, {}),
    ("an identity without a colon", _with(search_identities=f"search:x,{PASSWORD}"), {}, {}),
    ("the admin's user in a role", _with(data_identities=f"admin:{PASSWORD}"), {}, {}),
    ("a user in both roles", _with(search_identities=f"data:{PASSWORD}"), {}, {}),
    ("a bad variable", _without("--admin-auth"), {"DISCOVERY_ZK_ADMIN_AUTH": PASSWORD}, {}),
    (
        "a bad identities variable",
        _without("--data-identities"),
        {"DISCOVERY_ZK_DATA_IDENTITIES": f"data:{PASSWORD},digest:x:{PASSWORD}"},
        {},
    ),
    ("a bad file", _without("--admin-auth"), {}, {"--admin-auth-file": f"{PASSWORD}\n"}),
    (
        "a bad identities file",
        _without("--search-identities"),
        {},
        {"--search-identities-file": f"search:ok\ndigest:s:{PASSWORD}\n"},
    ),
    ("flag and file", _with(), {}, {"--admin-auth-file": f"{ADMIN}\n"}),
    ("an empty file", _without("--data-identities"), {}, {"--data-identities-file": "\n"}),
    ("missing ones", ["--admin-auth", ADMIN], {}, {}),
]


@pytest.mark.parametrize(("argv", "env", "files"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_no_message_repeats_a_password(
    argv: list[str],
    env: dict[str, str],
    files: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for variable, value in env.items():
        monkeypatch.setenv(variable, value)
    for flag, text in files.items():
        argv = [*argv, flag, _write(tmp_path, flag.strip("-"), text)]
    code: int | str | None
    try:
        code = cli.main(["zk-init", *NOWHERE, *argv])
    except SystemExit as exited:
        code = exited.code
    out, err = capsys.readouterr()
    assert code == EXIT_USAGE, (out, err)
    assert err.startswith("discovery zk-init: "), err
    assert PASSWORD not in out + err, err


@pytest.mark.parametrize(
    ("parse", "text"),
    [
        (DigestId.parse, PASSWORD),
        (DigestId.parse, f":{PASSWORD}"),
        (DigestId.parse, f"digest:user:{PASSWORD}"),
        (DigestId.parse, f"digest:{PASSWORD}"),
        (credentials, f"digest:admin:{PASSWORD}"),
        (credentials, f" {PASSWORD} "),
        (identity_list, f"a:b,{PASSWORD}"),
        (identity_list, f"a:b\ndigest:c:{PASSWORD}"),
    ],
)
def test_no_exception_repeats_a_password(parse: Callable[[str], object], text: str) -> None:
    with pytest.raises((ValueError, argparse.ArgumentTypeError)) as failed:
        parse(text)
    assert PASSWORD not in str(failed.value)


def test_errors_name_the_flag_or_file_that_was_wrong(tmp_path: Path) -> None:
    bad = _write(tmp_path, "search", f"search:ok\n{PASSWORD}\n")
    with pytest.raises(ConfigError) as failed:
        secrets(_namespace([*_without("--search-identities"), "--search-identities-file", bad]))
    message = str(failed.value)
    assert message.startswith("--search-identities-file / DISCOVERY_ZK_SEARCH_IDENTITIES_FILE")
    assert bad in message
    assert "identity 2 of 2" in message
    with pytest.raises(ConfigError, match=r"^--admin-auth / DISCOVERY_ZK_ADMIN_AUTH: .*no ':'"):
        secrets(_namespace(_with(admin_auth=PASSWORD)))
    with pytest.raises(ConfigError, match="give only one"):
        secrets(_namespace([*_with(), "--admin-auth-file", _write(tmp_path, "a", ADMIN)]))
    with pytest.raises(ConfigError, match="required: --data-identities or --data-identities-file"):
        secrets(_namespace(_without("--data-identities")))


def test_zk_digest_names_a_bad_line_by_number_not_by_text(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(f"{DATA}\n{PASSWORD}\n"))
    assert cli.main(["zk-digest"]) == 2
    out, err = capsys.readouterr()
    assert out.strip() == str(DigestId.parse(DATA))
    assert "line 2" in err
    assert PASSWORD not in err
