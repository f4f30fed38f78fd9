"""TLS to ZooKeeper: the kazoo client's settings, and a handshake tried before connecting.

Every client we make with TLS verifies the server's certificate chain and its name (the
host as written in the connection string): there is no way to turn either off. kazoo
treats a refused handshake like any failed connection and retries it for ever, so a
certificate that can never be accepted would show only as a connect timeout;
:func:`check_handshake` tries a handshake first, one server after another until one
completes, and turns a refusal by all of them into an error naming TLS and the reason.

Design: docs/design/security.md, "ZooKeeper transport: TLS".
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import ssl
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient

from discovery.config import ZkConfig
from discovery.errors import ZkConnectionError

__all__ = ["KazooTls", "check_handshake", "client_options"]

#: Seconds :func:`check_handshake` gives one server's handshake before it tries the next
#: server as well. A handshake costs both sides CPU (the server's JVM most), and a fleet
#: restarting its data servers makes one each: trying every server of the ensemble at
#: once tripled that burst on ZooKeeper for nothing, the first answer being enough.
HANDSHAKE_STAGGER = 1.0

# Alerts a server sends when it refuses our client certificate (or its absence).
_CLIENT_CERT_ALERTS = frozenset(
    {
        "SSLV3_ALERT_BAD_CERTIFICATE",
        "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
        "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE",
        "TLSV13_ALERT_CERTIFICATE_REQUIRED",
        "TLSV1_ALERT_UNKNOWN_CA",
        "TLSV1_ALERT_ACCESS_DENIED",
    }
)


@dataclass(frozen=True)
class KazooTls:
    """The TLS settings of a kazoo client: the CA file (None: the system's CAs), and a
    client certificate with its key (both or neither)."""

    ca: str | None = None
    certfile: str | None = None
    keyfile: str | None = None

    @classmethod
    def from_config(cls, config: ZkConfig) -> KazooTls | None:
        """``config``'s settings; None without TLS."""
        if not config.tls:
            return None
        return cls(config.tls_ca, config.tls_cert, config.tls_key)

    @classmethod
    def of(cls, client: KazooClient) -> KazooTls | None:
        """The settings ``client`` was made with; None for a plaintext client. So that a
        second client for the same ensemble (closing an abandoned session) connects
        as the first one does."""
        if not client.use_ssl:
            return None
        return cls(client.ca, client.certfile, client.keyfile)

    def client_options(self) -> dict[str, Any]:
        """``KazooClient`` keyword arguments: TLS, verifying chain and host name."""
        return {
            "use_ssl": True,
            "ca": self.ca,
            "certfile": self.certfile,
            "keyfile": self.keyfile,
            "verify_certs": True,
            # kazoo's default is False: the chain alone would accept any certificate
            # the CA ever signed, another cluster's included.
            "check_hostname": True,
        }

    def ssl_context(self) -> ssl.SSLContext:
        """A client context for sockets of our own (four-letter words over TLS): the
        same verification as kazoo's.

        Raises:
            ssl.SSLError, OSError: a file does not load.
        """
        context = ssl.create_default_context(cafile=self.ca)
        if self.certfile is not None:
            context.load_cert_chain(self.certfile, self.keyfile)
        return context


def client_options(tls: KazooTls | None) -> dict[str, Any]:
    """``KazooClient`` keyword arguments for ``tls`` (none for a plaintext client)."""
    return {} if tls is None else tls.client_options()


async def check_handshake(
    client: KazooClient, timeout: float, stagger: float = HANDSHAKE_STAGGER
) -> None:
    """Try a TLS handshake with the servers of ``client`` (in threads), as kazoo's
    connection would (its handler, its settings), before it connects.

    The servers are tried in a random order (so that a fleet's clients spread over the
    ensemble), the next one as soon as the last refused or could not be reached, or
    once it has had ``stagger`` seconds without an answer (its attempt goes on beside),
    all within ``timeout`` in all. Returns as soon as one server completes a handshake,
    or when none could be reached (no TCP connection, or no answer in time): kazoo's own
    retries go on from there. Returns at once for a plaintext client.

    Raises:
        ZkConnectionError: every server that answered refused the handshake (the
            certificate, its name, a server that does not speak TLS on that port, a
            client certificate missing or refused); the message names TLS, each such
            server and the reason.
    """
    tls = KazooTls.of(client)
    if tls is None:
        return
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout  # for all the attempts: a later one gets what is left
    untried = random.sample(list(client.hosts), len(client.hosts))
    attempts: set[asyncio.Task[_Outcome]] = set()
    refusals: list[str] = []
    try:
        while untried or attempts:
            if untried and loop.time() < deadline:
                host, port = untried.pop(0)
                left = deadline - loop.time()
                attempts.add(
                    asyncio.create_task(
                        asyncio.to_thread(_handshake, client, host, port, tls, left)
                    )
                )
            elif not attempts:
                break  # out of time with servers untried: kazoo's retries go on from here
            done, attempts = await asyncio.wait(
                attempts,
                timeout=stagger if untried and loop.time() < deadline else None,
                return_when=asyncio.FIRST_COMPLETED,
            )
            for attempt in done:
                outcome = attempt.result()
                if outcome.completed:
                    return  # one server speaks TLS with us: kazoo will get through
                if outcome.refusal is not None:
                    refusals.append(outcome.refusal)
    finally:
        # Each thread ends within its timeout by itself; only the waiting stops here.
        for attempt in attempts:
            attempt.cancel()
    if refusals:
        raise ZkConnectionError(
            "TLS handshake with ZooKeeper refused: " + "; ".join(sorted(refusals))
        )


@dataclass(frozen=True)
class _Outcome:
    """One server's answer to a handshake: completed, refused (why), or none (both unset)."""

    completed: bool = False
    refusal: str | None = None


def _handshake(
    client: KazooClient, host: str, port: int, tls: KazooTls, timeout: float
) -> _Outcome:
    """One handshake with ``host:port``, trying each of its addresses until one answers."""
    try:
        addresses = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
    except OSError:
        return _Outcome()
    for *_, address in addresses:
        try:
            # The very call kazoo's connection makes (hostname: as written, for the check).
            sock = client.handler.create_connection(
                address=(address[0], address[1]),
                hostname=host,
                timeout=timeout,
                **tls.client_options(),
            )
        except (ssl.SSLError, ConnectionResetError) as exc:
            return _Outcome(refusal=f"{host}:{port}: {_describe(exc)}")
        except OSError:
            continue  # refused, unreachable, timed out: not an answer
        with contextlib.suppress(OSError):
            sock.close()
        return _Outcome(completed=True)
    return _Outcome()


def _describe(exc: OSError) -> str:
    """What a refused handshake means, with the likely fix."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (
            f"its certificate is not accepted: {exc.verify_message} (is it signed by the "
            "CA of --zk-tls-ca, and does it name the host as written in --zk?)"
        )
    reason = getattr(exc, "reason", None)
    if reason in _CLIENT_CERT_ALERTS:
        return (
            f"it refused our client certificate or its absence ({reason}): give "
            "--zk-tls-cert and --zk-tls-key, signed by a CA in its ssl.trustStore"
        )
    if isinstance(exc, ssl.SSLEOFError | ConnectionResetError) or reason in (
        "WRONG_VERSION_NUMBER",
        "RECORD_LAYER_FAILURE",
    ):
        return (
            f"it closed the connection during the handshake ({reason or exc}): is this "
            "port ZooKeeper's secureClientPort, not its plaintext clientPort?"
        )
    return str(exc)
