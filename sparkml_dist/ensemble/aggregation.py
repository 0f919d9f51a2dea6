"""Combining members' outputs: soft/hard voting and averaging.  [runs anywhere]

Used both inside the Arrow UDF on executors and by ``predict``/``predict_proba`` on the driver, so
the two always give the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np


@dataclass
class Member:
    """One fitted ensemble member.

    Attributes:
        group: the group it was trained on.
        model: the fitted scikit-learn-API object.
        features: column indices (into the full feature vector) the model was trained on.
        classes: for classifiers, the global class index of each of the model's outputs
            (the model was fitted on local labels ``0..len(classes)-1``); None for regressors.
        n_rows: rows (including bootstrap copies) it was fitted on.
        constant: set when the group held a single class: the member always votes for it.
    """

    group: int
    model: Any
    features: np.ndarray
    classes: Optional[np.ndarray]
    n_rows: int
    constant: bool = False

    def _inputs(self, X: "np.ndarray | _Batch") -> np.ndarray:
        if isinstance(X, _Batch):
            X = X.for_model(self.model)
        if self.features.size == X.shape[1] and np.array_equal(self.features, np.arange(X.shape[1])):
            return X
        return X[:, self.features]

    def aligned_proba(self, X: np.ndarray, n_classes: int) -> np.ndarray:
        """Probabilities in the global class order (zeros for classes this member never saw)."""
        out = np.zeros((X.shape[0], n_classes))
        if self.constant:
            out[:, self.classes[0]] = 1.0
            return out
        out[:, self.classes] = self.model.predict_proba(self._inputs(X))
        return out

    def aligned_vote(self, X: np.ndarray) -> np.ndarray:
        """Global class index voted for by this member, per row."""
        if self.constant:
            return np.full(X.shape[0], self.classes[0], dtype=np.int64)
        local = np.asarray(self.model.predict(self._inputs(X))).astype(np.int64)
        return self.classes[local]

    def predict_value(self, X: np.ndarray) -> np.ndarray:
        return np.asarray(self.model.predict(self._inputs(X)), dtype=np.float64).reshape(-1)


class _Batch:
    """One batch of features shared by all members, converted at most once per dtype.

    scikit-learn trees predict on float32 and convert float64 input themselves, once per call;
    converting once per batch for all tree members gives the same numbers without the copies.
    """

    def __init__(self, X: np.ndarray) -> None:
        self.X = X
        self.shape = X.shape
        self._f32: Optional[np.ndarray] = None

    def for_model(self, model: Any) -> np.ndarray:
        if hasattr(model, "tree_"):
            if self._f32 is None:
                self._f32 = np.ascontiguousarray(self.X, dtype=np.float32)
            return self._f32
        return self.X


def vote(members: Sequence[Member], X: np.ndarray, n_classes: int, voting: str) -> np.ndarray:
    """Raw class scores (n_rows, n_classes): summed probabilities (soft) or vote counts (hard)."""
    X = _Batch(X) if isinstance(X, np.ndarray) else X
    raw = np.zeros((X.shape[0], n_classes))
    if voting == "soft":
        for m in members:
            raw += m.aligned_proba(X, n_classes)
    else:
        rows = np.arange(X.shape[0])
        for m in members:
            np.add.at(raw, (rows, m.aligned_vote(X)), 1.0)
    return raw


def probabilities(raw: np.ndarray) -> np.ndarray:
    total = raw.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, raw / np.where(total > 0, total, 1.0), 1.0 / raw.shape[1])


def mean_prediction(members: Sequence[Member], X: np.ndarray) -> np.ndarray:
    X = _Batch(X) if isinstance(X, np.ndarray) else X
    out = np.zeros(X.shape[0])
    for m in members:
        out += m.predict_value(X)
    return out / max(1, len(members))
