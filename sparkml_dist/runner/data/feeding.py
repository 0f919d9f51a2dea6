"""A barrier task's data phase: each rank's shard and the function into its work directory.  [executor]

Rows that arrive from Spark (the task's partition, each row with its stream) are spilled to each
rank's local disk, one Arrow IPC record batch per chunk (:class:`Spill`); the phase is bounded by
progress (:class:`DataWatch`), not by ``start_timeout``, and a stall fails naming the shard's rank.
A plain Parquet scan is not read here at all: the rank reads its streams from the files as it
trains.  Either way the rank gets a small manifest (:mod:`sparkml_dist.runner.data.sources`).

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

**A task's rows into its ranks' spill files.**  Each row carries its stream in ``GROUP_COL`` (see
:func:`sparkml_dist.runner.data.sharding.spark_shards`) and the partition is sorted by stream; a row goes
to the file of every rank of the task that reads its stream (one, or a pipeline replica's stages),
cut into chunks of :data:`CHUNK_ROWS` rows per stream.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Tuple

import numpy as np
import pyarrow as pa

from ...errors import ConfigurationError
from ...group_rows import GROUP_COL
from .. import protocol
from ..protocol import RankFailure
from .sources import write_manifest
from .spec import ParquetSlices, SparkRows


def _stalled(members: list) -> Callable[[float, int], RankFailure]:
    def report(idle: float, rows: int) -> RankFailure:
        spec, ranks = members[0].spec, ", ".join(str(m.rank) for m in members)
        who = f"rank {ranks}" if len(members) == 1 else f"ranks {ranks}"
        source = spec.data.source
        return members[0].fail(
            f"the shard of {who} stalled: no rows arrived from {source} for {idle:.0f}s "
            f"after {rows} rows (data_timeout={spec.timeouts.data}s). A lost executor, a stuck "
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


def feed(members: list, batches: Iterable[pa.RecordBatch]) -> Tuple[List[Dict[str, str]], List[int]]:
    """Give each rank its shard (a manifest, and for Spark's rows a spill file) and the function;
    each rank's environment and its shard's rows.  Bounded by progress (:class:`DataWatch`), not by
    ``start_timeout``.
    Whatever goes wrong here (a full disk, a changed input) fails the rank with its cause in the
    message, so the driver's error says it rather than Spark's ``getResult`` and JVM frames."""
    try:
        return _feed(members, batches)
    except RankFailure:
        raise
    except Exception as exc:  # noqa: BLE001 - every cause is carried to the driver as it is
        raise members[0].fail(_data_failure(members, exc), None, "data") from exc


def _data_failure(members: list, exc: BaseException) -> str:
    import errno

    ranks = ", ".join(str(m.rank) for m in members)
    text = f"the data phase of rank{'s' * (len(members) > 1)} {ranks} failed: {type(exc).__name__}: {exc}"
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        text += (
            f" (writing the shard under {os.path.dirname(members[0].workdir)} on {members[0].address}: the "
            "executor's local disk is full. Free space there, point spark.local.dir / SPARK_LOCAL_DIRS "
            "at a larger disk, or let the ranks read a Parquet scan in place instead of spilled rows)"
        )
    return text


def _feed(members: list, batches: Iterable[pa.RecordBatch]) -> Tuple[List[Dict[str, str]], List[int]]:
    spec = members[0].spec
    data = spec.data
    if not isinstance(data, SparkRows):
        for _ in batches:  # drain the placeholder rows, so Spark can reuse this Python worker
            pass
    envs: List[Dict[str, str]] = [{} for _ in members]
    rows = [0 for _ in members]
    if data is not None:
        streams = data.streams
        where = [
            dict(
                sizes=list(streams.sizes),
                data_rank=streams.data_rank(m.rank),
                data_world=streams.data_world,
                streams=list(streams.of(m.rank)),
            )
            for m in members
        ]
        if isinstance(data, ParquetSlices):
            slices = [[[s.uri, s.row_group, s.start, s.stop] for s in part] for part in data.split.parts]
            for w in where:
                w.update(
                    kind="parquet",
                    columns=list(data.split.columns),
                    schema=data.split.schema,
                    parts={c: slices[c] for c in w["streams"]},
                )
                if spec.resizes:  # a world that changes in place deals every stream again: all named
                    w["every_part"] = dict(enumerate(slices))
        else:
            _spill(members, where, batches)
        for i, (m, w, env) in enumerate(zip(members, where, envs)):
            if not w["streams"]:  # past the data ranks (a reduction server): no shard
                continue
            rows[i] = sum(streams.sizes[c] for c in w["streams"])
            path = os.path.join(m.workdir, protocol.SHARD_FILE)
            write_manifest(path, **w)
            env[protocol.SHARD_ENV] = path
    for m in members:
        with open(os.path.join(m.workdir, protocol.FN_FILE), "wb") as fh:
            fh.write(spec.payload)
    return envs, rows


def _spill(members: list, where: List[dict], batches: Iterable[pa.RecordBatch]) -> None:
    """Spark's rows into each rank's spill file, watched for stalls."""
    spec = members[0].spec
    spills = [
        Spill(os.path.join(m.workdir, protocol.SPILL_FILE), w["streams"], spec.data.streams.sizes)
        for m, w in zip(members, where)
    ]
    stuck = _end_worker if members[0].gang.echo_output else None  # Spark tasks only, not the driver
    watch = DataWatch(spec.timeouts.data, _stalled(members), stuck)
    try:
        with watch:
            route(watch.batches(batches), spills)
    finally:
        for sp in spills:
            sp.close()
    watch.check()
    for sp, w, m in zip(spills, where, members):
        sp.verify(m.rank)
        w.update(kind="ipc", file=sp.path, chunk_rows=CHUNK_ROWS)


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


CHUNK_ROWS = 4096  # rows of one chunk of a spill file: the unit a rank reads and shuffles


class Spill:
    """One rank's spill file: its streams in order, ``CHUNK_ROWS`` rows a record batch."""

    def __init__(self, path: str, streams: List[int], sizes) -> None:
        self.path, self.streams, self.sizes = path, list(streams), sizes
        self.rows = {c: 0 for c in self.streams}
        self._writer: Optional[pa.ipc.RecordBatchFileWriter] = None
        self._sink: Optional[pa.NativeFile] = None
        self._stream: Optional[int] = None
        self._buf: List[pa.RecordBatch] = []
        self._held = 0

    def add(self, stream: int, batch: pa.RecordBatch) -> None:
        """Rows of ``stream``, in order (the streams come one after another)."""
        if stream != self._stream:
            self._flush(whole_only=False)
            self._stream = stream
        if self._writer is None:
            self._sink = pa.OSFile(self.path, "wb")
            self._writer = pa.ipc.new_file(self._sink, batch.schema)
        self._buf.append(batch)
        self._held += batch.num_rows
        self.rows[stream] += batch.num_rows
        if self._held >= CHUNK_ROWS:
            self._flush(whole_only=True)

    def _flush(self, whole_only: bool) -> None:
        if not self._held:
            return
        table = pa.Table.from_batches(self._buf).combine_chunks()
        keep = self._held % CHUNK_ROWS if whole_only else 0
        cut = self._held - keep
        for lo in range(0, cut, CHUNK_ROWS):
            for b in table.slice(lo, min(CHUNK_ROWS, cut - lo)).to_batches(max_chunksize=CHUNK_ROWS):
                self._writer.write_batch(b)
        self._buf = table.slice(cut).to_batches() if keep else []
        self._held = keep

    def close(self) -> None:
        """Write what is held and close the file; the file is closed even when writing fails (a
        full disk), so nothing keeps the disk busy."""
        writer, sink, self._writer, self._sink = self._writer, self._sink, None, None
        if writer is None:
            return
        try:
            self._writer = writer
            self._flush(whole_only=False)
            self._writer = None
            writer.close()
        finally:
            self._writer = None
            sink.close()

    def verify(self, rank: int) -> None:
        """Every stream got the rows the driver counted, else the input changed under us."""
        for c in self.streams:
            if self.rows[c] != self.sizes[c]:
                raise ConfigurationError(
                    f"rank {rank}: stream {c} received {self.rows[c]} rows, but the DataFrame had "
                    f"{self.sizes[c]} for it when its rows were counted: the DataFrame gives other "
                    "rows each time it is read (a non-deterministic source or UDF). Persist it first "
                    "(df.cache() then df.count(), or df.localCheckpoint()), or write it to Parquet"
                )


def route(batches: Iterable[pa.RecordBatch], spills: List[Spill]) -> None:
    """Each run of one stream's rows to the spill of every rank that reads the stream."""
    readers: Dict[int, List[Spill]] = {}
    for sp in spills:
        for c in sp.streams:
            readers.setdefault(c, []).append(sp)
    for batch in batches:
        if not batch.num_rows:
            continue
        stream = batch.column(GROUP_COL).to_numpy(zero_copy_only=False)
        data = batch.drop_columns([GROUP_COL])
        cuts = [0, *(np.flatnonzero(np.diff(stream)) + 1).tolist(), len(stream)]
        for a, b in zip(cuts[:-1], cuts[1:]):
            for sp in readers.get(int(stream[a]), ()):
                sp.add(int(stream[a]), data.slice(a, b - a))
