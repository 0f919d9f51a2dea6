"""A barrier task's data phase: each rank's shard and the function into its work directory.  [executor]

Rows arrive from Spark (the task's partition, routed by rank when the task runs several) or are read
by the task from Parquet row ranges; either way the phase is bounded by progress
(:mod:`.data_watch`), not by ``start_timeout``, and a stall fails naming the shard's rank.
"""

from __future__ import annotations

import os
from typing import Callable, Dict, Iterable, List

import pyarrow as pa

from .. import parquet_split
from . import protocol, shard_files
from .data_watch import DataWatch
from .protocol import RankFailure


def _stalled(members: list) -> Callable[[float, int], RankFailure]:
    def report(idle: float, rows: int) -> RankFailure:
        spec, ranks = members[0].spec, ", ".join(str(m.rank) for m in members)
        who = f"rank {ranks}" if len(members) == 1 else f"ranks {ranks}"
        source = "its Parquet row ranges" if spec.file_split is not None else "Spark"
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
    Bounded by progress (:mod:`.data_watch`), not by ``start_timeout``."""
    spec = members[0].spec
    if not spec.has_data or spec.file_split is not None:
        for _ in batches:  # drain the placeholder rows, so Spark can reuse this Python worker
            pass
    envs: List[Dict[str, str]] = [{} for _ in members]
    if spec.has_data:
        paths = [os.path.join(m.workdir, protocol.SHARD_FILE) for m in members]
        stuck = _end_worker if members[0].gang.echo_output else None  # Spark tasks only, not the driver
        watch = DataWatch(spec.data_timeout, _stalled(members), stuck)
        with watch:
            if spec.file_split is not None:  # each rank reads its own row ranges from the files
                read = lambda m: watch.batches(parquet_split.read(spec.file_split, m.rank))  # noqa: E731
                rows = [shard_files.write_shard(read(m), p) for m, p in zip(members, paths)]
            elif len(members) == 1:
                rows = [shard_files.write_shard(watch.batches(batches), paths[0])]
            else:
                rows = shard_files.write_routed(watch.batches(batches), paths, members[0].rank)
        watch.check()
        for m, path, n, env in zip(members, paths, rows, envs):
            m.rows = n
            env[protocol.SHARD_ENV] = path
    for m in members:
        with open(os.path.join(m.workdir, protocol.FN_FILE), "wb") as fh:
            fh.write(spec.payload)
    return envs
