"""Combining members' outputs: soft/hard voting and averaging.  [anywhere]

Used both inside the Arrow UDF on executors and by ``predict``/``predict_proba`` on the driver, so
the two always give the same numbers.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from .member_records import Member


class Batch:
    """One batch of features (dense, or CSR) shared by all members, converted at most once per dtype.

    scikit-learn trees predict on float32 and convert float64 input themselves, once per call;
    converting once per batch for all tree members gives the same numbers without the copies.
    """

    def __init__(self, X: np.ndarray) -> None:
        self.X = X
        self.shape = X.shape
        self._f32: Optional[np.ndarray] = None

    def for_model(self, model: Any) -> np.ndarray:
        if hasattr(model, "tree_") and isinstance(self.X, np.ndarray):  # CSR goes as it is
            if self._f32 is None:
                self._f32 = np.ascontiguousarray(self.X, dtype=np.float32)
            return self._f32
        return self.X


def vote(members: Sequence[Member], X: np.ndarray, n_classes: int, voting: str) -> np.ndarray:
    """Raw class scores (n_rows, n_classes): summed probabilities (soft) or vote counts (hard)."""
    X = X if isinstance(X, Batch) else Batch(X)
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
    X = X if isinstance(X, Batch) else Batch(X)
    out = np.zeros(X.shape[0])
    for m in members:
        out += m.predict_value(X)
    return out / max(1, len(members))
