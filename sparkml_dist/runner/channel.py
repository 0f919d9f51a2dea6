"""The live log channel from ranks to the driver, authenticated with a per-run secret.  [both]

The driver runs a :class:`LogServer`; each barrier task connects with a :class:`LogClient`.

Handshake: the server sends a random 32-byte nonce, the client answers
``HMAC-SHA256(secret, nonce)`` and the server acknowledges with one byte; a wrong or late answer
(after :data:`HANDSHAKE_TIMEOUT` seconds) closes the connection.  After that, frames are a 4-byte
big-endian length and a UTF-8 JSON object (never a pickle); a frame over :data:`MAX_FRAME` bytes
closes the connection.  The secret travels inside the task spec (through Spark's own authenticated
channel), never on a command line.

Frames may also flow back: a server made with ``replies=True`` hands ``on_message`` a second
argument, a ``send(dict)`` for that connection (the tuner answers a trial's report and tells it to
stop); a client made with ``on_frame`` reads them on its own thread.

A channel that keeps working whatever its peers do:

* the server is one selector thread that only moves bytes; messages go through a queue to one
  handler thread (so MLflow or Optuna I/O in a handler never stalls frames), and a handler that
  raises is logged and the next message handled;
* a connection costs a socket and a few bytes until it has proven it knows the secret; at most
  :data:`MAX_UNAUTHENTICATED` wait at once and at most :data:`MAX_PER_SOURCE` from one address: a
  new connection evicts the oldest waiting one (of its own address first), so a flood of idle
  connections cannot lock ranks out, and a client evicted before its acknowledgement retries with
  backoff (``retry_for``);
* a client's send gives up after :data:`SEND_TIMEOUT` seconds and drops the connection: the rank
  keeps running (its output still reaches the executor's stderr and ``log_dir``);
* dropped connections are logged at most once per :data:`WARN_EVERY` seconds, with a count.

It listens on the address the ranks are given, not on every interface.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import queue
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
ACK = b"\x01"
HANDSHAKE_TIMEOUT = 5.0
SEND_TIMEOUT = 10.0
MAX_UNAUTHENTICATED = 64
MAX_PER_SOURCE = 48
MAX_QUEUED = 100_000
WARN_EVERY = 10.0


def new_secret() -> bytes:
    return os.urandom(32)


def _recv_exact(sock: socket.socket, n: int, buf: Optional[bytearray] = None) -> bytes:
    """``n`` bytes; with ``buf`` (kept by the caller across calls), a timeout loses nothing."""
    buf = bytearray() if buf is None else buf
    while len(buf) < n:
        part = sock.recv(n - len(buf))
        if not part:
            raise ConnectionError("connection closed")
        buf += part
    out = bytes(buf[:n])
    del buf[:n]
    return out


class _Conn:
    """What the server keeps per connection: the nonce until authenticated, then a frame buffer."""

    __slots__ = ("sock", "addr", "nonce", "deadline", "buf")

    def __init__(self, sock: socket.socket, addr, nonce: bytes, deadline: float) -> None:
        self.sock, self.addr, self.nonce, self.deadline = sock, addr, nonce, deadline
        self.buf = bytearray()

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
        self._warn = _Warnings()
        self.handler_errors = 0
        self._conns: Dict[int, _Conn] = {}
        self._queue: "queue.Queue" = queue.Queue(MAX_QUEUED)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._sock, selectors.EVENT_READ)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sparkml_dist-logs", daemon=True)
        self._handler = threading.Thread(target=self._handle, name="sparkml_dist-log-handler", daemon=True)
        self._thread.start()
        self._handler.start()

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
        while not (self._closed.is_set() and self._queue.empty()):
            try:
                message, send = self._queue.get(timeout=0.2)
            except queue.Empty:
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
        pool = same if len(same) >= MAX_PER_SOURCE else waiting if len(waiting) >= MAX_UNAUTHENTICATED else []
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
                send = (lambda reply, sock=conn.sock: _send_frame(sock, reply)) if self._replies else None
                try:
                    self._queue.put_nowait((message, send))
                except queue.Full:
                    self._warn(conn.addr, "sent more messages than the handler could take (one dropped)")

    def _expire(self, now: float) -> None:
        for conn in [c for c in self._conns.values() if not c.authenticated and c.deadline < now]:
            self._drop(conn, f"did not authenticate within {HANDSHAKE_TIMEOUT:.0f}s")

    def _drop(self, conn: _Conn, why: Optional[str] = None) -> None:
        self._conns.pop(conn.sock.fileno(), None)
        try:
            self._selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        if why is not None:
            self._warn(conn.addr, why)
        conn.sock.close()

    def close(self) -> None:
        """Stop accepting; messages already received are still handled (up to 2 s)."""
        self._closed.set()
        self._thread.join(2.0)
        self._handler.join(2.0)
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
    ``retry_for``: seconds to keep retrying, with backoff, a handshake the server closed before
    acknowledging it (a flooded server evicts waiting connections); a refused or unreachable
    address fails at once (``OSError``).
    """

    def __init__(
        self,
        host: str,
        port: int,
        secret: bytes,
        timeout: float = 10.0,
        on_frame: Optional[Callable[[dict], None]] = None,
        retry_for: float = 0.0,
    ) -> None:
        self._lock = threading.Lock()
        self._sock: Optional[socket.socket] = self._connect(host, port, secret, timeout, retry_for)
        self._sock.settimeout(SEND_TIMEOUT)
        if on_frame is not None:
            reader = threading.Thread(
                target=self._read, args=(self._sock, on_frame), name="sparkml_dist-replies", daemon=True
            )
            reader.start()

    @staticmethod
    def _connect(host: str, port: int, secret: bytes, timeout: float, retry_for: float) -> socket.socket:
        deadline, delay = time.monotonic() + retry_for, 0.05
        while True:
            sock = socket.create_connection((host, port), timeout=timeout)  # refused: raises at once
            try:
                sock.settimeout(min(timeout, HANDSHAKE_TIMEOUT))
                nonce = _recv_exact(sock, NONCE)
                sock.sendall(hmac.new(secret, nonce, sha256).digest())
                if _recv_exact(sock, 1) == ACK:
                    return sock
                raise ConnectionError("the server did not acknowledge the handshake")
            except OSError:  # ConnectionError, timeouts: evicted or too slow
                sock.close()
                if time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    @staticmethod
    def _read(sock: socket.socket, on_frame: Callable[[dict], None]) -> None:
        buf, length = bytearray(), None  # what was read survives a timeout, frame by frame
        try:
            while True:
                try:
                    if length is None:
                        (length,) = struct.unpack(">I", _recv_exact(sock, 4, buf))
                        if length > MAX_FRAME:
                            return
                    body, length = _recv_exact(sock, length, buf), None
                except socket.timeout:  # the send timeout applies to reads too: just idle
                    continue
                message = json.loads(body.decode("utf-8"))
                if isinstance(message, dict):
                    on_frame(message)
        except (OSError, ConnectionError, ValueError):
            return  # closed (by us or the driver): nothing more will come

    @property
    def connected(self) -> bool:
        """False once a send failed or :meth:`close` ran."""
        return self._sock is not None

    def send(self, message: dict) -> None:
        """Send one frame; a send that fails or takes over SEND_TIMEOUT drops the connection."""
        data = _frame(message)
        with self._lock:
            if self._sock is None:
                return
            try:
                self._sock.sendall(struct.pack(">I", len(data)) + data)
            except OSError:  # socket.timeout included: a server that stopped reading
                self._sock.close()
                self._sock = None

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None
