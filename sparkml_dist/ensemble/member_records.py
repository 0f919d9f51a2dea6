"""The member format: what one fitted model of an ensemble is, and its record on disk.  [anywhere]

A bagging member (:class:`Member`) or a grouped model's key model (:class:`KeyModel`) is saved as
two items of its group in a :class:`~sparkml_dist.formats.store.ModelStore`: item :data:`RECORD`, a
JSON record of everything but the model, and item :data:`MODEL`, the model in a format whose loading
runs no code.  Executors write members this way (``membersDir``) and a saved stage holds them the
same way, so both read them back with :func:`from_record`.

Also the names of the columns the ensemble stages hand to their executor code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from ..formats.checks import UnsafeModelError

# the columns a fit hands its executors (the user's columns, renamed)
FEATURES, LABEL, WEIGHT = "__sd_features", "__sd_label", "__sd_weight"

RECORD, MODEL = 0, 1  # the items of a member's group in a store
ESTIMATOR_GROUP = -1  # a saved estimator's group (its unfitted estimator), not a member


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

    def _inputs(self, X: Any) -> np.ndarray:
        if hasattr(X, "for_model"):  # an aggregation.Batch: converted once for all members
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


@dataclass(frozen=True)
class KeyModel:
    """The model fitted for one key (``group`` is the key's index in the trained model), the rows it
    saw and what its training reported (``metrics``: the user's function's)."""

    group: int
    key: Any
    model: Any
    rows: int
    metrics: Dict[str, float] = field(default_factory=dict)


def json_key(key: Any) -> bool:
    try:
        json.dumps(key)
        return True
    except (TypeError, ValueError):
        return False


def to_record(m: Any) -> Tuple[dict, Any]:
    """(the JSON record of a :class:`Member` or :class:`KeyModel`, its model)."""
    if isinstance(m, Member):
        classes = None if m.classes is None else [int(c) for c in m.classes]
        return {
            "kind": "member",
            "group": int(m.group),
            "features": [int(f) for f in m.features],
            "classes": classes,
            "n_rows": int(m.n_rows),
            "constant": bool(m.constant),
        }, m.model
    record = {"kind": "key_model", "group": int(m.group), "rows": int(m.rows)}
    if json_key(m.key):  # a key JSON cannot hold (a timestamp) is the driver's to name, by group
        record["key"] = m.key
    if m.metrics:
        record["metrics"] = dict(m.metrics)
    return record, m.model


def from_record(record: dict, model: Any) -> Any:
    """The :class:`Member` or :class:`KeyModel` a record and its model describe."""
    if record.get("kind") == "member":
        classes = record["classes"]
        return Member(
            int(record["group"]),
            model,
            np.asarray(record["features"], dtype=np.int64),
            None if classes is None else np.asarray(classes, dtype=np.int64),
            int(record["n_rows"]),
            bool(record["constant"]),
        )
    if record.get("kind") == "key_model":
        metrics = {str(k): float(v) for k, v in (record.get("metrics") or {}).items()}
        return KeyModel(int(record["group"]), record.get("key"), model, int(record["rows"]), metrics)
    raise UnsafeModelError(f"unknown member record kind {record.get('kind')!r}")


def write_member(write: Callable[[int, int, Any], dict], member: Any) -> List[dict]:
    """One member's record and model through ``write(group, item, obj) -> meta`` (a
    :meth:`ModelStore.write <sparkml_dist.formats.store.ModelStore.write>`); their metadata, the record
    inside (what the driver needs without loading anything).  Nothing of the member stays
    referenced after the call."""
    record, model = to_record(member)
    metas = [write(record["group"], RECORD, record), write(record["group"], MODEL, model)]
    metas[0]["record"] = record  # lets a lazy load size the groups without loading them
    return metas
