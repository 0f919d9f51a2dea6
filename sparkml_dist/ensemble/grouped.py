"""Many models: one scikit-learn-API model per distinct key of a column.  [driver]

``GroupedTrainer(estimator, groupCol, featuresCols, labelCol).fit(df)`` trains one clone of
``estimator`` per distinct value of ``groupCol`` (a store, a customer segment, a sensor):

1. one aggregation job counts each key's rows (:func:`sparkml_dist.ensemble.groups.count_keys`:
   keys stay in Spark's types, so a timestamp or an array key finds all of its rows); null keys
   are refused; keys with fewer than ``minRows`` rows are reported: an error listing them
   (default) or, with ``onSmallGroups="skip"``, a warning and the model's ``skippedGroups``;
2. the per-group engine (:mod:`sparkml_dist.ensemble.groups`) sends each key's rows to one task,
   orders them by a hash of the seed and the row (the same models on any partitioning), and fits
   one clone per key, one key's rows held at a time;
3. the fitted models come back through the shared collection layer, or stay in ``membersDir``; a
   key whose fit raises fails the fit with a ``WorkerError`` naming the key and its traceback, or
   with ``onError="skip"`` is listed in ``model.failedGroups``.

``GroupedModel.transform(df)`` adds ``predictionCol`` from the model of each row's key; a key not
seen in training raises (``unseenKey="error"``, default) or predicts null (``unseenKey="null"``).
``GroupedModel.predict(X, keys)`` does the same locally. Models save and load like any pyspark.ml
stage (also inside a Pipeline).

Example::

    from sparkml_dist.ensemble import GroupedTrainer
    from sklearn.linear_model import Ridge

    model = GroupedTrainer(estimator=Ridge(), groupCol="store", featuresCols=["price", "promo"],
                           labelCol="sales").fit(df)
    model.transform(new_df).select("store", "prediction").show()
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional

import numpy as np
import pyarrow as pa
from pyspark import keyword_only
from pyspark.ml import Estimator, Model

from .. import gpus as gpus_mod
from .. import launch, partitioning, serialization, tracking
from ..errors import ConfigurationError
from . import groups, member_store, validation
from ._fit_groups import Clone, GroupFitSpec, Inputs, fresh_copy
from ._key_scoring import PredictSpec, predict_batch, predict_keys
from .member_records import FEATURES, LABEL, KeyModel
from .members_table import TableMembers
from .params import _GroupedParams
from .persistence import StageReadWrite

log = logging.getLogger(__name__)


class GroupedTrainer(Estimator, _GroupedParams, StageReadWrite):
    """One clone of ``estimator`` per distinct value of ``groupCol`` (see the module docstring).

    Parameters (keyword): ``estimator``, ``groupCol``, ``featuresCols`` / ``featuresCol``,
    ``labelCol``, ``predictionCol``, ``minRows`` (1), ``onSmallGroups`` ("error" | "skip"),
    ``unseenKey`` ("error" | "null"), ``seed`` (0: each key's rows are ordered by a hash of it and
    the row, and an estimator whose ``random_state`` is None gets the key's own seed: the same
    models on any partitioning), ``membersDir``, ``onError`` ("raise" | "skip": ``model.failedGroups``),
    ``useGpu``, ``mlflow``: as for :class:`~sparkml_dist.ensemble.BaggingClassifier`.
    """

    @keyword_only
    def __init__(
        self,
        *,
        estimator: Any = None,
        groupCol: Optional[str] = None,
        featuresCols: Optional[List[str]] = None,
        featuresCol: str = "features",
        labelCol: str = "label",
        predictionCol: str = "prediction",
        minRows: int = 1,
        onSmallGroups: str = "error",
        unseenKey: str = "error",
        mlflow: Optional[bool] = None,
        seed: int = 0,
        membersDir: Optional[str] = None,
        onError: str = "raise",
        useGpu: bool = False,
    ):
        super().__init__()
        self._set(**self._input_kwargs)

    @keyword_only
    def setParams(self, **kwargs):
        return self._set(**kwargs)

    def _estimator_blob(self) -> bytes:
        est = self.getEstimator()
        if est is None or not hasattr(est, "fit") or not hasattr(est, "predict"):
            raise ConfigurationError(
                "estimator must be a scikit-learn-API estimator with fit and predict, "
                f"got {type(est).__name__}"
            )
        try:
            est = fresh_copy(est)  # unfitted: a fitted estimator's state is not shipped
        except Exception as exc:
            raise ConfigurationError(
                f"estimator={est!r} cannot be cloned: {type(exc).__name__}: {exc}; pass an estimator "
                "whose get_params() returns its constructor arguments"
            ) from exc
        return serialization.travelling(est, f"estimator={est!r}")

    def _prepare(self, dataset):
        """(the key, features and label columns, whether the label is a string)."""
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        key_col = self.getGroupCol()
        feats = validation.features_column(dataset, self.getFeaturesCol(), self.getFeaturesCols())
        if self.getLabelCol() not in dataset.columns:
            raise ConfigurationError(
                f"labelCol={self.getLabelCol()!r} is not a column; the DataFrame has {dataset.columns}"
            )
        is_string_label = isinstance(dataset.schema[self.getLabelCol()].dataType, T.StringType)
        label = (
            F.col(self.getLabelCol())
            if is_string_label
            else validation.numeric_column(dataset, self.getLabelCol(), "labelCol")
        )
        return dataset.select(F.col(key_col), feats.alias(FEATURES), label.alias(LABEL)), is_string_label

    def _count_keys(self, prepared):
        """Rows per key in one job (:func:`groups.count_keys`); refuses null keys, labels and
        features.  (the counts, the indices of the keys kept, small keys)."""
        from pyspark.sql import functions as F

        key_col = self.getGroupCol()
        counts = groups.count_keys(
            prepared,
            key_col,
            {
                "null_labels": F.sum(F.when(F.col(LABEL).isNull(), 1).otherwise(0)),
                "null_features": F.sum(F.when(F.col(FEATURES).isNull(), 1).otherwise(0)),
            },
        )
        for what, param in (("null_labels", "labelCol"), ("null_features", "features")):
            bad = [(k, e[what]) for k, e in zip(counts.keys, counts.extras) if e[what]]
            if bad:
                raise ConfigurationError(
                    f"{param}: {sum(n for _, n in bad)} rows are null (keys "
                    f"{[k for k, _ in bad[:5]]}); drop or impute them first."
                )
        keep = [g for g, n in enumerate(counts.rows) if n >= self.getMinRows()]
        small = {counts.keys[g]: counts.rows[g] for g in range(len(counts.keys)) if g not in set(keep)}
        return counts, keep, small

    def _check_small(self, small: Dict[Any, int], kept: List[int]) -> None:
        key_col = self.getGroupCol()
        if small and self.getOnSmallGroups() == "error":
            listed = ", ".join(f"{k!r}: {n}" for k, n in list(small.items())[:10])
            raise ConfigurationError(
                f"{len(small)} key(s) of {key_col!r} have fewer than minRows={self.getMinRows()} rows "
                f"({listed}{', ...' if len(small) > 10 else ''}). Filter them out, lower minRows, or "
                "set onSmallGroups='skip' to train the others and list these in model.skippedGroups."
            )
        if small:
            log.warning(
                "GroupedTrainer: skipping %d key(s) with fewer than %d rows: %s",
                len(small),
                self.getMinRows(),
                list(small)[:10],
            )
        if not kept:
            raise ConfigurationError(
                f"no key of {key_col!r} has minRows={self.getMinRows()} rows; nothing to fit."
            )

    def _fit(self, dataset):
        return tracking.tracked_fit(self, self._fit_keys, dataset)

    def _fit_keys(self, dataset):
        self._check_params(dataset)
        blob = self._estimator_blob()
        key_col = self.getGroupCol()
        prepared, is_string_label = self._prepare(dataset)
        spark = launch.session_of(dataset)
        counts, keep, small = self._count_keys(prepared)
        self._check_small(small, keep)
        n_features = len(self.getFeaturesCols()) or 1
        split = groups.by_key(
            prepared,
            counts,
            [FEATURES, LABEL],
            keep=keep,
            seed=int(self.getSeed()),
            key_cols=[key_col, FEATURES, LABEL],
            bytes_per_row=(n_features + 2) * 8,
        )
        est = serialization.loads(blob)
        gpus, profile = gpus_mod.plan_models(spark, est, self.getUseGpu(), "useGpu")
        spec = partitioning.SplitSpec(num_groups=max(1, len(split.keys)), seed=int(self.getSeed()))
        recipe = Clone(blob, seeds=tuple(partitioning.group_seeds(spec)), gpus=gpus)
        store = member_store.new_store(self.getMembersDir(), self.uid)
        fitted = groups.fit(
            split,
            GroupFitSpec(
                recipe, Inputs(features=(FEATURES,), label=LABEL), split.keys, self.getOnError(), store, "key"
            ),
            what="key",
            description=f"sparkml_dist: fitting {len(split.keys)} models by {key_col}",
            profile=profile,
        )
        if store is None:
            members = [r.model for r in fitted.results if r is not None]
        else:  # loaded when used; the driver names each key (a record holds no key JSON cannot)
            members = member_store.LazyMembers(store.uri, fitted.stored)
        kept = [r.key for r in fitted.results if r is not None]
        model = GroupedModel(members=members, skipped=small, label_is_string=is_string_label, keys=kept)
        model.failedGroups = dict(fitted.skipped)
        return self._copyValues(model)


class GroupedModel(Model, _GroupedParams, StageReadWrite, TableMembers):
    """The models of a :class:`GroupedTrainer`, one per key."""

    def _table_state(self) -> dict:
        return {"label_is_string": self._label_is_string}

    @classmethod
    def _from_members(cls, members: list, state: dict):
        return cls(
            members=sorted(members, key=lambda m: m.group), label_is_string=bool(state.get("label_is_string"))
        )

    def __init__(
        self,
        members: Optional[List[KeyModel]] = None,
        skipped: Optional[Dict[Any, int]] = None,
        label_is_string: bool = False,
        keys: Optional[List[Any]] = None,
    ):
        super().__init__()
        lazy = isinstance(members, member_store.LazyMembers)
        self._members = members if lazy else list(members or [])
        self._keys = list(keys) if keys is not None else None  # the members' keys, when they are lazy
        self._skipped = dict(skipped or {})
        self._label_is_string = bool(label_is_string)
        self.failedGroups: Dict[Any, str] = {}  # a fit with onError="skip": {key: why its fit failed}

    @property
    def keys(self) -> List[Any]:
        """The keys that have a model, in sorted order."""
        return list(self._keys) if self._keys is not None else [m.key for m in self._members]

    @property
    def models(self) -> Dict[Any, Any]:
        """``{key: fitted model}``."""
        return {k: m.model for k, m in zip(self.keys, self._members)}

    @property
    def groupSizes(self) -> Dict[Any, int]:
        if isinstance(self._members, member_store.LazyMembers):  # from the records: nothing loaded
            return {k: int(r["rows"]) for k, r in zip(self.keys, self._members.records)}
        return {m.key: m.rows for m in self._members}

    @property
    def skippedGroups(self) -> Dict[Any, int]:
        """Keys left without a model (fewer than minRows rows) and their row counts."""
        return dict(self._skipped)

    def predict(self, X, keys) -> np.ndarray:
        """Local predictions: row i from the model of ``keys[i]`` (``unseenKey`` applies)."""
        X = X.tocsr() if hasattr(X, "tocsr") else np.asarray(X, dtype=np.float64)
        out_type = pa.string() if self._label_is_string else pa.float64()
        preds = predict_batch(
            pa.array(list(keys)),
            X,
            pa.array(self.keys),
            [m.model for m in self._members],
            self.getUnseenKey(),
            out_type,
        )
        return np.asarray(preds.to_pylist(), dtype=object if self._label_is_string else np.float64)

    def _transform(self, dataset):
        from pyspark.sql import types as T

        self._check_params(dataset)
        feats = validation.features_column(dataset, self.getFeaturesCol(), self.getFeaturesCols())
        if self.getPredictionCol() in dataset.columns:
            raise ConfigurationError(
                f"predictionCol={self.getPredictionCol()!r} is already a column; set another predictionCol"
            )
        lazy = isinstance(self._members, member_store.LazyMembers)  # each worker reads the store itself
        blob = serialization.dumps((self.keys, self._members if lazy else [m.model for m in self._members]))
        spec = PredictSpec(
            self.getGroupCol(),
            self.getPredictionCol(),
            "string" if self._label_is_string else "double",
            serialization.digest(blob),
            blob,
            self.getUnseenKey(),
        )
        out_type = T.StringType() if self._label_is_string else T.DoubleType()
        schema = T.StructType(
            dataset.schema.fields + [T.StructField(self.getPredictionCol(), out_type, True)]
        )
        from functools import partial

        # the features as fit saw them (vectors stay vectors: CSR for models that take it)
        return dataset.withColumn(FEATURES, feats).mapInArrow(partial(predict_keys, spec=spec), schema)

    # persistence (StageReadWrite stores _members in the model store, this state in metadata)
    def _persisted_state(self) -> dict:
        return {
            "label_is_string": self._label_is_string,
            "skipped": [[k, n] for k, n in self._skipped.items()],
        }

    def _restore_state(self, state: dict, members: list) -> None:
        self._members = sorted(members, key=lambda m: m.group)
        self._keys = None
        self._label_is_string = bool(state.get("label_is_string", False))
        self._skipped = {k: n for k, n in state.get("skipped", [])}
