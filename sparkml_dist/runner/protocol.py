"""Every name and message exchanged between a barrier task and its rank process.  [anywhere]

The *task* is the Spark barrier task on an executor (or a driver thread for ``np < 0``,
:mod:`sparkml_dist.runner.tasks.task`); the *rank process* is the child it starts
(:mod:`sparkml_dist.runner.tasks.rank`); the *driver* listens on the log channel
(:mod:`sparkml_dist.channel`).  Nothing else defines these names.

Lifecycle of one rank:

1. **start**: the task makes a work directory and (rank 0) binds and listens on the rendezvous
   socket, then starts ``python -c RANK_ENTRY`` in a new process group with the environment below
   (``RANK``, ``WORLD_SIZE``, ``WORKDIR_ENV``, ``CTRL_ENV``, ...), the socket passed as
   ``STORE_FD_ENV``.  The rank process ties its life to the task's and imports its backend
   (rank 0 starts the store) while the task goes on.
2. **feed**: the task writes the shard's manifest (``SHARD_FILE``; rows that came through Spark
   spilled to ``SPILL_FILE``, Arrow IPC) and the pickled function (``FN_FILE``) into the work
   directory.
3. **exchange**: the tasks all-gather one :func:`announce` each (address, store port, shard rows,
   GPUs), and each task writes one :func:`start_message` line to its rank's stdin: the rendezvous
   environment (``MASTER_ADDR``/``HOROVOD_*``, ``SHARD_ENV``, ...) plus what
   the backend adds (Horovod's slot table).
4. **run**: the rank process applies the environment, reports ``EVENT_RENDEZVOUS`` on the control
   pipe (``CTRL_ENV``, JSON lines) when it joins the rendezvous, runs the function, writes
   ``RESULT_FILE`` atomically and reports ``EVENT_DONE``.  ``EVENT_LOG`` carries
   :func:`~sparkml_dist.runner.log_to_driver` lines at any time.
5. **report**: the task relays to the driver as channel frames (``FRAME_*``): output lines, reaching
   the rendezvous, done, or a failure; a failed task raises :class:`RankFailure`, whose message
   carries the detail as JSON after :data:`FAILURE_MARKER` so it survives any transport of Spark's
   error (Spark Connect included).
"""

from __future__ import annotations

import json
import os
from typing import Dict, List, Optional, Sequence, Tuple

# ---------------------------------------------------------------- rank process environment
WORKDIR_ENV = "SPARKML_DIST_WORKDIR"
START_TIMEOUT_ENV = "SPARKML_DIST_START_TIMEOUT"  # seconds a rank may take to join the rendezvous
TOKEN_ENV = "SPARKML_DIST_RANK_TOKEN"  # inherited by everything a rank starts: how its reaper finds them
CTRL_ENV = "SPARKML_DIST_CTRL_FD"
PARENT_ENV = "SPARKML_DIST_PARENT_PID"
TIMEOUT_ENV = "SPARKML_DIST_COLLECTIVE_TIMEOUT"
BACKEND_ENV = "SPARKML_DIST_BACKEND"
RUN_ENV = "SPARKML_DIST_RUN_ID"
USE_GPU_ENV = "SPARKML_DIST_USE_GPU"
STORE_FD_ENV = "SPARKML_DIST_STORE_FD"
SHARD_ENV = "SPARKML_DIST_SHARD"  # path of this rank's shard manifest (JSON: where its streams are)
CHECKPOINT_DIR_ENV = "SPARKML_DIST_CHECKPOINT_DIR"
REPLACES_ENV = "SPARKML_DIST_REPLACES"  # "n": this rank replaces one lost inside elastic.run (the nth)
SPARE_ENV = "SPARKML_DIST_SPARE"  # "1": a rank started ahead, to take a lost rank's place (tasks.replace)
HANDOVER_ENV = "SPARKML_DIST_HANDOVER"  # "1": a decommission notice makes the ranks save and hand over
NOTICE_FILE = "decommission"  # written into rank 0's work directory when the driver sends FRAME_NOTICE
LEAVE_ENV = "SPARKML_DIST_LEAVE_ON_NOTICE"  # "1" (executor_loss="replace"): a noticed rank leaves at a commit
RESIZE_ENV = "SPARKML_DIST_RESIZE"  # "min_np:seconds" (executor_loss="replace", min_np): in-place resizes
ROLE_ENV = "SPARKML_DIST_ROLE"  # with roles (runner.roles): "chief", "worker", "ps" or "reducer"
STOP_FILE = "stop"  # written into a server rank's work directory when the driver sends FRAME_STOP

RANK_ENTRY = "from sparkml_dist.runner.tasks.rank import run; run()"
# Horovod's variables for one rank of one run (its place and its Gloo rendezvous): set by the
# Horovod backend in each rank's start message, and never part of a warm pool's key
HOROVOD_RANK_VARS = (
    "HOROVOD_RANK",
    "HOROVOD_SIZE",
    "HOROVOD_LOCAL_RANK",
    "HOROVOD_LOCAL_SIZE",
    "HOROVOD_CROSS_RANK",
    "HOROVOD_CROSS_SIZE",
    "HOROVOD_GLOO_RENDEZVOUS_ADDR",
    "HOROVOD_GLOO_RENDEZVOUS_PORT",
)

# ---------------------------------------------------------------- work directory files
FN_FILE = "fn.pkl"  # cloudpickled (main, args, kwargs, want_result), written by the task
SHARD_FILE = "shard.json"  # the rank's shard manifest (see shard_sources)
SPILL_FILE = "shard.arrow"  # the rank's rows that came through Spark, spilled by its task
RESULT_FILE = "result.pkl"  # the function's return value, written by the rank process

# ---------------------------------------------------------------- control events (rank -> task)
EVENT_RENDEZVOUS = "rendezvous"
EVENT_DONE = "done"
EVENT_LOG = "log"
EVENT_EXIT = "exit"  # {"code"}: the function called sys.exit(code)
EVENT_RAISED = "raised"  # the function raised: the rank leaves with code 1 (after its atexit handlers)
EVENT_METRICS = "metrics"  # {"step", "metrics"}: context().log_metrics on rank 0
EVENT_ELASTIC = "elastic"  # {"inside"}: the function entered elastic.run (true) or left it (false)
EVENT_OVER = "over"  # a new rank found the training over (another rank returned): it ends, no result
EVENT_LEAVE = "leave"  # {"commits"}: the rank leaves its decommissioned executor (elastic.run's commit)
EVENT_TIMING = "timing"  # {"steps", "step_s", "data_s", "comm_s", "final"}: the rank's step clock so far
STUCK_MARK = "stuck collective: "  # a log line naming who is in a stuck collective (stall_watch)
WORKDIR_MARK = "working directory on "  # a task's kept directory; the driver shows one line per path

# ---------------------------------------------------------------- channel frames (task -> driver)
FRAME_LINE = "line"  # {"rank", "stream": stdout|stderr|log, "text"}
FRAME_RENDEZVOUS = "rendezvous"  # {"rank"}
FRAME_DONE = "done"  # {"rank"}
FRAME_RETURNED = "returned"  # {"rank"}: with roles, rank 0's function returned (its process not yet ended)
FRAME_METRICS = "metrics"  # {"rank", "step", "metrics"}
FRAME_TIMING = "timing"  # {"rank", "host", "steps", "step_s", "data_s", "comm_s", "final"}: totals so far
FRAME_FAILED = "failed"  # {"rank", "exit_code", "phase", "message", "tail", "failed_at"}
FRAME_ANNOUNCE = "announce"  # {"task", "ranks": its announce()s as a JSON list} (exchange "driver")
FRAME_PEERS = "peers"  # driver -> task: {"tasks": every task's "ranks", in task order}
FRAME_NOTICE = "notice"  # driver -> rank 0's task ("replace": the noticed ranks'): {"executor", "host"}
FRAME_STOP = "stop"  # driver -> a server's task (runner.roles): rank 0's function returned, the servers end

FAILURE_MARKER = "SPARKML_DIST_RANK_FAILURE:"

# set by sparkml_dist.tune while a trial's function runs: BarrierRunner(np > 0) refuses to start there
IN_TRIAL_ENV = "SPARKML_DIST_TUNE_TRIAL"

# Spark's own credentials in an executor's (or the driver's) environment: a rank process runs user
# code and needs none of them, so it never inherits them.
SPARK_SECRET_VARS = (
    "_SPARK_AUTH_SECRET",
    "SPARK_AUTHENTICATE_SECRET",
    "PYSPARK_GATEWAY_SECRET",
    "PYTHON_WORKER_FACTORY_SECRET",
    "SPARK_CONNECT_AUTHENTICATE_TOKEN",
)


def without_spark_secrets(environ) -> Dict[str, str]:
    """``environ`` less :data:`SPARK_SECRET_VARS` and any other ``SPARK*``/``PYSPARK*``/``_SPARK*``
    variable naming a secret, token or password (the user's own variables, e.g. cloud storage
    credentials a checkpoint needs, stay)."""

    def spark_secret(name: str) -> bool:
        up = name.upper()
        return name in SPARK_SECRET_VARS or (
            up.lstrip("_").startswith(("SPARK", "PYSPARK"))
            and any(w in up for w in ("SECRET", "TOKEN", "PASSWORD"))
        )

    return {k: v for k, v in environ.items() if not spark_secret(k)}


def event(name: str, **fields) -> str:
    """One control-pipe line."""
    return json.dumps({"event": name, **fields}) + "\n"


def parse_event(line: str) -> Optional[dict]:
    try:
        ev = json.loads(line)
    except ValueError:
        return None
    return ev if isinstance(ev, dict) else None


def announce(
    host: str, port: int, rows: int, gpus: Optional[Sequence[str]], driver_error: Optional[str] = None
) -> str:
    """What a task tells its peers at the exchange (step 3); ``driver_error``: why its task could
    not reach the driver's log channel (None: it did, or there is none)."""
    return json.dumps(
        {
            "host": host,
            "port": port,
            "rows": rows,
            "gpus": list(gpus) if gpus else gpus,
            "driver": driver_error,
        }
    )


def peers(messages: Sequence[str]) -> List[dict]:
    """Every rank's announcement in rank order, from the tasks' messages (each one announcement,
    or a list of them for a task running several ranks)."""
    out: List[dict] = []
    for m in messages:
        value = json.loads(m)
        out.extend(value if isinstance(value, list) else [value])
    return out


def driver_reach_error(peers: Sequence[dict], channel: Optional[Sequence]) -> Optional[str]:
    """Why the run must not start when some tasks reached the driver's log channel and others
    could not: the driver advertises an address not every worker can reach (the wrong interface,
    a NAT, a firewall for some hosts).  None when all reached it, or none did (live logs are then
    off for the whole run: the driver says so and training goes on)."""
    failed = [(r, p) for r, p in enumerate(peers) if p.get("driver")]
    if channel is None or not failed or len(failed) == len(peers):
        return None
    hosts = sorted({p["host"] for _, p in failed})
    ok = sorted({p["host"] for p in peers if not p.get("driver")} - set(hosts))
    return (
        f"the driver's address {channel[0]} (port {channel[1]}) is unreachable from "
        f"{', '.join(hosts)} (rank{'s' * (len(failed) > 1)} {', '.join(str(r) for r, _ in failed)}: "
        f"{failed[0][1]['driver']})" + (f" but reachable from {', '.join(ok)}" if ok else "") + ". "
        "No rank was started. Set spark.driver.host (or SPARK_LOCAL_IP on the driver's machine) "
        "to an address every executor reaches, and let executors connect to the driver's ports."
    )


def start_message(env: Dict[str, str], **extra) -> bytes:
    """The one stdin line a rank process waits for: its rendezvous environment and backend extras."""
    return (json.dumps({"env": env, **extra}) + "\n").encode()


def read_start_message(line: str) -> Optional[dict]:
    return json.loads(line) if line else None


class RankFailure(RuntimeError):
    """Raised by a task whose rank failed; the message ends with a JSON detail after the marker."""

    def __init__(self, detail: dict) -> None:
        self.detail = detail
        super().__init__(f"{detail['message']} {FAILURE_MARKER}{json.dumps(detail)}")


class LeftOnNotice(RuntimeError):
    """Raised by a task whose ranks left their decommissioned executor at a commit
    (``executor_loss="replace"``): no failure of the run, Spark runs the task again elsewhere."""


def parse_failure(text: str) -> Optional[dict]:
    """The failure detail embedded in an error text by :class:`RankFailure`, if any."""
    at = text.find(FAILURE_MARKER)
    if at < 0:
        return None
    try:
        return json.JSONDecoder().raw_decode(text[at + len(FAILURE_MARKER) :])[0]
    except ValueError:
        return None


def is_symptom(failure: dict, peer_lost: Sequence[str]) -> bool:
    """Whether a failure only follows another: a rank stopped by a cancel, or one whose last lines
    say a peer went away (``peer_lost``)."""
    return failure.get("phase") == "cancelled" or _lost_a_peer(failure, peer_lost)


def _lost_a_peer(failure: dict, peer_lost: Sequence[str]) -> bool:
    return any(p in line for line in (failure.get("tail") or [])[-5:] for p in peer_lost)


def root_cause(failures: Sequence[dict], peer_lost: Sequence[str]) -> dict:
    """Of several failure details, the one that caused the others: a rank stopped by a cancel last,
    then one whose last lines only say a peer went away (``peer_lost``), then the earliest."""
    return min(
        failures,
        key=lambda f: (
            f.get("phase") == "cancelled",
            _lost_a_peer(f, peer_lost),
            f.get("failed_at", float("inf")),
        ),
    )


def resize_settings() -> Tuple[Optional[int], float]:
    """``(min_np, resize_wait)`` in a rank of a run whose world may shrink and grow in place, else
    ``(None, 0.0)`` (:data:`RESIZE_ENV`: ``"min_np:seconds"``)."""
    value = os.environ.get(RESIZE_ENV, "")
    if not value:
        return None, 0.0
    min_np, wait = value.split(":")
    return int(min_np), float(wait)
