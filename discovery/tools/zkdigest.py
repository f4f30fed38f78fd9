"""ZooKeeper digest identities, and ``discovery zk-digest``, which prints their hashed form.

:class:`DigestId` is one role's identity for ``discovery zk-init``
(:mod:`discovery.tools.zkinit`); :func:`identity_list` and :func:`credentials` parse
the forms zk-init takes. No message here ever repeats a password, nor text that could
be one (a hash typed where a password belongs, or the other way round): a bad identity
is described by its user name and what is wrong with it.

Design: docs/design/security.md, "ZooKeeper access control".
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import re
import sys
from dataclasses import dataclass
from typing import Final

from kazoo.security import ACL, Id

__all__ = [
    "HASHED_PREFIX",
    "DigestId",
    "add_digest_parser",
    "credentials",
    "identity_list",
    "run_digest",
]

#: The prefix of an identity given in its hashed form, ``digest:USER:HASH``.
HASHED_PREFIX: Final = "digest:"
# Identities in one value: comma-separated (a flag) or one per line (a file).
_SEPARATORS: Final = re.compile(r"[,\r\n]")


@dataclass(frozen=True)
class DigestId:
    """A ZooKeeper digest identity: a user and ``base64(sha1(user:password))``."""

    user: str
    hash: str

    @classmethod
    def from_password(cls, user: str, password: str) -> DigestId:
        digest = hashlib.sha1(f"{user}:{password}".encode()).digest()
        return cls(user, base64.b64encode(digest).decode("ascii"))

    @classmethod
    def parse(cls, text: str) -> DigestId:
        """``user:password`` (hashed here) or ``digest:user:HASH`` (already hashed).

        The hashed form lets an operator grant a role without knowing its password.

        Raises:
            ValueError: not one of the two forms; the message names the user, if any,
                and never the password or hash.
        """
        text = text.strip()
        if text.startswith(HASHED_PREFIX):
            user, sep, digest = text[len(HASHED_PREFIX) :].partition(":")
            if not (user and sep):
                raise ValueError("expected digest:USER:HASH, got no USER: before the hash")
            if not _is_sha1_base64(digest):
                raise ValueError(
                    f"expected digest:USER:HASH with HASH a base64 SHA-1 (28 characters, as "
                    f"`discovery zk-digest` prints it); the one for user {user!r} is not"
                )
            return cls(user, digest)
        user, sep, password = text.partition(":")
        if not sep:
            raise ValueError("expected USER:PASSWORD or digest:USER:HASH, got no ':' in it")
        if not user:
            raise ValueError("expected USER:PASSWORD or digest:USER:HASH, got an empty USER")
        if not password:
            raise ValueError(f"expected USER:PASSWORD, got no password for user {user!r}")
        return cls.from_password(user, password)

    @property
    def id(self) -> str:
        """The id as ZooKeeper stores it in an ACL: ``user:hash``."""
        return f"{self.user}:{self.hash}"

    def acl(self, perms: int) -> ACL:
        return ACL(perms, Id("digest", self.id))

    def __str__(self) -> str:
        return f"{HASHED_PREFIX}{self.id}"


def _is_sha1_base64(text: str) -> bool:
    try:
        return len(base64.b64decode(text, validate=True)) == 20
    except ValueError:
        return False


def identity_list(text: str) -> tuple[DigestId, ...]:
    """Identities (see :meth:`DigestId.parse`) separated by commas or line breaks.

    Raises:
        argparse.ArgumentTypeError: none given, or one malformed (which, by position,
            never by its text).
    """
    items = [item for item in _SEPARATORS.split(text) if item.strip()]
    if not items:
        raise argparse.ArgumentTypeError("expected at least one identity")
    identities = []
    for number, item in enumerate(items, 1):
        try:
            identities.append(DigestId.parse(item))
        except ValueError as exc:
            where = f"identity {number} of {len(items)}: " if len(items) > 1 else ""
            raise argparse.ArgumentTypeError(f"{where}{exc}") from None
    return tuple(identities)


def credentials(text: str) -> str:
    """``USER:PASSWORD`` to authenticate with (not the hashed form), returned as given.

    Raises:
        argparse.ArgumentTypeError: another form; the message never repeats the text.
    """
    if text.strip().startswith(HASHED_PREFIX):
        raise argparse.ArgumentTypeError(
            "expected USER:PASSWORD to authenticate with, not a digest:USER:HASH"
        )
    try:
        DigestId.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


# -- the zk-digest subcommand -----------------------------------------------------------


def add_digest_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """Register ``zk-digest``: print ``digest:USER:HASH`` for ``USER:PASSWORD`` on stdin."""
    parser = subparsers.add_parser(
        "zk-digest",
        help="print the digest:USER:HASH form of USER:PASSWORD lines read from stdin",
        description=(
            "Read USER:PASSWORD lines from stdin (not the command line, which ps shows) "
            "and print each as digest:USER:HASH, the form zk-init accepts in "
            "--data-identities and --search-identities without the password."
        ),
    )
    parser.set_defaults(func=run_digest)
    return parser


def run_digest(args: argparse.Namespace) -> int:
    """Print each stdin line's hashed form; 2 if any line was malformed (named by number)."""
    status = 0
    for number, line in enumerate(sys.stdin.read().splitlines(), 1):
        if not line.strip():
            continue
        try:
            print(DigestId.parse(line), flush=True)
        except ValueError as exc:
            print(f"discovery zk-digest: line {number}: {exc}", file=sys.stderr, flush=True)
            status = 2
    return status
