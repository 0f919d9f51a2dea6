"""Scoring with bagging members: votes and averages over Arrow batches, and the out-of-bag score.  [executor]

The executor side of :class:`sparkml_dist.ensemble.BaggingClassificationModel` /
``BaggingRegressionModel``'s ``transform`` and of ``oobScore``; nothing here touches a
SparkSession.  Fitting is the per-group engine's (:mod:`sparkml_dist.ensemble.engine.fitting`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import numpy as np
import pyarrow as pa

from ... import feature_arrays, serialization
from ..aggregation import Batch, mean_prediction, probabilities, vote


# --------------------------------------------------------------------------- prediction
@dataclass(frozen=True)
class PredictSpec:
    blob: bytes
    digest: str
    is_classifier: bool
    n_classes: int
    classes: Tuple[float, ...]
    voting: str
    n_features: int
    features_col: str


_SPARSE_OK: dict = {}  # members' digest -> whether every member takes sparse input (per worker)


def _batch_matrix(features: pa.Array, members, spec: PredictSpec):
    """A batch's features as the members take them (:func:`feature_arrays.matrix`)."""
    sparse_ok = _SPARSE_OK.get(spec.digest)
    if sparse_ok is None:
        fitted = [m.model for m in members if not m.constant]
        sparse_ok = _SPARSE_OK[spec.digest] = all(feature_arrays.accepts_sparse(m) for m in fitted)
    return feature_arrays.matrix(
        features, spec.n_features, sparse_ok=sparse_ok, what=f"column {spec.features_col!r}"
    )


def predict_arrow(features: pa.Array, spec: PredictSpec) -> pa.Array:
    """Arrow UDF body: features in, a struct of prediction (+ probability and raw scores) out."""
    members = serialization.cached_loads(spec.blob, spec.digest)  # once per Python worker
    if hasattr(members, "loaded"):  # members in a store (membersDir): read there once, kept
        members = members.loaded()
    X = _batch_matrix(features, members, spec)
    if not spec.is_classifier:
        return pa.StructArray.from_arrays([pa.array(mean_prediction(members, X))], names=["prediction"])
    raw = vote(members, X, spec.n_classes, spec.voting)
    prob = probabilities(raw)
    pred = np.asarray(spec.classes)[raw.argmax(axis=1)] if X.shape[0] else np.zeros(0)
    c = spec.n_classes

    def lists(m: np.ndarray) -> pa.Array:
        return pa.FixedSizeListArray.from_arrays(pa.array(m.reshape(-1)), c).cast(pa.list_(pa.float64()))

    return pa.StructArray.from_arrays(
        [pa.array(pred, pa.float64()), lists(prob), lists(raw)], names=["prediction", "probability", "raw"]
    )


def oob_arrow(features: pa.Array, groups: pa.Array, spec: PredictSpec) -> pa.Array:
    """Arrow UDF body of the out-of-bag score: each row predicted by the members whose group did
    not hold it (``groups``: the groups it was drawn into); ``has_oob`` false when every member saw it."""
    members = serialization.cached_loads(spec.blob, spec.digest)
    if hasattr(members, "loaded"):
        members = members.loaded()
    X = Batch(_batch_matrix(features, members, spec))
    n = X.shape[0]
    inbag = np.zeros((n, len(members)), dtype=bool)
    lists = groups.combine_chunks() if isinstance(groups, pa.ChunkedArray) else groups
    rows = np.repeat(np.arange(n), lists.value_lengths().to_numpy(zero_copy_only=False))
    inbag[rows, lists.flatten().to_numpy(zero_copy_only=False)] = True
    out = ~inbag
    if spec.is_classifier:
        raw = np.zeros((n, spec.n_classes))
        for k, m in enumerate(members):
            if spec.voting == "soft":
                raw += m.aligned_proba(X, spec.n_classes) * out[:, k, None]
            else:
                np.add.at(raw, (np.arange(n), m.aligned_vote(X)), out[:, k].astype(float))
        pred = np.asarray(spec.classes)[raw.argmax(axis=1)] if n else np.zeros(0)
        score = probabilities(raw)[:, -1] if n else np.zeros(0)  # the last class's: a binary AUC's score
    else:
        total = np.zeros(n)
        for k, m in enumerate(members):
            total += m.predict_value(X) * out[:, k]
        pred = score = total / np.maximum(out.sum(axis=1), 1)
    has = out.any(axis=1)
    return pa.StructArray.from_arrays(
        [pa.array(pred, pa.float64()), pa.array(score, pa.float64()), pa.array(has)],
        names=["prediction", "score", "has_oob"],
    )
