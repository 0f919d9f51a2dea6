"""A rank asked of a warm pool: returned at once, forked when the pool is ready.  [executor]

:meth:`.warm_pool.Pool.fork` gives the task a :class:`WarmProcess` without waiting: its pipes
(``stdin``, ``stdout``, ``stderr``) are there from the start, so the task connects to the driver,
writes its shard and exchanges addresses while the pool (started by this very request when it was
not running) is still importing the framework; the start message is written once the rank runs
(:meth:`WarmProcess.wait_forked`). A thread of its own starts the pool if needed, sends the request
and waits for the pool's answer: ``pid`` is None until then (``on_pid`` is called with it when it
comes).  It is ``subprocess.Popen`` as the task uses it:
``pid``, ``poll()``, ``wait()``, ``returncode``, and :meth:`WarmProcess.kill` for its process group.

**When the pool fails the request** (it could not be started, it ended before forking the rank, or
it did not answer within :data:`PID_WAIT_S`) the rank starts cold (``python -c RANK_ENTRY``) with
the same pipes and descriptors, which this object keeps until then; ``cold`` says so.  Killed
before the pool answered, the rank is never started: the request's connection is closed, and a
pool that reads a request whose connection is gone forks nothing.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from typing import Callable, Dict, List, Optional, Sequence

from .. import protocol

CONNECT_WAIT_S = 10.0  # a pool's socket that does not accept within this: the rank starts cold
PID_WAIT_S = 120.0  # a pool that does not fork within this (its import hangs): the rank starts cold


class WarmProcess:
    """Rank ``env`` in ``cwd`` with ``fds`` (the control pipe[, the store socket]: duplicated, the
    caller closes its own), forked by ``pool`` (a :class:`.warm_pool.Pool`) or else started cold."""

    def __init__(
        self, pool, env: Dict[str, str], cwd: str, fds: Sequence[int], on_pid: Callable[[int], None]
    ) -> None:
        self.pool, self.env, self.cwd, self.on_pid = pool, env, cwd, on_pid
        self.pid: Optional[int] = None
        self.returncode: Optional[int] = None
        self.cold = False  # the pool failed the request: started as a new interpreter
        self.conn: Optional[socket.socket] = None
        self._cold: Optional[subprocess.Popen] = None
        self._killed = False
        self._lock = threading.Lock()
        self._ended = threading.Event()
        self._released = threading.Event()  # the rank has its own descriptors (or never will)
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        # the rank's ends, kept until it has its own copies (forked, or started cold)
        self._kept: List[int] = [in_r, out_w, err_w, *(os.dup(fd) for fd in fds)]
        self.stdin = os.fdopen(in_w, "wb")
        self.stdout, self.stderr = os.fdopen(out_r, "rb"), os.fdopen(err_r, "rb")
        threading.Thread(target=self._run, daemon=True, name="sparkml_dist-warm-rank").start()

    # ------------------------------------------------------------------ the request's thread
    def _run(self) -> None:
        try:
            replies = self._request()
        except Exception:  # whatever went wrong asking the pool, the rank still starts (cold)
            with self._lock:
                self._drop_conn()
            replies = None
        reply = _read_line(replies) if replies is not None else None
        pid = reply.get("pid") if reply else None
        with self._lock:
            if self._killed:  # killed or closed meanwhile: a rank forked anyway dies with the connection
                return self._end(-signal.SIGKILL) if not self._ended.is_set() else None
            if not isinstance(pid, int):  # no pool, or it failed the request
                self._drop_conn()
                return self._start_cold()
            self.pid = pid
            self._release()
            self.conn.settimeout(None)
        self.on_pid(pid)
        reply = _read_line(replies)
        code = reply.get("exit") if reply else None
        self._end(code if isinstance(code, int) else -signal.SIGKILL)

    def _request(self):
        """Connect (starting the pool first when it is not running) and send the request; the
        connection's reader, or None when no pool took it."""
        for attempt in (0, 1):
            if attempt or not os.path.exists(self.pool.path):
                self.pool.start(self.env)  # a stale socket is replaced; another task's start is waited for
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.settimeout(CONNECT_WAIT_S)
            with self._lock:
                if self._killed:
                    conn.close()
                    return None
                self.conn = conn
            try:
                conn.connect(self.pool.path)
                line = (json.dumps({"env": self.env, "cwd": self.cwd}) + "\n").encode()
                socket.send_fds(conn, [line], self._kept)
            except OSError:
                with self._lock:
                    self._drop_conn()
                continue
            conn.settimeout(PID_WAIT_S)
            try:
                os.utime(self.pool.path, follow_symlinks=False)  # in use: the last pool to stop
            except OSError:  # the pool stopped meanwhile (another task made room): it answers nothing
                pass
            return conn.makefile("rb")
        return None

    def _start_cold(self) -> None:
        """(under the lock) The rank as a new interpreter, with the descriptors the pool was sent."""
        ctrl, *store = self._kept[3:]
        env = {**self.env, protocol.CTRL_ENV: str(ctrl)}
        if store:
            env[protocol.STORE_FD_ENV] = str(store[0])
        try:
            self._cold = subprocess.Popen(
                [sys.executable, "-c", protocol.RANK_ENTRY],
                env=env,
                cwd=self.cwd,
                stdin=self._kept[0],
                stdout=self._kept[1],
                stderr=self._kept[2],
                pass_fds=(ctrl, *store),
                start_new_session=True,
            )
        except OSError as exc:
            os.write(self._kept[2], f"the rank could not be started: {exc}\n".encode())
            self._release()
            return self._end(1)
        self.cold, self.pid = True, self._cold.pid
        self._release()
        threading.Thread(target=lambda: self._end(self._cold.wait()), daemon=True).start()
        self.on_pid(self.pid)

    def _end(self, code: int) -> None:
        self.returncode = code
        self._ended.set()

    def _release(self) -> None:
        for fd in self._kept:
            os.close(fd)
        self._kept = []
        self._released.set()

    def wait_forked(self) -> None:
        """Until the rank runs (forked, or started cold) and this process holds none of its
        descriptors: a framework that binds its reserved port again once the start message came
        (TensorFlow, JAX) must not meet this process's copy of the socket still listening."""
        self._released.wait()

    def _drop_conn(self) -> None:
        if self.conn is not None:
            try:
                self.conn.shutdown(socket.SHUT_RDWR)  # the pool kills the rank if it forked one
            except OSError:
                pass
            self.conn.close()
            self.conn = None

    # ------------------------------------------------------------------ as subprocess.Popen
    def poll(self) -> Optional[int]:
        return self.returncode if self._ended.is_set() else None

    def wait(self, timeout: Optional[float] = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"rank {self.pid}", timeout)
        return self.returncode  # type: ignore[return-value]

    def kill(self) -> None:
        """Kill the rank's process group; not forked yet, it never will be (ended: -SIGKILL)."""
        with self._lock:
            if self.pid is not None:
                return killpg(self.pid)
            self._killed = True
            self._drop_conn()
            self._release()
            self._end(-signal.SIGKILL)

    def close(self) -> None:
        """The task is done with it: a forked rank still running is killed by its pool."""
        with self._lock:
            self._killed = True
            self._drop_conn()
            self._release()


def killpg(pid: int) -> None:
    """SIGKILL process group ``pid`` (a rank's: it leads a session of its own), if it is still there."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read_line(replies, limit: int = 4096) -> Optional[dict]:
    """One JSON object the pool sent (None: the connection ended, timed out, or the line is not one)."""
    try:
        buf = replies.readline(limit)
    except (OSError, ValueError):
        return None
    try:
        message = json.loads(buf.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return message if isinstance(message, dict) else None
