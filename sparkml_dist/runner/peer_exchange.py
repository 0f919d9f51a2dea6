"""The tasks' exchange of addresses through the driver's log channel, the driver's side.  [driver]

Before their ranks start, a run's barrier tasks tell each other where each rank is (address,
store port, shard rows, GPUs: :func:`sparkml_dist.runner.protocol.announce`).  Spark's
``BarrierTaskContext.allGather`` does it, but a task that is not the last to arrive polls for
the answer once a second, so every run paid about a second for it.  Once a session's tasks have all
reached the driver's log channel (a first run on Spark's exchange shows it: :func:`remember`), its
later runs exchange through the driver instead (``TaskSpec.exchange == "driver"``): each task
sends one ``FRAME_ANNOUNCE`` and :class:`Announces` answers every task with ``FRAME_PEERS`` (all
the announcements, in task order) as soon as the last one arrives.  A task of such a run that
cannot reach the driver uses the allGather, and the others are told to join it
(:data:`FALLBACK_S`); the task side is :mod:`sparkml_dist.runner.tasks.exchange`.  A run of plain
tasks (``executor_loss="replace"``) always exchanges here: its answers name the driver's store,
a task announced again after the answer is a lost executor's task that Spark started again
(:mod:`sparkml_dist.runner.elastic.executor_loss` decides), and no fallback exists.

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


FALLBACK_S = 10.0  # not every task announced this long after the first: every task uses allGather


class Announces:
    """Collects one attempt's announcements; answers every task once all ``tasks`` are in.

    A task that cannot reach the driver (the network changed since the earlier run) uses Spark's
    allGather instead; so that it is not left alone there, when not every task has announced
    :data:`FALLBACK_S` seconds after the first one, every task (and any later one) is told to use
    the allGather too (``{"fallback": true}``): the run then goes on as a run of the gang exchange
    does (no live logs when no task reached the driver, the reach error when some did not)."""

    def __init__(
        self,
        tasks: int,
        fallback_s: float = FALLBACK_S,
        again: Optional[Callable[[int, int], object]] = None,
        short: Optional[Callable[[int], None]] = None,
        store: Optional[Tuple[str, int]] = None,
    ) -> None:
        self.tasks, self.fallback_s = tasks, fallback_s
        self._store = {"store": list(store)} if store else {}  # the run's store, when the driver serves it
        self._lock = threading.Lock()
        self._got: Dict[int, Tuple[str, Callable[[dict], None]]] = {}
        self._fell_back = False
        self._answer: Optional[list] = None  # every task's announcement, once all were in
        # plain tasks (executor_loss="replace"): a task announced again after the answer is a lost
        # executor's task started again (``again(task, attempt)``: join the survivors?), and
        # ``short(n)`` is told, instead of a fallback, when only n announced in time
        self._again, self._short = again, short

    @property
    def answered(self) -> bool:
        """Every task has announced (and was answered): the attempt's tasks hold their slots."""
        return self._answer is not None

    def _fall_back(self) -> None:
        with self._lock:
            if len(self._got) >= self.tasks:
                return
            if self._short is not None:  # no allGather to fall back to: the attempt fails
                got = len(self._got)
            else:
                self._fell_back = True
                sends = [s for _, s in self._got.values()]
        if self._short is not None:
            return self._short(got)
        for reply in sends:
            reply({"type": protocol.FRAME_PEERS, "fallback": True})

    def _announced_again(self, task: int, ranks: str, attempt, send: Callable[[dict], None]) -> None:
        """A lost executor's task, started again: answered as a replacement when ``again`` agrees
        (its entry replaced by its new addresses), else left unanswered (the job is cancelled)."""
        verdict = self._again(task, attempt if isinstance(attempt, int) else -1) if self._again else False
        if verdict == "over":  # the others finished: the task ends without its ranks
            return send({"type": protocol.FRAME_PEERS, "over": True})
        if not verdict:
            return
        with self._lock:
            self._answer[task] = ranks
            answer = {
                "type": protocol.FRAME_PEERS,
                "tasks": list(self._answer),
                "replaces": True,
                **self._store,
            }
        send(answer)

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
            if self._fell_back:
                send({"type": protocol.FRAME_PEERS, "fallback": True})
                return
            answered, sends = self._answer is not None, []
            if not answered:
                self._got[task] = (ranks, send)  # a task started again before the answer: its latest
                if len(self._got) == 1 and self.tasks > 1 and self.fallback_s is not None:
                    timer = threading.Timer(self.fallback_s, self._fall_back)
                    timer.daemon = True
                    timer.start()
                if len(self._got) == self.tasks:
                    self._answer = [self._got[t][0] for t in range(self.tasks)]
                    sends = [s for _, s in self._got.values()]
            answer = {"type": protocol.FRAME_PEERS, "tasks": list(self._answer or []), **self._store}
        if answered:
            return self._announced_again(task, ranks, message.get("attempt"), send)
        for reply in sends:
            reply(answer)
