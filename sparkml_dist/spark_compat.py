"""What differs between the pyspark releases this package supports (4.0 to 4.3), in one place.  [anywhere]

pyspark 4.0 (Databricks' current long-term-support runtime) lacks two APIs that 4.1 added; each
function here uses the API where it exists and otherwise a fallback with the same result, chosen
by looking for the API (never by version numbers):

* :func:`repartition_by_id` - ``DataFrame.repartitionById`` (4.1), else a hash repartition on a
  key chosen per partition with Spark's own Murmur3 (:func:`partition_keys`): the same placement;
* :func:`arrow_udf` - ``functions.arrow_udf`` (4.1), else a pandas UDF around the same Arrow
  function (Spark ML vectors handed over as their storage struct, as ``arrow_udf`` does).

The tests marked ``oldest`` run on pyspark 4.0 in a pass of their own (``make test-oldest``).

Example::

    grouped = repartition_by_id(df, 8, "__sd_group")     # group g in partition g, on 4.0 too
"""

from __future__ import annotations

from typing import List, Optional


def _murmur3_long(value: int, seed: int = 42) -> int:
    """Spark's ``hash()`` of a bigint (Murmur3_x86_32.hashLong, seed 42): what its hash
    partitioning puts a row's partition from."""
    m = 0xFFFFFFFF

    def mix_k1(k1):
        k1 = (k1 * 0xCC9E2D51) & m
        k1 = ((k1 << 15) | (k1 >> 17)) & m
        return (k1 * 0x1B873593) & m

    def mix_h1(h1, k1):
        h1 ^= k1
        h1 = ((h1 << 13) | (h1 >> 19)) & m
        return (h1 * 5 + 0xE6546B64) & m

    value &= 0xFFFFFFFFFFFFFFFF
    h1 = mix_h1(seed & m, mix_k1(value & m))
    h1 = mix_h1(h1, mix_k1(value >> 32))
    h1 ^= 8
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & m
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & m
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


_PARTITION_KEYS: dict = {}


def partition_keys(n: int) -> List[int]:
    """``keys[p]``: a bigint that Spark's hash partitioning into ``n`` partitions sends to ``p``."""
    if n not in _PARTITION_KEYS:
        keys: List[Optional[int]] = [None] * n
        left, value = n, 0
        while left:
            p = _murmur3_long(value) % n
            if keys[p] is None:
                keys[p], left = value, left - 1
            value += 1
        _PARTITION_KEYS[n] = keys
    return _PARTITION_KEYS[n]


def repartition_by_id(df, n: int, column: str):
    """``df.repartitionById(n, column)`` (rows whose ``column`` is ``p`` in partition ``p``): the
    API itself from pyspark 4.1; on 4.0 a hash repartition on a key chosen per partition so that it
    hashes to that partition (:func:`partition_keys`), with the same placement."""
    if hasattr(df, "repartitionById"):
        return df.repartitionById(n, column)
    return repartition_by_hash_key(df, n, column)


def repartition_by_hash_key(df, n: int, column: str):
    """:func:`repartition_by_id` as pyspark 4.0 can: a hash repartition on a per-partition key."""
    from pyspark.sql import functions as F

    keys = F.expr("array(" + ", ".join(f"{k}L" for k in partition_keys(n)) + ")")
    place = "__sd_partition_key"
    key = F.element_at(keys, F.col(column).cast("int") + 1)
    return df.withColumn(place, key).repartition(n, place).drop(place)


def arrow_udf(fn, return_type: str):
    """``pyspark.sql.functions.arrow_udf(fn, return_type)`` (Arrow arrays in, an Arrow array out):
    the API itself from pyspark 4.1; on 4.0 a pandas UDF around ``fn`` with the same result."""
    from pyspark.sql import functions as F

    if hasattr(F, "arrow_udf"):
        return F.arrow_udf(fn, return_type)
    import pyarrow as pa

    def through_pandas(*series):
        out = fn(*[_from_pandas(s) for s in series])
        if pa.types.is_struct(out.type):
            import pandas as pd

            return pd.DataFrame({f.name: _to_pandas(out.field(f.name)) for f in out.type})
        return _to_pandas(out)

    return F.pandas_udf(through_pandas, return_type)


def _from_pandas(series):
    """A pandas UDF's input column as Arrow; a struct (a Spark ML vector's storage, as pandas UDFs
    hand it over: a DataFrame of its fields) as the struct array arrow_udf would give."""
    import pandas as pd
    import pyarrow as pa

    if not isinstance(series, pd.DataFrame):
        return pa.Array.from_pandas(series)
    kinds = {"type": pa.int8(), "size": pa.int32(), "indices": pa.list_(pa.int32())}
    fields = [
        pa.Array.from_pandas(series[c], type=kinds.get(c)) if c in kinds else pa.Array.from_pandas(series[c])
        for c in series.columns
    ]
    return pa.StructArray.from_arrays(fields, names=[str(c) for c in series.columns])


def _to_pandas(arr):
    import pandas as pd

    if hasattr(arr.type, "value_type"):  # lists: one numpy array per row, as pandas UDFs return them
        return pd.Series(list(arr.to_numpy(zero_copy_only=False)))
    return arr.to_pandas()
