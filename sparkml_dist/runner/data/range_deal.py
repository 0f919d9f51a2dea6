"""Rows dealt into contiguous, balanced ranges of one order, moved by a single shuffle.  [driver]

The order is the package's one order of rows (:func:`sparkml_dist.partitioning.bucket_counts`:
bucket = key mod 1024, then the key ``xxhash64(seed, *columns)``, then the content), so it depends
on the rows and the seed only, never on how the input is partitioned.  Stream ``c`` of ``S`` holds
the positions ``[c*n//S, (c+1)*n//S)`` of that order: sizes differ by at most one row.

:func:`sparkml_dist.partitioning.balanced_groups` deals round-robin (what bagging wants: duplicate
rows spread over the groups) and so needs every row's position before it can move the row: a
window over each bucket (one shuffle of every row), then the move to its group (another).  Ranges
need only the counts: a bucket's rows all belong to the one or two streams its positions fall in,
so the count job tells each bucket which tasks to go to, one shuffle moves every row there (the
few rows of a bucket that straddles two streams go to both), and each task, holding whole
buckets sorted, numbers its rows itself (``monotonically_increasing_id``, whose low 33 bits count
the rows of a partition in order) and keeps those of its own streams.  Used by
``run_with_data``'s exact deal (:func:`.sharding.spark_shards`).

Example::

    placed, sizes = ranges(df, seed=0, key_cols=df.columns, streams=4, readers=[[0], [1], [2], [3]],
                           tasks=4)
    # partition t: the rows of streams t reads, GROUP_COL = their stream, in stream then key order
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np

from ... import partitioning, spark_compat

TASK_COL = "__sd_task"
_POS = "__sd_pos"
_ROW_BITS = (1 << 33) - 1  # monotonically_increasing_id: the row number within its partition


def _bucket_tasks(offsets: np.ndarray, n: int, streams: int, readers: Sequence[Sequence[int]]):
    """For each bucket the tasks reading a stream its positions fall in (empty for no rows)."""
    out: List[List[int]] = []
    for b in range(len(offsets) - 1):
        lo, hi = int(offsets[b]), int(offsets[b + 1])
        if lo == hi:
            out.append([])
            continue
        first, last = ((lo + 1) * streams - 1) // n, (hi * streams - 1) // n  # streams of lo, hi - 1
        out.append(sorted({t for c in range(first, last + 1) for t in readers[c]}))
    return out


def _sql_array(items) -> str:
    return "array(" + ", ".join(items) + ")"


def ranges(
    df, seed: int, key_cols: Sequence[str], streams: int, readers: Sequence[Sequence[int]], tasks: int
) -> Tuple[object, Tuple[int, ...]]:
    """``(placed, sizes)``: ``placed`` has ``tasks`` partitions, partition ``t`` the rows of every
    stream ``c`` with ``t in readers[c]``, ``GROUP_COL`` = the stream, sorted by stream then by the
    order; ``sizes`` the rows of each stream.  One Spark job (the counts) runs here."""
    from pyspark.sql import functions as F

    keyed, counts, _ = partitioning.bucket_counts(df, seed, key_cols)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    n = int(offsets[-1])
    sizes = tuple((c + 1) * n // streams - c * n // streams for c in range(streams))
    if n < streams:
        return None, sizes
    per_bucket = _bucket_tasks(offsets, n, streams, readers)
    # where a bucket's first row sits among the rows of each task that holds it
    delta: Dict[int, int] = {}
    seen = [0] * tasks
    for b, ts in enumerate(per_bucket):
        for t in ts:
            delta[t * partitioning._BUCKETS + b] = int(offsets[b]) - seen[t]
            seen[t] += int(counts[b])
    # SQL literals: one call to the JVM each, however many buckets and tasks
    goes_to = F.expr(_sql_array(_sql_array(f"{t}" for t in ts) for ts in per_bucket))
    where = F.expr("map(" + ", ".join(f"{k}L, {v}L" for k, v in delta.items()) + ")")
    kept_by = F.expr(_sql_array(_sql_array(f"{t}" for t in ts) for ts in readers))
    bucket, task = F.col(partitioning.BUCKET_COL), F.col(TASK_COL)
    moved = keyed.withColumn(TASK_COL, F.explode(F.element_at(goes_to, bucket + 1)))
    order = [partitioning.BUCKET_COL, partitioning.KEY_COL, *partitioning.orderable(df, key_cols)]
    held = spark_compat.repartition_by_id(moved, tasks, TASK_COL).sortWithinPartitions(*order)
    row = F.expr(f"monotonically_increasing_id() & {_ROW_BITS}")
    position = row + F.element_at(where, task.cast("long") * partitioning._BUCKETS + bucket)
    stream = F.expr(f"cast((({_POS} + 1) * {int(streams)} - 1) div {n} as int)")  # exact, in longs
    numbered = held.withColumn(_POS, position).withColumn(partitioning.GROUP_COL, stream)
    mine = F.array_contains(F.element_at(kept_by, F.col(partitioning.GROUP_COL) + 1), task)
    return numbered.where(mine).select(*df.columns, partitioning.GROUP_COL), sizes
