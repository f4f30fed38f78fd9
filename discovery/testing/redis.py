"""A real ``redis-server`` for development and tests, on loopback, without persistence.

Optionally with a password, ACL users and TLS (:mod:`discovery.testing.tls`), or as a
replica; ``$REDIS_SERVER`` overrides the binary.

Development: docs/development.md, "The development cluster".
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import socket
import ssl
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis

from discovery.errors import DevClusterError

from .ports import LOOPBACK, free_port
from .process import ManagedProcess
from .tls import DevPki, make_dev_pki

__all__ = [
    "RedisServer",
    "config_quote",
    "find_redis_server",
    "redis_command",
    "redis_ping",
    "redis_query",
]

_TLS_AUTH_CLIENTS = ("no", "optional", "yes")

logger = logging.getLogger(__name__)

_SETUP_HINT = "run `make setup` (installs the Debian package redis-server)"


def find_redis_server() -> str:
    """Return the ``redis-server`` executable: ``$REDIS_SERVER`` or ``redis-server`` on PATH.

    Raises ``DevClusterError`` naming ``make setup`` if it is not found.
    """
    explicit = os.environ.get("REDIS_SERVER")
    name = explicit or "redis-server"
    found = shutil.which(name)
    if found is None:
        where = (
            f"$REDIS_SERVER={explicit!r} is not an executable"
            if explicit
            else ("no `redis-server` on PATH")
        )
        raise DevClusterError(f"{where}; {_SETUP_HINT}")
    return found


def config_quote(value: str) -> str:
    """Quote ``value`` as one argument of a Redis configuration file line.

    Any text works (spaces, quotes, backslashes, newlines): Redis reads it back exactly.
    """
    escaped = (
        value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    )
    return f'"{escaped}"'


def _write_private(path: Path, text: str) -> None:
    # Created 0600 (not chmod-ed afterwards): the file may hold a password in clear.
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


def _sha256(password: str) -> str:
    # ACL files take a password's SHA-256 as well: no secret in clear on disk.
    return hashlib.sha256(password.encode("utf-8")).hexdigest()


def _resp(*parts: str) -> bytes:
    encoded = [part.encode("utf-8") for part in parts]
    return b"*%d\r\n" % len(encoded) + b"".join(
        b"$%d\r\n%s\r\n" % (len(part), part) for part in encoded
    )


def redis_ping(
    port: int,
    host: str = LOOPBACK,
    timeout: float = 1.0,
    *,
    password: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> bool:
    """Return True if a Redis server on ``host:port`` answers PING with ``+PONG``.

    With ``password`` it first authenticates as the ``default`` user; with
    ``ssl_context`` it speaks TLS. Never raises: unreachable, loading (``-LOADING``),
    refusing or misbehaving servers give False.
    """
    request = _resp("PING")
    replies = 1
    if password is not None:
        request = _resp("AUTH", password) + request
        replies = 2
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw:
            sock = (
                ssl_context.wrap_socket(raw, server_hostname=host)
                if ssl_context is not None
                else raw
            )
            sock.sendall(request)
            answer = b""
            while answer.count(b"\r\n") < replies:
                chunk = sock.recv(256)
                if not chunk:
                    break
                answer += chunk
    except OSError:  # ssl.SSLError included
        return False
    lines = answer.split(b"\r\n")
    if password is not None and not lines[0].startswith(b"+OK"):
        return False
    return len(lines) > replies - 1 and lines[replies - 1].startswith(b"+PONG")


def redis_command(
    host: str,
    port: int,
    *command: str,
    password: str | None = None,
    timeout: float = 2.0,
) -> Any:
    """Send one command on a fresh connection to ``host:port`` and return the reply, for
    fixtures that inspect servers (``INFO``, ``SENTINEL ...``, ``CLUSTER ...``).

    Strings come back decoded; ``INFO`` as a dict (redis-py's parsing), other replies as
    Redis sends them. With ``password`` it authenticates as the ``default`` user.

    Raises:
        redis.RedisError: no answer within ``timeout`` seconds, or an error reply.
    """
    client = redis.Redis(
        host=host,
        port=port,
        password=password,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        decode_responses=True,
    )
    try:
        return client.execute_command(*command)  # type: ignore[no-untyped-call]  # untyped
    finally:
        client.close()


def redis_query(host: str, port: int, *command: str, password: str | None = None) -> Any:
    """:func:`redis_command`, but None if the server cannot be reached or answers with an
    error: for fixtures that poll a condition."""
    try:
        return redis_command(host, port, *command, password=password)
    except (redis.RedisError, OSError):
        return None


class RedisServer(ManagedProcess):
    """One ``redis-server`` on ``127.0.0.1:port`` with its log in ``workdir/redis.log``.

    ``port`` defaults to a free port chosen at construction and kept across restarts; data
    is not kept (persistence is off). ``start()`` returns once the server answers PING
    (``start(wait=False)`` only launches it) and raises ``DevClusterError`` with the log
    tail if it exits or does not answer in time. ``stop()`` is idempotent and always reaps
    the process (SIGTERM, then SIGKILL after its timeout).

    Security, all off by default:

    * ``password``: the password of the ``default`` user, which keeps every right (the
      readiness probe and admin clients use it);
    * ``users``: ACL file lines (``user <name> <rules>``) of further users, written to
      ``workdir/users.acl`` (the ``default`` user is configured by ``password`` only);
    * ``tls``: the port speaks only TLS (no plain-text port), with a CA and server and
      client certificates made in ``workdir/tls`` (:attr:`pki`); ``tls_auth_clients``
      is Redis's ``tls-auth-clients`` (``no``, ``optional`` or ``yes``: a client
      certificate signed by that CA is required).

    Replication and further settings, also off by default:

    * ``replicaof``: ``(host, port)`` of a primary to replicate from (``--replicaof``);
      :attr:`replicaof` can be changed between runs, e.g. to rejoin after a failover;
    * ``config``: configuration directives (``"cluster-enabled yes"``), written to
      ``workdir/redis.conf`` (mode 0600, so it may hold ``masterauth``) before every
      start and given to the server as its configuration file (the command line still
      wins). Sentinels' ``CONFIG REWRITE`` may change the file; the next start writes it
      afresh;
    * ``name``: the name in messages and logs, e.g. ``redis-2`` in a group.

    Raises:
        ValueError: a ``users`` line is not a ``user`` line, or names ``default``, or
            ``tls_auth_clients`` is not one of the three values, or a ``config`` line is
            empty or spans lines.
    """

    def __init__(
        self,
        workdir: str | os.PathLike[str],
        port: int | None = None,
        *,
        password: str | None = None,
        users: Sequence[str] = (),
        tls: bool = False,
        tls_auth_clients: str = "no",
        host: str = LOOPBACK,
        replicaof: tuple[str, int] | None = None,
        config: Sequence[str] = (),
        name: str = "redis",
    ) -> None:
        directory = Path(workdir)
        self._host = host
        super().__init__(name, directory, directory / "redis.log")
        self._port = free_port() if port is None else port
        for line in users:
            words = line.split()
            if len(words) < 2 or words[0] != "user" or "\n" in line:
                raise ValueError(f"not an ACL file line 'user <name> <rules>': {line!r}")
            if words[1] == "default":
                raise ValueError("the default user is configured by password=, not users=")
        if tls_auth_clients not in _TLS_AUTH_CLIENTS:
            raise ValueError(f"tls_auth_clients must be one of {_TLS_AUTH_CLIENTS}")
        for line in config:
            if not line.strip() or "\n" in line or "\r" in line:
                raise ValueError(f"not one configuration directive: {line!r}")
        self._replicaof = replicaof
        self._config = tuple(config)
        self._password = password
        self._users = tuple(users)
        self._tls = tls
        self._tls_auth_clients = tls_auth_clients
        self._pki: DevPki | None = None
        self._ssl_context: ssl.SSLContext | None = None

    @property
    def port(self) -> int:
        """The TCP port on :attr:`host`."""
        return self._port

    @property
    def host(self) -> str:
        """The address the server binds and clients connect to."""
        return self._host

    @property
    def address(self) -> str:
        """``<host>:<port>``."""
        return f"{self._host}:{self._port}"

    @property
    def replicaof(self) -> tuple[str, int] | None:
        """The primary this server replicates from when it starts, None for a primary.

        Setting it takes effect at the next start; a running server is not changed (the
        ``REPLICAOF`` command does that).
        """
        return self._replicaof

    @replicaof.setter
    def replicaof(self, primary: tuple[str, int] | None) -> None:
        self._replicaof = primary

    @property
    def config_path(self) -> Path | None:
        """``workdir/redis.conf`` when ``config`` directives were given, else None."""
        return self._workdir / "redis.conf" if self._config else None

    @property
    def url(self) -> str:
        """``redis://<host>:<port>/0`` (``rediss://`` with TLS), without credentials."""
        scheme = "rediss" if self._tls else "redis"
        return f"{scheme}://{self._host}:{self._port}/0"

    def client_url(self, username: str | None = None, password: str | None = None) -> str:
        """:attr:`url` with credentials in it (quoted as URLs need)."""
        if username is None and password is None:
            return self.url
        user = urllib.parse.quote(username or "", safe="")
        secret = "" if password is None else ":" + urllib.parse.quote(password, safe="")
        return self.url.replace("://", f"://{user}{secret}@", 1)

    @property
    def password(self) -> str | None:
        """The ``default`` user's password, None without one."""
        return self._password

    @property
    def pki(self) -> DevPki:
        """The TLS files (the CA that clients verify with); made on first use.

        Raises:
            DevClusterError: the server has no TLS, or openssl failed.
        """
        if not self._tls:
            raise DevClusterError("this Redis server runs without TLS")
        if self._pki is None:
            self._pki = make_dev_pki(self._workdir / "tls")
        return self._pki

    @property
    def _uses_acl_file(self) -> bool:
        return bool(self._users) or self._password is not None

    def _prepare(self) -> None:
        if self.config_path is not None:
            _write_private(self.config_path, "\n".join(self._config) + "\n")
        if self._uses_acl_file:
            default = (
                "user default on nopass ~* &* +@all"
                if self._password is None
                else f"user default on #{_sha256(self._password)} ~* &* +@all"
            )
            acl = self._workdir / "users.acl"
            acl.write_text("\n".join((default, *self._users)) + "\n", encoding="utf-8")
            acl.chmod(0o600)
        if self._tls:
            pki = self.pki
            context = ssl.create_default_context(cafile=str(pki.ca_cert))
            context.load_cert_chain(str(pki.client_cert), str(pki.client_key))
            self._ssl_context = context

    def _command(self) -> list[str]:
        # A configuration file must come first; command-line options override it.
        config_file = [] if self.config_path is None else [str(self.config_path)]
        replication = (
            []
            if self._replicaof is None
            else ["--replicaof", self._replicaof[0], str(self._replicaof[1])]
        )
        return [
            find_redis_server(),
            *config_file,
            "--port",
            str(self._port),
            "--bind",
            self._host,
            # Protected mode refuses every client from a non-loopback address when no
            # password is set; ours is a network lab's private address (198.18.0.0/15).
            "--protected-mode",
            "yes" if self._host == LOOPBACK else "no",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--dir",
            str(self._workdir),
            "--logfile",
            str(self._log_path),
            *self._security_arguments(),
            *replication,
        ]

    def _security_arguments(self) -> list[str]:
        args: list[str] = []
        if self._uses_acl_file:
            # Even a lone password goes into the file (not --requirepass): the command
            # line is visible in ps and written to the log.
            args += ["--aclfile", str(self._workdir / "users.acl")]
        if self._tls:
            pki = self.pki
            args += [
                "--port",
                "0",
                "--tls-port",
                str(self._port),
                "--tls-cert-file",
                str(pki.server_cert),
                "--tls-key-file",
                str(pki.server_key),
                "--tls-ca-cert-file",
                str(pki.ca_cert),
                "--tls-auth-clients",
                self._tls_auth_clients,
            ]
        return args

    def _probe(self) -> bool:
        return redis_ping(
            self._port, self._host, password=self._password, ssl_context=self._ssl_context
        )
