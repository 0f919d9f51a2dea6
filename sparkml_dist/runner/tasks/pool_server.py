"""A warm rank pool: one interpreter with the framework imported, forking ranks on request.  [executor]

Started by :mod:`.warm_pool` (a barrier task, or the driver for ``np < 0``) as
``python -c POOL_ENTRY``, its arguments (the socket's directory descriptor and name, the backend,
the anchor, the idle time) one JSON line on its stdin, never on its command line, with the
environment its ranks will have: it
binds its Unix socket (in a directory only its user can enter), leaves its parent (a daemon: no
task's life is its life), imports what the backend imports before a rank's start message
(:meth:`~sparkml_dist.runner.backends.base.Backend.preload`: ``torch.distributed``, never a CUDA
context) and then serves, single-threaded, until

* the *anchor* process ends (Spark's Python daemon of the executor, whose life is the
  application's on that executor; the driver's process for ``np < 0``), watched with a pidfd;
* nothing was asked of it and no rank of it ran for ``IDLE_S`` seconds;
* a task asks it to stop (the pool's cap on processes per anchor, :data:`.warm_pool.MAX_POOLS`).

**A request, one rank.**  A connection from a process of the same user (``SO_PEERCRED``) sends one
JSON line (at most :data:`MAX_REQUEST` bytes: the rank's environment and working directory) with 4
or 5 descriptors (stdin, stdout, stderr, the control pipe, rank 0's listening store socket).  The
pool forks; the child starts a session of its own, takes the descriptors, the environment (its
``PARENT_ENV`` this pool, so it dies with it) and the directory, reseeds numpy's global generator
(a cold process draws a new seed; a fork would share one) and runs the rank's entry as ``python -c
RANK_ENTRY`` would.  The pool answers ``{"pid": n}``, and ``{"exit": code}`` when the rank ends
(``-9``: killed by SIGKILL); a connection closed while its rank runs kills the rank's process
group (and a request whose connection closed before it was read forks nothing).  A rank's exit
code, its kill and its death with its task thus keep their meaning.  Nothing received is executed
or unpickled: a malformed request is dropped.

**A standby** (:mod:`.standby`): asked ``{"standby": true}`` (the driver's warm job on a spare
executor), the pool forks one process that makes the backend's spare imports and waits; the next
rank asked of it is handed to that process instead of forked.

**What a rank leaves behind** (a double fork, a daemon that left the rank's session) is re-parented
to the pool, a child subreaper, and killed once its rank has ended (:mod:`.orphans`).
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import struct
import sys
import time
import traceback
from typing import Dict, List, Optional

from . import orphans
from .orphans import Orphans
from .rank_request import MAX_FDS, MAX_REQUEST, close_all, parse_request, reply, start_rank
from .standby import Standby


class _Rank:
    def __init__(self, conn: socket.socket, pid: int) -> None:
        self.conn, self.pid = conn, pid


class _Pending:
    """A request being read: its bytes so far and the descriptors that came with them."""

    def __init__(self) -> None:
        self.data, self.fds = bytearray(), []


class PoolServer:
    def __init__(
        self, listener: socket.socket, anchor: int, idle_s: float, dir_fd: int = -1, spare_preload=None
    ) -> None:
        self.listener, self.idle_s, self.dir_fd = listener, idle_s, dir_fd
        self.spare_preload = spare_preload or (lambda: None)  # what a standby imports
        self.standby: Optional[Standby] = None
        self.sel = selectors.DefaultSelector()
        self.ranks: Dict[int, _Rank] = {}  # pid -> its connection
        self.orphans = Orphans()  # what ranks left behind, re-parented to this pool
        self.pending: Dict[socket.socket, _Pending] = {}
        self.stopping = False
        self.last = time.monotonic()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the loop through the pipe
        self.anchor_fd = _pidfd(anchor)
        self.sel.register(listener, selectors.EVENT_READ, "accept")
        self.sel.register(self.wake_r, selectors.EVENT_READ, "wake")
        if self.anchor_fd is not None:
            self.sel.register(self.anchor_fd, selectors.EVENT_READ, "anchor")
        self.anchor = anchor

    # ------------------------------------------------------------------ loop
    def serve(self) -> None:
        while True:
            if self.anchor_fd is None and not alive(self.anchor):
                return
            if not self.ranks and (self.stopping or time.monotonic() - self.last > self.idle_s):
                return
            events = self.sel.select(timeout=1.0)
            for key, _ in events:
                if key.data == "anchor":
                    return  # the application (or executor) is gone: its ranks die with this process
                if key.data == "accept":
                    self._accept()
                elif key.data == "wake":
                    os.read(self.wake_r, 4096)
                elif key.data == "request":
                    self._read(key.fileobj)
                elif key.data == "rank":
                    self._rank_conn(key.fileobj)
                elif key.data == "standby" and not self.standby.heard():
                    self._drop_standby()
            self._reap()

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        if struct.unpack("3i", creds)[1] != os.getuid():  # another user's process: never served
            conn.close()
            return
        self.last = time.monotonic()
        self.pending[conn] = _Pending()
        self.sel.register(conn, selectors.EVENT_READ, "request")

    def _drop(self, conn: socket.socket) -> None:
        pending = self.pending.pop(conn, None)
        if pending is not None:
            close_all(pending.fds)
        self.sel.unregister(conn)
        conn.close()

    def _read(self, conn: socket.socket) -> None:
        pending = self.pending[conn]
        try:
            data, fds, _, _ = socket.recv_fds(conn, 65536, MAX_FDS)
        except OSError:
            return self._drop(conn)
        pending.fds.extend(fds)
        pending.data += data
        if not data or len(pending.data) > MAX_REQUEST or len(pending.fds) > MAX_FDS:
            return self._drop(conn)
        if not pending.data.endswith(b"\n"):
            return  # the rest of the line comes in the next read
        request = parse_request(bytes(pending.data), len(pending.fds))
        if request is None:
            return self._drop(conn)
        if request.get("stop"):
            self.stopping = True
            self._close_listener()
            return self._drop(conn)
        if request.get("standby"):
            self._drop(conn)
            if self.standby is None and not self.stopping:
                self.standby = Standby.fork(self._close_inherited, self.spare_preload)
                self.sel.register(self.standby.end, selectors.EVENT_READ, "standby")
            return None
        if _closed(conn):  # its task was killed or gave up while this pool imported: fork nothing
            return self._drop(conn)
        del self.pending[conn]
        self._fork(conn, request, pending.fds)

    def _close_listener(self) -> None:
        try:
            self.sel.unregister(self.listener)
        except (KeyError, ValueError):
            return
        self.listener.close()

    def _fork(self, conn: socket.socket, request: dict, fds: List[int]) -> None:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():  # never: a fork would share a context
            close_all(fds)
            conn.close()
            os._exit(3)
        standby = self.standby if self.standby is not None and self.standby.ready else None
        if standby is not None and standby.hand(request, fds):  # it becomes this rank: no fork
            pid = standby.pid
            self._drop_standby()
        else:
            pid = os.fork()
            if pid == 0:
                self._child(conn, request, fds)  # never returns
        close_all(fds)
        self.ranks[pid] = _Rank(conn, pid)
        self.sel.modify(conn, selectors.EVENT_READ, "rank")
        reply(conn, {"pid": pid}, pid)  # with a pidfd: the task signals this process, none other

    def _child(self, conn: socket.socket, request: dict, fds: List[int]) -> None:
        try:
            conn.close()
            self._close_inherited()
            os.setsid()
            start_rank(request, fds, os.getppid())
        except BaseException:
            traceback.print_exc()
        os._exit(1)

    def _close_inherited(self) -> None:
        """In a forked child: close what is the pool's (its sockets, its requests' descriptors)."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        self.sel.close()
        standby = [self.standby.end] if self.standby is not None else []
        for c in [self.listener, *self.pending, *(r.conn for r in self.ranks.values()), *standby]:
            c.close()
        close_all([fd for p in self.pending.values() for fd in p.fds])
        close_all(
            [self.wake_r, self.wake_w, self.dir_fd] + ([self.anchor_fd] if self.anchor_fd is not None else [])
        )

    def _drop_standby(self) -> None:
        """No standby any more (it became a rank, or it ended)."""
        self.sel.unregister(self.standby.end)
        self.standby.close()
        self.standby = None

    def _rank_conn(self, conn: socket.socket) -> None:
        """The task closed its connection (it ended, or was killed) while its rank runs."""
        try:
            data = conn.recv(1)
        except OSError:
            data = b""
        if data:
            return
        for rank in list(self.ranks.values()):
            if rank.conn is conn:
                _killpg(rank.pid)

    def _reap(self) -> None:
        reaped = False
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            reaped = True
            self.orphans.forget(pid)
            if self.standby is not None and pid == self.standby.pid:
                self._drop_standby()  # it ended before it was handed a rank
            rank = self.ranks.pop(pid, None)
            if rank is None:
                continue  # a process a rank left, ended
            self.last = time.monotonic()
            reply(rank.conn, {"exit": os.waitstatus_to_exitcode(status)})
            self.sel.unregister(rank.conn)
            rank.conn.close()
        if reaped:
            self.orphans.end(set(self.ranks), keep={self.standby.pid} if self.standby else set())


def _closed(conn: socket.socket) -> bool:
    try:  # the peer's end of the connection is closed: no byte to peek at, and no wait
        return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _killpg(pid: int) -> None:
    """Kill rank ``pid`` (this pool's child, not reaped yet: the number is still its own) and its
    process group."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _pidfd(pid: int) -> Optional[int]:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # an old kernel: polled instead
        return None


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _arguments() -> dict:
    """What :meth:`.warm_pool.Pool.start` wrote on this pool's stdin (one JSON line)."""
    args = json.loads(sys.stdin.buffer.readline(65536).decode("utf-8"))
    name = args["name"]
    if not (isinstance(name, str) and name.endswith(".sock") and "/" not in name and len(name) < 80):
        raise ValueError(f"not a pool socket's name: {name!r}")
    return {
        "dir_fd": int(args["dir_fd"]),
        "name": name,
        "backend": str(args["backend"]),
        "anchor": int(args["anchor"]),
        "idle_s": float(args["idle_s"]),
    }


def main() -> None:
    """Bind its socket in the directory it was handed, leave the parent (which waits for that),
    preload, serve (its arguments on stdin: :func:`_arguments`)."""
    args = _arguments()
    dir_fd, name = args["dir_fd"], args["name"]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o077)
    try:
        listener.bind(f"/proc/self/fd/{dir_fd}/{name}")  # in that very directory, whatever its path
    finally:
        os.umask(old)
    listener.listen(1024)  # every rank of a run may ask while the pool still imports
    bound = os.stat(name, dir_fd=dir_fd).st_ino
    if os.fork():  # the starting task waits for this exit: the socket is there, connections queue
        os._exit(0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a notebook's interrupt is for the driver
    try:
        from .. import backends

        backend = backends.get(args["backend"])
        for key, value in backend.env_defaults.items():  # as the rank sets them before its imports
            os.environ.setdefault(key, value)
        backend.preload()
        from ..data import shard  # noqa: F401 - every rank maps its shard through it (0.2 s)

        orphans.subreaper()
        PoolServer(listener, args["anchor"], args["idle_s"], dir_fd, backend.spare_preload).serve()
    finally:
        orphans.end_all()  # ranks die with the pool anyway; what they left, here
        try:
            if os.stat(name, dir_fd=dir_fd).st_ino == bound:  # not a newer pool's socket there
                os.unlink(name, dir_fd=dir_fd)
        except OSError:  # gone already
            pass
    os._exit(0)


if __name__ == "__main__":  # pragma: no cover - started with POOL_ENTRY
    main()
