"""Scoring with a grouped model: each row predicted by its key's model.  [executor]

The executor side of :class:`sparkml_dist.ensemble.GroupedModel`'s ``transform`` (and its local
``predict``): module-level functions taking ``(batches, spec)``; nothing here touches a
SparkSession.  Fitting is the per-group engine's (:mod:`sparkml_dist.ensemble._fit_groups`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, List

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import feature_arrays, serialization
from .member_records import FEATURES


@dataclass(frozen=True)
class PredictSpec:
    key_col: str
    prediction_col: str
    prediction_type: str  # "double" or "string"
    models_key: str
    models_blob: bytes  # pickled (keys, models)
    unseen: str


def _models(spec: PredictSpec):
    """(keys as an Arrow array, models), unpickled once per Python worker."""

    def ready(keys_models):
        keys, models = keys_models
        if hasattr(models, "loaded"):  # members in a store (membersDir): read there once, kept
            models = [m.model for m in models.loaded()]
        return pa.array(keys), models

    return serialization.cached_loads(spec.models_blob, spec.models_key, then=ready)


def predict_batch(
    key_array: pa.Array,
    features: Any,
    keys: pa.Array,
    models: List[Any],
    unseen: str,
    out_type: pa.DataType,
) -> pa.Array:
    """Predictions for one batch: each row from its key's model (null where the key has none).
    ``features``: a matrix, or ``sparse_ok -> matrix`` building the form each model takes."""
    value_set = keys if keys.type == key_array.type else keys.cast(key_array.type)
    idx = pc.fill_null(pc.index_in(key_array, value_set=value_set), -1).to_numpy(zero_copy_only=False)
    unknown = idx < 0
    if unseen == "error" and unknown.any():
        missing = pc.unique(pc.filter(key_array, pa.array(unknown))).to_pylist()
        raise ValueError(
            f"keys {missing[:10]} were not seen in training (no model); filter them out, "
            "or set unseenKey='null' to predict null for them"
        )
    is_string = pa.types.is_string(out_type)
    out = np.empty(len(idx), dtype=object) if is_string else np.full(len(idx), np.nan)
    for g in np.unique(idx[~unknown]):
        rows = np.flatnonzero(idx == g)
        X = features(feature_arrays.accepts_sparse(models[g])) if callable(features) else features
        preds = np.asarray(models[g].predict(X[rows]))
        out[rows] = preds.astype(str) if is_string else preds
    return pa.array(out, type=out_type, mask=unknown)


def predict_keys(batches: Iterable[pa.RecordBatch], spec: PredictSpec) -> Iterator[pa.RecordBatch]:
    keys, models = _models(spec)
    out_type = pa.string() if spec.prediction_type == "string" else pa.float64()
    for batch in batches:
        column = batch.column(FEATURES)
        features = functools.lru_cache(maxsize=2)(
            lambda sparse_ok, column=column: feature_arrays.matrix(
                column, sparse_ok=sparse_ok, what="features"
            )
        )  # built once per batch in each form its keys' models take
        preds = predict_batch(batch.column(spec.key_col), features, keys, models, spec.unseen, out_type)
        kept = [i for i, name in enumerate(batch.schema.names) if name != FEATURES]
        yield pa.RecordBatch.from_arrays(
            [batch.column(i) for i in kept] + [preds],
            names=[batch.schema.names[i] for i in kept] + [spec.prediction_col],
        )
