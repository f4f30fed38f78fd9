"""The operator commands' exit status: one scheme, stated in every command's ``--help``.

What each code is returned for is asserted where the command runs against real servers
(tests/integration/test_status.py, test_maintenance.py, test_redis_contents.py, test_acl.py,
test_redis_auth.py); here, that scripts can read the scheme where they look.
"""

from __future__ import annotations

import pytest

from discovery.tools import exitcodes
from discovery.tools.main import build_parser


def test_the_codes_are_the_documented_ones() -> None:
    codes = (
        exitcodes.EXIT_OK,
        exitcodes.EXIT_ATTENTION,
        exitcodes.EXIT_USAGE,
        exitcodes.EXIT_UNREACHABLE,
        exitcodes.EXIT_REFUSED,
    )
    assert codes == (0, 1, 2, 3, 4)
    for code, words in ((0, "0 (:data:`EXIT_OK`)"), (4, "4 (:data:`EXIT_REFUSED`)")):
        assert words in (exitcodes.__doc__ or ""), code


@pytest.mark.parametrize(
    ("argv", "meaning"),
    [
        (["status"], "exit status: 0 healthy; 1 degraded"),
        (["maint", "set"], "exit status: 0 done (clearing an absent marker is not an error)"),
        (["maint", "clear"], "exit status: 0 done"),
        (["maint", "list"], "exit status: 0 done"),
        (["fence", "check"], "exit status: 0 fine / repaired; 1 check: poisoned"),
        (["fence", "repair"], "repair: nothing written"),
        (["zk-init"], "exit status: 0 done"),
    ],
)
def test_every_operator_command_states_the_scheme_in_its_help(
    argv: list[str], meaning: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args([*argv, "--help"])
    assert exited.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert meaning in text
    for common in (
        "2 bad arguments",
        "3 ZooKeeper or Redis could not be reached or failed the operation",
        "4 ZooKeeper or Redis refused (credentials or ACL",
    ):
        assert common in text, (argv, common)
