"""Text that is safe to print: what others wrote, with its control characters made
visible (:func:`escape_controls`), and URLs with their passwords masked (:func:`redact_url`).

A data server's registration, a maintenance marker, a published list: any participant
can write any string into them. Shown raw on a terminal, such a string can steer it
(ANSI and OSC escape sequences, a carriage return writing over the line, a bell), add
lines of its own (a newline, then a made-up row) or reorder what is shown (bidi
overrides). Every text report of the command-line tools passes what it shows through
:func:`escape_controls`; the ``--json`` documents need nothing more, as
:func:`json.dumps` escapes every such character with its default ``ensure_ascii``.

Design: docs/design/security.md, "Untrusted text" and "Secrets in messages".
"""

from __future__ import annotations

import re
import unicodedata
from typing import Final

__all__ = ["escape_controls", "redact_url"]

# Unicode categories of the characters that are not shown as themselves: controls (C0
# and C1, with ESC, CR, LF, TAB, DEL and NEL), format characters (the bidi embeddings,
# overrides, isolates and marks, zero-width characters, the BOM), lone surrogates (which
# a JSON document can hold as "\ud800" and which no terminal encoding can print) and the
# line and paragraph separators.
_HIDDEN: Final = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


# The three everyone knows by their short names.
_SHORT: Final = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    short = _SHORT.get(char)
    if short is not None:
        return short
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def escape_controls(text: str) -> str:
    """``text`` with every character that a terminal would not show as itself (the
    controls, format characters such as the bidi overrides, lone surrogates, and line
    and paragraph separators) replaced by its Python-style escape (``\\x1b``, ``\\n``, ``\\r``,
    ``\\t``, ``\\u202e``, ``\\U000e0041``): the result is one line, shown as written.

    Backslashes are left as they are, so escaping twice changes nothing and a
    reason that spells out ``\\x1b`` reads the same as one holding an ESC: harmless,
    as neither can steer the terminal (the ``--json`` document has the exact text).
    Never raises.
    """
    # The common case (nothing to escape) at C speed: isprintable() is False for every
    # character of the hidden categories (and for a few harmless ones, such as a
    # no-break space, which the slow path then keeps).
    if text.isprintable():
        return text
    return "".join(
        _escape(char) if unicodedata.category(char) in _HIDDEN else char for char in text
    )


# A query parameter that may carry a secret: redis-py takes ``?password=`` as the
# password (and any parameter as a connection option).
_SECRET_PARAMETER: Final = re.compile(
    r"(?i)([?&;][^=&;#]*(?:pass|secret|token|auth|cred)[^=&;#]*=)[^&;#]*"
)


def redact_url(url: str) -> str:
    """``url`` with its password (and any password-like query parameter) replaced by
    ``***``, for messages, logs and reprs.

    Read as text, not parsed, so that a URL no parser takes is masked too: the
    credentials are everything before the *last* ``@`` after the scheme (a password
    with an unencoded ``/``, ``?``, ``#`` or ``@`` ends a parser's host part early and
    would otherwise show). The user name (before the first ``:``) stays visible: it
    says which identity was used. A URL with ``@`` in its path (a Sentinel primary
    name, a socket path) and a ``:`` before it is masked too much rather than too
    little. Never raises.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:  # no scheme (a mistake, say ``:pw@host:6379``): mask all the same
        scheme, rest = "", url
    userinfo, at, host = rest.rpartition("@")
    if at and ":" in userinfo:
        rest = f"{userinfo.partition(':')[0]}:***@{host}"
    return scheme + sep + _SECRET_PARAMETER.sub(r"\1***", rest)
