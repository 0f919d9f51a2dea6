"""What a pool or a keeper is asked for one rank, and what it answers.  [executor]

A task asks a warm pool (:mod:`.pool_server`) or a cold rank's keeper (:mod:`.keeper`) for its
rank the same way: one JSON line (at most :data:`MAX_REQUEST` bytes: ``{"env": {name: text},
"cwd": path}``; for a pool, ``{"stop": true}`` or ``{"standby": true}`` too) with 4 or 5
descriptors (the rank's stdin, stdout and stderr, its control pipe, rank 0's listening store
socket), over a Unix socket; the server answers JSON lines, ``{"pid": n}`` once the rank runs and
``{"exit": code}`` when it ends.  Nothing received is executed or unpickled: a malformed request is dropped.

Example::

    request = parse_request(line, len(fds))        # None: not one
    env = take_descriptors(request, fds, os.getppid())   # in the rank's new process
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
from typing import Dict, List, Optional

from .. import protocol

MAX_REQUEST = 1 << 20  # a rank's environment and directory, as JSON
MAX_FDS = 5
# What differs from rank to rank and run to run in a rank's environment, and no framework reads at
# its import: left out of a warm pool's key and of the environment a pool or a keeper runs with
# (their interpreters are not a rank: a sitecustomize keyed to RANK, say, does not fire in them).
PER_RANK = frozenset(
    {
        "RANK",
        "WORLD_SIZE",
        "CUDA_VISIBLE_DEVICES",
        protocol.TIMEOUT_ENV,
        protocol.START_TIMEOUT_ENV,
        protocol.RUN_ENV,
        protocol.USE_GPU_ENV,
        protocol.TOKEN_ENV,
        protocol.CTRL_ENV,
        protocol.PARENT_ENV,
        protocol.WORKDIR_ENV,
        protocol.STORE_FD_ENV,
        protocol.REPLACES_ENV,
        protocol.SPARE_ENV,
        protocol.CHECKPOINT_DIR_ENV,  # the run's, read by checkpoint.save/load in the function
        "MLFLOW_RUN_ID",  # the job's MLflow run, read by mlflow.log_* in the function
    }
)
# What a launcher sets for one run of its own, read when a process group forms and never at an
# import: TorchDistributor leaves these in the Spark Python worker its task ran in (a new
# MASTER_PORT and rendezvous id each run), and Spark reuses that worker for the next task, ours
# included: in the key, every run after one of TorchDistributor's would have started cold
# (measured: a warm launch 0.44-0.51 s, after TorchDistributor 0.99-1.29 s).
PER_RUN = frozenset(
    {
        "MASTER_ADDR",
        "MASTER_PORT",
        "NODE_RANK",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "PYSPARK_TORCH_DISTRIBUTOR_RDZV_ID",
        "SPARK_PARTITION_ARROW_DATA_FILE",
        "SPARK_DATAFRAME_SCHEMA_FILE",
        "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_RESTART_COUNT",
        "TF_CONFIG",
        *protocol.HOROVOD_RANK_VARS,
    }
)
NOT_KEYED = PER_RANK | PER_RUN


def server_env(env: Dict[str, str]) -> Dict[str, str]:
    """The environment of a pool or a keeper serving ranks of ``env``: none of the rank's own."""
    return {k: v for k, v in env.items() if k not in NOT_KEYED}


def parse_request(data: bytes, nfds: int) -> Optional[dict]:
    """The request, if well formed: a stop, a standby, or a rank's env (str to str), cwd and 4-5
    descriptors."""
    try:
        request = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(request, dict):
        return None
    if request.get("stop") is True or request.get("standby") is True:  # to a pool, no descriptors
        return request
    env, cwd = request.get("env"), request.get("cwd")
    if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        return None
    if not isinstance(cwd, str) or not os.path.isdir(cwd) or nfds not in (4, 5):
        return None
    return request


def take_descriptors(request: dict, fds: List[int], parent: int) -> Dict[str, str]:
    """In a rank's new process: its stdin, stdout and stderr from ``fds``; the environment it runs
    with (the request's, naming its control pipe, its store socket and ``parent``, whose death it
    dies with)."""
    stdin, stdout, stderr, ctrl, *store = fds
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
    close_all([stdin, stdout, stderr])
    env = dict(request["env"])
    env[protocol.CTRL_ENV] = str(ctrl)
    env[protocol.PARENT_ENV] = str(parent)  # the rank dies with its pool or keeper
    if store:
        env[protocol.STORE_FD_ENV] = str(store[0])
    else:
        env.pop(protocol.STORE_FD_ENV, None)
    return env


def start_rank(request: dict, fds: List[int], pool_pid: int) -> None:
    """In a pool's forked child (or its standby, :mod:`.standby`): become the rank ``request``
    describes, then run its entry."""
    env = take_descriptors(request, fds, pool_pid)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(request["cwd"])
    sys.argv = ["-c"]
    numpy = sys.modules.get("numpy")
    if numpy is not None:  # a cold rank draws a fresh seed; a forked one would share the pool's
        numpy.random.set_state(numpy.random.RandomState().get_state())
    from .rank import run

    run()


def reply(conn: socket.socket, message: dict, pid: Optional[int] = None) -> None:
    """Send ``message`` (one JSON line); with ``pid``, a pidfd of that process beside it."""
    line = (json.dumps(message) + "\n").encode()
    try:
        if pid is None:
            conn.sendall(line)
            return
        pidfd = os.pidfd_open(pid)
        try:
            socket.send_fds(conn, [line], [pidfd])
        finally:
            os.close(pidfd)
    except OSError:
        pass


def check_peer(conn: socket.socket, path: str) -> None:
    """Refuse (``PermissionError``) a connected socket whose server is not this user's process
    (``SO_PEERCRED``): a socket another user put at ``path`` is never sent a rank's environment,
    its descriptors or its start message."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    uid = struct.unpack("3i", creds)[1]
    if uid != os.getuid():
        raise PermissionError(f"the socket {path} is served by uid {uid}, not by this user")


class Replies:
    """The lines a pool or keeper sends over ``conn``, and the descriptors that came with them."""

    def __init__(self, conn: socket.socket, limit: int = 4096) -> None:
        self.conn, self.limit, self.buf, self.fds = conn, limit, b"", []

    def next(self) -> Optional[dict]:
        """The next JSON object (None: the connection ended, timed out, or the line is not one)."""
        while b"\n" not in self.buf:
            try:
                data, fds, _, _ = socket.recv_fds(self.conn, self.limit, 2)
            except OSError:
                return None
            self.fds.extend(fds)
            if not data or len(self.buf) + len(data) > self.limit:
                return None
            self.buf += data
        line, _, self.buf = self.buf.partition(b"\n")
        try:
            message = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return None
        return message if isinstance(message, dict) else None

    def take_fd(self) -> Optional[int]:
        """The first descriptor received (the caller owns it); the others closed."""
        fds, self.fds = self.fds, []
        close_all(fds[1:])
        return fds[0] if fds else None


def close_all(fds: List[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
