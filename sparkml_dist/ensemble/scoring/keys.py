"""Scoring with a grouped model: each row predicted by its key's model.  [executor]

The executor side of :class:`sparkml_dist.ensemble.GroupedModel`'s ``transform`` (and its local
``predict``).  The driver joins each row to its key's index (``INDEX_COL``, null for a key without
a model) and, when the models fill more than one block, sends the rows of a run of blocks to one
task (:mod:`..stored.key_blocks`), so each task reads only the blocks of its rows' keys, once
per Python worker (:class:`~..stored.key_models.KeyModels` keeps them), and decodes only the
models its rows use.
Nothing here touches a SparkSession.  Fitting is the per-group engine's
(:mod:`sparkml_dist.ensemble.engine.fitting`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ... import feature_arrays, serialization
from ..member_records import FEATURES

INDEX_COL = "__sd_key_index"  # the row's key's index among the model's keys (null: none)
BLOCK_COL = "__sd_block"  # the block holding that key's model (the partition it is scored in)


@dataclass(frozen=True)
class PredictSpec:
    key_col: str
    prediction_col: str
    prediction_type: str  # "double" or "string"
    models_key: str
    models_blob: bytes  # the pickled KeyModels, without its keys
    unseen: str


def predict_rows(
    key_array: pa.Array,
    idx: np.ndarray,
    features: Any,
    model_of: Callable[[int], Any],
    unseen: str,
    out_type: pa.DataType,
) -> pa.Array:
    """Predictions for one batch: row ``r`` from the model of key ``idx[r]`` (-1: no model for its
    key, named from ``key_array``).  ``features``: a matrix, or ``sparse_ok -> matrix`` building
    the form each model takes.  A key whose fit failed has no model either."""
    models = {int(g): model_of(int(g)) for g in np.unique(idx[idx >= 0])}
    failed = {g for g, m in models.items() if m is None}
    unknown = (idx < 0) | np.isin(idx, list(failed))
    if unseen == "error" and unknown.any():
        unseen_rows = idx < 0
        why = (
            "were not seen in training (no model)" if unseen_rows.any() else "have no model: their fit failed"
        )
        missing = pc.unique(pc.filter(key_array, pa.array(unseen_rows if unseen_rows.any() else unknown)))
        raise ValueError(
            f"keys {missing.to_pylist()[:10]} {why}; filter them out, or set unseenKey='null' to "
            "predict null for them"
        )
    is_string = pa.types.is_string(out_type)
    out = np.empty(len(idx), dtype=object) if is_string else np.full(len(idx), np.nan)
    order = np.argsort(idx, kind="stable")
    cuts = np.flatnonzero(np.diff(idx[order])) + 1
    for rows in np.split(order, cuts):
        g = int(idx[rows[0]]) if len(rows) else -1
        if g < 0 or g in failed:
            continue
        X = features(feature_arrays.accepts_sparse(models[g])) if callable(features) else features
        preds = np.asarray(models[g].predict(X[rows]))
        out[rows] = preds.astype(str) if is_string else preds
    return pa.array(out, type=out_type, mask=unknown)


def predict_keys(batches: Iterable[pa.RecordBatch], spec: PredictSpec) -> Iterator[pa.RecordBatch]:
    models = serialization.cached_loads(spec.models_blob, spec.models_key)
    out_type = pa.string() if spec.prediction_type == "string" else pa.float64()
    dropped = (FEATURES, INDEX_COL, BLOCK_COL)
    for batch in batches:
        column = batch.column(FEATURES)
        features = functools.lru_cache(maxsize=2)(
            lambda sparse_ok, column=column: feature_arrays.matrix(
                column, sparse_ok=sparse_ok, what="features"
            )
        )  # built once per batch in each form its keys' models take
        idx = pc.fill_null(batch.column(INDEX_COL), -1).to_numpy(zero_copy_only=False).astype(np.int64)
        preds = predict_rows(batch.column(spec.key_col), idx, features, models.model, spec.unseen, out_type)
        kept = [i for i, name in enumerate(batch.schema.names) if name not in dropped]
        yield pa.RecordBatch.from_arrays(
            [batch.column(i) for i in kept] + [preds],
            names=[batch.schema.names[i] for i in kept] + [spec.prediction_col],
        )
