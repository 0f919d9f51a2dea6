"""A rank asked of a warm pool, or of a cold rank's keeper: returned at once.  [executor]

:meth:`.warm_pool.Pool.fork` gives the task a :class:`WarmProcess` without waiting: its pipes
(``stdin``, ``stdout``, ``stderr``) are there from the start, so the task connects to the driver,
writes its shard and exchanges addresses while the pool (started by this very request when it was
not running) is still importing the framework; the start message is written once the rank runs
(:meth:`WarmProcess.wait_forked`). A thread of its own starts the pool if needed, sends the request
and waits for the pool's answer: ``pid`` is None until then (``on_pid`` is called with it when it
comes).  It is ``subprocess.Popen`` as the task uses it:
``pid``, ``poll()``, ``wait()``, ``returncode``, and :meth:`WarmProcess.kill` for its process group.

**A cold rank** (no pool: ``warm_ranks=False``, or the pool failed the request: it could not be
started, it ended before forking the rank, or it did not answer within :data:`PID_WAIT_S`) is asked
of a *keeper* (:mod:`.keeper`) the same way, with the same pipes and descriptors, which this object
keeps until then: a small process of its own that starts the rank as a new interpreter and, as a
pool does, outlives it to end whatever it left behind; ``cold`` says so.  Killed before the pool
answered, the rank is never started: the request's connection is closed, and a pool that reads a
request whose connection is gone forks nothing.
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

from .keeper import KEEPER_ENTRY
from .rank_request import Replies, check_peer, server_env

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
        self.cold = False  # no pool, or it failed the request: started by a keeper, a new interpreter
        self.conn: Optional[socket.socket] = None
        self._pidfd: Optional[int] = None  # proves self.pid still names the rank (its pool's or keeper's)
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
        replies = self._ask(self._request) if self.pool is not None else None
        pid, pidfd = self._forked(replies)
        if pid is None:  # no pool, or it failed the request (or sent no pidfd with its answer)
            with self._lock:
                self._drop_conn()
            self.cold = True
            replies = self._ask(self._keeper_request)
            pid, pidfd = self._forked(replies)
        with self._lock:
            if self._killed:  # killed or closed meanwhile: a rank forked anyway dies with the connection
                _close(pidfd)
                return self._end(-signal.SIGKILL) if not self._ended.is_set() else None
            if pid is None:  # not even a keeper could start it
                os.write(self._kept[2], b"the rank could not be started: its keeper did not run it\n")
                self._release()
                return self._end(1)
            self.pid, self._pidfd = pid, pidfd
            self._release()
            self.conn.settimeout(None)
        self.on_pid(pid)
        reply = replies.next()
        code = reply.get("exit") if reply else None
        self._end(code if isinstance(code, int) else -signal.SIGKILL)

    @staticmethod
    def _forked(replies: Optional[Replies]):
        """(pid, its pidfd) from the first answer; (None, None) without both."""
        reply = replies.next() if replies is not None else None
        pid = reply.get("pid") if reply else None
        pidfd = replies.take_fd() if replies is not None else None
        if isinstance(pid, int) and pidfd is not None:
            return pid, pidfd
        _close(pidfd)
        return None, None

    def _ask(self, request) -> Optional[Replies]:
        """``request()``'s replies; None when it failed (whatever went wrong)."""
        try:
            return request()
        except Exception:  # noqa: BLE001 - a pool or keeper that failed: the caller goes on without it
            with self._lock:
                self._drop_conn()
            return None

    def _request(self) -> Optional[Replies]:
        """Connect (starting the pool first when it is not running) and send the request; the
        connection's replies, or None when no pool of this user took it."""
        for attempt in (0, 1):
            if attempt or not os.path.exists(self.pool.path):
                self.pool.start(self.env)  # a stale socket is replaced; another task's start is waited for
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.settimeout(CONNECT_WAIT_S)
            if not self._hold(conn):
                return None
            try:
                conn.connect(self.pool.path)
                check_peer(conn, self.pool.path)  # another user's socket gets nothing of the rank
                self._send(conn)
            except OSError:
                with self._lock:
                    self._drop_conn()
                continue
            conn.settimeout(PID_WAIT_S)
            self.pool.touch()
            return Replies(conn)
        return None

    def _keeper_request(self) -> Optional[Replies]:
        """Start a keeper for the rank (:mod:`.keeper`) and send it the request; its replies."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            if not self._hold(mine):
                mine.close()
                return None
            subprocess.Popen(
                [sys.executable, "-c", KEEPER_ENTRY, str(theirs.fileno())],
                env=server_env(self.env),  # no token: not the rank's reaper's to kill (it ends
                # what the rank left, then itself), no RANK: startup code keyed to ranks skips it
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=self._kept[2],  # a keeper that fails says why in the rank's stderr
                pass_fds=(theirs.fileno(),),
                start_new_session=True,  # its own: a kill of the task's group leaves it to clean up
            )
        finally:
            theirs.close()
        self._send(mine)
        return Replies(mine)

    def _hold(self, conn: socket.socket) -> bool:
        """Keep ``conn`` as the request's connection (False: killed meanwhile, nothing to ask)."""
        with self._lock:
            if self._killed:
                conn.close()
                return False
            self.conn = conn
        return True

    def _send(self, conn: socket.socket) -> None:
        line = (json.dumps({"env": self.env, "cwd": self.cwd}) + "\n").encode()
        socket.send_fds(conn, [line], self._kept)

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
        """Kill the rank's process group; not forked yet, it never will be (ended: -SIGKILL).
        A forked rank is killed twice over: by this process (its pidfd) and by its pool or keeper
        (its parent, whose child's number cannot be another's yet), which kills it when this end
        of the request's connection stops sending, and still answers its exit code."""
        with self._lock:
            if self.pid is not None:
                killpg(self.pid, self._pidfd)
                try:
                    self.conn.shutdown(socket.SHUT_WR)
                except (AttributeError, OSError):  # closed meanwhile: the pool has killed it
                    pass
                return
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
            _close(self._pidfd)
            self._pidfd = None


def _close(fd: Optional[int]) -> None:
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass


def killpg(pid: int, pidfd: Optional[int]) -> None:
    """SIGKILL process group ``pid`` (a rank's: it leads a session of its own), if that very process
    is still there: ``pidfd`` (from its pool or keeper) proves the number still names it; a pid
    without one is never signalled."""
    if pidfd is None:
        return
    try:
        signal.pidfd_send_signal(pidfd, 0)  # ProcessLookupError: it ended, its number may be reused
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass
