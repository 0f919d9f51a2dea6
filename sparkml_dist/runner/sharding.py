"""How ``run_with_data`` turns a DataFrame into one shard per rank.  [driver]

Two ways, decided before launching:

* a plain Parquet scan is read straight from its files by the tasks
  (:func:`sparkml_dist.parquet_split.split_files`: contiguous row ranges whose sizes differ by at
  most one row);
* anything else moves through Spark: rows are hashed to ranks by the shared partitioning layer
  (disjoint, independent of the input's partitioning), or dealt round-robin when the input is too
  small for hashing to fill every rank.  Partition r then holds rank r's shard.
"""

from __future__ import annotations

import logging
from typing import Optional

from .. import parquet_split, partitioning
from ..errors import ConfigurationError

log = logging.getLogger(__name__)

_ROWS_PER_RANK_TO_HASH = 64  # fewer rows per rank than this: deal them round-robin


def _too_few_rows(n: int, world: int) -> ConfigurationError:
    return ConfigurationError(
        f"the DataFrame has {n} rows, fewer than np={world} ranks; every rank needs at least one row."
    )


def file_split(df, world: int) -> Optional[parquet_split.ParquetSplit]:
    """Each rank's row ranges of ``df``'s Parquet files, or None to move the rows through Spark."""
    split, why = parquet_split.split_files(df, world)
    if split is None:
        log.info("run_with_data: the rows go through Spark, not straight from files: %s", why)
        return None
    if split.num_rows < world:
        raise _too_few_rows(split.num_rows, world)
    log.info(
        "run_with_data: %d ranks read %d rows straight from %d Parquet files",
        world,
        split.num_rows,
        len({s.uri for part in split.parts for s in part}),
    )
    return split


def spark_shards(df, world: int, seed: int = 0, per_task: int = 1):
    """``df`` as ``world`` partitions, partition r holding rank r's shard (lazy but for one cheap
    check). The ranks exchange their row counts at the rendezvous.

    ``per_task`` > 1 (a task runs several ranks): ``world / per_task`` partitions, task t holding
    the shards of ranks ``t*per_task ...`` with each row's rank in ``partitioning.GROUP_COL``, so
    the shards are the same rows as with one rank per task.
    """
    cols = df.columns
    small = _ROWS_PER_RANK_TO_HASH * world
    n = df.limit(small).count()
    if n < world:
        raise _too_few_rows(n, world)
    if n < small:
        grouped = partitioning.deal_groups(df, world, seed, cols)
    else:
        spec = partitioning.SplitSpec(num_groups=world, seed=seed, names={"num_groups": "np"})
        grouped = partitioning.assign_groups(df, spec, cols)
    if per_task == 1:
        return grouped.select(*cols)
    from pyspark.sql import functions as F

    task = (F.col(partitioning.GROUP_COL) / per_task).cast("int")
    return grouped.select(*cols, partitioning.GROUP_COL).repartitionById(world // per_task, task)
