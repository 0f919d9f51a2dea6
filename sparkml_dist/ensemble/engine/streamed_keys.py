"""Which keys of a grouped fit train from a stream, decided before the fit.  [driver]

A key whose rows a task's memory would not hold (:func:`sparkml_dist._spark_env.task_memory_budget`
over the bytes a row takes in the fit, three copies) trains from a stream with the estimator's
``partial_fit``, or XGBoost's external memory (:mod:`.stream`), one chunk of rows held at a
time; ``streamAbove`` sets the
number of rows instead (0: every key streams).  An estimator without ``partial_fit`` is refused
before the fit, naming the keys, their size and the fixes.  A classifier's ``partial_fit`` must
see every class of its key at its first call: one job reads the classes of the streamed keys.

Example::

    held_rows, stream = plan(spark, prepared, counts, keep, estimator, None, bytes_per_row=24)
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np

from ... import _spark_env, launch
from ...errors import ConfigurationError
from ..member_records import LABEL
from .stream import is_xgboost


def plan(
    spark, df, counts, keep: np.ndarray, estimator: Any, stream_above: Optional[int], bytes_per_row: float,
    label_col: str = LABEL,
) -> Tuple[int, Dict[int, Optional[tuple]]]:  # fmt: skip
    """``(the most rows a key may hold, {group index: its classes (None for a regressor)})`` for
    the keys that stream (see the module docstring)."""
    held = stream_above
    if held is None:
        held = max(1, int(_spark_env.task_memory_budget(spark) // max(1.0, 3 * bytes_per_row)))
    big = np.flatnonzero(counts.rows[keep] > held)
    if not big.size:
        return held, {}
    if not hasattr(estimator, "partial_fit") and not is_xgboost(estimator):
        shown = counts.python_keys(keep[big[:5]])
        need = float(counts.rows[keep[big]].max()) * 3 * bytes_per_row
        raise ConfigurationError(
            f"{big.size} key(s) of {counts.key_col!r} (e.g. {shown}) have more rows than one task holds "
            f"(streamAbove: {held} rows; the largest needs about {need / 2**30:.2f} GiB) and "
            f"{type(estimator).__name__} has no partial_fit to train from a stream: use an estimator "
            "that has one (SGDRegressor, SGDClassifier, MiniBatchKMeans, ...) or XGBoost's (external "
            "memory), give Python workers more "
            "memory (spark.executor.pyspark.memory), or split those keys"
        )
    if getattr(estimator, "_estimator_type", None) != "classifier":
        return held, {int(g): None for g in big}
    return held, _classes(spark, df, counts, keep[big], big, label_col)


def _classes(spark, df, counts, indices: Sequence[int], groups: Sequence[int], label_col: str) -> dict:
    """{group: the sorted label values of its key} for the streamed keys, in one job."""
    from pyspark.sql import functions as F

    from .key_counts import key_table

    keys = counts.keys.take(np.asarray(indices, dtype=np.int64))
    table = key_table(spark, keys, counts.key_col, df.schema[counts.key_col].dataType)
    with launch.job_scope(spark, f"sparkml_dist: the classes of {len(indices)} streamed keys"):
        found = (
            df.join(F.broadcast(table), on=counts.key_col)
            .groupBy("__sd_group")
            .agg(F.array_sort(F.collect_set(label_col)).alias("classes"))
            .collect()
        )
    by_position = {int(r["__sd_group"]): tuple(r["classes"]) for r in found}
    return {int(g): by_position.get(i) for i, g in enumerate(groups)}
