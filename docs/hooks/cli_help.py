"""A MkDocs hook (mkdocs.yml): the commands' ``--help``, as the installed commands print
it, written into the pages at build time.

A line ``<!-- help: discovery status -->`` (any indentation, e.g. inside an admonition)
becomes a ``text`` code block of what ``discovery status --help`` prints, so the pages
never drift from the flags. The command is one of the project's console scripts
(``[project.scripts]``); its entry point is called in this process with ``--help``
(argparse prints and exits), at a fixed width of 88 columns. A command that fails,
or prints no help, fails the build.

Docs tooling only: nothing in the packages imports it.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import sys
from importlib.metadata import entry_points
from typing import Any

from mkdocs.exceptions import PluginError

MARKER = re.compile(
    r"^(?P<indent>[ \t]*)<!-- help: (?P<command>[a-z][a-z0-9 -]*?) -->[ \t]*$", re.M
)
WIDTH = "88"


@functools.cache
def command_help(command: str) -> str:
    """What ``<command> --help`` prints (``command``: a console script and subcommands)."""
    script, *subcommands = command.split()
    found = entry_points(group="console_scripts", name=script)
    if not found:
        raise PluginError(f"<!-- help: {command} -->: no console script {script!r}")
    main = next(iter(found)).load()
    out = io.StringIO()
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    argv0, sys.argv[0] = sys.argv[0], script  # argparse's default prog
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            main([*subcommands, "--help"])
    except Exception as exc:
        raise PluginError(f"{command} --help failed: {exc!r}") from exc
    finally:
        sys.argv[0] = argv0
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns
    text = out.getvalue().rstrip()
    if not text.startswith("usage:"):
        raise PluginError(f"{command} --help printed no usage: {text[:200]!r}")
    return text


def _block(match: re.Match[str]) -> str:
    indent = match["indent"]
    lines = ["```text", *command_help(match["command"]).splitlines(), "```"]
    return "\n".join(f"{indent}{line}" if line else "" for line in lines)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    return MARKER.sub(_block, markdown)
