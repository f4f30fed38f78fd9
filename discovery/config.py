"""The library's settings: frozen dataclasses, built once and passed down.

Each checks itself when built and raises :class:`~discovery.errors.ConfigError` naming the
setting (and its flag and variable, where it has them). Nothing here reads ``os.environ``.

Settings: docs/settings.md, "How settings are read".
"""

from __future__ import annotations

import os
import ssl
import urllib.parse
from dataclasses import dataclass, fields

from discovery.errors import ConfigError
from discovery.safetext import redact_url

__all__ = [
    "AgentConfig",
    "ClusterConfig",
    "HttpEdgeConfig",
    "RedisConfig",
    "ZkConfig",
    "redact_url",
]


@dataclass(frozen=True)
class AgentConfig:
    """How the agent probes its server and when it takes it offline.

    The defaults detect a dead or hung server in about ``fall * interval`` = 3 s
    (well inside a typical 10 s session timeout, which only catches dead processes),
    need two good probes in a row before re-admitting (one lucky answer from a
    struggling server is not health), and hold a server that was re-admitted more
    than three times in five minutes out for two minutes, so a flapping server does
    not keep dragging every query's latency up on its bad swings.

    Attributes:
        probe_interval: seconds between probes.
        probe_timeout: a probe not answered in this many seconds fails.
        max_latency: a probe answered slower than this fails ("slow").
        fall: consecutive failures that force the server offline.
        rise: consecutive successes that bring it back.
        flap_max: re-admissions allowed within ``flap_window``; one more starts a
            cool-down of ``flap_cooldown`` seconds.
        drain_grace: seconds a draining server keeps serving (while search servers
            stop routing to it) before it removes its node.
        verify_interval: seconds between the slow sweep's checks, while registered,
            that our node still exists and belongs to our session (one ZooKeeper
            read; each wait drawn between half and one and a half times this).
            Events cannot be relied on alone: a client can stay connected to a
            session the ensemble has closed, and then no watch fires for the node
            that went with it (see :class:`~discovery.zk.session.ZkSession`). Such a
            session comes of a reconnection, so the node is also read back about 2,
            10 and 30 s after every connection
            (:data:`~discovery.zk.registration.VERIFY_AFTER_CONNECT`); the sweep
            bounds the rest. 50,000 servers at 120 s cost about 420 reads a second
            across the ensemble (5,000 at 10 s).
        busy_grace: seconds for which a slow or timed-out probe is excused ("busy",
            counted neither as a failure nor as a success) when load explains the
            slowness: the server's thread waited for a CPU during it (the machine
            busy) or was busy nearly all along (a loop saturated by its work), not
            stuck (see
            :class:`~discovery.agent.policy.HealthPolicy`), counted from the first
            excused probe of an unbroken run of failed probes; 0 excuses nothing.
            Load alone must not take servers offline all together, but a server
            that stays slow for this long on a starved machine does go.
    """

    probe_interval: float = 1.0
    probe_timeout: float = 1.0
    max_latency: float = 0.5
    fall: int = 3
    rise: int = 2
    flap_max: int = 3
    flap_window: float = 300.0
    flap_cooldown: float = 120.0
    drain_grace: float = 5.0
    verify_interval: float = 120.0
    busy_grace: float = 120.0

    def __post_init__(self) -> None:
        for name in (
            "probe_interval",
            "probe_timeout",
            "max_latency",
            "flap_window",
            "verify_interval",
        ):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)!r}")
        for name in ("flap_cooldown", "drain_grace"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must not be negative, got {getattr(self, name)!r}")
        for name in ("fall", "rise", "flap_max"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)!r}")
        # Written so that NaN fails too (every comparison with NaN is false); an
        # infinite grace would excuse a starved server's slowness for ever.
        if not 0 <= self.busy_grace < float("inf"):
            raise ConfigError(
                "--probe-busy-grace / DISCOVERY_PROBE_BUSY_GRACE: busy_grace must be a "
                f"finite number >= 0, got {self.busy_grace!r}"
            )


@dataclass(frozen=True)
class ZkConfig:
    """How to reach ZooKeeper and how long our session lives without us.

    Attributes:
        hosts: kazoo connection string, optionally with a chroot
            (``zk1:2181,zk2:2181/prod-search``).
        session_timeout: seconds ZooKeeper keeps our session (and ephemeral nodes)
            after it last heard from us; the bound on how long a dead process
            stays registered.
        connect_timeout: seconds :meth:`ZkSession.start` keeps trying before it fails.
        operation_timeout: seconds one operation may wait (for a reconnect, say)
            before it fails with :class:`~discovery.errors.ZkConnectionError`;
            defaults to the session timeout.
        auth: digest credentials ``user:password`` or None. The repr shows the user
            and hides the password (``'user:***'``), so a logged config leaks nothing.
        tls: connect over TLS (to ZooKeeper's ``secureClientPort``). The server's
            certificate chain is always verified (against ``tls_ca``, else the
            system's CAs), and so is its name: the certificate must name each host as
            written in ``hosts`` (DNS name or IP address).
        tls_ca: PEM file of the CA certificates that verify the servers.
        tls_cert, tls_key: a client certificate and its (unencrypted) key, for an
            ensemble that requires one (``ssl.clientAuth=need``); both or neither.

    TLS files are checked when the config is built: each must be a readable file, and
    they must load (a CA file holding no certificate, or a key that does not match its
    certificate, is refused here rather than retried for ever at connect time).
    """

    hosts: str
    session_timeout: float = 10.0
    connect_timeout: float = 30.0
    operation_timeout: float | None = None
    auth: str | None = None
    tls: bool = False
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None

    def __post_init__(self) -> None:
        if not self.hosts or not self.hosts.strip():
            raise ConfigError("--zk / DISCOVERY_ZK_HOSTS: empty ZooKeeper hosts string")
        for name in ("session_timeout", "connect_timeout"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)!r}")
        if self.operation_timeout is not None and not self.operation_timeout > 0:
            raise ConfigError(f"operation_timeout must be positive, got {self.operation_timeout}")
        if self.auth is not None and ":" not in self.auth:
            raise ConfigError("--zk-auth / DISCOVERY_ZK_AUTH: expected user:password")
        _check_zk_tls(self)

    def __repr__(self) -> str:
        shown = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "auth" and value is not None:
                # The user names the identity (useful in a log); the password never shows.
                value = value.partition(":")[0] + ":***"
            shown.append(f"{f.name}={value!r}")
        return f"ZkConfig({', '.join(shown)})"

    @property
    def effective_operation_timeout(self) -> float:
        return (
            self.operation_timeout if self.operation_timeout is not None else self.session_timeout
        )


#: ZkConfig's TLS files: field, flag and variable.
_ZK_TLS_FILES = (
    ("tls_ca", "--zk-tls-ca", "DISCOVERY_ZK_TLS_CA"),
    ("tls_cert", "--zk-tls-cert", "DISCOVERY_ZK_TLS_CERT"),
    ("tls_key", "--zk-tls-key", "DISCOVERY_ZK_TLS_KEY"),
)


def _no_key_password() -> str:
    # Without a callback OpenSSL would prompt on the terminal for an encrypted key's
    # password, and so would kazoo, which loads the key at each connection.
    raise ConfigError(
        "--zk-tls-key / DISCOVERY_ZK_TLS_KEY: the key is encrypted; give it unencrypted"
    )


def _check_zk_tls(config: ZkConfig) -> None:
    """Check ``config``'s TLS settings: files only with TLS, readable, and loadable."""
    for name, flag, env in _ZK_TLS_FILES:
        path = getattr(config, name)
        if path is None:
            continue
        if not config.tls:
            raise ConfigError(f"{flag} / {env} needs --zk-tls (DISCOVERY_ZK_TLS=1)")
        if not os.path.isfile(path):
            raise ConfigError(f"{flag} / {env}: no such file: {path!r}")
        if not os.access(path, os.R_OK):
            raise ConfigError(f"{flag} / {env}: file not readable: {path!r}")
    if (config.tls_cert is None) != (config.tls_key is None):
        raise ConfigError(
            "--zk-tls-cert and --zk-tls-key (DISCOVERY_ZK_TLS_CERT, DISCOVERY_ZK_TLS_KEY) "
            "go together: give both or neither"
        )
    if not config.tls:
        return
    # Loaded once here only to refuse bad files early; kazoo loads them again at each
    # connection (so renewed files on disk are picked up at the next reconnection).
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if config.tls_ca is not None:
        try:
            context.load_verify_locations(cafile=config.tls_ca)
        except (ssl.SSLError, OSError, ValueError) as exc:
            raise ConfigError(
                f"--zk-tls-ca / DISCOVERY_ZK_TLS_CA: {config.tls_ca!r} holds no usable PEM "
                f"CA certificate: {exc}"
            ) from None
    if config.tls_cert is not None:
        try:
            context.load_cert_chain(config.tls_cert, config.tls_key, password=_no_key_password)
        except (ssl.SSLError, OSError, ValueError) as exc:
            raise ConfigError(
                f"--zk-tls-cert / --zk-tls-key: cannot load the client certificate "
                f"{config.tls_cert!r} with its key {config.tls_key!r}: {exc}"
            ) from None


@dataclass(frozen=True)
class HttpEdgeConfig:
    """What a client can hold of one of our HTTP servers: connections, and their time.

    A connection waits for a request head from the moment it opens, and on a kept-alive
    connection from the first byte of the next request; an idle kept-alive connection
    waits for nothing (the keep-alive timeout closes it, sooner near the cap). See
    :mod:`discovery.httpedge` and :mod:`discovery.httpconns`.

    Attributes:
        header_timeout: seconds a request head may take to arrive in full; the
            connection is closed after that (a client trickling header bytes, the
            slowloris attack, holds a connection at most this long).
        max_pending_headers: connections that may be waiting for a request head at
            once; one more closes the one that has waited longest, so that clients
            holding many such connections cannot crowd out new ones.
        max_connections: connections that may be open at once; one more closes the
            longest idle kept-alive one, else the longest waiting for a head, else is
            refused (503). None: derived from the open-file limit at start-up
            (:func:`~discovery.httpconns.default_max_connections`).
        pressure_keepalive: seconds an idle kept-alive connection is kept while more
            than three quarters of ``max_connections`` are open (otherwise 75 s).
    """

    header_timeout: float = 10.0
    max_pending_headers: int = 256
    max_connections: int | None = None
    pressure_keepalive: float = 5.0

    def __post_init__(self) -> None:
        if not 0 < self.header_timeout < float("inf"):
            raise ConfigError(
                f"--header-timeout / DISCOVERY_HEADER_TIMEOUT must be a positive number of "
                f"seconds, got {self.header_timeout!r}"
            )
        if self.max_pending_headers < 1:
            raise ConfigError(
                f"--max-pending-headers / DISCOVERY_MAX_PENDING_HEADERS must be at least 1, "
                f"got {self.max_pending_headers!r}"
            )
        if self.max_connections is not None and self.max_connections < 1:
            raise ConfigError(
                f"--max-connections / DISCOVERY_MAX_CONNECTIONS must be at least 1, "
                f"got {self.max_connections!r}"
            )
        if not 0 < self.pressure_keepalive < float("inf"):
            raise ConfigError(
                f"--pressure-keepalive / DISCOVERY_PRESSURE_KEEPALIVE must be a positive "
                f"number of seconds, got {self.pressure_keepalive!r}"
            )


_REDIS_SCHEMES = (
    "redis",
    "rediss",
    "unix",
    "redis+sentinel",
    "rediss+sentinel",
    "redis+cluster",
    "rediss+cluster",
)


def _credentials_spill(url: str, netloc: str) -> bool:
    """True if ``url``'s text has credentials (a ``:`` before its last ``@``, as
    :func:`~discovery.safetext.redact_url` reads it) beyond what a URL parser takes
    for them (``netloc``'s, up to its last ``@``)."""
    rest = url.partition("://")[2]
    userinfo = rest.rpartition("@")[0]
    return ":" in userinfo and userinfo != netloc.rpartition("@")[0]


@dataclass(frozen=True)
class RedisConfig:
    """Credentials and TLS for Redis, beyond what the URL (:class:`ClusterConfig`) says.

    Two roles use Redis: every search server *reads* the live list (MULTI/EXEC of
    HGETALL, XREAD, HMGET, GET, PING) with ``username``/``password``; the leader
    *publishes* it (the fenced publish script) with
    ``publish_username``/``publish_password``, each of which defaults to its reading
    counterpart. So a cluster can give non-leaders a user that
    cannot write (see :mod:`discovery.livelist.redis.conn` for the ACL rules of both roles).
    Reading credentials may instead be in the URL (``redis://user:pw@host``), but not
    in both places.

    TLS is on with ``tls`` or a ``rediss://`` URL. The server's certificate chain is
    always verified (against ``tls_ca``, else the system's CAs); ``tls_verify_hostname``
    also checks that it names the URL's host. ``tls_cert``/``tls_key`` are a client
    certificate for servers that require one.

    The repr never shows a password. Raises :class:`ConfigError` naming the flag for
    an inconsistent combination.
    """

    username: str | None = None
    password: str | None = None
    publish_username: str | None = None
    publish_password: str | None = None
    tls: bool = False
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_verify_hostname: bool = True

    def __post_init__(self) -> None:
        for name in ("username", "password", "publish_username", "publish_password"):
            if getattr(self, name) == "":
                flag = "--redis-" + name.replace("_", "-")
                raise ConfigError(f"{flag}: must not be empty (leave it unset instead)")
        if self.tls_key is not None and self.tls_cert is None:
            raise ConfigError("--redis-tls-key needs --redis-tls-cert")

    def __repr__(self) -> str:
        shown = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("password") and value is not None:
                shown.append(f"{f.name}='***'")
            else:
                shown.append(f"{f.name}={value!r}")
        return f"RedisConfig({', '.join(shown)})"

    def uses_tls(self, url: str) -> bool:
        """True if connections to ``url`` use TLS (``tls`` or a ``rediss://`` URL)."""
        return self.tls or urllib.parse.urlsplit(url).scheme.startswith("rediss")

    def check_url(self, url: str) -> None:
        """Check these settings against the Redis URL they go with.

        Raises:
            ConfigError: an unknown scheme, credentials both in the URL and in flags,
                TLS files without TLS, or TLS over a unix socket.
        """
        where = "--redis / DISCOVERY_REDIS_URL"
        try:
            parts = urllib.parse.urlsplit(url)
            in_url = parts.username or parts.password
        except ValueError as exc:
            raise ConfigError(f"{where}: {redact_url(url)!r}: {exc}") from None
        if _credentials_spill(url, parts.netloc):
            # A parser would take part of the password for the host or the path, and
            # then quote it in its errors ("port ... 'S3C'"): refused here, masked.
            raise ConfigError(
                f"{where}: {redact_url(url)!r}: the credentials hold a '/', '?', '#' or "
                "'@' that is not percent-encoded (write %2F, %3F, %23, %40)"
            )
        if parts.scheme not in _REDIS_SCHEMES:
            raise ConfigError(
                f"{where}: {redact_url(url)!r} must start with redis://, rediss://, unix://, "
                "redis+sentinel://, rediss+sentinel://, redis+cluster://, rediss+cluster:// "
                "or memory://"
            )
        if in_url and (self.username is not None or self.password is not None):
            raise ConfigError(
                f"{where} carries credentials and so do --redis-username/--redis-password: "
                "give them in one place"
            )
        if parts.scheme == "unix" and self.tls:
            raise ConfigError("--redis-tls: not possible over a unix:// socket")
        if (self.tls_ca or self.tls_cert) and not self.uses_tls(url):
            raise ConfigError(
                "--redis-tls-ca / --redis-tls-cert need TLS: use a rediss:// URL or --redis-tls"
            )


@dataclass(frozen=True)
class ClusterConfig:
    """Cluster-wide names: the cluster, its live-list store's URL, the admin token.

    ``redis_url`` is the store's URL (:attr:`store_url`, its neutral name; the field
    keeps the name of the ``--redis`` flag that sets it): a Redis URL, or
    ``memory://NAME`` for the in-process store (:func:`discovery.livelist.open_store`).
    ``redis`` holds the Redis store's credentials and TLS settings; only the Redis
    store reads them (:func:`discovery.livelist.redis.conn.make_redis`). The repr hides the URL's
    password and the admin token. The admin token is sent by clients in an HTTP
    header, so it must be visible ASCII (no spaces or control characters).
    """

    cluster: str = "default"
    redis_url: str = "redis://127.0.0.1:6379/0"
    admin_token: str | None = None
    redis: RedisConfig = RedisConfig()

    def __post_init__(self) -> None:
        if not self.cluster or any(c in self.cluster for c in " :/{}\n\t"):
            raise ConfigError(
                f"--cluster / DISCOVERY_CLUSTER: {self.cluster!r} must be a non-empty name "
                "without spaces, ':', '/' or braces"
            )
        if self.store_scheme == "memory":
            if self.redis != RedisConfig():
                raise ConfigError(
                    "--redis / DISCOVERY_REDIS_URL: a memory:// store takes no Redis "
                    "credentials or TLS settings"
                )
        else:
            self.redis.check_url(self.redis_url)
        token = self.admin_token
        if token is not None and not (token and all("!" <= c <= "~" for c in token)):
            # The token itself is never echoed: it is a secret, and this ends up in logs.
            raise ConfigError(
                "--admin-token / DISCOVERY_ADMIN_TOKEN: must be one or more visible ASCII "
                "characters (no spaces, control or non-ASCII characters), as it is sent "
                "in an HTTP header"
            )

    def __repr__(self) -> str:
        token = None if self.admin_token is None else "***"
        return (
            f"ClusterConfig(cluster={self.cluster!r}, redis_url={redact_url(self.redis_url)!r}, "
            f"admin_token={token!r}, redis={self.redis!r})"
        )

    @property
    def store_url(self) -> str:
        """The live-list store's URL (the ``redis_url`` field)."""
        return self.redis_url

    @property
    def store_scheme(self) -> str:
        """The scheme of :attr:`store_url`, which picks the store (``""`` if unparsable)."""
        try:
            return urllib.parse.urlsplit(self.redis_url).scheme
        except ValueError:
            return ""

    @property
    def redis_prefix(self) -> str:
        """``discovery:{<cluster>}``: the live list's key prefix, a Redis Cluster hash tag
        (the in-memory store names its lists the same way)."""
        return "discovery:{" + self.cluster + "}"
