"""The distinct keys of a column, counted in one job, and the table that joins them back.  [driver]

:func:`count_keys` is the first job of every fit by key (:class:`GroupedTrainer`,
``train_per_group(group_col=...)``): each distinct value's rows and the data checks' aggregates,
collected as Arrow and kept as Arrow (10^6 keys are a few arrays, not a million Python objects).
The keys never leave Spark's types on their way back into the job: :func:`key_table` builds the
small DataFrame joined back to the rows from that Arrow table, so a timestamp in a
daylight-saving zone, a float, an array or a struct key finds every one of its rows.  Null keys,
keys Python cannot hold (a string that is not UTF-8) and keys Python cannot tell apart are refused
by name.

Example::

    counts = count_keys(df, "store", {"nulls": F.sum(F.col("y").isNull().cast("int"))})
    counts.n, counts.rows[:5], counts.extra("nulls"), counts.key(0)
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Sequence

import numpy as np
import pyarrow as pa

from ... import launch, partitioning
from ...errors import ConfigurationError
from ...group_rows import GROUP_COL, hashable, key_fold

ROWS = "__rows"
_INJECTIVE = ("binary", "large_binary", "bool", "date32[day]")


@dataclass
class KeyCounts:
    """What one job found about a key column: ``arrow`` (the distinct keys in Spark's order, their
    rows as ``ROWS`` and the data checks' aggregates), ``rows`` (numpy)."""

    key_col: str
    arrow: pa.Table
    rows: np.ndarray
    fold: Optional[str] = None  # the key text's collation, when not byte for byte (group_rows.key_fold)

    @property
    def n(self) -> int:
        return self.arrow.num_rows

    @property
    def keys(self) -> pa.Array:
        """The keys in their Spark type (Arrow), in index order."""
        return self.arrow.column(self.key_col).combine_chunks()

    def key(self, i: int) -> Any:
        """Key ``i`` as Python holds it."""
        return hashable(self.keys[int(i)].as_py())

    def python_keys(self, indices: Optional[Sequence[int]] = None) -> List[Any]:
        keys = self.keys if indices is None else self.keys.take(pa.array(indices, pa.int64()))
        return [hashable(k) for k in keys.to_pylist()]

    def extra(self, name: str) -> np.ndarray:
        return self.arrow.column(name).to_numpy(zero_copy_only=False)


def count_keys(df, key_col: str, extra_aggs: Optional[Mapping[str, Any]] = None, param: str = "groupCol"):
    """One job: the rows (and ``extra_aggs``) of each distinct value of ``key_col``, as
    :class:`KeyCounts`; null keys, and keys Python cannot hold or tell apart, refused by name."""
    from pyspark.sql import functions as F

    if key_col not in df.columns:
        raise ConfigurationError(f"{param}={key_col!r} is not a column; the DataFrame has {df.columns}")
    bad = partitioning.unkeyable_part(df.schema[key_col].dataType)
    if bad:
        raise ConfigurationError(
            f"{param}={key_col!r} is {bad}, which Spark cannot group by; derive a key column from it"
        )
    fold = key_fold(df.schema[key_col].dataType, key_col, param)
    aggs = [F.count(F.lit(1)).alias(ROWS)] + [c.alias(n) for n, c in (extra_aggs or {}).items()]
    with launch.job_scope(launch.session_of(df), f"sparkml_dist: counting rows per {key_col}"):
        counted = df.groupBy(key_col).agg(*aggs).orderBy(key_col).toArrow()
    _check_keys(counted, key_col, param)
    return KeyCounts(key_col, counted, counted.column(ROWS).to_numpy().astype(np.int64), fold)


def _check_keys(counted: pa.Table, key_col: str, param: str) -> None:
    """A null key, a key Python cannot hold, or two keys Python cannot tell apart, refused by name."""
    if not counted.num_rows:
        raise ConfigurationError("the input DataFrame is empty; there is nothing to train")
    column = counted.column(key_col).combine_chunks()
    if column.null_count:
        valid = column.is_valid().to_numpy(zero_copy_only=False)
        nulls = int(counted.column(ROWS).to_numpy()[~valid].sum())
        raise ConfigurationError(
            f"{param}={key_col!r} is null in {nulls} rows: fill them or filter them out "
            f"(df.na.drop(subset=[{key_col!r}])); a null key gets no model"
        )
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        try:
            column.validate(full=True)
        except pa.ArrowInvalid:
            raw = next(v for v in column.cast(pa.large_binary()).to_pylist() if not _utf8(v))
            raise ConfigurationError(
                f"{param}={key_col!r}: the key {raw!r} is not valid UTF-8 text, so it cannot name a "
                f"group; make the key column plain text or bytes first (e.g. F.hex({key_col!r}) or "
                f"F.col({key_col!r}).cast('binary'))"
            ) from None
        return  # valid text: distinct in Python as in Spark
    if pa.types.is_integer(column.type) or str(column.type) in _INJECTIVE:
        return  # Python holds each of these as a distinct value
    keys = [hashable(k) for k in column.to_pylist()]
    same = [k for k, n in Counter(keys).items() if n > 1]
    if same:
        raise ConfigurationError(
            f"{param}={key_col!r}: distinct keys {same[:5]} become equal in Python; derive a key "
            "column that tells them apart (e.g. cast it to a string)"
        )


def _utf8(value: bytes) -> bool:
    try:
        value.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def key_table(spark, keys: pa.Array, key_col: str, key_type, extra: Optional[Mapping[str, pa.Array]] = None):
    """The small DataFrame ``(key_col, GROUP_COL, *extra)`` joined back to the rows: key ``i`` of
    ``keys`` is group ``i``; made from the counting job's own Arrow values (never from Python
    objects), in the key column's own Spark type."""
    from pyspark.sql import types as T

    columns = {key_col: keys, GROUP_COL: pa.array(np.arange(len(keys), dtype=np.int32))}
    fields = [T.StructField(key_col, key_type), T.StructField(GROUP_COL, T.IntegerType())]
    for name, values in (extra or {}).items():
        columns[name] = values
        fields.append(T.StructField(name, T.IntegerType()))
    return spark.createDataFrame(pa.table(columns), schema=T.StructType(fields))
