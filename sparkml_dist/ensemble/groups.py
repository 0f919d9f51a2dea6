"""Rows -> groups for every per-group trainer, and the fit of all groups in one job.  [driver]

The one engine under :class:`~sparkml_dist.ensemble.BaggingClassifier` /
:class:`~sparkml_dist.ensemble.BaggingRegressor`, :class:`~sparkml_dist.ensemble.GroupedTrainer`
and :func:`~sparkml_dist.ensemble.train_per_group`:

1. **Rows -> groups** (:class:`Groups`), two ways on one row key
   (:func:`sparkml_dist.partitioning.row_keys`) and one sampling description
   (:class:`~sparkml_dist.partitioning.SplitSpec`):

   * :func:`by_split`: the shared split (``disjoint`` dealt in balanced groups, ``bootstrap``,
     ``subsample``), group ``g`` in partition ``g``;
   * :func:`by_key`: one group per distinct value of a key column.  The keys never leave Spark's
     types on their way back into the job: one job counts each key's rows (and any data checks),
     collected as Arrow; the key table joined back is built from that Arrow table, so a timestamp
     in a daylight-saving zone, a float, an array or a struct key finds every one of its rows.
     Keys that Python cannot hold (a string that is not UTF-8) are refused naming the key.

2. **The fit** (:func:`fit`): :func:`sparkml_dist.ensemble._fit_groups.fit_groups` runs in every
   task (one recipe: an estimator cloned per group, or the user's function; one error policy; one
   output: collected, or written to ``membersDir`` in the one member record format), the results
   come back through the collection layer, and every group's trained rows are checked against the
   rows counted for it (a key whose rows did not all arrive fails the fit, naming it).

Example::

    groups = by_key(df, count_keys(df, "store"), ["x1", "x2", "label"], seed=0)
    fitted = fit(groups, GroupFitSpec(recipe, inputs, groups.keys), what="key", description="...")
    fitted.results[0].model
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .. import launch, partitioning, plan
from ..errors import CollectionError, ConfigurationError
from ..group_rows import GROUP_COL, KEY_COL
from . import member_store
from ._fit_groups import GroupFitSpec, fit_groups

log = logging.getLogger(__name__)


@dataclass
class Groups:
    """A DataFrame's rows dealt to groups: ``frame`` holds ``GROUP_COL``, ``KEY_COL`` and the
    columns asked for, each task's rows one group after another; group ``g`` is called
    ``keys[g]``; ``stats`` has the rows counted per group and any data checks' aggregates;
    ``small`` the keys left out for having too few rows."""

    frame: Any
    keys: Tuple[Any, ...]
    stats: partitioning.GroupStats
    small: Dict[Any, int] = field(default_factory=dict)


def by_split(
    df,
    spec: partitioning.SplitSpec,
    key_cols: Sequence[str],
    columns: Optional[Sequence[str]] = None,
    extra_aggs: Optional[Mapping[str, Any]] = None,
) -> Groups:
    """The shared split of ``df``'s rows (see :mod:`sparkml_dist.partitioning`), sizes and
    ``extra_aggs`` from one counting job."""
    spark = launch.session_of(df)
    if spec.sampling == "disjoint":  # exactly balanced groups, whatever the rows
        with launch.job_scope(spark, "sparkml_dist: dealing rows to groups, checking the data"):
            grouped, stats = partitioning.deal(df, spec, key_cols, extra_aggs)
    else:
        grouped = partitioning.assign_groups(df, spec, key_cols)
        with launch.job_scope(spark, "sparkml_dist: sizing groups, checking the data"):
            stats = partitioning.group_stats(grouped, spec.num_groups, extra_aggs)
    if columns is not None:
        grouped = grouped.select(GROUP_COL, KEY_COL, *columns)
    return Groups(grouped, tuple(range(spec.num_groups)), stats)


@dataclass
class KeyCounts:
    """What one job found about a key column: each distinct key (as Python holds it, in Spark's
    order), its rows and the data checks' aggregates, and the keys as Spark gave them (Arrow)."""

    key_col: str
    keys: List[Any]
    rows: List[int]
    extras: List[dict]
    arrow: Any  # a pyarrow Table of the one key column


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
    aggs = [F.count(F.lit(1)).alias("__rows")] + [c.alias(n) for n, c in (extra_aggs or {}).items()]
    with launch.job_scope(launch.session_of(df), f"sparkml_dist: counting rows per {key_col}"):
        counted = df.groupBy(key_col).agg(*aggs).orderBy(key_col).toArrow()
    keys, rows, extras = _keys(counted, key_col, param)
    return KeyCounts(key_col, keys, rows, extras, counted.select([key_col]))


def by_key(
    df,
    counts: KeyCounts,
    columns: Sequence[str],
    *,
    keep: Optional[Sequence[int]] = None,
    seed: int = 0,
    key_cols: Optional[Sequence[str]] = None,
    bytes_per_row: float = 64.0,
) -> Groups:
    """One group per key of ``counts`` (those at ``keep`` when given), see the module docstring.
    Rows are keyed by ``key_cols`` (default: every hashable column) for their order in a group."""
    spark = launch.session_of(df)
    kept = list(range(len(counts.keys))) if keep is None else list(keep)
    table = _key_table(spark, counts.arrow.take(kept), df.schema[counts.key_col].dataType)
    keyed = partitioning.row_keys(df, seed, key_cols or partitioning.hashable_columns(df))
    biggest = max([counts.rows[g] for g in kept] or [0])
    concurrency = plan.plan_concurrency(spark, biggest * bytes_per_row * 3)
    parts = max(1, min(len(kept), concurrency.concurrency * 4))
    grouped = partitioning.assign_keys(keyed, counts.key_col, table, parts)
    stats = partitioning.GroupStats(
        num_groups=len(kept),
        rows={i: counts.rows[g] for i, g in enumerate(kept)},
        extras={i: counts.extras[g] for i, g in enumerate(kept)},
    )
    log.info("%r: %d keys in %d tasks (%s)", counts.key_col, len(kept), parts, concurrency.summary())
    small = {counts.keys[g]: counts.rows[g] for g in set(range(len(counts.keys))) - set(kept)}
    return Groups(
        grouped.select(GROUP_COL, KEY_COL, *columns), tuple(counts.keys[g] for g in kept), stats, small
    )


def _keys(counted, key_col: str, param: str):
    """(Python keys, row counts, other aggregates) of the counting job's Arrow table; a null key,
    a key Python cannot hold, or two keys Python cannot tell apart are refused by name."""
    if not counted.num_rows:
        raise ConfigurationError("the input DataFrame is empty; there is nothing to train")
    column = counted.column(key_col)
    counts = counted.column("__rows").to_pylist()
    if column.null_count:
        nulls = sum(n for n, valid in zip(counts, column.is_valid().to_pylist()) if not valid)
        raise ConfigurationError(
            f"{param}={key_col!r} is null in {nulls} rows: fill them or filter them out "
            f"(df.na.drop(subset=[{key_col!r}])); a null key gets no model"
        )
    keys = []
    for i in range(len(column)):
        try:
            keys.append(_hashable(column[i].as_py()))
        except UnicodeDecodeError:
            raw = column.chunk(0).cast("binary")[i].as_py() if column.num_chunks == 1 else b"?"
            raise ConfigurationError(
                f"{param}={key_col!r}: the key {raw!r} is not valid UTF-8 text, so it cannot name a "
                f"group; make the key column plain text or bytes first (e.g. F.hex({key_col!r}) or "
                f"F.col({key_col!r}).cast('binary'))"
            ) from None
    same = [k for k, n in Counter(keys).items() if n > 1]
    if same:
        raise ConfigurationError(
            f"{param}={key_col!r}: distinct keys {same[:5]} become equal in Python; derive a key "
            "column that tells them apart (e.g. cast it to a string)"
        )
    rest = [c for c in counted.column_names if c not in (key_col, "__rows")]
    extras = [{c: counted.column(c)[i].as_py() for c in rest} for i in range(counted.num_rows)]
    return keys, counts, extras


def _hashable(value):
    """A key as Python holds it: lists (array keys) as tuples, dicts (struct keys) as tuples of
    their items, so every key can name a group in a dict."""
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _hashable(v)) for k, v in value.items())
    return value


def _key_table(spark, keys, key_type):
    """The small DataFrame (key, GROUP_COL) joined back to the rows, made from the counting job's
    own Arrow values (never from Python objects), in the key column's own Spark type."""
    import pyarrow as pa
    from pyspark.sql import types as T

    table = keys.append_column(GROUP_COL, pa.array(range(keys.num_rows), pa.int32()))
    name = keys.column_names[0]
    schema = T.StructType([T.StructField(name, key_type), T.StructField(GROUP_COL, T.IntegerType())])
    return spark.createDataFrame(table, schema=schema)


@dataclass
class Fitted:
    """What :func:`fit` returns: each group's result in group order (``None`` where the group was
    skipped), ``skipped`` ({key: error}), and with ``membersDir`` the committed store's metadata."""

    results: List[Any]
    skipped: Dict[Any, str]
    stored: Optional[List[dict]] = None


def fit(
    groups: Groups,
    spec: GroupFitSpec,
    *,
    what: str,
    description: str,
    profile: Any = None,
    frame: Any = None,
) -> Fitted:
    """Every group fitted by ``spec``'s recipe in one Spark job (see the module docstring);
    ``frame`` replaces ``groups.frame`` (the same rows, e.g. sorted within partitions)."""
    out = launch.run_on_groups(
        frame if frame is not None else groups.frame,
        fit_groups,
        spec,
        expected_groups=range(len(groups.keys)),
        description=description,
        profile=profile,
    )
    results = [out[(g, 0)] for g in range(len(groups.keys))]
    _check_rows(groups, results, what)
    skipped = {r.key: r.error for r in results if r.error is not None}
    if skipped:
        log.warning("%d of %d %ss skipped: %s", len(skipped), len(results), what, sorted(map(str, skipped)))
    if len(skipped) == len(results):
        raise CollectionError(f"every {what} failed; the first: {next(iter(skipped.values()))}")
    stored = None
    if spec.store is not None:
        metas = [meta for r in results if r.error is None for meta in r.stored]
        stored = member_store.commit_checked(spec.store, metas)
    return Fitted([r if r.error is None else None for r in results], skipped, stored)


def _check_rows(groups: Groups, results: List[Any], what: str) -> None:
    """Each group trained on the rows counted for it: a key that lost rows on its way is named."""
    for g, r in enumerate(results):
        counted = groups.stats.rows.get(g, 0)
        if r.rows != counted:
            raise CollectionError(
                f"{what} {groups.keys[g]!r}: {counted} rows were counted for it but its task received "
                f"{r.rows}; its rows did not all find their group (the key changed on the way). Derive "
                "a plain key column (a string or an integer) and group by that."
            )
