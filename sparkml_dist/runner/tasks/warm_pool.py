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
another user's or is open to others; the pool serves only its own user's processes.

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
import stat
import subprocess
import sys
from typing import Callable, Dict, Optional, Sequence

from .pool_server import alive
from .rank_request import NOT_KEYED, server_env
from .warm_rank import WarmProcess

POOL_MARK = "sparkml_dist.runner.tasks.pool_server"  # in a pool's command line (and its ranks')
POOL_ENTRY = f"import sys; from {POOL_MARK} import main; main(*sys.argv[1:])"
IDLE_S = 300.0  # a pool without a rank for this long ends
MAX_POOLS = 3  # pools of one anchor (one executor's application) at most
WARM_ENV = "SPARKML_DIST_WARM_RANKS"  # "0": every rank starts cold


def enabled(setting: bool = True) -> bool:
    return setting and os.environ.get(WARM_ENV, "1") != "0" and hasattr(socket, "recv_fds")


def pool_dir() -> Optional[str]:
    """This user's pool directory (made 0700), or None when it cannot be trusted."""
    import tempfile

    path = os.path.join(tempfile.gettempdir(), f"sparkml_dist-pool-{os.getuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None  # a link, another user's, or open to others: no pool (every rank cold)
    return path


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

    def __init__(self, directory: str, key: str, backend: str, anchor: int) -> None:
        self.directory, self.backend, self.anchor = directory, backend, anchor
        self.path = os.path.join(directory, f"{anchor}-{key}.sock")

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

    # ------------------------------------------------------------------ starting it
    def start(self, env: Dict[str, str]) -> None:
        """Start this pool (returns once its socket accepts: requests then wait for its imports)."""
        lock_path = os.path.join(self.directory, "start.lock")
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # one task of the executor starts it; the others see it
            if _answers(self.path):
                return
            _unlink(self.path)  # a pool that ended without removing its socket
            self._make_room()
            env = server_env(env)
            cmd = [sys.executable, "-c", POOL_ENTRY, self.path, self.backend, str(self.anchor), str(IDLE_S)]
            subprocess.run(
                cmd,
                env=env,
                cwd="/",
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
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
        mine = []
        for name in os.listdir(self.directory):
            if not name.endswith(".sock"):
                continue
            path = os.path.join(self.directory, name)
            anchor = name.split("-", 1)[0]
            if anchor.isdigit() and not alive(int(anchor)):
                _unlink(path)
            elif name.startswith(f"{self.anchor}-"):
                try:
                    mine.append((os.lstat(path).st_mtime, path))
                except FileNotFoundError:
                    continue
        for _, path in sorted(mine)[: max(0, len(mine) - (MAX_POOLS - 1))]:
            _send(path, {"stop": True})
            _unlink(path)


def _answers(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(1.0)
        try:
            conn.connect(path)
        except OSError:
            return False
    return True


def _send(path: str, message: dict) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(1.0)
        try:
            conn.connect(path)
            conn.sendall((json.dumps(message) + "\n").encode())
        except OSError:
            pass


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
