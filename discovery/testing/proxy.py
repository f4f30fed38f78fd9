"""A TCP forwarder whose link can be cut: a partition between one client and one server.

:meth:`TcpProxy.blackhole` drops every byte both ways, connections left open, until
:meth:`~TcpProxy.heal`; :meth:`~TcpProxy.reset` closes them all. One daemon thread.

Design: docs/design/zookeeper.md, "The session watchdog: a session can never hang".
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
from dataclasses import dataclass, field

from .ports import LOOPBACK

__all__ = ["TcpProxy"]

log = logging.getLogger(__name__)

_CHUNK = 65536


@dataclass(eq=False)
class _Link:
    """One proxied connection: the client's socket and, unless silenced, the target's."""

    client: socket.socket
    target: socket.socket | None
    silenced: bool = False
    sockets: list[socket.socket] = field(default_factory=list)

    def peer(self, sock: socket.socket) -> socket.socket | None:
        return self.target if sock is self.client else self.client


class TcpProxy:
    """Forward ``listen address -> target`` until told to drop everything.

    Use as a context manager (or :meth:`start` / :meth:`close`); :attr:`address` is
    ``host:port`` to give the client instead of the target's.
    """

    def __init__(self, target_host: str, target_port: int, *, host: str = LOOPBACK) -> None:
        self._target = (target_host, target_port)
        self._listener = socket.create_server((host, 0))
        self._listener.setblocking(False)
        self.host = host
        self.port: int = self._listener.getsockname()[1]
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._lock = threading.Lock()
        self._links: dict[socket.socket, _Link] = {}
        self._blackholed = False
        # What the proxy thread is to close at its next turn: None, "silenced" or "all".
        self._pending_close: str | None = None
        self._stopping = False
        self._thread = threading.Thread(
            target=self._run, name=f"tcp-proxy:{self.port}", daemon=True
        )

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def blackholed(self) -> bool:
        return self._blackholed

    @property
    def connections(self) -> int:
        """Open proxied connections (silenced ones included)."""
        with self._lock:
            return len({id(link) for link in self._links.values()})

    def start(self) -> TcpProxy:
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._thread.start()
        return self

    def blackhole(self) -> None:
        """Drop every byte from now on, both ways, on open and new connections."""
        log.info("proxy %s -> %s:%d: blackholed", self.address, *self._target)
        with self._lock:
            self._blackholed = True
            for link in self._links.values():
                link.silenced = True

    def heal(self) -> None:
        """Forward again. Connections that lost bytes are closed: no TCP stream has gaps."""
        log.info("proxy %s -> %s:%d: healed", self.address, *self._target)
        with self._lock:
            self._blackholed = False
            self._pending_close = self._pending_close or "silenced"
        self._wake()

    def reset(self) -> None:
        """Close every open connection now (new ones are accepted as usual)."""
        with self._lock:
            self._pending_close = "all"
        self._wake()

    def close(self) -> None:
        self._stopping = True
        self._wake()
        if self._thread.is_alive():
            self._thread.join(10)
        for sock in (self._listener, self._wake_r, self._wake_w):
            sock.close()
        self._selector.close()

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the proxy thread ---------------------------------------------------------

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # closed already
            self._wake_w.send(b"\0")

    def _run(self) -> None:
        try:
            while not self._stopping:
                for key, _ in self._selector.select(timeout=1.0):
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    if sock is self._listener:
                        self._accept()
                    elif sock is self._wake_r:
                        self._wake_r.recv(_CHUNK)
                    else:
                        self._pump(sock)
                with self._lock:
                    pending, self._pending_close = self._pending_close, None
                if pending is not None:
                    self._close_all(only_silenced=pending == "silenced")
        except Exception:
            log.exception("proxy %s crashed", self.address)
        finally:
            self._close_all(only_silenced=False)

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except BlockingIOError:
            return
        target: socket.socket | None = None
        if not self._blackholed:
            try:
                target = socket.create_connection(self._target, timeout=5)
            except OSError as exc:
                log.info("proxy %s: target refused: %s", self.address, exc)
                client.close()  # as the target would have
                return
        link = _Link(client, target, silenced=target is None)
        with self._lock:
            for sock in (client, target):
                if sock is not None:
                    sock.setblocking(True)
                    sock.settimeout(5)
                    self._links[sock] = link
                    self._selector.register(sock, selectors.EVENT_READ)

    def _pump(self, sock: socket.socket) -> None:
        link = self._links.get(sock)
        if link is None:
            return
        try:
            data = sock.recv(_CHUNK)
        except OSError:
            data = b""
        if not data:
            self._drop(link)
            return
        peer = link.peer(sock)
        if link.silenced or peer is None:
            return  # the partition eats it
        try:
            peer.sendall(data)
        except OSError:
            self._drop(link)

    def _drop(self, link: _Link) -> None:
        with self._lock:
            for sock in (link.client, link.target):
                if sock is None:
                    continue
                self._links.pop(sock, None)
                with contextlib.suppress(KeyError, ValueError):
                    self._selector.unregister(sock)
                sock.close()

    def _close_all(self, *, only_silenced: bool) -> None:
        with self._lock:
            links = {id(link): link for link in self._links.values()}
        for link in links.values():
            if not only_silenced or link.silenced:
                self._drop(link)
