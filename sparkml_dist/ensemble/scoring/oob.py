"""The out-of-bag score of a bagging ensemble: each row scored by the members that did not see it.  [driver]

With ``sampling="bootstrap"`` or ``"subsample"`` a row's groups follow from its key (a hash of the
seed and the row) alone (:func:`sparkml_dist.partitioning.membership_sql`), so after the fit one
Spark job recomputes each row's groups where the row lies, predicts it with the other members
(:func:`.members.oob_arrow`) and aggregates: accuracy for a classifier, R^2
for a regressor, over the rows at least one member left out.  No data is collected.  An estimate
of the ensemble's error on unseen rows without a held-out set (scikit-learn's ``oob_score_``).

``model.oobMetrics_`` holds more from the same job: ``accuracy`` (and, for two classes, ``auc``,
the area under the ROC curve of the out-of-bag probability of the second class) for a classifier,
``r2`` and ``rmse`` for a regressor.  The AUC is counted from a 10,000-bin histogram of the scores
(pairs within one bin count one half), so it is exact for scores on a grid of 1/10,000 and within
the share of pairs that share a bin otherwise; only the histogram reaches the driver.
"""

from __future__ import annotations

import logging
from typing import Dict, Optional, Sequence, Tuple

from ... import launch, partitioning, spark_compat
from ...errors import ConfigurationError
from ..member_records import FEATURES, LABEL
from . import members as _member_scoring

log = logging.getLogger(__name__)


def check(sampling: str) -> None:
    if sampling not in ("bootstrap", "subsample"):
        raise ConfigurationError(
            f"oobScore=True needs sampling='bootstrap' or 'subsample' (rows some members did not see), "
            f"got sampling={sampling!r}; set sampling or oobScore=False"
        )


_BINS = 10_000


def auc_from_histogram(counts: Sequence[Tuple[int, float, float]]) -> Optional[float]:
    """ROC AUC from ``(bin, positives, negatives)`` rows: pairs in one bin count one half."""
    counts = sorted(counts)
    pos = sum(p for _, p, _ in counts)
    neg = sum(q for _, _, q in counts)
    if not pos or not neg:
        return None
    below = wins = 0.0
    for _, p, q in counts:
        wins += p * (below + 0.5 * q)
        below += q
    return wins / (pos * neg)


def score(model, prepared, spec: partitioning.SplitSpec, key_cols: Sequence[str]) -> Dict[str, float]:
    """The out-of-bag metrics of ``model`` over ``prepared`` (its ``FEATURES`` and ``LABEL``
    columns, as fitted): ``{"accuracy", "auc"}`` or ``{"r2", "rmse"}``; empty when no row was left
    out by any member."""
    from pyspark.sql import functions as F

    pspec = model._predict_spec()
    udf = spark_compat.arrow_udf(
        lambda feats, groups: _member_scoring.oob_arrow(feats, groups, pspec),
        "struct<prediction: double, score: double, has_oob: boolean>",
    )
    keyed = partitioning.row_keys(prepared, spec.seed, key_cols)
    scored = keyed.select(
        F.col(LABEL), udf(F.col(FEATURES), F.expr(partitioning.membership_sql(spec))).alias("o")
    )
    scored = scored.where("o.has_oob").select(
        F.col(LABEL).alias("y"), F.col("o.prediction").alias("p"), F.col("o.score").alias("s")
    )
    binary = model._is_classifier and len(model.classes) == 2
    with launch.job_scope(launch.session_of(prepared), "sparkml_dist: out-of-bag score"):
        if model._is_classifier:
            rows = _histogram(scored, float(model.classes[-1])).collect()
            n = sum(r["n"] for r in rows)
            out = {"accuracy": sum(r["hits"] for r in rows) / n} if n else {}
            if n and binary:
                auc = auc_from_histogram([(r["bin"], r["pos"], r["n"] - r["pos"]) for r in rows])
                out.update({} if auc is None else {"auc": auc})
        else:
            n, sse, var = scored.agg(
                F.count(F.lit(1)), F.sum((F.col("p") - F.col("y")) ** 2), F.var_pop("y")
            ).first()
            out = {"r2": 1 - sse / (n * var), "rmse": (sse / n) ** 0.5} if n else {}
    if not out:
        log.warning("oobScore: every row was drawn into every member; no out-of-bag score")
    return out


def _histogram(scored, positive: float):
    """Rows per score bin: how many, how many of the positive class, how many predicted right."""
    from pyspark.sql import functions as F

    return scored.groupBy(F.least(F.floor(F.col("s") * _BINS), F.lit(_BINS - 1)).alias("bin")).agg(
        F.count(F.lit(1)).alias("n"),
        F.sum((F.col("y") == positive).cast("long")).alias("pos"),
        F.sum((F.col("p") == F.col("y")).cast("long")).alias("hits"),
    )
