"""How long a run may take, and the Spark jobs it starts before its ranks, bounded by it.  [driver]

A run's :class:`Deadline` is set once, from ``timeout``, and counts restarts too; :func:`within`
puts the planning jobs a run starts before any rank (counting and dealing its rows) under the run's
own job tag, so Ctrl-C cancels them and nothing else, and the deadline passing cancels them too.
Both the launchers (:mod:`.launchers`) and the data path's planning (:mod:`.data.plan`) use them.

Example::

    deadline = Deadline.after(600)
    with within(spark, deadline, "counting the rows"):
        df.count()
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from typing import Optional

from .. import launch
from ..errors import RunTimeoutError


@dataclass(frozen=True)
class Deadline:
    """When the whole run (restarts included) must end; ``timeout`` None: never."""

    timeout: Optional[float]
    at: Optional[float]

    @classmethod
    def after(cls, timeout: Optional[float]) -> "Deadline":
        return cls(timeout, time.monotonic() + timeout if timeout else None)

    def expired(self) -> bool:
        return self.at is not None and time.monotonic() > self.at

    def remaining(self, default: float) -> float:
        """Seconds left (``default`` when there is no deadline)."""
        return default if self.at is None else max(0.0, min(default, self.at - time.monotonic()))


@contextlib.contextmanager
def within(spark, deadline: Deadline, what: str):
    """Spark jobs started inside (planning: counting and dealing rows) run under the run's own tag:
    Ctrl-C cancels them and nothing else, and the run's deadline passing cancels them too, which
    raises :class:`RunTimeoutError` saying ``what`` was running."""
    if spark is None:
        yield
        return
    tag, fired = launch.JobTag(spark), threading.Event()

    def expire() -> None:
        fired.set()
        tag.cancel()

    timer = threading.Timer(deadline.remaining(float("inf")), expire)
    timer.daemon = True
    if deadline.at is not None:
        timer.start()
    try:
        with tag.scope():
            yield
    except Exception as exc:
        if fired.is_set():
            raise RunTimeoutError(
                f"the run exceeded timeout={deadline.timeout}s while {what}; its Spark jobs were "
                "cancelled before any rank started"
            ) from exc
        raise
    finally:
        timer.cancel()
