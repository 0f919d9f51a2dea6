"""What a pool or a keeper is asked for one rank, and what it answers.  [executor]

A task asks a warm pool (:mod:`.pool_server`) or a cold rank's keeper (:mod:`.keeper`) for its
rank the same way: one JSON line (at most :data:`MAX_REQUEST` bytes: ``{"env": {name: text},
"cwd": path}``, or ``{"stop": true}`` for a pool) with 4 or 5 descriptors (the rank's stdin, stdout
and stderr, its control pipe, rank 0's listening store socket), over a Unix socket; the server
answers JSON lines, ``{"pid": n}`` once the rank runs and ``{"exit": code}`` when it ends.  Nothing
received is executed or unpickled: a malformed request is dropped.

Example::

    request = parse_request(line, len(fds))        # None: not one
    env = take_descriptors(request, fds, os.getppid())   # in the rank's new process
"""

from __future__ import annotations

import json
import os
import socket
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
        "HOROVOD_RANK",
        "HOROVOD_SIZE",
        "HOROVOD_LOCAL_RANK",
        "HOROVOD_LOCAL_SIZE",
        "HOROVOD_CROSS_RANK",
        "HOROVOD_CROSS_SIZE",
        "HOROVOD_GLOO_RENDEZVOUS_ADDR",
        "HOROVOD_GLOO_RENDEZVOUS_PORT",
    }
)
NOT_KEYED = PER_RANK | PER_RUN


def server_env(env: Dict[str, str]) -> Dict[str, str]:
    """The environment of a pool or a keeper serving ranks of ``env``: none of the rank's own."""
    return {k: v for k, v in env.items() if k not in NOT_KEYED}


def parse_request(data: bytes, nfds: int) -> Optional[dict]:
    """The request, if well formed: a stop, or a rank's env (str to str), cwd and 4-5 descriptors."""
    try:
        request = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(request, dict):
        return None
    if request.get("stop") is True:
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


def reply(conn: socket.socket, message: dict) -> None:
    try:
        conn.sendall((json.dumps(message) + "\n").encode())
    except OSError:
        pass


def close_all(fds: List[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def read_line(replies, limit: int = 4096) -> Optional[dict]:
    """One JSON object a server sent (None: the connection ended, timed out, or the line is not one)."""
    try:
        buf = replies.readline(limit)
    except (OSError, ValueError):
        return None
    try:
        message = json.loads(buf.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return message if isinstance(message, dict) else None
