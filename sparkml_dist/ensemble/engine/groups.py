"""Rows -> groups for every per-group trainer, and the fit of all groups in one job.  [driver]

The one engine under :class:`~sparkml_dist.ensemble.BaggingClassifier` /
:class:`~sparkml_dist.ensemble.BaggingRegressor`, :class:`~sparkml_dist.ensemble.GroupedTrainer`
and :func:`~sparkml_dist.ensemble.train_per_group`:

1. **Rows -> groups** (:class:`Groups`), two ways on one row key
   (:func:`sparkml_dist.partitioning.row_keys`) and one sampling description
   (:class:`~sparkml_dist.partitioning.SplitSpec`):

   * :func:`by_split`: the shared split (``disjoint`` dealt in balanced groups, ``bootstrap``,
     ``subsample``), group ``g`` in partition ``g``;
   * :func:`by_key`: one group per distinct value of a key column, counted by
     :func:`.key_counts.count_keys` (any number of keys: 10^6 in a
     benchmark).  Each task gets a run of consecutive keys in key order, cut where the rows, not
     the keys, divide evenly, and each row carries its key (``KEY_VALUE_COL``), so no task is sent
     the list of keys.

2. **The fit**: :func:`.task.fit_groups` runs in every task (one
   recipe: an estimator cloned per group, or the user's function; one error policy), the results
   come back through the collection layer, and every group's trained rows are checked against the
   rows counted for it (a key whose rows did not all arrive fails the fit, naming it).  Two
   outputs: :func:`fit` collects one result per group (a bagging member, or written to
   ``membersDir`` in the one member record format); :func:`fit_keys` gets the models of many keys
   in blocks (:mod:`..stored.key_blocks`), written to ``membersDir`` as they are fitted or
   collected whole, so the driver holds counts and references, never the models.

Example::

    groups = by_key(df, count_keys(df, "store"), ["x1", "x2", "label"], seed=0)
    fitted = fit_keys(groups, GroupFitSpec(recipe, inputs, None, blocks=("id", groups.n)), ...)
    fitted.blocks[0].lo, fitted.rows, fitted.failed
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from ... import launch, partitioning, plan, progress
from ...errors import CollectionError
from ...group_rows import GROUP_COL, KEY_COL, KEY_VALUE_COL
from ..stored import member_store
from ..stored.key_blocks import Block
from .fitting import GroupFitSpec
from .key_counts import KeyCounts, key_table
from .task import fit_groups

log = logging.getLogger(__name__)


@dataclass
class Groups:
    """A DataFrame's rows dealt to groups: ``frame`` holds ``GROUP_COL``, ``KEY_COL`` and the
    columns asked for, each task's rows one group after another; ``n`` groups, ``rows`` counted
    per group; the split's ``stats`` (its data checks' aggregates), or by key the ``counts`` and
    the indices into them of the groups (``kept``), ``small``: the keys left out for having too
    few rows ({key: rows}), and the number of ``tasks`` holding the rows (None: one per group)."""

    frame: Any
    n: int
    rows: np.ndarray
    stats: Optional[partitioning.GroupStats] = None
    counts: Optional[KeyCounts] = None
    kept: Optional[np.ndarray] = None
    small: Dict[Any, int] = field(default_factory=dict)
    tasks: Optional[int] = None  # the tasks the rows are in (None: one per group)

    @property
    def keys(self) -> Optional[tuple]:
        """The split's group names (0 .. n-1); None by key: each group's rows carry its key."""
        return tuple(range(self.n)) if self.counts is None else None

    def key(self, g: int) -> Any:
        """Group ``g``'s key as Python holds it."""
        return g if self.counts is None else self.counts.key(self.kept[g])

    @property
    def key_array(self):
        """By key: the groups' keys in their Spark type (Arrow), in group order."""
        import pyarrow as pa

        return self.counts.keys.take(pa.array(self.kept, pa.int64()))


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
    return Groups(grouped, spec.num_groups, stats.counts(), stats=stats)


def by_key(
    df,
    counts: KeyCounts,
    columns: Sequence[str],
    *,
    keep: Optional[Sequence[int]] = None,
    seed: int = 0,
    key_cols: Optional[Sequence[str]] = None,
    bytes_per_row: float = 64.0,
    held_rows: Optional[int] = None,
) -> Groups:
    """One group per key of ``counts`` (those at ``keep`` when given), see the module docstring.
    Rows are keyed by ``key_cols`` (default: every hashable column) for their order in a group.
    ``held_rows``: groups of more rows train from a stream (:mod:`.stream`), holding a
    chunk of rows, not the group."""
    from pyspark.sql import functions as F

    from .stream import CHUNK_ROWS

    spark = launch.session_of(df)
    kept = np.arange(counts.n) if keep is None else np.asarray(keep, dtype=np.int64)
    rows = counts.rows[kept]
    keyed = partitioning.row_keys(df, seed, key_cols or partitioning.hashable_columns(df))
    held = rows if held_rows is None else np.where(rows > held_rows, np.minimum(rows, CHUNK_ROWS), rows)
    concurrency = plan.plan_concurrency(spark, float(held.max(initial=0)) * bytes_per_row * 3)
    parts = max(1, min(len(kept), concurrency.concurrency * 4))
    table = key_table(
        spark,
        counts.keys.take(_arrow_ints(kept)),
        counts.key_col,
        df.schema[counts.key_col].dataType,
        {partitioning.PART_COL: _arrow_ints(runs(rows, parts), 32)},
    )
    grouped = partitioning.assign_keys(
        keyed.withColumn(KEY_VALUE_COL, F.col(counts.key_col)), counts.key_col, table, parts
    )
    log.info("%r: %d keys in %d tasks (%s)", counts.key_col, len(kept), parts, concurrency.summary())
    left = np.setdiff1d(np.arange(counts.n), kept)
    small = dict(zip(counts.python_keys(left), counts.rows[left].tolist())) if len(left) else {}
    return Groups(
        grouped.select(GROUP_COL, KEY_COL, KEY_VALUE_COL, *columns),
        len(kept),
        rows,
        counts=counts,
        kept=kept,
        small=small,
        tasks=parts,
    )


def _arrow_ints(values: np.ndarray, bits: int = 64):
    import pyarrow as pa

    return pa.array(np.asarray(values, dtype=np.int64 if bits == 64 else np.int32))


def runs(rows: np.ndarray, parts: int) -> np.ndarray:
    """The partition of each group: ``parts`` runs of consecutive groups holding about equal
    rows (a group is never split; a run may be empty when one group outweighs it)."""
    before = np.cumsum(rows) - rows
    total = max(1, int(rows.sum()))
    return np.minimum(before * parts // total, parts - 1).astype(np.int32)


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
    """Every group fitted by ``spec``'s recipe in one Spark job, one result per group collected
    (see the module docstring); ``frame`` replaces ``groups.frame`` (the same rows, e.g. sorted
    within partitions)."""
    out = launch.run_on_groups(
        frame if frame is not None else groups.frame,
        fit_groups,
        spec,
        expected_groups=range(groups.n),
        description=description,
        profile=profile,
    )
    results = [out[(g, 0)] for g in range(groups.n)]
    _check_rows(groups, np.array([r.rows for r in results], dtype=np.int64), what)
    skipped = {r.key: r.error for r in results if r.error is not None}
    _check_failures(len(skipped), len(results), next(iter(skipped.values()), ""), what, skipped)
    stored = None
    if spec.store is not None:
        metas = [meta for r in results if r.error is None for meta in r.stored]
        stored = member_store.commit_checked(spec.store, metas)
    return Fitted([r if r.error is None else None for r in results], skipped, stored)


@dataclass
class FittedKeys:
    """What :func:`fit_keys` returns: the blocks in key order (each written to the store, or its
    bytes), the rows each key's model saw, and the keys whose fit failed ({index: why})."""

    blocks: List[Block]
    rows: np.ndarray
    failed: Dict[int, str]


def fit_keys(groups: Groups, spec: GroupFitSpec, *, what: str, description: str, profile: Any = None):
    """Every key fitted by ``spec``'s recipe in one Spark job, the models in blocks (see the
    module docstring); with a store, its manifest committed."""
    spark = launch.session_of(groups.frame)
    with progress.fits(spark, groups.n, f"{what}s", tasks=groups.tasks, unit=what, delay=2.0) as channel:
        spec = dataclasses.replace(spec, progress=channel)
        out = launch.run_on_groups(groups.frame, fit_groups, spec, description=description, profile=profile)
    blocks = sorted(out.values(), key=lambda b: b.lo)
    _check_cover(groups, blocks, what)
    rows = np.concatenate([b.rows for b in blocks])
    for b in blocks:  # one array for every key: each block's rows a view of it, not a second copy
        b.rows = rows[b.lo : b.hi]
    _check_rows(groups, rows, what)
    failed = {i: why for b in blocks for i, why in b.failed.items()}
    first = failed[min(failed)] if failed else ""
    _check_failures(
        len(failed), groups.n, first, what, {groups.key(i): w for i, w in list(failed.items())[:10]}
    )
    if spec.store is not None:
        member_store.commit_checked(spec.store, [b.meta for b in blocks])
    del out
    launch.give_back_memory()  # what collecting and checking 10^5-10^6 keys' results freed
    return FittedKeys(blocks, rows, failed)


def _check_cover(groups: Groups, blocks: List[Block], what: str) -> None:
    """The blocks hold every key once: keys 0 .. n-1, in runs that meet end to end."""
    edge = 0
    for b in blocks:
        if b.lo != edge:
            lost = list(range(edge, b.lo))[:10] if b.lo > edge else []
            raise CollectionError(
                f"the fit's blocks do not hold every {what} once: "
                + (f"{what}s {[groups.key(i) for i in lost]} returned no model" if lost else
                   "two attempts of a task split their keys differently")
                + "; check the executor logs, or increase spark.task.maxFailures if tasks were lost"
            )  # fmt: skip
        edge = b.hi
    if edge != groups.n:
        lost = [groups.key(i) for i in range(edge, min(groups.n, edge + 10))]
        raise CollectionError(
            f"{groups.n - edge} {what}s returned no model (e.g. {lost}); check the executor logs"
        )


def _check_failures(failed: int, total: int, first: str, what: str, shown: Dict[Any, str]) -> None:
    if failed:
        log.warning("%d of %d %ss skipped: %s", failed, total, what, sorted(map(str, shown)))
    if failed == total:
        raise CollectionError(f"every {what} failed; the first: {first}")


def _check_rows(groups: Groups, rows: np.ndarray, what: str) -> None:
    """Each group trained on the rows counted for it: a key that lost rows on its way is named."""
    bad = np.flatnonzero(rows != groups.rows)
    if bad.size:
        g = int(bad[0])
        raise CollectionError(
            f"{what} {groups.key(g)!r}: {int(groups.rows[g])} rows were counted for it but its task "
            f"received {int(rows[g])}; its rows did not all find their group (the key changed on the "
            "way). Derive a plain key column (a string or an integer) and group by that."
        )
