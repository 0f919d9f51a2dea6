"""A task's rows into its ranks' shard files (Arrow IPC, memory-mapped by the ranks).  [executor]

One rank per task: the task's batches are its rank's shard.  Several ranks per task (one per GPU
it holds): each row carries its rank in ``GROUP_COL`` (see :func:`sparkml_dist.runner.sharding.
spark_shards`), and is routed to that rank's file; the shards are the rows they would be with one
rank per task.
"""

from __future__ import annotations

from typing import Iterable, List, Optional

import pyarrow as pa

from ..group_rows import GROUP_COL


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
