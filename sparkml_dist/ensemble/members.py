"""The fitted members as a user pulls them out of a bagging model.  [anywhere]

Inside the ensemble a classifier member is fitted on its group's labels encoded ``0..c-1`` (XGBoost
needs them so) and voted through :class:`~.member_records.Member`.  What
``model.models`` hands out speaks the user's labels instead::

    m = model.models[0]
    m.model.predict(X[:, m.features])   # the original label values, e.g. 0.0 / 1.0 / 7.0
    m.predict(X)                        # the same from the full feature matrix
    m.model.feature_importances_        # anything else is the fitted estimator's own attribute
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from .member_records import Member


class LabelledClassifier:
    """A member's fitted classifier whose ``predict`` returns label values, not local indices.

    ``classes_`` holds the labels of the estimator's outputs (the columns of ``predict_proba``);
    ``estimator_`` is the fitted object itself (None for a member whose group held one class: it
    always predicts that class).  Other attributes are read from ``estimator_``.
    """

    def __init__(self, estimator: Any, classes: np.ndarray) -> None:
        self.estimator_ = estimator
        self.classes_ = np.asarray(classes, dtype=np.float64)

    def predict(self, X) -> np.ndarray:
        if self.estimator_ is None:
            return np.full(np.shape(X)[0], self.classes_[0])
        local = np.asarray(self.estimator_.predict(X)).astype(np.int64)
        return self.classes_[local]

    def predict_proba(self, X) -> np.ndarray:
        if self.estimator_ is None:
            return np.ones((np.shape(X)[0], 1))
        return np.asarray(self.estimator_.predict_proba(X))

    def __getattr__(self, name: str) -> Any:
        est = self.__dict__.get("estimator_")
        if est is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(est, name)

    def __repr__(self) -> str:
        return f"LabelledClassifier({self.estimator_!r}, classes_={self.classes_.tolist()})"


@dataclass(frozen=True)
class FittedMember:
    """One member: ``model`` (predicts label values for classifiers), ``features`` (the column
    indices it reads), ``classes`` (the label values it saw; None for regressors), ``group`` and
    ``n_rows`` (rows it was fitted on, bootstrap copies included)."""

    group: int
    model: Any
    features: np.ndarray
    classes: Optional[tuple]
    n_rows: int

    def predict(self, X) -> np.ndarray:
        """Predictions for the full feature matrix (the member picks its own columns)."""
        return np.asarray(self.model.predict(np.asarray(X, dtype=np.float64)[:, self.features]))


def public(member: Member, labels: Optional[tuple]) -> FittedMember:
    """The user's view of ``member``; ``labels`` are the ensemble's classes (None: a regressor)."""
    if labels is None:
        return FittedMember(member.group, member.model, member.features, None, member.n_rows)
    values = np.asarray(labels, dtype=np.float64)[np.asarray(member.classes, dtype=np.int64)]
    model = LabelledClassifier(None if member.constant else member.model, values)
    return FittedMember(member.group, model, member.features, tuple(values.tolist()), member.n_rows)
