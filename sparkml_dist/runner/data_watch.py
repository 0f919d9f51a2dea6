"""A progress bound for a task's data phase: rows must keep arriving.  [executor]

Streaming a rank's shard into its task (Spark's shuffle fetch, or the task's own reads of Parquet
row ranges) may legitimately take long for a big shard, so it is not counted against
``start_timeout`` (that deadline starts when the ranks get their start message).  What is bounded
is *progress*: when no batch arrives for ``data_timeout`` seconds the task reports the stall (the
driver then cancels the run at once, which also stops the task that is blocked reading) and the
task fails naming the rank and its shard.  If the read is still blocked :data:`STUCK_GRACE`
seconds later (the report could not reach the driver: its channel is gone), ``on_stuck`` runs: a
Spark task then writes the stall to the executor's log and ends its own Python worker, so the job
fails instead of hanging.

Example::

    watch = DataWatch(300.0, on_stall=lambda idle, rows: report(...))
    with watch:
        for batch in watch.batches(spark_batches):
            write(batch)
    watch.check()   # raises what on_stall returned, if the data phase stalled
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Iterable, Iterator, Optional

import pyarrow as pa

_POLL_S = 0.25
STUCK_GRACE = 10.0


class DataWatch:
    """Calls ``on_stall(idle_s, rows_so_far)`` once when no batch arrived for ``timeout`` seconds
    (``timeout`` None: never); what it returns is raised by :meth:`check`."""

    def __init__(
        self,
        timeout: Optional[float],
        on_stall: Callable[[float, int], BaseException],
        on_stuck: Optional[Callable[[BaseException], None]] = None,
    ) -> None:
        self.timeout = timeout
        self._on_stall = on_stall
        self._on_stuck = on_stuck
        self._last = time.monotonic()
        self.rows = 0
        self.failure: Optional[BaseException] = None
        self._done = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def batches(self, source: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """``source``'s batches; each one counts as progress."""
        for batch in source:
            self._last = time.monotonic()
            self.rows += batch.num_rows
            yield batch
            self._last = time.monotonic()  # writing the batch is progress too

    def _watch(self) -> None:
        while not self._done.wait(_POLL_S):
            idle = time.monotonic() - self._last
            if idle > self.timeout:
                self.failure = self._on_stall(idle, self.rows)
                if self._on_stuck is not None and not self._done.wait(STUCK_GRACE):
                    self._on_stuck(self.failure)
                return

    def __enter__(self) -> "DataWatch":
        self._last = time.monotonic()
        if self.timeout:
            self._thread = threading.Thread(target=self._watch, name="sparkml_dist-data-watch", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()

    def check(self) -> None:
        if self.failure is not None:
            raise self.failure
