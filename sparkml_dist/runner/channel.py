"""The live log channel from ranks to the driver, authenticated with a per-run secret.  [both]

The driver runs a :class:`LogServer`; each barrier task connects with a :class:`LogClient`.

Handshake: the server sends a random 32-byte nonce, the client answers
``HMAC-SHA256(secret, nonce)``; a wrong or late answer (after :data:`HANDSHAKE_TIMEOUT` seconds)
closes the connection and is logged.  After that, frames are a 4-byte big-endian length and a
UTF-8 JSON object (never a pickle); a frame over :data:`MAX_FRAME` bytes closes the connection.
The secret travels inside the task spec (through Spark's own authenticated channel), never on a
command line.

Frames may also flow back: a server made with ``replies=True`` hands ``on_message`` a second
argument, a ``send(dict)`` for that connection (the tuner answers a trial's report and tells it to
stop); a client made with ``on_frame`` reads them on its own thread.

The server is one thread and a selector: a connection costs a socket and a few bytes of state
until it has proven it knows the secret, and at most :data:`MAX_UNAUTHENTICATED` such connections
wait at once (more are closed on accept).  It listens on the address the ranks are given, not on
every interface.
"""

from __future__ import annotations

import hmac
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

log = logging.getLogger(__name__)

MAX_FRAME = 1 << 20
NONCE = 32
HANDSHAKE_TIMEOUT = 5.0
MAX_UNAUTHENTICATED = 64


def new_secret() -> bytes:
    return os.urandom(32)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        part = sock.recv(n - len(buf))
        if not part:
            raise ConnectionError("connection closed")
        buf += part
    return bytes(buf)


class _Conn:
    """What the server keeps per connection: the nonce until authenticated, then a frame buffer."""

    __slots__ = ("sock", "addr", "nonce", "deadline", "buf")

    def __init__(self, sock: socket.socket, addr, nonce: bytes, deadline: float) -> None:
        self.sock, self.addr, self.nonce, self.deadline = sock, addr, nonce, deadline
        self.buf = bytearray()

    @property
    def authenticated(self) -> bool:
        return self.nonce is None


class LogServer:
    """Accepts authenticated rank connections and hands each message to ``on_message(dict)``
    (``on_message(dict, send)`` with ``replies=True``, ``send(dict)`` answering that connection).

    ``host``: the address to listen on (the one the ranks are told); a host name is resolved.
    """

    def __init__(
        self, secret: bytes, on_message: Callable, host: str = "127.0.0.1", replies: bool = False
    ) -> None:
        self._secret = secret
        self._on_message = on_message
        self._replies = replies
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((socket.gethostbyname(host), 0))
        self._sock.listen(128)
        self._sock.setblocking(False)
        self.address = self._sock.getsockname()[0]
        self.port = self._sock.getsockname()[1]
        self.rejected = 0
        self._conns: Dict[int, _Conn] = {}
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._sock, selectors.EVENT_READ)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sparkml_dist-logs", daemon=True)
        self._thread.start()

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
                if key.fileobj is self._sock:
                    self._accept()
                else:
                    self._read(self._conns.get(key.fd))
            self._expire(time.monotonic())

    def _accept(self) -> None:
        while True:
            try:
                sock, addr = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            if self.unauthenticated >= MAX_UNAUTHENTICATED:
                self._reject(sock, addr, "too many connections waiting to authenticate")
                continue
            nonce = os.urandom(NONCE)
            try:
                sock.setblocking(False)
                sock.send(nonce)  # 32 bytes into an empty socket buffer: never partial
            except OSError:
                sock.close()
                continue
            conn = _Conn(sock, addr, nonce, time.monotonic() + HANDSHAKE_TIMEOUT)
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
                if self._replies:
                    self._on_message(message, lambda reply, sock=conn.sock: _send_frame(sock, reply))
                else:
                    self._on_message(message)

    def _expire(self, now: float) -> None:
        for conn in [c for c in self._conns.values() if not c.authenticated and c.deadline < now]:
            self._drop(conn, f"did not authenticate within {HANDSHAKE_TIMEOUT:.0f}s")

    def _reject(self, sock: socket.socket, addr, why: str) -> None:
        self.rejected += 1
        log.warning("log channel: dropped a connection from %s:%s that %s", addr[0], addr[1], why)
        sock.close()

    def _drop(self, conn: _Conn, why: Optional[str] = None) -> None:
        self._conns.pop(conn.sock.fileno(), None)
        try:
            self._selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        if why is None:
            conn.sock.close()
        else:
            self._reject(conn.sock, conn.addr, why)

    def close(self) -> None:
        self._closed.set()
        self._thread.join(2.0)
        for conn in list(self._conns.values()):
            self._drop(conn)
        self._selector.close()
        self._sock.close()


def _send_frame(sock: socket.socket, message: dict) -> None:
    """One small frame to a (non-blocking) server-side connection; a peer that has gone or stopped
    reading misses it (what the server sends is advice: the Spark job is the authority)."""
    data = json.dumps(message).encode("utf-8")
    try:
        sock.sendall(struct.pack(">I", len(data)) + data)
    except OSError:
        pass


def listen(secret: bytes, on_message: Callable, host: str, replies: bool = False) -> LogServer:
    """A :class:`LogServer` on ``host`` (the address the ranks are given); on every interface, with
    a warning, when this machine cannot bind that address (a NAT'd or misconfigured driver host)."""
    try:
        return LogServer(secret, on_message, host, replies)
    except OSError as exc:
        log.warning("log channel: cannot listen on %s (%s); listening on every interface instead", host, exc)
        return LogServer(secret, on_message, "0.0.0.0", replies)


def _cut(value, cap: int):
    if isinstance(value, str) and len(value) > cap:
        return f"{value[:cap]} [... {len(value) - cap} more characters cut]"
    if isinstance(value, list):
        return [_cut(v, cap) for v in value]
    return value


def _frame(message: dict) -> bytes:
    """``message`` as JSON within MAX_FRAME: long strings are cut (saying so) rather than the frame,
    which the server could not parse and would answer by dropping the connection."""
    data = json.dumps(message).encode("utf-8")
    cap = 1 << 16
    while len(data) > MAX_FRAME and cap >= 64:
        data = json.dumps({k: _cut(v, cap) for k, v in message.items()}).encode("utf-8")
        cap //= 4
    if len(data) > MAX_FRAME:  # many short fields: keep what names the frame
        keep = {k: v for k, v in message.items() if not isinstance(v, (str, list)) or k in ("type", "stream")}
        data = json.dumps({**keep, "text": "[a frame too large to send was dropped]"}).encode("utf-8")
    return data


class LogClient:
    """A rank-side connection to the driver's :class:`LogServer`; ``send`` is thread-safe and never
    raises (logs are best effort: a lost driver connection must not fail training).

    ``on_frame``: called (on a reader thread) with each JSON object the server sends back.
    """

    def __init__(
        self,
        host: str,
        port: int,
        secret: bytes,
        timeout: float = 10.0,
        on_frame: Optional[Callable[[dict], None]] = None,
    ) -> None:
        self._lock = threading.Lock()
        self._sock: Optional[socket.socket] = socket.create_connection((host, port), timeout=timeout)
        nonce = _recv_exact(self._sock, NONCE)
        self._sock.sendall(hmac.new(secret, nonce, sha256).digest())
        self._sock.settimeout(None)
        if on_frame is not None:
            reader = threading.Thread(
                target=self._read, args=(self._sock, on_frame), name="sparkml_dist-replies", daemon=True
            )
            reader.start()

    @staticmethod
    def _read(sock: socket.socket, on_frame: Callable[[dict], None]) -> None:
        try:
            while True:
                (length,) = struct.unpack(">I", _recv_exact(sock, 4))
                if length > MAX_FRAME:
                    return
                message = json.loads(_recv_exact(sock, length).decode("utf-8"))
                if isinstance(message, dict):
                    on_frame(message)
        except (OSError, ConnectionError, ValueError):
            return  # closed (by us or the driver): nothing more will come

    @property
    def connected(self) -> bool:
        """False once a send failed or :meth:`close` ran."""
        return self._sock is not None

    def send(self, message: dict) -> None:
        data = _frame(message)
        with self._lock:
            if self._sock is None:
                return
            try:
                self._sock.sendall(struct.pack(">I", len(data)) + data)
            except OSError:
                self._sock = None

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None
