"""The tasks' exchange of addresses through the driver's log channel, the driver's side.  [driver]

Before their ranks start, a run's barrier tasks tell each other where each rank is (address,
store port, shard rows, GPUs: :func:`sparkml_dist.runner.protocol.announce`).  Spark's
``BarrierTaskContext.allGather`` does it, but a task that is not the last to arrive polls for
the answer once a second, so every run paid about a second for it.  Once a session's tasks have all
reached the driver's log channel (a first run on Spark's exchange shows it: :func:`remember`), its
later runs exchange through the driver instead (``TaskSpec.exchange == "driver"``): each task
sends one ``FRAME_ANNOUNCE`` and :class:`Announces` answers every task with ``FRAME_PEERS`` (all
the announcements, in task order) as soon as the last one arrives.  A task of such a run that
cannot reach the driver fails the run, naming the address (as a run whose tasks reach it from some
hosts only did already); the task side is :mod:`sparkml_dist.runner.tasks.exchange`.

Example::

    announces = Announces(tasks=2)
    announces.add({"type": "announce", "task": 1, "ranks": "[...]"}, send)   # from the channel
"""

from __future__ import annotations

import threading
from typing import Callable, Dict, Optional, Set, Tuple

from . import protocol

_REACHED: Set[Tuple[str, str]] = set()  # (application, driver address) whose tasks all reached it
_LOCK = threading.Lock()


def _application(spark) -> str:
    try:
        return str(spark.conf.get("spark.app.id"))
    except Exception:  # noqa: BLE001 - a session without one: this process's session object
        return f"session-{id(spark)}"


def mode(spark, host: str) -> str:
    """``"driver"`` when this session's tasks all reached the driver at ``host`` before, else
    ``"gang"`` (Spark's allGather)."""
    with _LOCK:
        return "driver" if spark is not None and (_application(spark), host) in _REACHED else "gang"


def remember(spark, host: str, ranks: int, accepted: int) -> None:
    """A run succeeded with ``accepted`` connections of its ``ranks`` ranks' tasks (one each) to
    the driver at ``host``: all of them reached it."""
    if spark is not None and ranks and accepted >= ranks:
        with _LOCK:
            _REACHED.add((_application(spark), host))


class Announces:
    """Collects one attempt's announcements; answers every task once all ``tasks`` are in."""

    def __init__(self, tasks: int) -> None:
        self.tasks = tasks
        self._lock = threading.Lock()
        self._got: Dict[int, Tuple[str, Callable[[dict], None]]] = {}

    def add(self, message: dict, send: Optional[Callable[[dict], None]]) -> None:
        task, ranks = message.get("task"), message.get("ranks")
        if (
            send is None
            or not isinstance(task, int)
            or not 0 <= task < self.tasks
            or not isinstance(ranks, str)
        ):
            return  # not a well-formed announcement of this attempt's tasks
        with self._lock:
            self._got[task] = (ranks, send)
            if len(self._got) < self.tasks:
                return
            answer = {"type": protocol.FRAME_PEERS, "tasks": [self._got[t][0] for t in range(self.tasks)]}
            sends = [s for _, s in self._got.values()]
        for reply in sends:
            reply(answer)
