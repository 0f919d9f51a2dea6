"""The tasks' exchange of addresses before their ranks start, a task's side.  [executor]

Each barrier task tells the others where its ranks are (:func:`sparkml_dist.runner.protocol.announce`)
and learns theirs: through the gang (Spark's ``allGather``; the driver's threads for ``np < 0``),
or, when the run's ``TaskSpec.exchange`` is ``"driver"``, through the driver's log channel (one
``FRAME_ANNOUNCE`` up, one ``FRAME_PEERS`` back: no poll; the driver's side and when it is used:
:mod:`sparkml_dist.runner.peer_exchange`).  Plain tasks (``executor_loss="replace"``) always use
the driver; a task Spark started again after its executor was lost gets the run's peers with
``"replaces"``, and its ranks start as replacements (``REPLACES_ENV``) that join the survivors.
A barrier task that cannot reach the driver in a run of the driver's exchange uses the allGather,
and so does every task the driver tells to (not all announced in time); one that loses its
connection before the answer fails naming the driver's address (a plain task: whenever it cannot
reach the driver).

Example::

    replies = DriverReplies()       # LogClient(..., on_frame=replies.on_frame, on_close=replies.on_close)
    starts = exchange(members, ports, envs)  # (local rank, start message) of each rank of the task
"""

from __future__ import annotations

import os
import threading
from typing import Dict, List, Optional, Tuple

from .. import protocol


class DriverReplies:
    """The driver's answer to this task's announcement, set by the channel's reader thread."""

    def __init__(self) -> None:
        self.peers: Optional[List[str]] = None
        self.replaces = False  # a lost executor's task started again: its ranks join the survivors
        self.over = False  # ... after the others finished: nothing left to join, the task ends
        self.store: Optional[Tuple[str, int]] = None  # the run's store, when the driver serves it
        self.fallback = False  # the driver said: use the gang's allGather (not every task reached it)
        self.ended = threading.Event()
        self.notice_to: List[str] = []  # work directories the driver's decommission notice goes to
        self.stop_to: List[str] = []  # ... and its stop (runner.roles: the chief is done)
        self.stopped = threading.Event()

    def on_frame(self, message: dict) -> None:
        tasks = message.get("tasks")
        if message.get("type") == protocol.FRAME_NOTICE:
            for workdir in self.notice_to:  # the rank's next checkpoint.due() sees it
                _touch(os.path.join(workdir, protocol.NOTICE_FILE))
        elif message.get("type") == protocol.FRAME_STOP:
            for workdir in self.stop_to:  # a server rank returns when it sees it
                _touch(os.path.join(workdir, protocol.STOP_FILE))
            self.stopped.set()
        elif message.get("type") == protocol.FRAME_PEERS and message.get("over") is True:
            self.over = True
            self.ended.set()
        elif message.get("type") == protocol.FRAME_PEERS and message.get("fallback") is True:
            self.fallback = True
            self.ended.set()
        elif message.get("type") == protocol.FRAME_PEERS and isinstance(tasks, list):
            store = message.get("store")
            if isinstance(store, list) and len(store) == 2 and isinstance(store[0], str):
                if isinstance(store[1], int) and 0 < store[1] < 65536:
                    self.store = (store[0], store[1])  # the driver serves the run's store
            if all(isinstance(t, str) for t in tasks):
                self.peers, self.replaces = tasks, message.get("replaces") is True
                self.ended.set()

    def on_close(self) -> None:
        self.ended.set()


def _touch(path: str) -> None:
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    except FileExistsError:
        pass
    except OSError:  # the rank's directory is gone: the rank ended, nothing to hand over
        pass


def all_announces(members, mine: str) -> Optional[List[str]]:
    """Every task's announcement (``mine`` is this task's), in task order; None when the driver
    says the run's other ranks have finished (a lost executor's task started again too late)."""
    first = members[0]
    spec, gang = first.spec, first.gang
    if (spec.exchange != "driver" or first.client is None) and not spec.barrier:
        raise first.fail(
            "executor_loss='replace' runs plain Spark tasks, which exchange their addresses through "
            f"the driver's log channel, and this task could not reach it ({first.driver_error}). Let "
            "executors connect to the driver's ports (spark.driver.host), or use executor_loss='restart'",
            None,
            "driver",
        )
    if spec.exchange != "driver" or first.client is None:  # unreachable: the driver tells the others
        return gang.allgather(mine)
    host, port = spec.channel
    attempt = getattr(gang, "attempt", 0)  # Spark's attempt of this task: > 0 when started again
    first.client.send({"type": protocol.FRAME_ANNOUNCE, "task": gang.rank, "ranks": mine, "attempt": attempt})
    while not first.replies.ended.wait(0.1):
        if first.cancelled():
            raise first.fail(
                f"rank {first.rank} was stopped because the run was cancelled", None, "cancelled"
            )
    if first.replies.over:
        return None
    if first.replies.fallback:
        return gang.allgather(mine)
    if first.replies.peers is None:
        raise first.fail(
            f"the connection to the driver's log channel ({host}, port {port}) closed before the "
            "tasks had exchanged their addresses. No rank was started.",
            None,
            "driver",
        )
    return first.replies.peers


def exchange(members, ports: List[int], envs: List[Dict[str, str]]) -> Optional[List[Tuple[int, bytes]]]:
    """All-gather every rank's address and shard size (one message per task, listing its ranks);
    for each rank of ``members`` (the task's ``_RankTask``s) its local rank and start message
    (None: the run is over without them, see :func:`all_announces`)."""
    spec = members[0].spec
    host = members[0].address
    mine = [protocol.announce(host, p, m.rows, m.gpus, m.driver_error) for m, p in zip(members, ports)]
    everyone = all_announces(members, "[" + ",".join(mine) + "]")
    if everyone is None:
        return None
    peers = protocol.peers(everyone)
    unreachable = protocol.driver_reach_error(peers, spec.channel)
    if unreachable:  # every task knows it: those that can report it do, and none starts its rank
        raise members[0].fail(unreachable, None, "driver")
    starts = []
    for m, shard_env in zip(members, envs):
        roles = {"roles": spec.roles} if spec.roles is not None else {}  # only a backend with roles
        place = (spec.timeouts.collective, spec.placement.nodes, spec.ranks_per_task)
        env, extra = m.backend.rank_env(m.rank, peers, m.gpus, *place, **roles)
        env.update(shard_env)
        if members[0].replies.store:  # served by the driver (executor_loss="replace"), not rank 0
            env["MASTER_ADDR"], env["MASTER_PORT"] = (
                members[0].replies.store[0],
                str(members[0].replies.store[1]),
            )
        if members[0].replies.replaces:  # its init_process_group joins the survivors' next group
            env[protocol.REPLACES_ENV] = str(getattr(m.gang, "attempt", 1))
        starts.append((int(env.get("LOCAL_RANK", "0")), protocol.start_message(env, **extra)))
    return starts
