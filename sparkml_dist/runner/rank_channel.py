"""This rank process's channel to its task: its control events, log lines and metrics.  [rank]

A rank process (:mod:`sparkml_dist.runner.tasks.rank`) opens it first thing, on the control pipe
its task passed down (``protocol.CTRL_ENV``); from then on anything running in the rank (the
runner's own code, :mod:`.context`'s ``log_to_driver``, :mod:`.elastic`, the step timing) sends
through it: one JSON event per line (:func:`sparkml_dist.runner.protocol.event`), from any thread.
Outside a rank process it is closed: the senders then return False.

Example::

    open_channel(int(os.environ[protocol.CTRL_ENV]))   # in the rank's main(), once
    send_log("epoch 3 done")                            # False outside a rank process
"""

from __future__ import annotations

import os
import threading
from typing import Optional

from . import protocol


class Channel:
    """The control pipe to the task, written one whole line at a time."""

    def __init__(self, fd: int) -> None:
        self._fh = os.fdopen(fd, "w", buffering=1)
        self._lock = threading.Lock()

    def send(self, name: str, **fields) -> None:
        with self._lock:  # log_to_driver may be called from the function's threads
            self._fh.write(protocol.event(name, **fields))
            self._fh.flush()


CTRL: Optional[Channel] = None  # this process's channel to its task, once its rank's main() runs


def open_channel(fd: int) -> Channel:
    """Open this process's channel on descriptor ``fd`` (a rank process, once)."""
    global CTRL
    CTRL = Channel(fd)
    return CTRL


def send(name: str, **fields) -> bool:
    """Send control event ``name`` to the task (False outside a rank process)."""
    if CTRL is None:
        return False
    CTRL.send(name, **fields)
    return True


def send_log(text: str) -> bool:
    """Send one log line to the driver through the task (False outside a rank process)."""
    return send(protocol.EVENT_LOG, text=text)


def send_metrics(step, metrics: dict) -> bool:
    """Send rank 0's metrics to the driver's MLflow run through the task (False outside a rank)."""
    return send(protocol.EVENT_METRICS, step=step, metrics=metrics)
