"""The live log channel from ranks to the driver, authenticated with a per-run secret.  [both]

The driver runs a :class:`LogServer`; each barrier task connects with a :class:`LogClient`.

Handshake: the server sends a random 32-byte nonce, the client answers
``HMAC-SHA256(secret, nonce)``; a wrong or late answer closes the connection and is logged.  After
that, frames are a 4-byte big-endian length and a UTF-8 JSON object (never a pickle); a frame over
:data:`MAX_FRAME` bytes closes the connection.  The secret travels inside the task spec (through
Spark's own authenticated channel), never on a command line.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import socket
import struct
import threading
from hashlib import sha256
from typing import Callable, List, Optional, Tuple

log = logging.getLogger(__name__)

MAX_FRAME = 1 << 20
NONCE = 32
HANDSHAKE_TIMEOUT = 5.0


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


class LogServer:
    """Accepts authenticated rank connections and hands each message to ``on_message(dict)``."""

    def __init__(self, secret: bytes, on_message: Callable[[dict], None], host: str = "0.0.0.0") -> None:
        self._secret = secret
        self._on_message = on_message
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, 0))
        self._sock.listen(64)
        self.port = self._sock.getsockname()[1]
        self.rejected = 0
        self._closed = threading.Event()
        self._conns: List[socket.socket] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept_loop, name="sparkml_dist-logs", daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                conn, addr = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn, addr), daemon=True).start()

    def _serve(self, conn: socket.socket, addr: Tuple[str, int]) -> None:
        with self._lock:
            self._conns.append(conn)
        try:
            nonce = os.urandom(NONCE)
            conn.settimeout(HANDSHAKE_TIMEOUT)
            conn.sendall(nonce)
            answer = _recv_exact(conn, 32)
            if not hmac.compare_digest(answer, hmac.new(self._secret, nonce, sha256).digest()):
                self.rejected += 1
                log.warning(
                    "log channel: dropped a connection from %s:%s that does not know the run's secret", *addr
                )
                return
            conn.settimeout(None)
            while True:
                (length,) = struct.unpack(">I", _recv_exact(conn, 4))
                if length > MAX_FRAME:
                    self.rejected += 1
                    log.warning(
                        "log channel: dropped %s:%s after a %d-byte frame (limit %d)",
                        *addr,
                        length,
                        MAX_FRAME,
                    )
                    return
                message = json.loads(_recv_exact(conn, length).decode("utf-8"))
                if isinstance(message, dict):
                    self._on_message(message)
        except (ConnectionError, OSError, ValueError, socket.timeout):
            return
        finally:
            conn.close()

    def close(self) -> None:
        self._closed.set()
        try:
            self._sock.close()
        finally:
            with self._lock:
                for c in self._conns:
                    try:
                        c.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass


class LogClient:
    """A rank-side connection to the driver's :class:`LogServer`; ``send`` is thread-safe and never
    raises (logs are best effort: a lost driver connection must not fail training)."""

    def __init__(self, host: str, port: int, secret: bytes, timeout: float = 10.0) -> None:
        self._lock = threading.Lock()
        self._sock: Optional[socket.socket] = socket.create_connection((host, port), timeout=timeout)
        nonce = _recv_exact(self._sock, NONCE)
        self._sock.sendall(hmac.new(secret, nonce, sha256).digest())
        self._sock.settimeout(None)

    def send(self, message: dict) -> None:
        data = json.dumps(message).encode("utf-8")[:MAX_FRAME]
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
