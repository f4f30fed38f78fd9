"""A MkDocs hook (mkdocs.yml): each alert rule of ``deploy/alerts.yml``, as Prometheus
loads it, written into the runbook page at build time.

A line ``<!-- alert: DiscoveryNoLeader -->`` becomes a table of that rule: severity,
how long the condition must hold (``for``), the summary, the rule's own runbook line
and its expression. The page that holds such markers must hold one for every rule in
the file, and only rules of the file: a rule added without its runbook section, or a
section left for a rule that is gone, fails the build.

Docs tooling only: nothing in the packages imports it.
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

import yaml
from mkdocs.exceptions import PluginError

MARKER = re.compile(r"^<!-- alert: (?P<name>[A-Za-z0-9_]+) -->[ \t]*$", re.M)
RULES_FILE = Path("deploy") / "alerts.yml"


def _rules(config_dir: Path) -> dict[str, dict[str, Any]]:
    path = config_dir / RULES_FILE
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise PluginError(f"{path}: {exc}") from exc
    rules: dict[str, dict[str, Any]] = {}
    for group in document["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                rules[rule["alert"]] = rule
    return rules


# Characters Markdown would read as markup (a table's pipe, emphasis, links, escapes).
_MARKUP = str.maketrans({c: f"&#{ord(c)};" for c in "|*_[]`\\"})


def _text(text: object) -> str:
    """Markdown ``text`` (a summary, a runbook line) for one table cell: one line."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _code(text: str) -> str:
    """``text`` as code in one table cell, nothing in it read as markup."""
    return f"<code>{html.escape(text).translate(_MARKUP)}</code>"


def _table(rule: dict[str, Any]) -> str:
    annotations = rule.get("annotations", {})
    lines = [line.strip() for line in str(rule["expr"]).splitlines() if line.strip()]
    expression = "<br>".join(_code(line) for line in lines)
    rows = [
        ("severity", f"**{_text(rule.get('labels', {}).get('severity', ''))}**"),
        ("fires after", _text(rule.get("for", "0s"))),
        ("summary", _text(annotations.get("summary", ""))),
        ("rule's runbook line", _text(annotations.get("runbook", ""))),
        ("expression", expression),
    ]
    lines = [
        "| rule | in `deploy/alerts.yml` |",
        "|---|---|",
        *(f"| {name} | {value} |" for name, value in rows),
    ]
    return "\n".join(lines)


def on_page_markdown(markdown: str, *, page: Any, config: Any, **kwargs: Any) -> str:
    named = MARKER.findall(markdown)
    if not named:
        return markdown
    rules = _rules(Path(config["config_file_path"]).parent)
    where = page.file.src_uri
    if missing := sorted(set(rules) - set(named)):
        raise PluginError(f"{where}: no section for the alert(s) {', '.join(missing)}")
    if unknown := sorted(set(named) - set(rules)):
        raise PluginError(f"{where}: {', '.join(unknown)} not in {RULES_FILE}")
    return MARKER.sub(lambda match: _table(rules[match["name"]]), markdown)
