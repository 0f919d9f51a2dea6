"""Where a run's rows come from, as the driver tells each task: the data room's spec.  [anywhere]

Built on the driver (:mod:`.sharding`) and carried in the task's
:class:`~sparkml_dist.runner.task_spec.TaskSpec` (its ``data``), read by the task's data phase
(:mod:`.feeding`): plain values only.  The rows are cut into *streams*
(:mod:`.sample_order`) dealt to the data ranks; they reach the ranks through Spark
(:class:`SparkRows`) or straight from a Parquet scan's files (:class:`ParquetSlices`).

Example::

    SparkRows(Streams(sizes=(50, 50), data_world=2)).streams.of(1)   # the streams rank 1 reads
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple, Union

from . import parquet_split
from .sample_order import rank_streams


@dataclass(frozen=True)
class Streams:
    """The rows cut into ``len(sizes)`` streams (:mod:`.data.sample_order`), dealt to ``data_world``
    data ranks; ``per_data_rank`` ranks share one data rank's streams (a pipeline's stages), so
    rank ``r`` is data rank ``r // per_data_rank``."""

    sizes: Tuple[int, ...]
    data_world: int
    per_data_rank: int = 1

    def data_rank(self, rank: int) -> int:
        return rank // self.per_data_rank

    def of(self, rank: int) -> Tuple[int, ...]:
        """The streams rank ``rank`` reads (none past the data ranks': a reduction server's)."""
        data_rank = self.data_rank(rank)
        if data_rank >= self.data_world:
            return ()
        return rank_streams(data_rank, self.data_world, len(self.sizes))


@dataclass(frozen=True)
class SparkRows:
    """The ranks' rows move through Spark: each task's partition holds its ranks' streams, each row
    with its stream in ``GROUP_COL``, sorted by stream, then by the rows' keys."""

    streams: Streams
    source = "Spark"


@dataclass(frozen=True)
class ParquetSlices:
    """Each rank reads its own streams of a plain Parquet scan's files (``split.parts[c]`` is
    stream ``c``): no Spark shuffle, no local copy."""

    split: parquet_split.ParquetSplit
    streams: Streams
    source = "its Parquet row ranges"


Data = Optional[Union[SparkRows, ParquetSlices]]  # a TaskSpec's ``data``: None, the function has none
