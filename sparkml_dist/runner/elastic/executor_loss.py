"""A lost executor costs its own ranks: ``BarrierRunner(executor_loss="replace")``.  [driver]

Spark's barrier stage ends as a whole when one of its executors is lost, so every rank starts
again from the latest checkpoint.  A stage of *plain* tasks does not: Spark runs the lost
executor's task again (a new attempt, on whatever executor it gives) and leaves the others
running.  With ``executor_loss="replace"`` the run's tasks are such plain tasks:

* they exchange their addresses through the driver's log channel (no ``allGather`` outside a
  barrier stage); the driver answers once every task announced, and fails the attempt when not
  every task did within ``start_timeout`` (plain tasks are not gang-scheduled: the slots are
  checked before the launch, as for a barrier stage);
* a task announced again after the answer is a lost executor's task that Spark started again:
  :meth:`Replacements.again` answers it with the run's peers marked ``"replaces"`` and its ranks
  start as replacements that join the survivors' next group inside
  :func:`sparkml_dist.runner.elastic.run` (their state from a live rank, as for a lost process);
  the survivors never leave their processes;
* a task started again after another rank finished (its task reported its end: the training is
  done) is told so and ends without its ranks (``"over"``); with ``return_all`` its result is then
  missing, which fails the run naming it;
* the run's store (the ``TCPStore`` every rank meets at, and the generations of
  :mod:`.membership`) is served by the driver (:func:`serve_store`), not by rank 0's process, so
  rank 0's executor is lost like any other (torch must be installed on the driver);
* with ``min_np`` the survivors do not wait for the lost task's ranks past ``resize_wait``: they
  go on as a smaller group and take the new ranks in at a commit once Spark runs the task again
  (:mod:`.membership`; the ranks get :data:`~sparkml_dist.runner.protocol.RESIZE_ENV`,
  :func:`resize_env`); every size from ``min_np`` to ``np`` must share the streams
  (:func:`check_resizable_data`);
* it refuses (the attempt fails and the run restarts from its checkpoint, as without this
  setting) when the run is failing already and past ``max_restarts`` replacements in one attempt;
* a decommissioned executor (``spark.decommission.enabled``) is not waited for: the driver's
  watch (:mod:`sparkml_dist.runner.decommission`) tells its ranks, which leave at their next
  commit (:meth:`~sparkml_dist.runner.elastic.TorchState.commit`); their tasks end, Spark runs them
  again on an executor that stays, and the others go back to that commit: no completed step is
  trained again, and the handover is not counted against ``max_restarts``.

A rank that raises still fails the run (its task reports it and the driver cancels the job, so
Spark's retry of that task is cancelled with it): a bug is not a lost executor.  The ranks' rows
must come from files (a Parquet scan or staged rows: ``read_files``, ``staging_dir``), not
through a shuffle whose blocks the lost executor held.  Only ``backend="torch"`` keeps survivors
(Horovod, TensorFlow and JAX keep the checkpoint restart).

Example::

    BarrierRunner(np=4, max_restarts=3, executor_loss="replace").run(main)   # main uses elastic.run
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional, Tuple

from ...errors import ConfigurationError

MODES = ("restart", "replace")


def check(mode: Any, backend, local: bool, max_restarts: int, roles) -> str:
    """``executor_loss``, refused by name where it cannot hold (``local``: the ranks are local
    processes, ``np < 0``)."""
    if mode not in MODES:
        raise ConfigurationError(
            f"executor_loss must be 'restart' (a lost executor ends the barrier stage: every rank "
            f"restarts from the checkpoint) or 'replace' (only its ranks start again); got {mode!r}"
        )
    if mode == "restart":
        return mode
    fix = "or leave executor_loss='restart'"
    if not backend.torch_group:
        raise ConfigurationError(
            f"executor_loss='replace' keeps survivors inside elastic.run, on backend='torch' only; "
            f"backend={backend.name!r} restarts from its checkpoint: {fix}"
        )
    if local:
        raise ConfigurationError(f"executor_loss='replace' is for Spark tasks (np > 0), not np < 0: {fix}")
    if max_restarts < 1:
        raise ConfigurationError(
            "executor_loss='replace' starts a lost executor's ranks again, at most max_restarts times: "
            f"set max_restarts >= 1, {fix}"
        )
    if roles is not None:
        raise ConfigurationError(f"executor_loss='replace' does not take roles or reduction servers: {fix}")
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise ConfigurationError(
            "executor_loss='replace' serves the run's store from the driver (it outlives every "
            f"executor), which needs torch installed on the driver: pip install torch, {fix}"
        )
    return mode


def check_resize_wait(seconds: Any) -> float:
    """``resize_wait``: the seconds (> 0) the survivors of a run that resizes in place
    (``executor_loss="replace"`` with ``min_np``) wait for a lost executor's ranks."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
        raise ConfigurationError(
            f"resize_wait must be a number of seconds > 0 (how long the others wait for a lost "
            f"executor's ranks before going on with fewer, min_np or more); got {seconds!r}"
        )
    return float(seconds)


def resize_env(runner) -> tuple:
    """The ranks' setting of an in-place resize (``executor_loss="replace"`` with ``min_np``):
    ``((RESIZE_ENV, "min_np:resize_wait"),)``, or none."""
    from .. import protocol

    if runner.executor_loss != "replace" or not runner.min_np:
        return ()
    return ((protocol.RESIZE_ENV, f"{runner.min_np}:{runner.resize_wait}"),)


def check_resizable_data(runner, streams, replicas) -> None:
    """A world that shrinks and grows in place deals the streams again to each size it takes
    (``min_np`` to ``np``): each must divide the number of streams, and ``replicas`` (ranks that
    read the same rows) is refused."""
    if runner.executor_loss != "replace" or not runner.min_np:
        return
    if replicas is not None:
        raise ConfigurationError(
            "run_with_data(replicas=...) is not taken with executor_loss='replace' and min_np (a world "
            "that shrinks in place deals the streams to single ranks): leave replicas or min_np out"
        )
    from ..data.resize import check_streams

    check_streams(streams or runner.world_size, runner.min_np, runner.world_size)


def refuse_spark_rows(data_df) -> None:
    """The ranks' rows must not come through Spark's shuffle (a lost executor's blocks go with it,
    and Spark would then run every unfinished task again, the survivors' included)."""
    if data_df is not None:
        raise ConfigurationError(
            "executor_loss='replace' needs the ranks to read their rows from files: a plain Parquet "
            "scan, or any DataFrame staged once (read_files=True and a staging_dir every executor "
            "reaches); these rows would be dealt through Spark's shuffle"
        )


class Replacements:
    """The driver's decisions on a lost executor's tasks for one attempt (module docstring).

    ``fail(detail)`` records a failure of the attempt (the monitor's ``add_failure``: the driver
    then cancels the job), ``failing()`` says whether one is recorded, ``say`` shows a line."""

    def __init__(
        self,
        ranks_per_task: int,
        max_restarts: int,
        fail: Callable[[dict], None],
        failing: Callable[[], bool],
        say: Callable[[str], Any],
        finished: Callable[[], bool] = lambda: False,
        left: Callable[[list], bool] = lambda ranks: False,
        hosts: Optional[dict] = None,
    ) -> None:
        self.per_task, self.max_restarts = ranks_per_task, max_restarts
        self.hosts = hosts if hosts is not None else {}  # rank -> the address it announced
        self._fail, self._failing, self._say, self._finished = fail, failing, say, finished
        self._left = left  # the ranks left a decommissioned executor on its notice (not a loss)
        self.used = 0
        self._lock = threading.Lock()

    def _failure(self, rank: int, message: str, lost: Optional[str] = None) -> None:
        detail = dict(rank=rank, exit_code=None, phase="run", message=message, tail=[], failed_at=time.time())
        if lost:  # a lost machine, not a bug: restarts go on however alike two losses look
            detail["lost_host"] = lost
        self._fail(detail)

    def again(self, task: int, attempt: int):
        """Task ``task`` announced again (Spark's attempt ``attempt``, its executor lost): whether
        its ranks start as replacements (True), the attempt fails (False, said why), or the task
        ends without them (``"over"``: another rank has finished, so the training is done and no
        group is left to join)."""
        ranks = list(range(task * self.per_task, (task + 1) * self.per_task))
        names = ", ".join(map(str, ranks))
        hosts = sorted({self.hosts[r] for r in ranks if r in self.hosts})  # where the lost ones ran
        lost = names + (f" (on {', '.join(hosts)})" if hosts else "")
        if self._failing():
            return False  # the run is failing already: this retry is cancelled with the job
        if self._finished():
            self._say(f"[sparkml_dist] rank {lost} lost with its executor after the others finished\n")
            return "over"
        if self._left(ranks):  # handed over at a commit: not counted against max_restarts
            self._say(
                f"[sparkml_dist] rank {names} left its decommissioned executor: Spark started its task "
                f"again (attempt {attempt}) on another executor; a new rank {names} joins the others\n"
            )
            return True
        with self._lock:
            self.used += 1
            used = self.used
        if used > self.max_restarts:
            self._failure(
                ranks[0],
                f"the executor of rank {names} was lost and max_restarts={self.max_restarts} "
                "replacements were used in this attempt",
            )
            return False
        self._say(
            f"[sparkml_dist] rank {lost} lost with its executor: Spark started its task again "
            f"(attempt {attempt}); a new rank {names} joins the others, which keep running "
            f"({used} of max_restarts={self.max_restarts})\n"
        )
        return True

    def short(self, announced: int, tasks: int, start_timeout: float) -> None:
        """Not every task announced within ``start_timeout``: plain tasks ran in waves."""
        self._failure(
            0,
            f"only {announced} of the run's {tasks} tasks started within start_timeout="
            f"{start_timeout}s: with executor_loss='replace' they are plain Spark tasks, which the "
            "cluster must run at once (free slots for all of them); add executors or cores, or "
            "lower np",
        )


def serve_store(host: str, timeout_s: float):
    """The run's ``TCPStore``, served by the driver on ``host`` (a free port: ``store.port``) for
    one attempt: it outlives every executor, rank 0's included.  Ends when the object is dropped."""
    import datetime

    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    return dist.TCPStore(host, 0, None, is_master=True, wait_for_workers=False, timeout=timeout)


def exchange(monitor, runner, tasks: int, per_task: int, store: Tuple[str, int], left=lambda ranks: False):
    """The driver's side of the address exchange for one attempt of ``executor_loss="replace"``:
    :class:`~sparkml_dist.runner.peer_exchange.Announces` whose answers name the driver's
    ``store`` (host, port), whose tasks announced again go to a :class:`Replacements` (``left``:
    whether ranks left a decommissioned executor on its notice), and whose missing tasks after
    ``start_timeout`` fail the attempt."""
    from ..peer_exchange import Announces

    failing, finished = (lambda: monitor.failure is not None), (lambda: bool(monitor.finished))
    book = Replacements(
        per_task,
        runner.max_restarts,
        monitor.add_failure,
        failing,
        runner.sink,
        finished,
        left,
        monitor.hosts,
    )
    start = runner.timeouts.start
    short = lambda n: book.short(n, tasks, start)  # noqa: E731 - one line, named for the call
    return Announces(tasks, fallback_s=start, again=book.again, short=short, store=store)
