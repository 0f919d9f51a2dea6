"""The rows a :class:`~sparkml_dist.search.ParallelSearchCV` fit collects from a DataFrame.  [driver]

A search copies its (small) data into every task, so ``fit(df, featuresCols=[...], labelCol=...)``
collects the columns once: numeric columns as a pandas frame (feature names kept), Spark ML vector
columns straight from Arrow to a ``scipy.sparse`` CSR matrix when the estimator takes sparse input
and the vectors are mostly zeros (dense otherwise), so a hashed text column is searched over
without ever being expanded.  The copy is refused, with what to do instead, when it would not fit
the executors' Python memory.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from .. import _spark_env, feature_arrays
from ..errors import ConfigurationError


def from_dataframe(df, featuresCols: Optional[Sequence[str]], labelCol: Optional[str], estimator):
    """(X, y) of a small DataFrame for a search: numeric columns as a pandas frame, vector columns
    (also mixed with numeric ones) through Arrow as CSR or dense (:func:`vector_data`)."""
    if not featuresCols:
        raise ConfigurationError(
            "fit(df, ...) on a Spark DataFrame needs featuresCols=[...] "
            "(and labelCol= for supervised estimators)"
        )
    wanted = list(featuresCols) + ([labelCol] if labelCol else [])
    missing = [c for c in wanted if c not in df.columns]
    if missing:
        raise ConfigurationError(f"columns {missing} are not in the DataFrame; it has {df.columns}")
    from pyspark.sql.types import BooleanType, NumericType

    types = {f.name: f.dataType for f in df.schema.fields}
    vectors = [c for c in featuresCols if types[c].simpleString() == "vector"]
    bad = [
        c for c in featuresCols if c not in vectors and not isinstance(types[c], (NumericType, BooleanType))
    ]
    if bad:
        raise ConfigurationError(
            f"feature columns {bad} are not numeric; encode them first "
            "(e.g. pyspark.ml.feature.StringIndexer)"
        )
    spark = df.sparkSession
    budget = _spark_env.ClusterMemory.from_spark(spark).python_bytes_per_executor
    n = df.count()
    stored = sum(12 * feature_arrays.vector_shape(df, c)[1] for c in vectors)  # CSR bytes per row
    need = n * ((len(wanted) - len(vectors)) * 8 + stored)
    if need * 4 > budget:
        raise ConfigurationError(
            f"the DataFrame ({n} rows x {len(wanted)} columns, ~{need / 2**20:.0f} MiB) is too "
            f"large to copy into every task (Python budget {budget / 2**20:.0f} MiB per executor). "
            "Search on a sample (df.sample(...)), or train one model over all rows with "
            "sparkml_dist.ensemble.BaggingClassifier / BarrierRunner."
        )
    if vectors:  # Arrow straight to CSR (or dense): vectors are never expanded as Python objects
        return vector_data(df.select(*wanted).toArrow(), featuresCols, labelCol, estimator)
    pdf = df.select(*wanted).toPandas()
    X = pdf[list(featuresCols)]
    y = pdf[labelCol].to_numpy() if labelCol else None
    return X, y


def vector_data(table, featuresCols: Sequence[str], labelCol: Optional[str], estimator):
    """(X, y) from collected rows with vector columns: CSR when the estimator takes it (and the
    vectors are mostly zeros), dense otherwise (:func:`sparkml_dist.feature_arrays.matrix`)."""
    from scipy import sparse

    sparse_ok = feature_arrays.accepts_sparse(estimator)
    parts = [
        feature_arrays.matrix(table.column(c), sparse_ok=sparse_ok, what=f"featuresCols: {c!r}")
        if feature_arrays.is_vector(table.schema.field(c).type)
        else table.column(c).to_numpy().astype(np.float64)[:, None]
        for c in featuresCols
    ]
    if any(sparse.issparse(p) for p in parts):
        X = sparse.hstack([sparse.csr_matrix(p) if not sparse.issparse(p) else p for p in parts]).tocsr()
    else:
        X = np.hstack(parts)
    y = table.column(labelCol).to_numpy(zero_copy_only=False) if labelCol else None
    return X, y
