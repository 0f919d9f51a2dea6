"""Spare executors kept warm for a lost executor's ranks (``executor_loss="replace"``).  [driver]

When an executor is lost, Spark runs its task again on a free slot, most often on an executor that
has run no rank of the run: a spare, or the one the cluster starts in place of the lost one.  Cold,
that task waits for the executor's Python worker to start (Spark's daemon, ~2 s here) and for the
executor's first warm pool to import torch (~3 s) before its rank can join the survivors: the
larger part of what a lost executor costs.  :class:`Spares` does that work ahead: while an attempt
of such a run trains, a driver thread runs a small plain job on the free slots, whose tasks start
the pool the run's ranks would be forked from (:mod:`.warm_spare`, :mod:`.warm_pool`: the same
key, under the same Spark daemon), and returns at once; the pool imports torch in its own process.
It does so once every task of the attempt has announced (its slots are taken), again whenever an
executor it has not seen registers, and every :data:`REFRESH_S` seconds (a pool unused for
:data:`~sparkml_dist.runner.tasks.warm_pool.IDLE_S` ends; a task that reaches it keeps it).

A warm job's task holds its slot for a fraction of a second, and Spark's FIFO scheduler gives a
free slot to the run's own job first, so a lost task is never kept waiting behind one.  Classic
Spark on a cluster only (Spark Connect cannot list the executors; a local master has no other
executor), with warm ranks on (``warm_ranks=True``, the default; ``SPARKML_DIST_WARM_SPARES=0`` in the
driver's environment turns only this off).  A warm job that fails is
ignored: the replacement then starts cold, as before.

Example::

    spares = Spares.start(spark, spec, tasks=2, ready=lambda: announces.answered)
    ...                                  # the attempt trains
    spares.stop()
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable, Optional

from ... import _spark_env, launch
from .. import backends
from .warm_spare import warm_pool_here

log = logging.getLogger(__name__)

REFRESH_S = 120.0  # a spare's pool is reached again this often (it ends after IDLE_S without use)
# how often the driver looks for executors it has not seen: a new executor is warmed within about
# this much of its registration (at 2 s, a lost task reached an executor registered 2 s before and
# not warmed yet: 6.8 s from the loss to its rank's announce, against 0.7 s on a warm one)
POLL_S = 0.5
OFF_ENV = (
    "SPARKML_DIST_WARM_SPARES"  # "0" in the driver's environment: no warm jobs (the benchmark's contender)
)


def _executors(spark) -> frozenset:
    """The executors registered now, the driver's entry with them (empty where unknown)."""
    try:
        infos = spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()
        return frozenset(f"{i.host()}:{i.port()}" for i in infos)
    except Exception:  # noqa: BLE001 - a JVM that will not say: nothing is warmed
        return frozenset()


class Spares:
    """The driver's thread that keeps the free slots' pools warm for one attempt (module docstring)."""

    def __init__(self, spark, spec, tasks: int, ready: Callable[[], bool]) -> None:
        self.spark, self.spec, self.tasks, self.ready = spark, spec, tasks, ready
        self.stopped = threading.Event()
        self.seen: frozenset = frozenset()
        self.last = 0.0  # when a warm job last ran (monotonic)
        self.jobs = 0  # warm jobs run (what tests and the benchmark read)
        self.job = launch.JobTag(spark, f"spares-{spec.run_id}")

    @classmethod
    def start(cls, spark, spec, tasks: int, ready: Callable[[], bool]) -> Optional["Spares"]:
        """The thread, started, where it can help: classic Spark on a cluster, warm ranks on."""
        if spark is None or _spark_env.is_connect(spark) or _spark_env.local_master(spark):
            return None
        if not spec.warm_ranks or not backends.get(spec.backend).warm_ranks or os.environ.get(OFF_ENV) == "0":
            return None
        spares = cls(spark, spec, tasks, ready)
        threading.Thread(target=spares._loop, name="sparkml_dist-spares", daemon=True).start()
        return spares

    def stop(self) -> None:
        self.stopped.set()
        self.job.cancel()

    def _loop(self) -> None:
        while not self.stopped.wait(POLL_S):
            if not self.ready():
                continue
            now, executors = time.monotonic(), _executors(self.spark)
            if executors - self.seen or now - self.last > REFRESH_S:
                self.seen, self.last = self.seen | executors, now
                self._warm()

    def _warm(self) -> None:
        """One task on each free slot: every slot less the attempt's tasks."""
        spark = self.spark
        slots = _spark_env.master_slots(_spark_env.master_of(spark), _spark_env.conf_of(spark))
        free = (slots if slots is not None else _spark_env.registered_slots(spark) or 0) - self.tasks
        if free <= 0 or self.stopped.is_set():
            return
        df = self.spark.range(0, free, 1, free)
        fn = _bind(self.spec)
        try:
            with self.job.scope():
                df.mapInArrow(fn, "started int").collect()
            self.jobs += 1
        except Exception as exc:  # noqa: BLE001 - a warm job is help, never a failure of the run
            log.debug("warming the spare executors failed: %s", exc)


def _bind(spec):
    import functools

    return functools.partial(warm_pool_here, spec=spec)
