"""How ``run_with_data`` turns a DataFrame into the ranks' streams.  [driver]

The rows are cut into ``S`` *streams* (``streams=``, default the number of data ranks; see
:mod:`sparkml_dist.runner.data.sample_order`), which depend on the data and the seed only, and rank
``r`` of ``D`` data ranks holds streams ``r, r + D, ...``.  Two ways, decided before launching:

* a plain Parquet scan is read straight from its files by the ranks themselves
  (:func:`.parquet_split.split_files`: ``S`` contiguous row ranges whose sizes differ by at most
  one row): no Spark job moves the rows, no local copy is made; any other DataFrame is first
  written once as Parquet files (:mod:`.staging`) and read the same way;
* with ``read_files=False`` (or no staging directory on a cluster) the rows move through Spark:
  they are dealt to streams as contiguous ranges of the package's one order of rows
  (:func:`sparkml_dist.runner.data.range_deal.ranges`: a job counts the rows per key bucket, one shuffle moves
  them; sizes differ by at most one row whatever the rows, duplicates included; the same rows and
  seed give the same streams however the input is partitioned), each task's partition holding its
  ranks' streams in that order, which the task spills to its ranks' local disk.

With ``replicas=D`` (pipelines: every rank of a replica must read the same rows in the same order)
there are ``D`` data ranks and rank r is data rank ``r // (np / D)``, as
``parallel.pipeline(..., data_parallel=D)`` lays out its ranks.
"""

from __future__ import annotations

import logging
from typing import Dict, Optional, Tuple

from ... import partitioning
from ...errors import ConfigurationError
from ...vectors import MAX_DENSE_VECTOR
from . import parquet_split, range_deal
from .sample_order import check_streams
from .spec import ParquetSlices, SparkRows, Streams

log = logging.getLogger(__name__)


def _too_few_rows(n: int, streams: int, named: bool) -> ConfigurationError:
    parts = f"run_with_data(streams={streams})" if named else f"np={streams} ranks"
    return ConfigurationError(
        f"the DataFrame has {n} rows, fewer than {parts}; every rank (every stream) needs at "
        "least one row. Lower np (or streams) or add data."
    )


def layout(world: int, replicas: Optional[int], streams: Optional[int]) -> Tuple[int, int, int]:
    """(data ranks, ranks per data rank, streams), checked."""
    data_world = replicas or world
    count = streams or data_world
    check_streams(count, data_world)
    return data_world, world // data_world, count


def file_split(df, world: int, replicas: Optional[int] = None, streams: Optional[int] = None, widths=None):
    """``(the streams of df's Parquet files, "")``, or ``(None, why df is not read from files)``;
    ``widths``: each vector column's width (:func:`vector_widths`), which every row read must have."""
    data_world, per, count = layout(world, replicas, streams)
    split, why = parquet_split.split_files(df, count, widths)
    if split is None:
        return None, why
    if split.num_rows < count:
        raise _too_few_rows(split.num_rows, count, streams is not None)
    log.info(
        "run_with_data: %d ranks read %d rows (%d streams) straight from %d Parquet files",
        world,
        split.num_rows,
        count,
        len({s.uri for part in split.parts for s in part}),
    )
    return ParquetSlices(split, Streams(tuple(split.rows), data_world, per)), ""


def vector_widths(df) -> Dict[str, int]:
    """Each Spark ML vector column's width: the one Spark ML's stages declare in the column's
    metadata (``ml_attr``), else that of the first rows (a small job: it computes them). A vector
    wider than :data:`~sparkml_dist.MAX_DENSE_VECTOR` entries is refused on the
    driver, naming the column and what to do."""
    from ...feature_arrays import vector_shape

    widths = {}
    for field in df.schema.fields:
        if field.dataType.simpleString() != "vector":
            continue
        name = field.name
        width = declared_width(field)
        if width is None:
            width, _ = vector_shape(df, name, sample=20)
        if width > MAX_DENSE_VECTOR:
            raise ConfigurationError(
                f"run_with_data: column {name!r} holds vectors of {width} entries, which each rank would "
                f"get dense ({width * 8 / 2**20:.1f} MiB per row): reduce the width (HashingTF's "
                "numFeatures, a feature selector), or select only the columns the function needs"
            )
        widths[name] = width
    return widths


def rank_columns(df, widths: Dict[str, int]):
    """``df`` as the ranks read it: its Spark ML vector columns (``widths``' keys:
    ``VectorAssembler``, ``OneHotEncoder``, ``HashingTF``) as arrays of doubles (``vector_to_array``,
    dense and sparse alike), so a rank's ``to_numpy`` / ``dataloader`` get an (n, d) array."""
    if not widths:
        return df
    return df.withColumns({name: vector_arrays(name) for name in widths})


def declared_width(field) -> Optional[int]:
    """The entries of a vector column as ``VectorAssembler``, ``HashingTF``, ``OneHotEncoder``...
    declare them (``metadata["ml_attr"]["num_attrs"]``), or None."""
    attr = (field.metadata or {}).get("ml_attr")
    n = attr.get("num_attrs") if isinstance(attr, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None


def vector_arrays(name: str):
    """``vector_to_array(name)`` that keeps a null vector null (Spark's fails the job on one), as
    the files' reader does (:func:`sparkml_dist.runner.data.parquet_split.vector_lists`)."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F

    return F.when(F.col(name).isNotNull(), vector_to_array(name))


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


def spark_shards(
    df,
    world: int,
    seed: int = 0,
    per_task: int = 1,
    replicas: Optional[int] = None,
    streams: Optional[int] = None,
    readers: Optional[int] = None,
):
    """``(SparkRows, rows)``: ``rows`` has ``world / per_task`` partitions, task t's holding the
    streams of its ranks (``t*per_task ...``), each row with its stream in ``GROUP_COL``, sorted by
    stream then by the rows' keys; a stream several tasks read (replicas) is copied to each; the
    ranks from ``readers`` on (reduction servers) read none.  The
    streams are contiguous ranges of the rows' one order (:func:`sparkml_dist.runner.data.range_deal.ranges`):
    one job counts the rows, one shuffle moves them.  Lazy but for that job."""
    _check_hashable(df.schema)
    data_world, per, count = layout(readers or world, replicas, streams)
    of = Streams((0,) * count, data_world, per).of
    tasks = world // per_task
    readers = [sorted({r // per_task for r in range(world) if c in of(r)}) for c in range(count)]
    rows, sizes = range_deal.ranges(df, seed, df.columns, count, readers, tasks)
    if rows is None:
        raise _too_few_rows(sum(sizes), count, streams is not None)
    log.info("run_with_data: %d rows dealt to %d streams of %d ranks", sum(sizes), count, world)
    return SparkRows(Streams(sizes, data_world, per)), rows
