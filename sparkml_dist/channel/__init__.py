"""The live log channel from ranks to the driver, authenticated with a per-run secret.  [anywhere]

The driver runs a :class:`~sparkml_dist.channel.server.LogServer`; each barrier task, trial or
search task connects with a :class:`LogClient`.  This module holds the wire format and the client;
:mod:`sparkml_dist.channel.server` the server.  Each user of the channel names its own frames
beside its code: the runner in :mod:`sparkml_dist.runner.protocol`, the tuner in
:mod:`sparkml_dist.tune.trial`, progress bars in :mod:`sparkml_dist.progress`.

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
  :data:`MAX_UNAUTHENTICATED` beyond the peers it expects wait at once, and at most
  :data:`MAX_PER_SOURCE` from one address: a
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
import os
import select
import socket
import struct
import threading
import time
from hashlib import sha256
from typing import Callable, Optional

MAX_FRAME = 1 << 20
NONCE = 32
ACK = b"\x01"
HANDSHAKE_TIMEOUT = 5.0
SEND_TIMEOUT = 10.0


def new_secret() -> bytes:
    return os.urandom(32)


def recv_exact(sock: socket.socket, n: int, buf: Optional[bytearray] = None) -> bytes:
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

    ``on_frame``: called (on a reader thread) with each JSON object the server sends back, and
    ``on_close()`` once nothing more can come (the connection closed).
    ``retry_for``: seconds to keep retrying, with backoff, a handshake the server closed before
    acknowledging it (a flooded server evicts waiting connections); a refused or unreachable
    address fails at once (``OSError``).  ``source``: the local address to connect from (default:
    the one the route gives).
    """

    def __init__(
        self,
        host: str,
        port: int,
        secret: bytes,
        timeout: float = 10.0,
        on_frame: Optional[Callable[[dict], None]] = None,
        retry_for: float = 0.0,
        source: Optional[str] = None,
        on_close: Optional[Callable[[], None]] = None,
    ) -> None:
        self._lock = threading.Lock()
        self._sock: Optional[socket.socket] = self._connect(host, port, secret, timeout, retry_for, source)
        self._sock.settimeout(SEND_TIMEOUT)
        if on_frame is not None:
            reader = threading.Thread(
                target=self._read,
                args=(self._sock, on_frame, on_close or (lambda: None)),
                name="sparkml_dist-replies",
                daemon=True,
            )
            reader.start()

    @staticmethod
    def _connect(
        host: str, port: int, secret: bytes, timeout: float, retry_for: float, source: Optional[str]
    ) -> socket.socket:
        deadline, delay = time.monotonic() + retry_for, 0.05
        bind = (source, 0) if source else None
        while True:
            sock = socket.create_connection(
                (host, port), timeout=timeout, source_address=bind
            )  # refused: raises
            try:
                sock.settimeout(min(timeout, HANDSHAKE_TIMEOUT))
                nonce = recv_exact(sock, NONCE)
                sock.sendall(hmac.new(secret, nonce, sha256).digest())
                if recv_exact(sock, 1) == ACK:
                    return sock
                raise ConnectionError("the server did not acknowledge the handshake")
            except OSError:  # ConnectionError, timeouts: evicted or too slow
                sock.close()
                if time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    @staticmethod
    def _read(sock: socket.socket, on_frame: Callable[[dict], None], on_close: Callable[[], None]) -> None:
        buf, length = bytearray(), None  # what was read survives a timeout, frame by frame
        try:
            while True:
                try:
                    if length is None:
                        (length,) = struct.unpack(">I", recv_exact(sock, 4, buf))
                        if length > MAX_FRAME:
                            break
                    body, length = recv_exact(sock, length, buf), None
                except socket.timeout:  # the send timeout applies to reads too: just idle
                    continue
                message = json.loads(body.decode("utf-8"))
                if isinstance(message, dict):
                    on_frame(message)
        except (OSError, ConnectionError, ValueError):
            pass  # closed (by us or the driver): nothing more will come
        on_close()

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


def send_frame(sock: socket.socket, message: dict) -> None:
    """One frame to a (non-blocking) server-side connection (the server's replies), written whole
    (waiting up to SEND_TIMEOUT for room); a peer that has gone or stopped reading misses it."""
    data = json.dumps(message).encode("utf-8")
    view = memoryview(struct.pack(">I", len(data)) + data)
    end = time.monotonic() + SEND_TIMEOUT
    try:
        while view:
            try:
                view = view[sock.send(view) :]
            except BlockingIOError:
                left = end - time.monotonic()
                if left <= 0 or not select.select([], [sock], [], left)[1]:
                    return
    except OSError:
        pass
