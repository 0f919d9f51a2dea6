"""The driver's watch for decommissioned executors during one attempt of a run.  [driver]

Spark decommissions an executor before it goes (``spark.decommission.enabled``): a standalone
worker's or an executor's decommission signal (``SIGPWR``: what Kubernetes, YARN and the cloud
spot/preemption hooks send), dynamic allocation giving an executor back.  Spark gives a running
task no way to learn of it, but the driver's scheduler knows at once, so the watch asks it twice a
second: for each task of the attempt (its Spark task id, reported when its rank reaches the
rendezvous) the executor that runs it, and whether that executor is being decommissioned
(``TaskScheduler.getExecutorDecommissionState``).

On the first such executor it says so on the console and sends ``FRAME_NOTICE`` to rank 0's task;
the ranks then save a checkpoint at one agreed step and leave (:mod:`.checkpoint.handover`), and
the run starts again from it on the executors that stay (:meth:`noticed`: the attempt's failure is
the handover, not counted against ``max_restarts``).  No completed step is trained again.

Armed (:func:`armed`) for a ``backend="torch"`` run on a classic session (Spark Connect's client
has no scheduler to ask) with ``spark.decommission.enabled``, a ``checkpoint_dir`` and
``max_restarts >= 1``; otherwise a decommissioned executor is a lost one when it goes (a restart
from the latest checkpoint).

**In place** (:func:`in_place`: ``executor_loss="replace"``, with ``spark.decommission.enabled``
on a classic session): nothing restarts.  The watch tells the tasks of the ranks on each
decommissioned executor (once per executor, for the whole attempt); those ranks leave at their next
``elastic.run`` commit (:meth:`~sparkml_dist.runner.elastic.TorchState.commit`), their tasks end so
that Spark runs them again on an executor that stays, and the new ranks join the others, which go
back to that same commit: no completed step is trained again (:mod:`.elastic.executor_loss`).

Example (what the console shows)::

    [sparkml_dist] executor 1 on 10.0.0.12 (rank 1) is being decommissioned: the ranks save at
    their next agreed step and start again on the executors that stay
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Dict, Optional

from . import protocol

log = logging.getLogger(__name__)
POLL_S = 0.5


class HandOver(Exception):
    """An attempt ended by a decommission notice (the driver starts the run again from its checkpoint)."""

    def __init__(self, executor: str) -> None:
        super().__init__(f"executor {executor} decommissioned")
        self.executor = executor


def classic(spark) -> bool:
    """A session whose driver's scheduler this process can ask (not Spark Connect's client)."""
    if spark is None:
        return False
    try:
        spark.sparkContext._jsc.sc().taskScheduler()
    except Exception:
        return False
    return True


def armed(spark, runner) -> bool:
    """The run can hand over on a decommission notice (see the module docstring)."""
    if not runner.checkpoint_dir or runner.max_restarts < 1 or not classic(spark):
        return False
    if not getattr(runner.backend_spec, "torch_group", False):
        return False
    return _enabled(spark)


def in_place(spark, runner) -> bool:
    """A decommissioned executor's ranks leave at their next commit and start again elsewhere,
    the others keep running (see the module docstring)."""
    return runner.executor_loss == "replace" and classic(spark) and _enabled(spark)


def _enabled(spark) -> bool:
    return str(spark.conf.get("spark.decommission.enabled", "false")).strip().lower() == "true"


class Watch:
    """One attempt's executors: which runs each rank (:meth:`add` is fed each rank's rendezvous),
    whether one has gone (:meth:`gone`), and with ``notices`` the decommission watch (see the
    module docstring)."""

    def __init__(
        self, spark, say: Callable[[str], Any], notices: bool = True, in_place: bool = False
    ) -> None:
        sc = spark.sparkContext._jsc.sc()
        self._scheduler, self._backend = sc.taskScheduler(), sc.schedulerBackend()
        self._say = say
        self._lock = threading.Lock()
        self._tasks: Dict[int, int] = {}  # rank -> Spark task id
        self._hosts: Dict[int, str] = {}
        self._executors: Dict[int, str] = {}  # rank -> executor id
        self._send: Dict[int, Callable[[dict], None]] = {}  # rank -> its task's reply channel
        self.notice: Optional[str] = None  # the decommissioned executor, once seen
        self.in_place = in_place  # tell the executor's own ranks, and go on watching the others
        self.told: Dict[str, list] = {}  # executor -> its ranks, told of its decommission
        self._leaving: set = set()  # in place: ranks told to leave, not yet started again
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sparkml_dist-decommission", daemon=True)
        if notices:
            self._thread.start()

    def add(self, rank: Any, msg: Dict[str, Any], send: Optional[Callable[[dict], None]]) -> None:
        """A rank reached the rendezvous: its task's Spark id (and rank 0's channel back)."""
        task = msg.get("task")
        if not isinstance(rank, int) or not isinstance(task, int) or isinstance(task, bool):
            return
        with self._lock:
            if self._tasks.get(rank) != task:  # a rank started again in another task: its executor anew
                self._executors.pop(rank, None)
            self._tasks[rank] = task
            self._hosts[rank] = str(msg.get("host", "?"))
            if send is not None and (rank == 0 or self.in_place):
                self._send[rank] = send

    def left(self, ranks) -> bool:
        """``ranks`` left their decommissioned executor on its notice (in place); True once per
        notice (their task started again: a later loss of theirs is a loss)."""
        with self._lock:
            if not self.in_place or not set(ranks) <= self._leaving:
                return False
            self._leaving -= set(ranks)
            return True

    def noticed(self) -> bool:
        """A notice ended this attempt's ranks (a checkpoint handover; not one handled in place)."""
        return self.notice is not None and not self.in_place

    def gone(self, ranks) -> bool:
        """Whether the executor of one of ``ranks`` has left Spark (lost, or leaving): the driver
        need not wait longer for those ranks' reports (:meth:`.failures.Monitor.wait_for_reports`)."""
        try:
            with self._lock:
                tasks = {r: self._tasks[r] for r in ranks if r in self._tasks}
            for rank, task in tasks.items():
                executor = self._executor(rank, task)
                if executor is not None and not self._backend.isExecutorActive(executor):
                    return True
        except Exception:  # the session is stopping: wait as without the watch
            return False
        return False

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                if self._check():
                    return
            except Exception as exc:  # the JVM went away with the session: nothing more to watch
                log.debug("decommission watch stopped: %s", exc)
                return

    def _executor(self, rank: int, task: int) -> Optional[str]:
        if rank not in self._executors:
            found = self._scheduler.taskIdToExecutorId().get(task)
            if not found.isDefined():
                return None
            self._executors[rank] = str(found.get())
        return self._executors[rank]

    def _check(self) -> bool:
        with self._lock:
            tasks = dict(self._tasks)
        by_executor: Dict[str, list] = {}
        for rank, task in tasks.items():
            executor = self._executor(rank, task)
            if executor is not None:
                by_executor.setdefault(executor, []).append(rank)
        for executor, ranks in sorted(by_executor.items()):
            if executor in self.told:
                continue
            if self._scheduler.getExecutorDecommissionState(executor).isDefined():
                self._tell(executor, sorted(ranks))
                return not self.in_place  # in place: the other executors are watched on
        return False

    def _tell(self, executor: str, ranks: list) -> None:
        self.notice = executor
        host = self._hosts.get(ranks[0], "?")
        names = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
        then = (
            "its ranks leave at their next commit and Spark starts them again on another executor; the "
            "others keep running"
            if self.in_place
            else "the ranks save at their next agreed step and start again on the executors that stay"
        )
        self._say(f"[sparkml_dist] executor {executor} on {host} ({names}) is being decommissioned: {then}\n")
        with self._lock:
            self.told[executor] = ranks
            self._leaving |= set(ranks)
            sends = [self._send.get(r) for r in (ranks if self.in_place else [0])]
        for send in {id(s): s for s in sends if s is not None}.values():  # a task of several ranks: once
            send({"type": protocol.FRAME_NOTICE, "executor": executor, "host": host})
