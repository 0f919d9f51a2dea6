"""The gang of a run's tasks, as a task sees it: its index, the all-gather, its resources.  [executor]

:class:`SparkGang` is Spark's ``BarrierTaskContext``; :class:`ThreadGang` is the same for the
threads that stand for tasks when ``np < 0`` (and in tests without Spark).
"""

from __future__ import annotations

import os
import threading
from typing import List, Optional


class SparkGang:
    """The barrier task context as the supervisor sees it."""

    echo_output = True  # a task's stderr is the executor log: every rank line is kept there
    # whose life bounds a warm pool (tasks.warm_pool): Spark's Python daemon, this executor's
    # Python side for the application (it ends with the application or the executor)
    pool_anchor = staticmethod(os.getppid)

    def __init__(self) -> None:
        from pyspark import BarrierTaskContext

        self._ctx = BarrierTaskContext.get()
        self.rank = self._ctx.partitionId()
        self.attempt = self._ctx.attemptNumber()

    def allgather(self, message: str) -> List[str]:
        return list(self._ctx.allGather(message))

    def resources(self) -> dict:
        return self._ctx.resources()

    def task_id(self) -> int:
        """Spark's id of this task attempt: the driver finds the executor that runs it from it."""
        return self._ctx.taskAttemptId()


class PlainSparkGang(SparkGang):
    """A plain (not barrier) task's context: Spark runs the run's tasks at once when it has the
    slots (checked before the launch) and retries a task alone when its executor is lost."""

    def __init__(self) -> None:
        from pyspark import TaskContext

        self._ctx = TaskContext.get()
        self.rank = self._ctx.partitionId()
        self.attempt = self._ctx.attemptNumber()

    def allgather(self, message: str) -> List[str]:
        raise RuntimeError("plain tasks have no allGather: their exchange goes through the driver")


class ThreadGang:
    """A gang of threads on one machine: for ``np < 0`` and for tests without Spark."""

    def __init__(self, size: int, timeout: Optional[float] = None) -> None:
        self._barrier = threading.Barrier(size, timeout=timeout)
        self._slots: List[Optional[str]] = [None] * size

    def member(self, rank: int) -> "_ThreadMember":
        return _ThreadMember(self, rank)


class _ThreadMember:
    echo_output = False  # the driver's stderr is the notebook: lines go there only when streamed
    pool_anchor = staticmethod(os.getpid)  # the driver's process

    def __init__(self, gang: ThreadGang, rank: int) -> None:
        self._gang, self.rank = gang, rank
        self.attempt = 0

    def allgather(self, message: str) -> List[str]:
        self._gang._slots[self.rank] = message
        self._gang._barrier.wait()
        out = list(self._gang._slots)
        self._gang._barrier.wait()
        return out

    def abort(self) -> None:
        self._gang._barrier.abort()

    def resources(self) -> dict:
        return {}

    def task_id(self) -> None:
        return None  # a driver thread: no executor to be decommissioned
