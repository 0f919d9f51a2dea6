"""The driver's end of the log channel: one selector thread, one handler thread.  [driver]

The wire format, the handshake and what a peer may and may not do are described in
:mod:`sparkml_dist.channel`; this module serves it (see :func:`listen`); what waits between the
two threads, bounded per connection, is :mod:`.inbox`'s.
"""

from __future__ import annotations

import hmac
import itertools
import json
import logging
import os
import selectors
import socket
import struct
import threading
import time
from hashlib import sha256
from typing import Callable, Dict, Optional

from .. import channel
from . import ACK, MAX_FRAME, NONCE
from .inbox import Inbox, Tally

log = logging.getLogger(__name__)

MAX_UNAUTHENTICATED = 64  # beyond the connections the server expects (``expected``)
MAX_PER_SOURCE = 48
DRAIN_SECONDS = 2.0  # close(): how long lines still waiting are shown; the rest are counted
WARN_EVERY = 10.0

_serial = itertools.count()


class _Conn:
    """What the server keeps per connection: the nonce until authenticated, then a frame buffer."""

    __slots__ = ("sock", "addr", "nonce", "deadline", "buf", "key")

    def __init__(self, sock: socket.socket, addr, nonce: bytes, deadline: float) -> None:
        self.sock, self.addr, self.nonce, self.deadline = sock, addr, nonce, deadline
        self.buf = bytearray()
        self.key = next(_serial)  # names its messages in the inbox (a file descriptor is reused)

    @property
    def authenticated(self) -> bool:
        return self.nonce is None


class _Warnings:
    """Dropped-connection warnings, at most one per WARN_EVERY seconds (counting the rest)."""

    def __init__(self) -> None:
        self.count, self._unsaid, self._last = 0, 0, -WARN_EVERY

    def __call__(self, addr, why: str) -> None:
        self.count += 1
        self._unsaid += 1
        now = time.monotonic()
        if now - self._last >= WARN_EVERY:
            more = f" ({self._unsaid - 1} more since the last warning)" if self._unsaid > 1 else ""
            log.warning("log channel: dropped a connection from %s:%s that %s%s", addr[0], addr[1], why, more)
            self._last, self._unsaid = now, 0


class LogServer:
    """Accepts authenticated rank connections and hands each message to ``on_message(dict)``
    (``on_message(dict, send)`` with ``replies=True``, ``send(dict)`` answering that connection),
    on a handler thread of its own.

    ``host``: the address to listen on (the one the ranks are told); a host name is resolved.
    ``expected``: how many peers will connect (a run's tasks): that many handshakes may wait at
    once on top of :data:`MAX_UNAUTHENTICATED` (thousands of tasks starting together are not
    evicted as a flood: benchmarks/bench_scale.py).  The soft limit on open files is raised to
    the hard one: each peer holds a descriptor, and Linux's default (1,024) is below a large run's.
    """

    def __init__(
        self,
        secret: bytes,
        on_message: Callable,
        host: str = "127.0.0.1",
        replies: bool = False,
        expected: int = 0,
    ) -> None:
        _raise_open_files_limit()
        self._secret = secret
        self._on_message = on_message
        self._replies = replies
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((socket.gethostbyname(host), 0))
        self._sock.listen(1024)  # the kernel caps it at net.core.somaxconn
        self.max_waiting = MAX_UNAUTHENTICATED + max(0, int(expected))
        self._sock.setblocking(False)
        self.address = self._sock.getsockname()[0]
        self.port = self._sock.getsockname()[1]
        self._warn = _Warnings()
        self.handler_errors = 0
        self.accepted = 0  # connections that passed the handshake
        self._open = 0  # authenticated connections open now: each one's share of the inbox
        self.lines = Tally()  # every line a rank meant for the driver, accounted
        self._show_until = float("inf")  # close(): lines handled after this are counted, not shown
        self._conns: Dict[int, _Conn] = {}
        self._inbox = Inbox()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._sock, selectors.EVENT_READ)
        self._wake, self._waker = socket.socketpair()  # close() wakes the loop: no select tick to wait
        self._selector.register(self._wake, selectors.EVENT_READ)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sparkml_dist-logs", daemon=True)
        self._handler = threading.Thread(target=self._handle, name="sparkml_dist-log-handler", daemon=True)
        self._thread.start()
        self._handler.start()

    @property
    def dropped(self) -> int:
        """How many log lines were not shown (by rank: ``lines.not_shown()``)."""
        return sum(self.lines.not_shown().values())

    @property
    def rejected(self) -> int:
        """Connections dropped so far (wrong secret, late, evicted, bad frames)."""
        return self._warn.count

    @property
    def unauthenticated(self) -> int:
        return sum(1 for c in list(self._conns.values()) if not c.authenticated)

    def _loop(self) -> None:
        while not self._closed.is_set():
            try:
                events = self._selector.select(timeout=0.2)
            except (OSError, ValueError):  # closed under us
                return
            for key, _ in events:
                if key.fileobj is self._wake:
                    continue  # closing: the loop's condition ends it
                try:
                    if key.fileobj is self._sock:
                        self._accept()
                    else:
                        self._read(self._conns.get(key.fd))
                except Exception:  # noqa: BLE001 - one bad connection must not end the channel
                    log.exception("log channel: error while serving a connection (the channel goes on)")
                    conn = self._conns.get(key.fd)
                    if conn is not None:
                        self._drop(conn)
            self._expire(time.monotonic())

    def _handle(self) -> None:
        while not (self._closed.is_set() and not self._inbox.count):
            item = self._inbox.get(timeout=0.2)
            if item is None:
                continue
            message, send = item
            if message.get("type") == "line" and time.monotonic() > self._show_until:
                self.lines.dropped(message)  # the channel has closed: counted, never shown late
                continue
            try:
                self._on_message(message, send) if self._replies else self._on_message(message)
            except Exception:  # noqa: BLE001 - a handler's bug must not silence the run
                self.handler_errors += 1
                if self.handler_errors <= 3 or self.handler_errors % 100 == 0:
                    log.exception(
                        "log channel: a message handler raised (%d so far); going on", self.handler_errors
                    )

    def _evict_for(self, addr) -> None:
        """Make room for a new connection from ``addr``: evict the oldest one waiting to
        authenticate (from ``addr`` when that address holds MAX_PER_SOURCE already)."""
        waiting = [c for c in self._conns.values() if not c.authenticated]
        same = [c for c in waiting if c.addr[0] == addr[0]]
        pool = same if len(same) >= MAX_PER_SOURCE else waiting if len(waiting) >= self.max_waiting else []
        if pool:
            self._drop(min(pool, key=lambda c: c.deadline), "was evicted: too many connections waiting")

    def _accept(self) -> None:
        while True:
            try:
                sock, addr = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            self._evict_for(addr)
            nonce = os.urandom(NONCE)
            try:
                sock.setblocking(False)
                sock.send(nonce)  # 32 bytes into an empty socket buffer: never partial
            except OSError:
                sock.close()
                continue
            conn = _Conn(sock, addr, nonce, time.monotonic() + channel.HANDSHAKE_TIMEOUT)
            self._conns[sock.fileno()] = conn
            self._selector.register(sock, selectors.EVENT_READ)

    def _read(self, conn: Optional[_Conn]) -> None:
        if conn is None:
            return
        want = NONCE - len(conn.buf) if not conn.authenticated else 1 << 16
        try:
            data = conn.sock.recv(want)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn)
            return
        conn.buf += data
        if not conn.authenticated:
            if len(conn.buf) < NONCE:
                return
            expected = hmac.new(self._secret, conn.nonce, sha256).digest()
            if not hmac.compare_digest(bytes(conn.buf[:NONCE]), expected):
                self._drop(conn, "does not know the run's secret")
                return
            conn.nonce, conn.buf = None, conn.buf[NONCE:]
            self.accepted += 1
            self._open += 1
            try:
                conn.sock.send(ACK)
            except OSError:
                self._drop(conn)
                return
        self._frames(conn)

    def _frames(self, conn: _Conn) -> None:
        while len(conn.buf) >= 4:
            (length,) = struct.unpack(">I", conn.buf[:4])
            if length > MAX_FRAME:
                self._drop(conn, f"sent a {length}-byte frame (limit {MAX_FRAME})")
                return
            if len(conn.buf) < 4 + length:
                return
            body, conn.buf = bytes(conn.buf[4 : 4 + length]), conn.buf[4 + length :]
            try:
                message = json.loads(body.decode("utf-8"))
            except ValueError:
                self._drop(conn, "sent a frame that is not JSON")
                return
            if isinstance(message, dict):
                send = (
                    (lambda reply, sock=conn.sock: channel.send_frame(sock, reply)) if self._replies else None
                )
                size = len(body) if message.get("type") == "line" else 0
                self.lines.arrived(message, size)
                if not self._inbox.put(conn.key, (message, send), size, self._open):
                    self._room_for(conn.key, message, send)

    def _room_for(self, key: int, message: dict, send) -> None:
        """No room in the handler's inbox: a log line is shed (counted); a report (rendezvous, done,
        failed, metrics, a trial's) waits for room, up to WARN_EVERY seconds (a handler that
        stopped cannot wedge the channel)."""
        deadline = time.monotonic() + WARN_EVERY
        while message.get("type") != "line" and time.monotonic() < deadline:
            if self._inbox.wait_room(deadline - time.monotonic()) and self._inbox.put(
                key, (message, send), 0, 1
            ):
                return
        self.lines.shed(message)

    def _read_what_is_left(self) -> None:
        """Once the selector thread has stopped: the frames already in the connections' socket
        buffers, read and queued (bounded: what the kernel holds)."""
        for conn in [c for c in self._conns.values() if c.authenticated]:
            for _ in range(1024):
                try:
                    data = conn.sock.recv(1 << 16)
                except (BlockingIOError, InterruptedError, OSError):
                    break
                if not data:
                    break
                conn.buf += data
                self._frames(conn)
                if conn.sock.fileno() not in self._conns:
                    break

    def _expire(self, now: float) -> None:
        for conn in [c for c in self._conns.values() if not c.authenticated and c.deadline < now]:
            self._drop(conn, f"did not authenticate within {channel.HANDSHAKE_TIMEOUT:.0f}s")

    def _drop(self, conn: _Conn, why: Optional[str] = None) -> None:
        if self._conns.pop(conn.sock.fileno(), None) is not None and conn.authenticated:
            self._open -= 1
        try:
            self._selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        if why is not None:
            self._warn(conn.addr, why)
        conn.sock.close()

    def close(self) -> None:
        """Stop accepting; messages already received are still handled, lines for up to
        :data:`DRAIN_SECONDS` (the rest counted in :attr:`dropped`): nothing is shown after close."""
        self._closed.set()
        try:
            self._waker.send(b"x")
        except OSError:
            pass
        self._thread.join(2.0)
        if not self._thread.is_alive():
            self._read_what_is_left()  # a task's last frames (its final report) may still be in flight
        self._show_until = time.monotonic() + DRAIN_SECONDS
        self._inbox.wake()
        self._handler.join(DRAIN_SECONDS + WARN_EVERY)
        for conn in list(self._conns.values()):
            self._drop(conn)
        self._selector.close()
        self._sock.close()
        self._wake.close()
        self._waker.close()


def _raise_open_files_limit() -> None:
    """The soft limit on open files up to the hard one (where the platform has them)."""
    try:
        import resource
    except ImportError:  # not a Unix
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):  # an infinite hard limit some kernels refuse as a soft one
            pass


def listen(
    secret: bytes, on_message: Callable, host: str, replies: bool = False, expected: int = 0
) -> LogServer:
    """A :class:`LogServer` on ``host`` (the address the ranks are given); on every interface, with
    a warning, when this machine cannot bind that address (a NAT'd or misconfigured driver host)."""
    try:
        return LogServer(secret, on_message, host, replies, expected)
    except OSError as exc:
        log.warning("log channel: cannot listen on %s (%s); listening on every interface instead", host, exc)
        return LogServer(secret, on_message, "0.0.0.0", replies, expected)
