"""What a barrier task sends its driver, queued: its rank's lines never wait on the network.  [executor]

The task reads its rank's output as fast as the rank writes it, so a rank never blocks on a driver
that shows lines slower than it prints them; the lines wait here, at most :data:`MAX_BYTES` of
them, and one sender thread writes them to the :class:`~sparkml_dist.channel.LogClient`. A line
that finds no room is shed here (every line is also in the executor's log). Other frames (the
rendezvous, done, failed, metrics) are never shed and keep their order among the lines. Each
rank's lines are counted as they are posted (:meth:`Outbox.posted`): the task's final report
carries that count, so the driver knows how many lines of a rank it did not show, wherever they
were shed (here, in its own inbox, or in transit).

Example::

    out = Outbox(LogClient(host, port, secret))
    out.send({"type": "line", "rank": 0, "stream": "stdout", "text": "epoch 1"})   # returns at once
    out.close()                                    # what is queued is sent first (bounded wait)
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Dict

from . import SEND_TIMEOUT

MAX_BYTES = 4 << 20  # line text waiting to be sent, per task


class Outbox:
    """A queue in front of a LogClient (see the module docstring); ``send`` and ``connected`` as
    the client's."""

    def __init__(self, client, max_bytes: int = MAX_BYTES) -> None:
        self.client, self.max_bytes = client, max_bytes
        self._cond = threading.Condition()
        self._queue: "collections.deque" = collections.deque()
        self._bytes = 0
        self._busy = False
        self._closed = False
        self._posted: Dict[int, int] = {}
        self.shed = 0
        self._thread = threading.Thread(target=self._send_all, name="sparkml_dist-outbox", daemon=True)
        self._thread.start()

    @property
    def connected(self) -> bool:
        return self.client.connected

    def posted(self, rank) -> int:
        """Lines of ``rank`` handed to :meth:`send` so far (sent or shed)."""
        with self._cond:
            return self._posted.get(rank, 0)

    def send(self, message: dict) -> None:
        size = len(str(message.get("text", ""))) if message.get("type") == "line" else 0
        with self._cond:
            if size:
                rank = message.get("rank")
                self._posted[rank] = self._posted.get(rank, 0) + 1
                if self._bytes + size > self.max_bytes or not self.client.connected:
                    self.shed += 1
                    return
            self._queue.append((message, size))
            self._bytes += size
            self._cond.notify_all()

    def _send_all(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                message, size = self._queue.popleft()
                self._busy = True
            try:
                self.client.send(message)  # a driver that stopped reading: dropped after SEND_TIMEOUT
            finally:
                with self._cond:
                    self._bytes -= size
                    self._busy = False
                    self._cond.notify_all()

    def flush(self, timeout: float = SEND_TIMEOUT) -> bool:
        """Wait until everything queued was sent (or the connection dropped); False on timeout."""
        end = time.monotonic() + timeout
        with self._cond:
            while (self._queue or self._busy) and self.client.connected:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def close(self) -> None:
        """Send what is queued (up to SEND_TIMEOUT), then close the connection."""
        self.flush()
        with self._cond:
            self._closed = True
            self._queue.clear()
            self._cond.notify_all()
        self.client.close()
