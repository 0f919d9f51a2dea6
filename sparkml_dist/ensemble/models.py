"""BaggingClassificationModel / BaggingRegressionModel: the fitted members, predicting.  [driver]

``transform`` scores whole Arrow batches on the executors (:func:`.scoring.members.
predict_arrow`); ``predict`` / ``predict_proba`` give the same numbers locally, through the same
:mod:`.aggregation`.  Models save and load like any pyspark.ml stage
(:mod:`.stored.persistence`).

Example::

    model = BaggingClassifier(numModels=8, featuresCols=cols).fit(train_df)
    model.transform(test_df).select("prediction", "probability").show()
    model.predict_proba(X)                    # the same numbers for a numpy array, locally
    model.models[0].model                     # a member: predicts your label values
    BaggingClassificationModel.load(path)     # after model.write().save(path)
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np
import pyarrow as pa
from pyspark.ml import Model
from pyspark.sql import functions as F

from .. import serialization, spark_compat
from ..errors import ConfigurationError
from . import validation
from .aggregation import mean_prediction, probabilities, vote
from .member_records import Member
from .members import FittedMember, public
from .params import ClassifierParams, RegressorParams
from .scoring import members as _member_scoring
from .stored.member_store import LazyMembers
from .stored.members_table import TableMembers
from .stored.persistence import StageReadWrite


class BaggingModel(Model, StageReadWrite, TableMembers):
    _is_classifier = False

    def _table_state(self) -> dict:
        return {
            "n_features": self._n_features,
            "classes": None if self._classes is None else list(self._classes),
        }

    @classmethod
    def _from_members(cls, members: list, state: dict):
        return cls(members=members, n_features=int(state.get("n_features", 0)), classes=state.get("classes"))

    def __init__(
        self,
        members: Optional[List[Member]] = None,
        n_features: int = 0,
        classes: Optional[Sequence[float]] = None,
    ):
        super().__init__()
        self._members = members if isinstance(members, LazyMembers) else list(members or [])
        self._n_features = int(n_features)
        self._classes = tuple(float(c) for c in classes) if classes is not None else None
        self.failedGroups: dict = {}  # a fit with onError="skip": {group: why its member failed}
        self.oobScore_: Optional[float] = None  # set by a fit with oobScore=True (not saved with the model)
        self.oobMetrics_: dict = {}  # the same fit: accuracy (+ auc for two classes), or r2 and rmse

    # ------------------------------------------------------------------ inspection
    @property
    def models(self) -> List[FittedMember]:
        """The fitted members (:class:`~.members.FittedMember`): ``.model``
        (a classifier's predicts your label values), ``.features`` (column indices), ``.classes``,
        ``.predict(X)`` on the full feature matrix."""
        return [public(m, self._classes) for m in self._members]

    @property
    def numFeatures(self) -> int:
        return self._n_features

    @property
    def groupSizes(self) -> List[int]:
        """Rows each member was trained on (bootstrap copies included)."""
        records = getattr(self._members, "records", None)  # members in a store: no loading
        if records is not None and all(records):
            return [int(r["n_rows"]) for r in records]
        return [m.n_rows for m in self._members]

    # ------------------------------------------------------------------ local prediction
    def _local_X(self, X) -> np.ndarray:
        if hasattr(X, "tocsr"):  # scipy.sparse: kept sparse, as transform keeps sparse vectors
            if X.ndim != 2 or X.shape[1] != self._n_features:
                raise ConfigurationError(f"X has shape {X.shape}; expected (n_rows, {self._n_features}).")
            return X.tocsr()
        cols = self.getFeaturesCols()
        if hasattr(X, "columns") and cols and all(c in X.columns for c in cols):
            X = X[cols]
        arr = np.asarray(X, dtype=np.float64)
        if arr.ndim != 2 or arr.shape[1] != self._n_features:
            raise ConfigurationError(f"X has shape {arr.shape}; expected (n_rows, {self._n_features}).")
        return arr

    def _predict_spec(self) -> _member_scoring.PredictSpec:
        blob = serialization.dumps(self._members)
        return _member_scoring.PredictSpec(
            blob=blob,
            digest=serialization.digest(blob),
            is_classifier=self._is_classifier,
            n_classes=len(self._classes or ()),
            classes=self._classes or (),
            voting=self.getVoting() if self._is_classifier else "",
            n_features=self._n_features,
            features_col=self.getFeaturesCol(),
        )

    # ------------------------------------------------------------------ Spark transform
    def _transform(self, dataset):
        spec = self._predict_spec()
        feats = validation.features_column(dataset, self.getFeaturesCol(), self.getFeaturesCols())
        if self._is_classifier:
            out_type = "struct<prediction: double, probability: array<double>, raw: array<double>>"
        else:
            out_type = "struct<prediction: double>"

        def predict(features: pa.Array) -> pa.Array:
            return _member_scoring.predict_arrow(features, spec)

        udf = spark_compat.arrow_udf(predict, out_type)
        tmp = "__sd_prediction"
        out = dataset.withColumn(tmp, udf(feats))
        outputs = {self.getPredictionCol(): F.col(f"{tmp}.prediction")}
        if self._is_classifier:
            from pyspark.ml.functions import array_to_vector

            outputs[self.getProbabilityCol()] = array_to_vector(F.col(f"{tmp}.probability"))
            outputs[self.getRawPredictionCol()] = array_to_vector(F.col(f"{tmp}.raw"))
        outputs = {name: col for name, col in outputs.items() if name}
        return out.withColumns(outputs).drop(tmp)


class BaggingClassificationModel(BaggingModel, ClassifierParams):
    """A fitted :class:`BaggingClassifier`."""

    _is_classifier = True

    @property
    def classes(self) -> tuple:
        """The label values, in the order of the probability vector."""
        return self._classes

    @property
    def numClasses(self) -> int:
        return len(self._classes)

    def predict_raw(self, X) -> np.ndarray:
        return vote(self._members, self._local_X(X), len(self._classes), self.getVoting())

    def predict_proba(self, X) -> np.ndarray:
        """Class probabilities for a local numpy array / pandas DataFrame (as ``transform``)."""
        return probabilities(self.predict_raw(X))

    def predict(self, X) -> np.ndarray:
        """Predicted labels for a local numpy array / pandas DataFrame (as ``transform``)."""
        raw = self.predict_raw(X)
        return np.asarray(self._classes)[raw.argmax(axis=1)]


class BaggingRegressionModel(BaggingModel, RegressorParams):
    """A fitted :class:`BaggingRegressor`."""

    def predict(self, X) -> np.ndarray:
        """Mean of the members' predictions for a local numpy array / pandas DataFrame."""
        return mean_prediction(self._members, self._local_X(X))
