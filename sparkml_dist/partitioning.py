"""The shared split: rows of a DataFrame -> K groups, each group's rows in one task.  [driver]

Modes (``sampling``):

* ``disjoint``  every row lands in exactly one group (``sample_ratio`` < 1 keeps that share of it);
  :func:`balanced_groups` deals them so group sizes differ by at most one row;
* ``bootstrap`` each row appears Poisson(``sample_ratio``) times in every group (sampling with
  replacement, as in random forests);
* ``subsample`` each row appears in each group with probability ``sample_ratio`` (without
  replacement).

Assignment is a pure function of the seed and the row's *content*: a 64-bit key
``xxhash64(seed, *key_cols)`` is computed in Spark SQL, and each group's draw is another hash of that
key.  The same seed and the same rows give the same groups however the input is partitioned, on
every retry and every cluster shape.  Group ``g`` is then moved to partition ``g`` exactly with
``repartitionById`` (DataFrame API only, so it runs on Spark Connect too).  Inside a group, rows are
ordered by key (ties broken by content) with :func:`order_rows` before fitting.

Optional column subsets (``feature_ratio`` < 1, the random-subspace / vertical split) are drawn once
on the driver with :func:`feature_subsets`.

Example::

    spec = SplitSpec(num_groups=8, sampling="bootstrap", sample_ratio=0.5, seed=42)
    grouped = assign_groups(df, spec, key_cols=["features", "label"])
    stats = group_stats(grouped, spec.num_groups)      # one Spark job
    check_groups(stats, spec, bytes_per_row=8 * 12, budget_bytes=_spark_env.task_memory_budget(spark))
    print(stats.summary())                             # "8 groups, rows min/median/max = ..."
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence

import numpy as np

from . import spark_compat
from .errors import ConfigurationError
from .group_rows import GROUP_COL, KEY_COL, draw_seeds, order_rows  # noqa: F401 - the split's columns

log = logging.getLogger(__name__)

SAMPLING_MODES = ("disjoint", "bootstrap", "subsample")
MAX_GROUPS = 10_000  # each group is a partition and a member: more would swamp the driver
_U53 = 9007199254740992.0  # 2**53: uniform doubles from the top 53 bits of a 64-bit hash


def check_ratio(name: str, value: float) -> float:
    """``value`` must be a number in (0, 1]; the error names the parameter."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigurationError(f"{name} must be a number in (0, 1], got {value!r}") from None
    if not (0.0 < v <= 1.0) or math.isnan(v):
        raise ConfigurationError(f"{name} must be in (0, 1], got {value!r}")
    return v


@dataclass(frozen=True)
class SplitSpec:
    """How to split rows (and columns) into groups.  Plain values: safe to ship to executors."""

    num_groups: int
    sampling: str = "disjoint"
    sample_ratio: float = 1.0
    feature_ratio: float = 1.0
    seed: int = 0
    names: Mapping[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        n = self.names.get
        if (
            not isinstance(self.num_groups, (int, np.integer))
            or isinstance(self.num_groups, bool)
            or self.num_groups < 1
        ):
            raise ConfigurationError(
                f"{n('num_groups', 'num_groups')} must be an integer >= 1, got {self.num_groups!r}"
            )
        if self.num_groups > MAX_GROUPS:
            raise ConfigurationError(
                f"{n('num_groups', 'num_groups')}={self.num_groups} is above {MAX_GROUPS}: every group "
                "is a Spark partition and a model the driver keeps. Use fewer, larger groups."
            )
        if self.sampling not in SAMPLING_MODES:
            raise ConfigurationError(
                f"{n('sampling', 'sampling')} must be one of {', '.join(SAMPLING_MODES)}; "
                f"got {self.sampling!r}"
            )
        check_ratio(n("sample_ratio", "sample_ratio"), self.sample_ratio)
        check_ratio(n("feature_ratio", "feature_ratio"), self.feature_ratio)


# --------------------------------------------------------------------------- SQL expressions
def _uniform(key: str, salt: str) -> str:
    return f"(shiftrightunsigned(xxhash64({key}, {salt}), 11) / {_U53!r})"


def _poisson_count(u: str, lam: float) -> str:
    """Inverse-CDF Poisson(lam) draw from uniform ``u``, as a sum of threshold tests."""
    terms, p, cum, k = [], math.exp(-lam), 0.0, 0
    while True:
        cum += p
        if 1.0 - cum < 1e-12 or k > 60:
            break
        terms.append(f"CAST({u} >= {cum!r} AS INT)")
        k += 1
        p *= lam / k
    return "(" + " + ".join(terms) + ")" if terms else "0"


def membership_sql(spec: SplitSpec, key: str = KEY_COL) -> str:
    """SQL for the array of group ids a row belongs to (with repeats for bootstrap copies)."""
    k, r = spec.num_groups, float(spec.sample_ratio)
    if spec.sampling == "disjoint":
        one = f"array(CAST(pmod({key}, {k}) AS INT))"
        return one if r >= 1.0 else f"CASE WHEN {_uniform(key, '-1')} < {r!r} THEN {one} ELSE array() END"
    if spec.sampling == "subsample":
        return f"filter(sequence(0, {k - 1}), g -> {_uniform(key, 'g')} < {r!r})"
    return (
        f"flatten(transform(sequence(0, {k - 1}), "
        f"g -> array_repeat(g, {_poisson_count(_uniform(key, 'g'), r)})))"
    )


def row_keys(df, seed: int, key_cols: Sequence[str]):
    """``df`` plus ``KEY_COL``: the 64-bit key ``xxhash64(seed, *key_cols)`` of each row, the one
    row key of the package (groups, the order of a group's rows, the out-of-bag draw).  Lazy."""
    from pyspark.sql import functions as F

    if not key_cols:
        raise ConfigurationError("key_cols must name at least one column to derive row keys from")
    return df.withColumn(KEY_COL, F.xxhash64(F.lit(int(seed)), *[F.col(c) for c in key_cols]))


def hashable_columns(df) -> List[str]:
    """The columns of ``df`` a row key can be computed from (all but maps and variants)."""
    return [c for c in df.columns if not unkeyable_part(df.schema[c].dataType, hashing=True)]


def assign_groups(df, spec: SplitSpec, key_cols: Sequence[str]):
    """``df`` plus ``KEY_COL`` (long) and ``GROUP_COL`` (int), one row per (row, group, copy),
    with group ``g`` in partition ``g``.  Lazy: starts no Spark job."""
    from pyspark.sql import functions as F

    keyed = row_keys(df, spec.seed, key_cols)
    exploded = keyed.withColumn(GROUP_COL, F.explode(F.expr(membership_sql(spec))))
    return spark_compat.repartition_by_id(exploded, spec.num_groups, GROUP_COL)


# --------------------------------------------------------------------------- drawn on the driver
def feature_subsets(n_features: int, spec: SplitSpec) -> List[np.ndarray]:
    """Sorted column indices per group: all columns, or ``ceil(feature_ratio * n)`` drawn per group."""
    if spec.feature_ratio >= 1.0:
        return [np.arange(n_features) for _ in range(spec.num_groups)]
    size = max(1, int(math.ceil(spec.feature_ratio * n_features)))
    rng = np.random.default_rng([int(spec.seed) & 0xFFFFFFFF, 1])
    return [np.sort(rng.choice(n_features, size=size, replace=False)) for _ in range(spec.num_groups)]


def group_seeds(spec: SplitSpec) -> List[int]:
    """One seed per group for the member's own randomness (e.g. ``random_state``), drawn once."""
    return [int(s) for s in draw_seeds(spec.seed, spec.num_groups)]


# --------------------------------------------------------------------------- checks
@dataclass
class GroupStats:
    """Rows per group (and any extra per-group aggregates) from one Spark job."""

    num_groups: int
    rows: Dict[int, int]
    extras: Dict[int, dict] = field(default_factory=dict)

    def counts(self) -> np.ndarray:
        return np.array([self.rows.get(g, 0) for g in range(self.num_groups)], dtype=np.int64)

    def summary(self) -> str:
        c = self.counts()
        return (
            f"{self.num_groups} groups, rows min/median/max = "
            f"{int(c.min())}/{int(np.median(c))}/{int(c.max())} (total {int(c.sum())})"
        )


def group_stats(grouped, num_groups: int, extra_aggs: Optional[Mapping[str, object]] = None) -> GroupStats:
    """Count rows per group (0..num_groups-1), plus ``extra_aggs`` ({name: aggregate Column}), in one
    Spark job."""
    from pyspark.sql import functions as F

    aggs = [F.count(F.lit(1)).alias("__rows")]
    aggs += [col.alias(name) for name, col in (extra_aggs or {}).items()]
    rows, extras = {}, {}
    for r in grouped.groupBy(GROUP_COL).agg(*aggs).collect():
        d = r.asDict()
        g = int(d.pop(GROUP_COL))
        rows[g] = int(d.pop("__rows"))
        extras[g] = d
    return GroupStats(num_groups=num_groups, rows=rows, extras=extras)


def check_groups(stats: GroupStats, spec: SplitSpec, *, bytes_per_row: float, budget_bytes: int) -> None:
    """No empty group, and no group larger than one task can hold."""
    n = spec.names.get
    counts = stats.counts()
    empty = [g for g in range(spec.num_groups) if counts[g] == 0]
    if empty:
        shown = ", ".join(map(str, empty[:10])) + (" ..." if len(empty) > 10 else "")
        raise ConfigurationError(
            f"{len(empty)} of {spec.num_groups} groups received no rows (groups {shown}); "
            f"{int(counts.sum())} rows were assigned in all. Lower {n('num_groups', 'num_groups')} "
            f"or raise {n('sample_ratio', 'sample_ratio')}."
        )
    biggest = int(counts.argmax())
    need = float(counts[biggest]) * bytes_per_row
    if need > budget_bytes:
        raise ConfigurationError(
            f"group {biggest} has {int(counts[biggest])} rows, about {need / 2**30:.2f} GiB in memory, "
            f"more than one task can hold ({budget_bytes / 2**30:.2f} GiB). Raise "
            f"{n('num_groups', 'num_groups')} or lower {n('sample_ratio', 'sample_ratio')}/"
            f"{n('feature_ratio', 'feature_ratio')}, or give Python workers more memory with "
            "spark.executor.pyspark.memory."
        )
    log.debug("split: %s", stats.summary())


_BUCKETS = 1024  # hash buckets counted to place every row's position (balanced_groups)
BUCKET_COL = "__sd_bucket"


def bucket_counts(df, seed: int, key_cols: Sequence[str], extra_aggs: Optional[Mapping[str, object]] = None):
    """``(keyed, counts, extras)``: ``df`` with ``KEY_COL`` and its bucket ``BUCKET_COL`` (the key
    mod 1024), the rows of each bucket (an array of 1024) and ``extra_aggs`` per bucket, from one
    Spark job.  The rows in the order (bucket, key, content) are the package's one order of rows:
    a bucket's offset is the count of the buckets before it."""
    from pyspark.sql import functions as F

    keyed = row_keys(df, seed, key_cols).withColumn(
        BUCKET_COL, F.pmod(F.col(KEY_COL), F.lit(_BUCKETS)).cast("int")
    )
    aggs = [F.count(F.lit(1)).alias("__rows")] + [c.alias(name) for name, c in (extra_aggs or {}).items()]
    counts, extras = np.zeros(_BUCKETS, dtype=np.int64), {}
    for r in keyed.groupBy(BUCKET_COL).agg(*aggs).collect():
        d = r.asDict()
        b = int(d.pop(BUCKET_COL))
        counts[b] = int(d.pop("__rows"))
        extras[b] = d
    return keyed, counts, extras


def unkeyable_part(dtype, *, hashing: bool = False) -> str:
    """The part of a Spark type that rows cannot be sorted by ('' when none): maps, variants and
    user-defined types, also inside arrays and structs.  ``hashing``: what ``xxhash64`` cannot
    hash instead (a UDT hashes as its underlying SQL type)."""
    from pyspark.sql import types as T

    if isinstance(dtype, T.MapType) or type(dtype).__name__ == "VariantType":
        return dtype.simpleString()
    if isinstance(dtype, T.UserDefinedType) and not hashing:
        return dtype.simpleString()
    if isinstance(dtype, T.ArrayType):
        return unkeyable_part(dtype.elementType, hashing=hashing)
    if isinstance(dtype, T.StructType):
        return next((u for f in dtype.fields for u in [unkeyable_part(f.dataType, hashing=hashing)] if u), "")
    return ""


def orderable(df, key_cols: Sequence[str]) -> List[str]:
    """The key columns Spark can sort by."""
    types = {f.name: f.dataType for f in df.schema.fields}
    return [c for c in key_cols if c in types and not unkeyable_part(types[c])]


def balanced_groups(df, spec: SplitSpec, key_cols: Sequence[str]):
    """Disjoint groups of exactly balanced sizes: ``(grouped, n)``, as :func:`assign_groups` returns
    ``grouped`` (``KEY_COL``, ``GROUP_COL``, group ``g`` in partition ``g``) and ``n`` the rows kept.

    Rows are put in one order by their key ``xxhash64(seed, *key_cols)`` (ties, i.e. equal rows,
    by content) and dealt round-robin, so group sizes differ by at most one row (``floor(n/K)`` or
    ``ceil(n/K)``) whatever the rows: duplicates spread over the groups instead of piling into one.
    ``sample_ratio`` < 1 keeps the first ``round(ratio * n)`` rows of that order (a uniform draw).
    The order depends on the rows and the seed only, never on the input's partitioning.

    Scales out: one Spark job counts the rows of 1024 key buckets, each bucket is numbered by a
    window over that bucket alone, and the counts turn bucket positions into global ones.
    """
    grouped, stats = deal(df, spec, key_cols)
    return grouped, int(stats.counts().sum())


def deal(df, spec: SplitSpec, key_cols: Sequence[str], extra_aggs: Optional[Mapping[str, object]] = None):
    """:func:`balanced_groups` as ``(grouped, stats)``: the one counting job also computes
    ``extra_aggs`` ({name: aggregate Column} over the input's rows, per key bucket: sums, minima,
    sets add up across buckets as across groups), and the group sizes follow from the deal, so
    no job counts the groups again."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if spec.sampling != "disjoint":
        raise ConfigurationError(f"balanced_groups deals disjoint groups, not {spec.sampling!r} ones")
    keyed, counts, extras = bucket_counts(df, spec.seed, key_cols, extra_aggs)
    bucket = BUCKET_COL
    offsets = np.concatenate([[0], np.cumsum(counts)])
    n = int(offsets[-1])
    keep = n if spec.sample_ratio >= 1.0 else int(round(float(spec.sample_ratio) * n))
    order = Window.partitionBy(bucket).orderBy(KEY_COL, *[F.col(c) for c in orderable(df, key_cols)])
    # one SQL literal (one call to the JVM, not one per bucket as F.lit(list) would make)
    starts = F.expr("array(" + ", ".join(f"{int(o)}L" for o in offsets[:-1]) + ")")
    position = F.element_at(starts, F.col(bucket) + 1) + F.row_number().over(order)
    placed = keyed.withColumn("__sd_pos", position - 1)
    if keep < n:
        placed = placed.where(F.col("__sd_pos") < keep)
    dealt = placed.withColumn(GROUP_COL, F.pmod(F.col("__sd_pos"), F.lit(spec.num_groups)).cast("int"))
    k = spec.num_groups
    rows = {g: keep // k + (1 if g < keep % k else 0) for g in range(k) if keep // k or g < keep % k}
    stats = GroupStats(num_groups=k, rows=rows, extras=extras)
    return spark_compat.repartition_by_id(dealt.drop(bucket, "__sd_pos"), k, GROUP_COL), stats


PART_COL = "__sd_part"


def assign_keys(df, key_col: str, key_table, num_parts: int):
    """Rows grouped by the value of ``key_col``: ``GROUP_COL`` = the key's index in ``key_table``.

    ``key_table`` is a small DataFrame of ``(key_col, GROUP_COL, PART_COL)``: each key's group and
    the partition its rows go to (runs of consecutive keys, see
    :func:`sparkml_dist.ensemble.engine.groups.by_key`); rows whose key is not in it are dropped (the
    caller decided to skip those keys).  Each partition is sorted by group, so a task sees its keys
    one after another, in key order, each key's rows in their order (by ``KEY_COL``), and can fit
    them one at a time.  Lazy: starts no Spark job.
    """
    from pyspark.sql import functions as F

    joined = df.join(F.broadcast(key_table), on=key_col, how="inner")
    return (
        spark_compat.repartition_by_id(joined, int(num_parts), PART_COL)
        .drop(PART_COL)
        .sortWithinPartitions(GROUP_COL, KEY_COL)  # a group's rows in their order already
    )
