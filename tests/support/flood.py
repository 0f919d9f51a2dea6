"""A flood of idle, never-authenticating connections against a log channel."""

import socket
import threading
import time


def wait(cond, within=10.0):
    deadline = time.time() + within
    while not cond() and time.time() < deadline:
        time.sleep(0.02)
    return cond()


class Flood:
    """``n`` idle connections to ``port`` that never authenticate, re-opened as the server closes
    them, until stopped: what an attacker on the network (or a port scanner) does."""

    def __init__(self, port, n=500, host="127.0.0.1"):
        self.host, self.port, self.n, self.opened = host, port, n, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        socks = []
        while not self._stop.is_set():
            socks = [s for s in socks if not _closed(s)]
            while len(socks) < self.n and not self._stop.is_set():
                try:
                    socks.append(socket.create_connection((self.host, self.port), timeout=2))
                    self.opened += 1
                except OSError:
                    break
            time.sleep(0.05)
        for s in socks:
            s.close()

    def __enter__(self):
        self._thread.start()
        assert wait(lambda: self.opened >= self.n, within=30), self.opened
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(10)


def _closed(sock):
    sock.setblocking(False)
    try:
        return sock.recv(64, socket.MSG_PEEK) == b"" or False
    except BlockingIOError:
        return False
    except OSError:
        return True
