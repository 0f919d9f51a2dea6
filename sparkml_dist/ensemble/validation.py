"""Checks of columns, parameters and data before training.  [driver]

Schema and parameter problems are found without starting any Spark job.  Data problems (empty
input, NaN/inf, null labels, ragged vectors, a single class) are found by the same single
aggregation job that sizes the groups (:func:`sparkml_dist.partitioning.group_stats`), before any
model is trained.  Spark ML vector columns pass through as vectors (never expanded: a hashed
2^18-column space stays sparse); SQL cannot look inside them, so their width comes from the first
rows (:func:`vector_shape`) and their values are checked where each group is fitted
(:func:`sparkml_dist.feature_arrays.check_finite`), with the same messages.

NaN policy: NaN (and null elements of array features) is refused unless the estimator declares
that it handles missing values (scikit-learn's ``allow_nan`` tag: HistGradientBoosting*, XGBoost,
LightGBM, ...), in which case NaN is passed through.  +/-inf is always refused.
"""

from __future__ import annotations

from typing import Dict, List, Optional

from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..errors import ConfigurationError
from ..feature_arrays import vector_shape  # noqa: F401 - used by the estimators through here
from .member_records import FEATURES, LABEL, WEIGHT


def _field(schema: T.StructType, name: str, param: str, hint: str):
    if name not in schema.fieldNames():
        raise ConfigurationError(
            f"{param}={name!r}: no such column; the DataFrame has {schema.fieldNames()}. {hint}"
        )
    return schema[name].dataType


def _quoted(column: str) -> str:
    """A top-level column's name as SQL reads it literally (dots and backticks included)."""
    return "`" + column.replace("`", "``") + "`"


def _is_vector(dt) -> bool:
    return isinstance(dt, T.UserDefinedType) and type(dt).__name__ == "VectorUDT"


def is_vector_input(df, features_col: str, features_cols: List[str]) -> bool:
    """Whether the features are one Spark ML vector column (passed through as vectors)."""
    return not features_cols and features_col in df.columns and _is_vector(df.schema[features_col].dataType)


def features_column(df, features_col: str, features_cols: List[str]):
    """The features as fit reads them: the vector column itself, else an ``array<double>`` Column
    of an array column or of numeric columns."""
    schema = df.schema
    if features_cols:
        for c in features_cols:
            dt = _field(schema, c, "featuresCols", "List numeric columns only.")
            if not isinstance(dt, T.NumericType):
                raise ConfigurationError(
                    f"featuresCols: column {c!r} has type {dt.simpleString()}, expected a numeric "
                    "type. Cast it, or encode strings first (e.g. StringIndexer)."
                )
        # one SQL expression (one call to the JVM; a Column per feature costs two each)
        return F.expr("array(" + ", ".join(f"CAST({_quoted(c)} AS DOUBLE)" for c in features_cols) + ")")
    dt = _field(
        schema,
        features_col,
        "featuresCol",
        "Assemble numeric columns with VectorAssembler, or set featuresCols=[...].",
    )
    if _is_vector(dt):
        return df[features_col]
    if isinstance(dt, T.ArrayType) and isinstance(dt.elementType, T.NumericType):
        return df[features_col].cast("array<double>")
    raise ConfigurationError(
        f"featuresCol={features_col!r} has type {dt.simpleString()}; expected a vector or an array "
        "of numbers. Assemble numeric columns with VectorAssembler, or set featuresCols=[...]."
    )


def numeric_column(df, name: str, param: str):
    dt = _field(df.schema, name, param, "")
    if not isinstance(dt, T.NumericType):
        hint = " Index string labels with StringIndexer first." if param == "labelCol" else ""
        raise ConfigurationError(
            f"{param}={name!r} has type {dt.simpleString()}; expected a numeric column.{hint}"
        )
    return df[name].cast("double")


def estimator_allows_nan(estimator) -> bool:
    try:
        from sklearn.utils import get_tags

        return bool(get_tags(estimator).input_tags.allow_nan)
    except Exception:  # not a scikit-learn estimator, or an older tag API
        tags = getattr(estimator, "_get_tags", None)
        return bool(tags().get("allow_nan", False)) if callable(tags) else False


def data_aggregates(
    is_classifier: bool, has_weight: bool, max_classes: int = 1000, vectors: bool = False
) -> Dict[str, object]:
    """Per-group aggregates computed alongside the group sizes (a classifier's labels: at most
    ``max_classes + 1`` distinct values per group reach the driver, enough to refuse too many).
    ``vectors``: the features are vectors, whose values the executors check instead."""
    feats = F.col(FEATURES)
    label = F.col(LABEL)
    aggs = {"null_vectors": F.sum(F.when(feats.isNull(), 1).otherwise(0))}
    if not vectors:
        # built-in array functions, not exists() with a lambda: half the time on wide rows.
        # array_contains finds NaN (NaN = NaN in Spark SQL) and is null, not false, only where
        # the array holds a null and not the value: array_compact's length counts the nulls
        inf = float("inf")
        nan_or_null = F.array_contains(feats, float("nan")) | (F.size(F.array_compact(feats)) < F.size(feats))
        aggs.update(
            nan_rows=F.sum(F.when(nan_or_null, 1).otherwise(0)),
            inf_rows=F.sum(
                F.when(F.array_contains(feats, inf) | F.array_contains(feats, -inf), 1).otherwise(0)
            ),
            min_len=F.min(F.size(feats)),
            max_len=F.max(F.size(feats)),
        )
    aggs.update(
        {
            "bad_labels": F.sum(
                F.when(label.isNull() | F.isnan(label) | (F.abs(label) == float("inf")), 1).otherwise(0)
            ),
        }
    )
    if has_weight:
        w = F.col(WEIGHT)
        aggs["bad_weights"] = F.sum(
            F.when(w.isNull() | F.isnan(w) | (w < 0) | (F.abs(w) == float("inf")), 1).otherwise(0)
        )
    if is_classifier:
        aggs["labels"] = F.slice(F.collect_set(label), 1, int(max_classes) + 1)
    return aggs


def _bad_feature_report(df, features_col: str, features_cols: List[str], what: str) -> str:
    """Name the offending columns (or vector positions) with counts: runs only on the error path."""
    test = {"NaN": lambda c: c.isNull() | F.isnan(c), "inf": lambda c: F.abs(c) == float("inf")}[what]
    if features_cols:
        cols = {c: F.col(_quoted(c)).cast("double") for c in features_cols}
        row = df.select(*[F.sum(F.when(test(v), 1).otherwise(0)).alias(c) for c, v in cols.items()]).first()
        bad = {c: int(row[c] or 0) for c in features_cols if row[c]}
        return ", ".join(f"column {c!r}: {n} rows" for c, n in bad.items())
    arr = features_column(df, features_col, features_cols)
    pos = (
        df.select(F.posexplode(arr).alias("pos", "v"))
        .where(test(F.col("v")))
        .groupBy("pos")
        .count()
        .orderBy("pos")
        .limit(10)
        .collect()
    )
    return f"column {features_col!r} at positions " + ", ".join(
        f"{r['pos']} ({r['count']} rows)" for r in pos
    )


def check_data(
    stats,
    df,
    *,
    features_col: str,
    features_cols: List[str],
    label_col: str,
    weight_col: str,
    allow_nan: bool,
    is_classifier: bool,
    counts_copies: bool,
    max_classes: int = 1000,
    vector_width: Optional[int] = None,
) -> dict:
    """Raise ConfigurationError for bad data; return {"n_features", "classes"}.  ``vector_width``:
    the features are vectors of that width (:func:`vector_shape`), checked on the executors."""
    ex = stats.extras.values()
    rows = "row copies" if counts_copies else "rows"
    total = lambda key: sum(int(e.get(key) or 0) for e in ex)  # noqa: E731
    fname = repr(features_cols) if features_cols else repr(features_col)
    if total("null_vectors"):
        raise ConfigurationError(
            f"features {fname}: {total('null_vectors')} {rows} have a null "
            "feature vector. Drop or impute them."
        )
    if total("inf_rows"):
        raise ConfigurationError(
            f"features contain +/-inf in {total('inf_rows')} {rows} ("
            f"{_bad_feature_report(df, features_col, features_cols, 'inf')}). Clip or drop them."
        )
    if total("nan_rows") and not allow_nan:
        raise ConfigurationError(
            f"features contain NaN or null in {total('nan_rows')} {rows} ("
            f"{_bad_feature_report(df, features_col, features_cols, 'NaN')}). Impute them (e.g. "
            "pyspark.ml.feature.Imputer), drop them, or use an estimator that handles missing values "
            "(HistGradientBoostingClassifier, XGBoost)."
        )
    if total("bad_labels"):
        raise ConfigurationError(
            f"labelCol={label_col!r}: {total('bad_labels')} {rows} have a null, "
            "NaN or infinite label. Drop them before fitting."
        )
    if total("bad_weights"):
        raise ConfigurationError(
            f"weightCol={weight_col!r}: {total('bad_weights')} {rows} have a "
            "null, NaN, infinite or negative weight."
        )
    return _shape_and_classes(list(ex), fname, label_col, is_classifier, max_classes, vector_width)


def _shape_and_classes(
    ex: list, fname: str, label_col: str, is_classifier: bool, max_classes: int, vector_width: Optional[int]
) -> dict:
    """Every vector the same non-zero length; a classifier's label at least two classes."""
    if vector_width is not None:
        lo = hi = vector_width
    else:
        lo = min(int(e["min_len"]) for e in ex)
        hi = max(int(e["max_len"]) for e in ex)
    if lo != hi:
        raise ConfigurationError(
            f"features {fname}: vectors have between {lo} and {hi} values; every "
            "row needs the same number of features."
        )
    if hi == 0:
        raise ConfigurationError(f"features {fname}: the feature vectors are empty.")
    out = {"n_features": hi, "classes": None}
    if is_classifier:
        classes = sorted({float(v) for e in ex for v in (e.get("labels") or [])})
        if len(classes) > max_classes:
            shown = ", ".join(f"{c:g}" for c in classes[:5])
            raise ConfigurationError(
                f"labelCol={label_col!r} has more than maxClasses={max_classes} distinct values ({shown}, "
                "...); a classifier makes each one a class. For a continuous label use a regressor "
                "(BaggingRegressor); for that many real classes raise maxClasses."
            )
        if len(classes) < 2:
            raise ConfigurationError(
                f"labelCol={label_col!r} has a single class ({classes[0] if classes else 'none'}); a "
                "classifier needs at least two. Check the label column or the filter that built it."
            )
        out["classes"] = tuple(classes)
    return out
