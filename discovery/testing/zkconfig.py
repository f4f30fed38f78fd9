"""What a local ZooKeeper runs with: the JVM and its classpath, the ``zoo.cfg`` lines of
a TLS client port, and four-letter words (over TLS too).

:class:`ZooKeeperTls` is the option of :class:`~discovery.testing.zookeeper.ZooKeeperServer`
that makes its client port TLS-only, with the throwaway certificates of
:mod:`discovery.testing.tls`.

Design: docs/design/security.md, "ZooKeeper transport: TLS"; the lines for a real
ensemble: docs/operating.md, "Deploying ZooKeeper".
"""

from __future__ import annotations

import os
import shutil
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

from discovery.errors import DevClusterError

from .ports import LOOPBACK
from .tls import DevPki

__all__ = [
    "JVM_FLAGS",
    "ZooKeeperTls",
    "find_java",
    "four_letter_word",
    "zookeeper_classpath",
]

_DEBIAN_ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
# The Debian jar names its dependencies in its manifest, but not a logging binding; without
# one slf4j drops every server log line, which we need for error messages.
_DEBIAN_SLF4J_BINDING = Path("/usr/share/java/slf4j-simple.jar")
# Nor netty-codec, which Netty's handler needs: without it the Netty connection factory
# (the only one that speaks TLS) starts, then closes every connection it accepts.
_DEBIAN_NETTY_CODEC = Path("/usr/share/java/netty-codec.jar")
#: Small heap, serial GC and C1 only: a dev server holds little data, and these flags roughly
#: halve start-up time and resident memory, which matters with several JVMs on one machine.
JVM_FLAGS = (
    "-Xms32m",
    "-Xmx256m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:-UsePerfData",
    "-Xshare:auto",
    "-Djava.net.preferIPv4Stack=true",
    "-Dzookeeper.jmx.log4j.disable=true",
    "-Dorg.slf4j.simpleLogger.showDateTime=true",
    "-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd HH:mm:ss.SSS",
)
_SETUP_HINT = "run `make setup` (installs the Debian packages zookeeper and a Java runtime)"
_CLIENT_AUTH = ("need", "want", "none")


def find_java() -> str:
    """Return the ``java`` executable: ``$JAVA``, ``$JAVA_HOME/bin/java``, or ``java`` on PATH.

    Raises ``DevClusterError`` naming ``make setup`` if none is found.
    """
    explicit = os.environ.get("JAVA")
    if explicit:
        found = shutil.which(explicit)
        if found is None:
            raise DevClusterError(f"$JAVA={explicit!r} is not an executable; {_SETUP_HINT}")
        return found
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / "java"
        if os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("java")
    if found is None:
        raise DevClusterError(f"no `java` found ($JAVA, $JAVA_HOME, PATH); {_SETUP_HINT}")
    return found


def zookeeper_classpath(*, netty: bool = False) -> str:
    """Return the JVM classpath for ZooKeeper: ``$ZOOKEEPER_CLASSPATH`` or the Debian jars
    (with ``netty``, also the Netty jar the Debian manifest leaves out).

    Raises ``DevClusterError`` naming ``make setup`` if the Debian jar is missing and no
    classpath is configured.
    """
    explicit = os.environ.get("ZOOKEEPER_CLASSPATH")
    if explicit:
        return explicit
    if not _DEBIAN_ZOOKEEPER_JAR.is_file():
        raise DevClusterError(
            f"{_DEBIAN_ZOOKEEPER_JAR} not found and $ZOOKEEPER_CLASSPATH is not set; {_SETUP_HINT}"
        )
    parts = [str(_DEBIAN_ZOOKEEPER_JAR)]
    if _DEBIAN_SLF4J_BINDING.is_file():
        parts.append(str(_DEBIAN_SLF4J_BINDING))
    if netty:
        if not _DEBIAN_NETTY_CODEC.is_file():
            raise DevClusterError(f"{_DEBIAN_NETTY_CODEC} not found (TLS needs it); {_SETUP_HINT}")
        parts.append(str(_DEBIAN_NETTY_CODEC))
    return os.pathsep.join(parts)


def four_letter_word(
    port: int,
    word: str,
    host: str = LOOPBACK,
    timeout: float = 2.0,
    *,
    context: ssl.SSLContext | None = None,
) -> str:
    """Send a ZooKeeper four-letter command (``srvr``, ``ruok``, ``mntr``...) and return the answer.

    Only commands listed in the server's ``4lw.commands.whitelist`` answer. With
    ``context`` the command goes over TLS (a ``secureClientPort`` answers them too).
    Raises ``OSError`` (including ``TimeoutError`` and ``ssl.SSLError``) if the server
    cannot be reached.
    """
    if len(word) != 4:
        raise ValueError(f"four-letter words have four letters, got {word!r}")
    chunks: list[bytes] = []
    with socket.create_connection((host, port), timeout=timeout) as raw:
        sock = raw if context is None else context.wrap_socket(raw, server_hostname=host)
        with sock:
            sock.sendall(word.encode("ascii"))
            while chunk := sock.recv(4096):
                chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", errors="replace")


@dataclass(frozen=True)
class ZooKeeperTls:
    """A ZooKeeper client port that speaks only TLS (``secureClientPort``; no plaintext
    port is opened).

    ``pki``'s server certificate is the server's (``localhost`` and ``127.0.0.1`` unless
    made otherwise), and its CA the one client certificates must be signed by.
    ``client_auth`` is ZooKeeper's ``ssl.clientAuth``: ``need`` (every client presents
    a certificate of that CA), ``want`` (one presented is checked) or ``none``.
    Raises ``ValueError`` for another value.
    """

    pki: DevPki
    client_auth: str = "need"

    def __post_init__(self) -> None:
        if self.client_auth not in _CLIENT_AUTH:
            raise ValueError(f"client_auth must be one of {_CLIENT_AUTH}, got {self.client_auth!r}")

    def zoo_cfg(self, *, port: int, host: str, keystore: Path) -> list[str]:
        """The ``zoo.cfg`` lines of the secure port ``host:port`` (``keystore``: the file
        :meth:`write_keystore` writes)."""
        return [
            f"secureClientPort={port}",
            f"secureClientPortAddress={host}",
            # The NIO factory (the default) has no TLS.
            "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
            f"ssl.keyStore.location={keystore}",
            "ssl.keyStore.type=PEM",
            f"ssl.trustStore.location={self.pki.ca_cert}",
            "ssl.trustStore.type=PEM",
            f"ssl.clientAuth={self.client_auth}",
        ]

    def write_keystore(self, path: Path) -> None:
        """Write ZooKeeper's PEM key store: the server's key and certificate in one file."""
        key = self.pki.server_key.read_text(encoding="ascii")
        cert = self.pki.server_cert.read_text(encoding="ascii")
        path.write_text(key + cert, encoding="ascii")
        path.chmod(0o600)

    def client_context(self) -> ssl.SSLContext:
        """A client context with ``pki``'s CA and client certificate, checking the chain
        but not the name (for probing a server by whatever address it listens on)."""
        context = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        context.check_hostname = False
        context.load_cert_chain(self.pki.client_cert, self.pki.client_key)
        return context
