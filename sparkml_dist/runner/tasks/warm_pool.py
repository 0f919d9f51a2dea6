"""Warm ranks: a rank forked from a pool process that has already imported its framework.  [executor]

A cold rank is a new ``python -c RANK_ENTRY``: the interpreter, then ``import torch`` (about a
second a rank; TensorFlow several).  A *pool* (:mod:`.pool_server`) is that interpreter with the
backend's imports done (:meth:`~sparkml_dist.runner.backends.base.Backend.preload`), kept between
runs; a task asks it for a rank, which is forked in milliseconds and from then on is what a cold
rank is: its own session and process group, the task's pipes, its exit code, its kill.

**Which pool.**  One per *key*: the Python (``sys.executable``), the backend, the rank's
environment less what differs from rank to rank and run to run and no framework reads at its
import (:data:`PER_RANK`: ``RANK``, ``CUDA_VISIBLE_DEVICES``, the run id, the checkpoint
directory, the MLflow run, ...; so ``env=``, ``OMP_NUM_THREADS``, ``KERAS_BACKEND``,
``PYTHONPATH`` are in it: a rank never runs under imports made with other settings; nor the
rendezvous variables another launcher left for its own run, :data:`PER_RUN`), this
package's files (an edited install is a new pool) and the *anchor*: the process whose life bounds
the pool's (Spark's Python daemon on an executor: the application on that executor; the driver's
process for ``np < 0``).  Its socket is ``<tmp>/sparkml_dist-pool-<uid>/<anchor>-<key>.sock``: a
directory of the user's own, mode 0700, refused (every rank then starts cold) when it is a link, is
another user's or is open to others.  That check is made once per process, and the directory is
then reached only through the descriptor it opened (:class:`PoolDir`: a directory renamed away
and another linked in its place is never used); the socket's name is never on a command line; a
task sends a request only to a socket served by its own user (``SO_PEERCRED``), and the pool
serves only its own user's processes.  A pool answers a rank's pid with a *pidfd* of it, and a
task signals only a pid it holds a pidfd of (:mod:`.warm_rank`).

**When.**  A rank is always asked of its pool; a task that finds none starts it (in a thread: the
task goes on), and the request waits in the pool's socket while the pool imports, the task's own
steps (the log channel, the shard, the address exchange) overlapping that import; so a session's
first run imports the framework once per executor instead of once per rank, and its second run
finds the pool ready.  A pool that fails the request (see :mod:`.warm_rank`) gets the rank started
cold.  A pool ends with its anchor, after :data:`IDLE_S` seconds without a rank, or when a
new pool of the same anchor would be the :data:`MAX_POOLS` + 1-th (the least recently used one
stops once its ranks end).  It holds what its imports hold: for torch ~220 MiB of resident memory,
shared copy-on-write with the ranks forked from it.  ``BarrierRunner(warm_ranks=False)`` or
``SPARKML_DIST_WARM_RANKS=0`` in the environment starts every rank cold.

Example::

    pool = Pool.of(env, backend, anchor=os.getppid())
    proc = pool.fork(env, cwd, (ctrl_w,), on_pid=print) if pool else subprocess.Popen(...)
    proc.stdin.write(start_message)    # pipes work at once; the pid comes once the pool forked it
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import subprocess
import sys
from typing import Callable, Dict, Optional, Sequence

from .pool_server import alive
from .rank_request import NOT_KEYED, check_peer, server_env
from .warm_rank import WarmProcess

POOL_MARK = "sparkml_dist.runner.tasks.pool_server"  # in a pool's command line (and its ranks')
POOL_ENTRY = f"from {POOL_MARK} import main; main()"  # its arguments: one JSON line on its stdin
IDLE_S = 300.0  # a pool without a rank for this long ends
MAX_POOLS = 3  # pools of one anchor (one executor's application) at most
WARM_ENV = "SPARKML_DIST_WARM_RANKS"  # "0": every rank starts cold


def enabled(setting: bool = True) -> bool:
    """Warm ranks may be used: asked for, and Linux (descriptors over Unix sockets, ``/proc``)."""
    fit = hasattr(socket, "recv_fds") and hasattr(os, "pidfd_open") and os.path.isdir("/proc/self/fd")
    return setting and os.environ.get(WARM_ENV, "1") != "0" and fit


class PoolDir:
    """This user's pool directory, checked once and then reached only through the descriptor that
    check opened (``/proc/self/fd/N/name``): renaming it away and linking another in its place,
    after the check, changes nothing for this process."""

    def __init__(self, path: str, fd: int) -> None:
        self.path, self.fd = path, fd

    @classmethod
    def open(cls, path: str) -> Optional["PoolDir"]:
        """``path`` made 0700 when missing, opened without following a link, and kept when it is
        a directory of this user's that no one else can enter; None otherwise."""
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError:
            return None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None  # a link, or not a directory
        st = os.fstat(fd)
        if st.st_uid != os.getuid() or st.st_mode & 0o077:
            os.close(fd)
            return None  # another user's, or open to others: no pool (every rank cold)
        return cls(path, fd)

    def at(self, name: str) -> str:
        """A path to ``name`` inside this very directory, whatever its name now leads to."""
        return f"/proc/self/fd/{self.fd}/{name}"


_DIRS: Dict[str, PoolDir] = {}  # path -> the directory opened there (once per process)


def pool_dir() -> Optional[PoolDir]:
    """This user's pool directory (made 0700), or None when it cannot be trusted."""
    import tempfile

    path = os.path.join(tempfile.gettempdir(), f"sparkml_dist-pool-{os.getuid()}")
    if path not in _DIRS:
        opened = PoolDir.open(path)
        if opened is None:
            return None
        _DIRS[path] = opened
    return _DIRS[path]


def _install_stamp() -> str:
    """This package's files and their times: an edited install is another pool."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the package
    parts = []
    for root, _, files in os.walk(here):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(root, name)
                st = os.stat(path)
                parts.append(f"{os.path.relpath(path, here)}:{st.st_mtime_ns}:{st.st_size}")
    return ";".join(sorted(parts))


def pool_key(env: Dict[str, str], backend: str) -> str:
    kept = sorted((k, v) for k, v in env.items() if k not in NOT_KEYED)
    blob = json.dumps([sys.executable, backend, _install_stamp(), kept]).encode()
    return hashlib.sha256(blob).hexdigest()[:24]


class Pool:
    """The pool a rank with ``env`` of ``backend`` under ``anchor`` would come from."""

    def __init__(self, directory: PoolDir, key: str, backend: str, anchor: int) -> None:
        self.directory, self.backend, self.anchor = directory, backend, anchor
        self.name = f"{anchor}-{key}.sock"
        self.path = directory.at(self.name)  # through the checked directory's descriptor

    @classmethod
    def of(cls, env: Dict[str, str], backend: str, anchor: int) -> Optional["Pool"]:
        directory = pool_dir()
        return cls(directory, pool_key(env, backend), backend, anchor) if directory else None

    # ------------------------------------------------------------------ a rank from the pool
    def fork(
        self, env: Dict[str, str], cwd: str, fds: Sequence[int], on_pid: Callable[[int], None]
    ) -> WarmProcess:
        """The rank, forked by this pool (started first when it is not running), with new pipes for
        its stdin, stdout and stderr (the process's ``stdin``, ``stdout``, ``stderr``) and ``fds``
        (the control pipe[, the store socket]).  Returns at once; ``on_pid(pid)`` once it runs.
        When the pool fails the request the rank starts cold (:mod:`.warm_rank`)."""
        return WarmProcess(self, env, cwd, fds, on_pid)

    def keep_standby(self) -> None:
        """Ask the running pool to keep a standby: the next rank's process forked ahead with the
        imports of a first step (:mod:`.standby`); one it has already is kept."""
        _send(self.path, {"standby": True})

    def touch(self) -> None:
        """Mark it in use (the last pool to stop); gone meanwhile (another task made room), no matter."""
        try:
            os.utime(self.name, dir_fd=self.directory.fd, follow_symlinks=False)
        except OSError:
            pass

    # ------------------------------------------------------------------ starting it
    def start(self, env: Dict[str, str]) -> None:
        """Start this pool (returns once its socket accepts: requests then wait for its imports).
        Its socket's name and directory reach it on its stdin and as a descriptor, never on its
        command line (which any user can read)."""
        dfd = self.directory.fd
        try:
            flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open("start.lock", flags, 0o600, dir_fd=dfd)
        except OSError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # one task of the executor starts it; the others see it
            if _answers(self.path):
                return
            _unlink(self.name, dfd)  # a pool that ended without removing its socket
            self._make_room()
            args = {"dir_fd": dfd, "name": self.name, "backend": self.backend, "anchor": self.anchor}
            subprocess.run(
                [sys.executable, "-c", POOL_ENTRY],
                input=(json.dumps({**args, "idle_s": IDLE_S}) + "\n").encode(),
                env=server_env(env),
                cwd="/",
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(dfd,),
                start_new_session=True,
                timeout=60,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            pass
        finally:
            os.close(fd)

    def _make_room(self) -> None:
        """Stop the least recently used pools of this anchor beyond MAX_POOLS - 1; remove the
        sockets of pools whose anchor is gone (a pool killed before it could)."""
        dfd, mine = self.directory.fd, []
        for name in os.listdir(dfd):
            if not name.endswith(".sock"):
                continue
            anchor = name.split("-", 1)[0]
            if anchor.isdigit() and not alive(int(anchor)):
                _unlink(name, dfd)
            elif name.startswith(f"{self.anchor}-"):
                try:
                    mine.append((os.lstat(name, dir_fd=dfd).st_mtime, name))
                except FileNotFoundError:
                    continue
        for _, name in sorted(mine)[: max(0, len(mine) - (MAX_POOLS - 1))]:
            _send(self.directory.at(name), {"stop": True})
            _unlink(name, dfd)


def connect(path: str, timeout: float) -> socket.socket:
    """A connection to the pool at ``path``, refused (``PermissionError``) unless the process
    serving it is this user's (:func:`.rank_request.check_peer`)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(timeout)
    try:
        conn.connect(path)
        check_peer(conn, path)
    except BaseException:
        conn.close()
        raise
    return conn


def _answers(path: str) -> bool:
    try:
        connect(path, 1.0).close()
    except OSError:
        return False
    return True


def _send(path: str, message: dict) -> None:
    try:
        with connect(path, 1.0) as conn:
            conn.sendall((json.dumps(message) + "\n").encode())
    except OSError:
        pass


def _unlink(name: str, dir_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
