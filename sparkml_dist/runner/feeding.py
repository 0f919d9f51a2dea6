"""A barrier task's data phase: each rank's shard and the function into its work directory.  [executor]

Rows arrive from Spark (the task's partition, routed by rank when the task runs several) or are read
by the task from Parquet row ranges; either way the phase is bounded by progress
(:class:`DataWatch`), not by ``start_timeout``, and a stall fails naming the shard's rank.

**A progress bound for a task's data phase: rows must keep arriving.**
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

**A task's rows into its ranks' shard files (Arrow IPC, memory-mapped by the ranks).**
One rank per task: the task's batches are its rank's shard.  Several ranks per task (one per GPU
it holds): each row carries its rank in ``GROUP_COL`` (see :func:`sparkml_dist.runner.sharding.
spark_shards`), and is routed to that rank's file; the shards are the rows they would be with one
rank per task.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable, Dict, Iterable, Iterator, List, Optional

import pyarrow as pa

from .. import parquet_split
from ..group_rows import GROUP_COL
from . import protocol
from .protocol import RankFailure
from .task_spec import ParquetSlices, SparkRows


def _stalled(members: list) -> Callable[[float, int], RankFailure]:
    def report(idle: float, rows: int) -> RankFailure:
        spec, ranks = members[0].spec, ", ".join(str(m.rank) for m in members)
        who = f"rank {ranks}" if len(members) == 1 else f"ranks {ranks}"
        source = spec.data.source
        return members[0].fail(
            f"the shard of {who} stalled: no rows arrived from {source} for {idle:.0f}s "
            f"after {rows} rows (data_timeout={spec.data_timeout}s). A lost executor, a stuck "
            "shuffle fetch or slow storage; raise data_timeout if the input is just slow.",
            None,
            "data",
        )

    return report


def _end_worker(failure: BaseException) -> None:
    """The read is still blocked after the stall was reported (the driver did not cancel: its
    channel is gone): say why in the executor's log and end this Python worker, so that Spark fails
    the task instead of waiting forever.  The reaper beside each rank then removes what it left."""
    import signal
    import sys

    sys.stderr.write(f"sparkml_dist: ending this task's Python worker: {failure}\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def feed(members: list, batches: Iterable[pa.RecordBatch]) -> List[Dict[str, str]]:
    """Write each rank's shard and the function into its work directory; each shard's environment.
    Bounded by progress (:class:`DataWatch`), not by ``start_timeout``."""
    spec = members[0].spec
    if not isinstance(spec.data, SparkRows):
        for _ in batches:  # drain the placeholder rows, so Spark can reuse this Python worker
            pass
    envs: List[Dict[str, str]] = [{} for _ in members]
    if spec.data is not None:
        paths = [os.path.join(m.workdir, protocol.SHARD_FILE) for m in members]
        stuck = _end_worker if members[0].gang.echo_output else None  # Spark tasks only, not the driver
        watch = DataWatch(spec.data_timeout, _stalled(members), stuck)
        with watch:
            if isinstance(spec.data, ParquetSlices):  # each rank reads its own row ranges
                read = lambda m: watch.batches(parquet_split.read(spec.data.split, m.rank))  # noqa: E731
                rows = [write_shard(read(m), p) for m, p in zip(members, paths)]
            elif len(members) == 1:
                rows = [write_shard(watch.batches(batches), paths[0])]
            else:
                rows = write_routed(watch.batches(batches), paths, members[0].rank)
        watch.check()
        for m, path, n, env in zip(members, paths, rows, envs):
            m.rows = n
            env[protocol.SHARD_ENV] = path
    for m in members:
        with open(os.path.join(m.workdir, protocol.FN_FILE), "wb") as fh:
            fh.write(spec.payload)
    return envs


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


def write_shard(batches: Iterable[pa.RecordBatch], path: str) -> int:
    """Stream the task's batches into an Arrow IPC file (an empty file of no columns for none);
    returns the row count."""
    rows, writer = 0, None
    try:
        for batch in batches:
            if writer is None:
                writer = pa.ipc.new_file(path, batch.schema)
            writer.write_batch(batch)
            rows += batch.num_rows
    finally:
        if writer is not None:
            writer.close()
    if writer is None:
        pa.ipc.new_file(path, pa.schema([])).close()
    return rows


def write_routed(batches: Iterable[pa.RecordBatch], paths: List[str], first_rank: int) -> List[int]:
    """A task of several ranks: each row goes to the shard file of the rank in its GROUP_COL."""
    writers: List[Optional[pa.ipc.RecordBatchFileWriter]] = [None] * len(paths)
    rows, schema = [0] * len(paths), None
    try:
        for batch in batches:
            owner = batch.column(GROUP_COL).to_numpy(zero_copy_only=False) - first_rank
            data = batch.drop_columns([GROUP_COL])
            schema = data.schema
            for j in range(len(paths)):
                part = data.filter(pa.array(owner == j))
                if part.num_rows:
                    if writers[j] is None:
                        writers[j] = pa.ipc.new_file(paths[j], schema)
                    writers[j].write_batch(part)
                    rows[j] += part.num_rows
    finally:
        for w in writers:
            if w is not None:
                w.close()
    for j, w in enumerate(writers):
        if w is None:  # a rank without rows: an empty file (the driver refuses fewer rows than ranks)
            pa.ipc.new_file(paths[j], schema or pa.schema([])).close()
    return rows
