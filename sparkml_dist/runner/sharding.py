"""How ``run_with_data`` turns a DataFrame into one shard per rank.  [driver]

Two ways, decided before launching:

* a plain Parquet scan is read straight from its files by the tasks
  (:func:`sparkml_dist.parquet_split.split_files`: contiguous row ranges whose sizes differ by at
  most one row);
* anything else moves through Spark: rows are dealt to ranks by the shared partitioning layer
  (:func:`sparkml_dist.partitioning.balanced_groups`: shard sizes differ by at most one row whatever
  the rows, duplicates included; the same rows and seed give the same shards however the input is
  partitioned).  Partition r then holds rank r's shard.

With ``replicas=D`` (pipelines: every rank of a replica must read the same rows in the same order)
the rows are dealt into D shards instead, and rank r reads shard ``r // (np / D)``, as
``parallel.pipeline(..., data_parallel=D)`` lays out its ranks; within a shard rows come in the
order of their keys, so the ranks of a replica see them in one order.
"""

from __future__ import annotations

import logging
from typing import Optional

from .. import parquet_split, partitioning
from ..errors import ConfigurationError
from .task_spec import ParquetSlices

log = logging.getLogger(__name__)


def _too_few_rows(n: int, world: int) -> ConfigurationError:
    return ConfigurationError(
        f"the DataFrame has {n} rows, fewer than np={world} ranks; every rank needs at least one row."
    )


def file_split(df, world: int, replicas: Optional[int] = None) -> Optional[ParquetSlices]:
    """Each rank's row ranges of ``df``'s Parquet files, or None to move the rows through Spark;
    with ``replicas`` D, D shards, rank r reading shard ``r // (world / D)``."""
    shards = replicas or world
    split, why = parquet_split.split_files(df, shards)
    if split is None:
        log.info("run_with_data: the rows go through Spark, not straight from files: %s", why)
        return None
    if split.num_rows < shards:
        raise _too_few_rows(split.num_rows, shards)
    if replicas:
        import dataclasses

        per = world // replicas
        split = dataclasses.replace(
            split,
            parts=tuple(split.parts[r // per] for r in range(world)),
            rows=tuple(split.rows[r // per] for r in range(world)),
        )
    log.info(
        "run_with_data: %d ranks read %d rows straight from %d Parquet files",
        world,
        split.num_rows,
        len({s.uri for part in split.parts for s in part}),
    )
    return ParquetSlices(split)


def _check_hashable(schema) -> None:
    """Rows are dealt to ranks by a hash of their values: say which column Spark cannot hash."""
    for field in schema.fields:
        bad = partitioning.unkeyable_part(field.dataType, hashing=True)
        if bad:
            raise ConfigurationError(
                f"run_with_data: column {field.name!r} holds {bad} values, which Spark can neither "
                "hash nor order, so its rows cannot be dealt to ranks. Convert it first (e.g. "
                f"F.to_json({field.name!r})) or drop it, and decode it in the rank if needed."
            )


def spark_shards(df, world: int, seed: int = 0, per_task: int = 1, replicas: Optional[int] = None):
    """``df`` as ``world`` partitions, partition r holding rank r's shard (lazy but for the job that
    counts the rows). The ranks exchange their row counts at the rendezvous.

    ``per_task`` > 1 (a task runs several ranks): ``world / per_task`` partitions, task t holding
    the shards of ranks ``t*per_task ...`` with each row's rank in ``partitioning.GROUP_COL``, so
    the shards are the same rows as with one rank per task.  ``replicas``: see the module docstring.
    """
    _check_hashable(df.schema)
    cols = df.columns
    shards = replicas or world
    spec = partitioning.SplitSpec(
        num_groups=shards, seed=seed, names={"num_groups": "replicas" if replicas else "np"}
    )
    grouped, n = partitioning.balanced_groups(df, spec, cols)
    if n < shards:
        raise _too_few_rows(n, shards)
    if replicas:
        return _replicated(grouped, cols, world, replicas, per_task)
    log.info("run_with_data: %d rows dealt to %d ranks (%d or %d each)", n, world, n // world, -(-n // world))
    if per_task == 1:
        return grouped.select(*cols)
    from pyspark.sql import functions as F

    task = (F.col(partitioning.GROUP_COL) / per_task).cast("int")
    return grouped.select(*cols, partitioning.GROUP_COL).repartitionById(world // per_task, task)


def _replicated(grouped, cols, world: int, replicas: int, per_task: int):
    """Shard g (``GROUP_COL``) copied to ranks ``g*per .. g*per + per - 1`` (per = world /
    replicas), partition r holding rank r's rows (task t the ranks of its ``per_task``), each in the
    order of the rows' keys: the ranks of a replica read the same rows in the same order."""
    from pyspark.sql import functions as F

    per = world // replicas
    g = F.col(partitioning.GROUP_COL)
    rank = "__sd_rank"
    copies = grouped.select(
        *cols, partitioning.KEY_COL, F.explode(F.sequence(g * per, g * per + per - 1)).alias(rank)
    )
    order = [rank, partitioning.KEY_COL, *partitioning.orderable(copies, cols)]
    if per_task == 1:
        return copies.repartitionById(world, F.col(rank)).sortWithinPartitions(*order).select(*cols)
    task = (F.col(rank) / per_task).cast("int")
    out = copies.repartitionById(world // per_task, task).sortWithinPartitions(*order)
    return out.select(*cols, F.col(rank).cast("int").alias(partitioning.GROUP_COL))
