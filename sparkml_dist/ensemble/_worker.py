"""Fit one scikit-learn-API model per group, and predict batches.  [executor]

Module-level functions taking ``(batches, spec)``; nothing here touches a SparkSession.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import collection, member_gpus, serialization
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


def features_to_numpy(arr: pa.Array, n_features: Optional[int] = None, what: str = "features") -> np.ndarray:
    """A list<double> Arrow array -> (n_rows, n_features) float64 array; nulls inside become NaN."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    n = len(arr)
    if arr.null_count:
        raise ValueError(f"{what}: {arr.null_count} rows have a null feature vector")
    values = arr.flatten()
    if n == 0:
        return np.zeros((0, n_features or 0))
    width = len(values) // n
    lengths = pc.list_value_length(arr)
    lo, hi = pc.min_max(lengths).values()
    if lo.as_py() != hi.as_py() or (n_features is not None and width != n_features):
        raise ValueError(
            f"{what}: rows have {lo.as_py()}..{hi.as_py()} values; expected "
            f"{n_features if n_features is not None else 'the same number'} in every row"
        )
    return values.to_numpy(zero_copy_only=False).astype(np.float64, copy=False).reshape(n, width)


def _estimator_from(blob: bytes):
    return serialization.loads(blob)


def fresh_copy(estimator):
    """A fresh unfitted copy: scikit-learn's ``clone`` for an estimator with ``get_params`` (its
    errors reach the user), a deep copy for any other object with the scikit-learn API."""
    if hasattr(estimator, "get_params"):
        from sklearn.base import clone

        return clone(estimator)
    return copy.deepcopy(estimator)


def _fit_member(spec: FitSpec, group: int, table: pa.Table) -> Member:
    X = features_to_numpy(table.column(FEATURES), spec.n_features)
    y = table.column(LABEL).to_numpy().astype(np.float64)
    w = table.column(WEIGHT).to_numpy().astype(np.float64) if spec.has_weight else None
    keys = table.column(KEY_COL).to_numpy()
    order = order_rows(keys, X, y) if w is None else order_rows(keys, X, y, w)
    feats = np.asarray(spec.feature_subsets[group], dtype=np.int64)
    Xg = X[order][:, feats] if feats.size != X.shape[1] else X[order]
    yg = y[order]
    wg = w[order] if w is not None else None
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
    if not batches:
        return
    table = pa.Table.from_batches(batches)
    groups = table.column(GROUP_COL).to_numpy()
    for group in np.unique(groups):
        g = int(group)
        part = table.filter(pa.array(groups == group)) if len(np.unique(groups)) > 1 else table
        try:
            member = _fit_member(spec, g, part)
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


def predict_arrow(features: pa.Array, spec: PredictSpec) -> pa.Array:
    """Arrow UDF body: features in, a struct of prediction (+ probability and raw scores) out."""
    members = serialization.cached_loads(spec.blob, spec.digest)  # once per Python worker
    if hasattr(members, "loaded"):  # members in a store (membersDir): read there once, kept
        members = members.loaded()
    X = features_to_numpy(features, spec.n_features, what=f"column {spec.features_col!r}")
    if not spec.is_classifier:
        return pa.StructArray.from_arrays([pa.array(mean_prediction(members, X))], names=["prediction"])
    raw = vote(members, X, spec.n_classes, spec.voting)
    prob = probabilities(raw)
    pred = np.asarray(spec.classes)[raw.argmax(axis=1)] if len(X) else np.zeros(0)
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
    X = Batch(features_to_numpy(features, spec.n_features, what=f"column {spec.features_col!r}"))
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
    else:
        total = np.zeros(n)
        for k, m in enumerate(members):
            total += m.predict_value(X) * out[:, k]
        pred = total / np.maximum(out.sum(axis=1), 1)
    has = out.any(axis=1)
    return pa.StructArray.from_arrays(
        [pa.array(pred, pa.float64()), pa.array(has)], names=["prediction", "has_oob"]
    )
