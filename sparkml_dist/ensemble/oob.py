"""The out-of-bag score of a bagging ensemble: each row scored by the members that did not see it.  [driver]

With ``sampling="bootstrap"`` or ``"subsample"`` a row's groups follow from its key (a hash of the
seed and the row) alone (:func:`sparkml_dist.partitioning.membership_sql`), so after the fit one
Spark job recomputes each row's groups where the row lies, predicts it with the other members
(:func:`sparkml_dist.ensemble._worker.oob_arrow`) and aggregates: accuracy for a classifier, R^2
for a regressor, over the rows at least one member left out.  No data is collected.  An estimate
of the ensemble's error on unseen rows without a held-out set (scikit-learn's ``oob_score_``).
"""

from __future__ import annotations

import logging
from typing import Optional, Sequence

from .. import launch, partitioning
from ..errors import ConfigurationError
from ..group_rows import KEY_COL
from . import _worker
from .member_records import FEATURES, LABEL

log = logging.getLogger(__name__)


def check(sampling: str) -> None:
    if sampling not in ("bootstrap", "subsample"):
        raise ConfigurationError(
            f"oobScore=True needs sampling='bootstrap' or 'subsample' (rows some members did not see), "
            f"got sampling={sampling!r}; set sampling or oobScore=False"
        )


def score(model, prepared, spec: partitioning.SplitSpec, key_cols: Sequence[str]) -> Optional[float]:
    """The out-of-bag score of ``model`` over ``prepared`` (its ``FEATURES`` and ``LABEL``
    columns, as fitted); None when no row was left out by any member."""
    from pyspark.sql import functions as F

    pspec = model._predict_spec()
    udf = F.arrow_udf(
        lambda feats, groups: _worker.oob_arrow(feats, groups, pspec),
        "struct<prediction: double, has_oob: boolean>",
    )
    keyed = prepared.withColumn(KEY_COL, F.xxhash64(F.lit(int(spec.seed)), *[F.col(c) for c in key_cols]))
    scored = keyed.select(
        F.col(LABEL), udf(F.col(FEATURES), F.expr(partitioning.membership_sql(spec))).alias("o")
    )
    scored = scored.where("o.has_oob")
    if model._is_classifier:
        agg = scored.agg(
            F.count(F.lit(1)).alias("n"), F.avg((F.col("o.prediction") == F.col(LABEL)).cast("double"))
        )
    else:
        agg = scored.agg(
            F.count(F.lit(1)).alias("n"),
            (1 - F.sum((F.col("o.prediction") - F.col(LABEL)) ** 2) / (F.count(F.lit(1)) * F.var_pop(LABEL))),
        )
    with launch.job_scope(launch.session_of(prepared), "sparkml_dist: out-of-bag score"):
        n, value = agg.first()
    if not n:
        log.warning("oobScore: every row was drawn into every member; no out-of-bag score")
        return None
    return float(value)
