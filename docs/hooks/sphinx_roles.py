"""A Griffe extension for the API reference (mkdocs.yml): the docstrings' reST bits in
Markdown.

The docstrings are Google-style (``Args:``, ``Raises:``), which mkdocstrings parses, but
they cross-reference with Sphinx's roles (``:class:`Agent```, ``:meth:`start```,
``:func:`~discovery.zk.expiry.expire_session```), which Markdown would show as they are.
This extension rewrites each role into a cross-reference that mkdocs-autorefs resolves
to the page and anchor where the object is rendered:

* the target is resolved in the docstring's own scope, as Sphinx would (a method's
  ``:meth:`start``` is its class's ``start``; ``:class:`Agent``` in a module is the
  name that module imports), and a dotted target is taken as a full path, or a path
  relative to a name in scope;
* ``~`` shows the last component only; ``:meth:`` and ``:func:`` get ``()``;
* the reference is *optional*: a target that the reference does not render (a private
  helper, an operator tool) becomes code text with the path as its tooltip, not a broken
  link nor a strict-mode warning. What the reference renders is linked.

It also turns reST's literal-block marker (a paragraph ending in ``::``) into a plain
colon: the indented block after it is a code block in Markdown as in reST.

Docs tooling only: nothing in the packages imports it.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

ROLE = re.compile(r":(?P<role>class|meth|func|mod|attr|data|exc|obj|const):`(?P<target>[^`]+)`")
LITERAL_MARKER = re.compile(r"(?<=\S)::$", flags=re.MULTILINE)
LONE_LITERAL_MARKER = re.compile(r"^[ \t]*::$", flags=re.MULTILINE)
CALLABLE_ROLES = {"meth", "func"}


def _resolve(obj: griffe.Object, target: str) -> str | None:
    """The full path of ``target`` as seen from ``obj``'s docstring, if there is one."""
    head, _, rest = target.partition(".")
    try:
        resolved = obj.resolve(head)
    except griffe.NameResolutionError:
        resolved = None
    if resolved is not None:
        return f"{resolved}.{rest}" if rest else resolved
    if rest:  # a full dotted path: kept as written, resolved (or not) by autorefs
        return target
    return None


def _reference(obj: griffe.Object, match: re.Match[str]) -> str:
    role, target = match["role"], match["target"].strip()
    short = target.startswith("~")
    target = target.lstrip("~").removesuffix("()")
    title = target.rsplit(".", 1)[-1] if short else target
    if role in CALLABLE_ROLES:
        title += "()"
    code = f"<code>{html.escape(title)}</code>"
    path = _resolve(obj, target)
    if path is None:
        return code
    return f'<autoref identifier="{html.escape(path)}" optional>{code}</autoref>'


def rewrite(obj: griffe.Object, text: str) -> str:
    """``text`` (a docstring of ``obj``) with its roles and literal markers in Markdown."""
    text = ROLE.sub(lambda match: _reference(obj, match), text)
    text = LONE_LITERAL_MARKER.sub("", text)
    return LITERAL_MARKER.sub(":", text)


def _walk(obj: griffe.Object, seen: set[int]) -> None:
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if obj.docstring is not None:
        obj.docstring.value = rewrite(obj, obj.docstring.value)
    for member in obj.members.values():
        if not member.is_alias:  # an alias's docstring is its target's, rewritten there
            _walk(member, seen)  # type: ignore[arg-type]


class SphinxRoles(griffe.Extension):
    """Rewrite every docstring of a package once it is loaded."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        _walk(pkg, set())
