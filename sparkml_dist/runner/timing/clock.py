"""A rank's step clock: steps, and their time split into data wait, communication and compute.  [rank]

One :class:`StepClock` per rank process (:data:`CLOCK`).  Step boundaries come from three kinds of
source, the most explicit winning once it has been seen (a lower one is then ignored, so no step
is counted twice): ``"step"`` (:func:`step`, the function's own marking), ``"loader"`` (the
runner's loader: a step begins when a batch is asked for) and ``"hook"`` (the framework: a
``DistributedDataParallel`` training forward, Horovod's ``DistributedOptimizer.step``, a Keras
``fit`` batch; :mod:`.hooks`).  A step's time runs from its beginning to the next one's (or to the
end its source marks: the loader's last batch, :func:`step`'s exit).  ``data_s`` is time the
loader made the step wait for its batch, ``comm_s`` time spent waiting on collectives that the
step's own work no longer hid (a DDP backward waiting for its last buckets, Horovod's
``synchronize``), and compute the rest.

A thread of the clock sends the totals so far (``protocol.EVENT_TIMING``) every
:data:`SUMMARY_S` seconds while steps advance, and once more when the function returns
(:func:`final`): a few hundred bytes a rank, whatever the step rate.  Outside a rank process (no
channel) nothing is sent.  What a step costs the clock: two ``perf_counter`` calls and a lock.

Example::

    with step():                     # the function's own step (nothing else counts steps then)
        train_on(batch)
    CLOCK.waited("data", 0.012)      # what the loader does for each batch it makes a step wait for
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Dict, Iterator, Optional

from .. import protocol, rank_channel

SUMMARY_S = 2.0  # how often a rank sends its totals while its steps advance
TIMING_ENV = "SPARKML_DIST_STEP_TIMING"  # "0": no step clock at all (to measure what it costs)
_PRIORITY = {"hook": 0, "loader": 1, "step": 2}


class StepClock:
    """See the module docstring."""

    def __init__(self) -> None:
        self.on = os.environ.get(TIMING_ENV, "1") != "0"
        self._lock = threading.Lock()
        self.steps, self.step_s, self.data_s, self.comm_s = 0, 0.0, 0.0, 0.0
        self._owner = -1  # the priority of the source whose boundaries count
        self._began: Optional[float] = None  # when the open step began (None: no step open)
        self._sender: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._sent = -1  # the steps of the last summary sent

    def begin(self, source: str) -> None:
        """A step begins (``source`` see :data:`_PRIORITY`): the open one, if any, ends here."""
        if not self.on:
            return
        now = time.perf_counter()
        with self._lock:
            if not self._take(source):
                return
            if self._began is not None:
                self.steps += 1
                self.step_s += now - self._began
            self._began = now
        self._start_sender()

    def end(self, source: str, at: Optional[float] = None) -> None:
        """The open step ends (at ``at``, a ``perf_counter`` time, or now); none is open after."""
        now = time.perf_counter() if at is None else at
        with self._lock:
            if not self._take(source) or self._began is None:
                return
            self.steps += 1
            self.step_s += max(0.0, now - self._began)
            self._began = None

    def drop(self, source: str) -> None:
        """The step just begun was not one (the loader asked past its last batch): none is open."""
        with self._lock:
            if self._take(source):
                self._began = None

    def abandon(self) -> None:
        """The open step did not complete (a peer was lost inside ``elastic.run``): neither it nor
        the wait for the group to form again counts as a step's time (it is no straggler's)."""
        with self._lock:
            self._began = None

    def _take(self, source: str) -> bool:
        """(under the lock) Whether ``source``'s boundaries count; a more explicit one takes over,
        its first boundary starting afresh (what the others counted stays)."""
        rank = _PRIORITY[source]
        if rank < self._owner:
            return False
        if rank > self._owner:
            self._owner, self._began = rank, None
        return True

    def waited(self, kind: str, seconds: float) -> None:
        """``seconds`` of the open step spent waiting for ``kind``: "data" or "comm"."""
        if not self.on:
            return
        with self._lock:
            if kind == "data":
                self.data_s += seconds
            else:
                self.comm_s += seconds

    def totals(self) -> Dict[str, float]:
        with self._lock:
            return {"steps": self.steps, "step_s": self.step_s, "data_s": self.data_s, "comm_s": self.comm_s}

    # ------------------------------------------------------------------ summaries to the driver
    def _start_sender(self) -> None:
        if self._sender is None and rank_channel.CTRL is not None:
            with self._lock:
                if self._sender is not None:
                    return
                self._sender = threading.Thread(
                    target=self._send_loop, daemon=True, name="sparkml_dist-timing"
                )
            self._sender.start()

    def _send_loop(self) -> None:
        while not self._stop.wait(SUMMARY_S):
            totals = self.totals()
            if totals["steps"] != self._sent:
                self._sent = int(totals["steps"])
                rank_channel.send(protocol.EVENT_TIMING, final=False, **totals)

    def final(self, at: Optional[float] = None) -> None:
        """The function returned: close a step the framework left open (at ``at``, its last
        communication's end, when known) and send the totals once more, steps or none."""
        self._stop.set()
        if not self.on:
            return
        with self._lock:
            hook_open = self._owner == _PRIORITY["hook"] and self._began is not None
        if hook_open:
            self.end("hook", at)
        rank_channel.send(protocol.EVENT_TIMING, final=True, **self.totals())


CLOCK = StepClock()


@contextlib.contextmanager
def step() -> Iterator[None]:
    """Mark one step of the function's own loop (see the module docstring): its time is counted,
    split into data wait, communication and compute; once used, only these marks count steps."""
    CLOCK.begin("step")
    try:
        yield
    finally:
        CLOCK.end("step")
