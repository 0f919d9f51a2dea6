"""Messages waiting between the log server's selector thread and its handler; lines accounted.  [driver]

One queue per connection, taken in turn, so that one connection's backlog never holds another's
lines back; a connection's *lines* may fill its share of :data:`MAX_QUEUED_BYTES` (that over the
connections open, at least :data:`MIN_SHARE`), and a line beyond it is refused: the server sheds
it and counts it by rank. A rank printing 16 KiB lines at full speed fills its own share only;
the driver's memory for waiting lines stays under :data:`MAX_QUEUED_BYTES` whatever the ranks
print. Other messages (reports: done, failed, rendezvous, metrics) are refused only past
:data:`MAX_QUEUED` messages, and then wait for room.

Every line a rank meant for the driver is accounted (:class:`Tally`): received, not shown (shed
here, or still waiting when the channel closed), and posted by its task (the count its final report
carries), so the run says how many lines of which rank it did not show.

Example::

    inbox = Inbox()
    inbox.put(conn_key, (message, send), size=len(frame), connections=2)   # False: no room
    inbox.get(timeout=0.2)                                                # next connection's oldest
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any, Dict

MAX_QUEUED = 100_000  # messages waiting for the handler, every connection's together
MAX_QUEUED_BYTES = 16 << 20  # line text waiting for the handler, every connection's together
MIN_SHARE = 256 << 10  # line text one connection may always have waiting
WARN_EVERY = 10.0  # seconds between two warnings of shed lines

log = logging.getLogger(__name__)


class Inbox:
    """The waiting messages (see the module docstring)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queues: "collections.OrderedDict[int, collections.deque]" = collections.OrderedDict()
        self._bytes: Dict[int, int] = {}
        self.bytes = 0
        self.count = 0
        self._woken = False  # wake(): a get() on an empty inbox returns at once from then on

    def put(self, key: int, item, size: int, connections: int) -> bool:
        """Queue ``item`` (a line of ``size`` bytes, or a report: ``size`` 0); False: no room."""
        with self._cond:
            if self.count >= MAX_QUEUED:
                return False
            share = max(MIN_SHARE, MAX_QUEUED_BYTES // max(1, connections))
            if size and (self._bytes.get(key, 0) + size > share or self.bytes + size > MAX_QUEUED_BYTES):
                return False
            self._queues.setdefault(key, collections.deque()).append((item, size))
            if size:
                self._bytes[key] = self._bytes.get(key, 0) + size
            self.bytes += size
            self.count += 1
            self._cond.notify_all()
            return True

    def wait_room(self, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.count < MAX_QUEUED, timeout)

    def get(self, timeout: float):
        """The next connection's oldest item, or None after ``timeout`` seconds without one."""
        with self._cond:
            self._cond.wait_for(lambda: bool(self._queues) or self._woken, timeout)
            if not self._queues:
                return None
            key, items = next(iter(self._queues.items()))
            item, size = items.popleft()
            if items:
                self._queues.move_to_end(key)  # the next connection's turn
            else:
                del self._queues[key]
            if size:
                left = self._bytes.pop(key) - size
                if left:
                    self._bytes[key] = left
            self.bytes -= size
            self.count -= 1
            self._cond.notify_all()
            return item

    def wake(self) -> None:
        """The channel closes: a reader waiting on an empty inbox returns now, not at its timeout."""
        with self._cond:
            self._woken = True
            self._cond.notify_all()


def _rank_of(message: dict):
    rank = message.get("rank")
    return rank if isinstance(rank, (int, str)) and not isinstance(rank, bool) else None


class Tally:
    """Lines by rank: received, not shown, and posted by the rank's task (see the module)."""

    def __init__(self) -> None:
        self.dropped_by: Dict[Any, int] = {}  # received, not shown
        self._received: Dict[Any, int] = {}
        self._posted: Dict[Any, int] = {}  # from a task's final report ("lines")
        self._said = -WARN_EVERY

    def arrived(self, message: dict, size: int) -> None:
        """A frame read: a line (``size`` > 0) counted; a final report's ``lines`` noted."""
        rank = _rank_of(message)
        if size:
            self._received[rank] = self._received.get(rank, 0) + 1
        elif isinstance(message.get("lines"), int) and not isinstance(message.get("lines"), bool):
            self._posted[rank] = max(self._posted.get(rank, 0), message["lines"])

    def dropped(self, message: dict) -> None:
        """A line received and not shown (no room, or the channel closed)."""
        rank = _rank_of(message)
        self.dropped_by[rank] = self.dropped_by.get(rank, 0) + 1

    def shed(self, message: dict) -> None:
        """A line the handler had no room for: dropped, counted, said at most once per WARN_EVERY
        seconds (the connection stays)."""
        self.dropped(message)
        now = time.monotonic()
        if now - self._said >= WARN_EVERY:
            self._said = now
            log.warning(
                "log channel: the ranks send lines faster than the driver shows them: %d dropped "
                "so far (each rank's lines are all in its executor log)",
                sum(self.dropped_by.values()),
            )

    def not_shown(self) -> Dict[Any, int]:
        """By rank: the lines dropped here, and those a task posted that never arrived (shed on its
        side, or lost in transit)."""
        out = dict(self.dropped_by)
        for rank, posted in self._posted.items():
            missing = posted - self._received.get(rank, 0)
            if missing > 0:
                out[rank] = out.get(rank, 0) + missing
        return {k: v for k, v in out.items() if v}
