"""Fit one scikit-learn-API model per group, and predict batches.  [executor]

Module-level functions taking ``(batches, spec)``; nothing here touches a SparkSession.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, List, Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import collection, feature_arrays, member_gpus, serialization
from ..group_rows import GROUP_COL, KEY_COL, order_rows
from .aggregation import Batch, mean_prediction, probabilities, vote
from .member_records import FEATURES, LABEL, WEIGHT, Member, write_member


@dataclass(frozen=True)
class FitSpec:
    """Everything a fitting task needs, as plain values built on the driver."""

    estimator_blob: bytes
    is_classifier: bool
    classes: Tuple[float, ...]
    feature_subsets: Tuple[Tuple[int, ...], ...]
    seeds: Tuple[int, ...]
    n_features: int
    has_weight: bool
    members_store: Optional[Any] = None  # a ModelStore: executors write members there (membersDir)
    gpus: Optional[Tuple[str, ...]] = None  # useGpu: () the task's own GPU, else the driver's to deal
    vectors: bool = False  # the features are Spark ML vectors: their values are checked here
    sparse_ok: bool = False  # the estimator takes scipy.sparse input (feature_arrays.matrix's rule)
    allow_nan: bool = False
    features_col: str = "features"


def _estimator_from(blob: bytes):
    return serialization.loads(blob)


def fresh_copy(estimator):
    """A fresh unfitted copy: scikit-learn's ``clone`` for an estimator with ``get_params`` (its
    errors reach the user), a deep copy for any other object with the scikit-learn API."""
    if hasattr(estimator, "get_params"):
        from sklearn.base import clone

        return clone(estimator)
    return copy.deepcopy(estimator)


def _group_arrays(spec: FitSpec, parts: List[pa.RecordBatch]):
    """(X, y, w) of one group's rows in their fixed order.  ``parts`` is emptied as the rows are
    read: a sparse group whose rows arrive in key order (Spark sorts them) is copied into its CSR
    matrix batch by batch, so it is held about once while the matrix is built, not twice."""
    columns = lambda name: np.concatenate([b.column(name).to_numpy() for b in parts])  # noqa: E731
    y = columns(LABEL).astype(np.float64)
    w = columns(WEIGHT).astype(np.float64) if spec.has_weight else None
    keys = columns(KEY_COL)
    what = f"featuresCol={spec.features_col!r}"
    if spec.vectors and spec.sparse_ok and np.all(keys[1:] >= keys[:-1]):  # arrived in order
        X = feature_arrays.csr_from_batches(parts, FEATURES, spec.n_features, what)
        if X.shape[0] and X.nnz >= feature_arrays.SPARSE_SHARE * X.shape[0] * X.shape[1]:
            X = X.toarray()  # mostly stored anyway: dense is faster (feature_arrays.matrix's rule)
        feature_arrays.check_finite(X, spec.allow_nan, what)
        return X, y, w
    table = pa.Table.from_batches(parts).select([FEATURES])
    parts.clear()
    if spec.vectors:  # equal keys are bootstrap copies of one row: ordered by label and weight
        order = order_rows(keys, y) if w is None else order_rows(keys, y, w)
        table = table.take(pa.array(order))
        X = feature_arrays.matrix(
            table.column(FEATURES), spec.n_features, sparse_ok=spec.sparse_ok, what=what
        )
        del table
        feature_arrays.check_finite(X, spec.allow_nan, what)
    else:
        X = feature_arrays.lists_to_numpy(table.column(FEATURES), spec.n_features)
        del table
        order = order_rows(keys, X, y) if w is None else order_rows(keys, X, y, w)
        X = X[order]
    return X, y[order], (w[order] if w is not None else None)


def _fit_member(spec: FitSpec, group: int, parts: List[pa.RecordBatch]) -> Member:
    X, yg, wg = _group_arrays(spec, parts)
    feats = np.asarray(spec.feature_subsets[group], dtype=np.int64)
    Xg = X[:, feats] if feats.size != X.shape[1] else X
    del X
    classes = None
    if spec.is_classifier:
        global_classes = np.asarray(spec.classes)
        present = np.unique(yg)
        classes = np.searchsorted(global_classes, present)
        if present.size == 1:
            return Member(group, None, feats, classes, len(yg), constant=True)
        yg = np.searchsorted(present, yg)  # local labels 0..c-1 (XGBoost needs them)
    model = fresh_copy(_estimator_from(spec.estimator_blob))
    if hasattr(model, "get_params") and "random_state" in model.get_params(deep=False):
        model.set_params(random_state=spec.seeds[group])
    if spec.gpus is not None:
        member_gpus.place(model, spec.gpus, group)
    if wg is not None:
        model.fit(Xg, yg, sample_weight=wg)
    else:
        model.fit(Xg, yg)
    return Member(group, model, feats, classes, len(yg))


def fit_groups(batches: Iterable[pa.RecordBatch], spec: FitSpec) -> Iterator[pa.RecordBatch]:
    """Executor task: the rows of one or more groups in, one chunked Member per group out."""
    batches = [b for b in batches if b.num_rows]
    groups = np.unique(np.concatenate([b.column(GROUP_COL).to_numpy() for b in batches])) if batches else []
    for group in groups:  # on Spark a task holds one group (partition g is group g)
        g = int(group)
        parts = (
            batches if len(groups) == 1 else [b.filter(pc.equal(b.column(GROUP_COL), group)) for b in batches]
        )
        try:
            member = _fit_member(spec, g, parts)
            if spec.members_store is not None:  # only the files' metadata goes back to the driver
                member = {"metas": write_member(spec.members_store.write, member)}
        except Exception as exc:  # one failed member is reported with its group, not retried
            yield collection.encode_error(
                g, f"fitting the model for group {g} failed: {type(exc).__name__}: {exc}"
            )
            continue
        yield collection.encode(g, 0, member)


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
