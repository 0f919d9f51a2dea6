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

Example (what the console shows)::

    [sparkml_dist] executor 1 on 10.0.0.12 (ranks 1) is being decommissioned: the ranks save at
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
    return str(spark.conf.get("spark.decommission.enabled", "false")).strip().lower() == "true"


class Watch:
    """One attempt's executors: which runs each rank (:meth:`add` is fed each rank's rendezvous),
    whether one has gone (:meth:`gone`), and with ``notices`` the decommission watch (see the
    module docstring)."""

    def __init__(self, spark, say: Callable[[str], Any], notices: bool = True) -> None:
        sc = spark.sparkContext._jsc.sc()
        self._scheduler, self._backend = sc.taskScheduler(), sc.schedulerBackend()
        self._say = say
        self._lock = threading.Lock()
        self._tasks: Dict[int, int] = {}  # rank -> Spark task id
        self._hosts: Dict[int, str] = {}
        self._executors: Dict[int, str] = {}  # rank -> executor id
        self._send: Optional[Callable[[dict], None]] = None  # rank 0's task's reply channel
        self.notice: Optional[str] = None  # the decommissioned executor, once seen
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
            self._tasks[rank] = task
            self._hosts[rank] = str(msg.get("host", "?"))
            if rank == 0:
                self._send = send

    def noticed(self) -> bool:
        return self.notice is not None

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
            if self._scheduler.getExecutorDecommissionState(executor).isDefined():
                self._tell(executor, sorted(ranks))
                return True
        return False

    def _tell(self, executor: str, ranks: list) -> None:
        self.notice = executor
        host = self._hosts.get(ranks[0], "?")
        self._say(
            f"[sparkml_dist] executor {executor} on {host} (ranks {', '.join(map(str, ranks))}) is being "
            "decommissioned: the ranks save at their next agreed step and start again on the executors "
            "that stay\n"
        )
        with self._lock:
            send = self._send
        if send is not None:
            send({"type": protocol.FRAME_NOTICE, "executor": executor, "host": host})
