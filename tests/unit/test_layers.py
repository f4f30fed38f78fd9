"""What ``import discovery`` brings in: the core only, never a tool, the test tooling,
the entry points' option tables or an application (no servers needed)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_importing_the_library_loads_the_core_only() -> None:
    script = (
        "import json, sys, discovery; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('discovery', 'data_server', 'search_server') or m == 'argparse')))"
    )
    loaded = json.loads(
        subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, check=True
        ).stdout
    )
    assert "discovery.zk.session" in loaded  # the probe sees what it should
    outside = [
        m
        for m in loaded
        if m == "argparse"
        or m.split(".")[0] != "discovery"
        or m.startswith(("discovery.tools", "discovery.testing", "discovery.cli"))
    ]
    assert not outside, f"import discovery loaded {outside}"
