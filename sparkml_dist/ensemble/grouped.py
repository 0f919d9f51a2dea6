"""Many models: one scikit-learn-API model per distinct key of a column.  [driver]

``GroupedTrainer(estimator, groupCol, featuresCols, labelCol).fit(df)`` trains one clone of
``estimator`` per distinct value of ``groupCol`` (a store, a customer segment, a sensor):

Any number of keys (10^6 in a benchmark):

1. one aggregation job counts each key's rows (:func:`.engine.key_counts.count_keys`:
   keys stay in Spark's types, so a timestamp or an array key finds all of its rows; the driver
   holds them as Arrow); null keys are refused; keys with fewer than ``minRows`` rows are
   reported: an error listing them (default) or, with ``onSmallGroups="skip"``, a warning and the
   model's ``skippedGroups``;
2. the per-group engine (:mod:`.engine.groups`) gives each task a run of
   consecutive keys (cut where the rows divide evenly), orders each key's rows by a hash of the
   seed and the row (the same models on any partitioning), and fits one clone per key, one key's
   rows held at a time;
3. each task writes its models in blocks as it fits them (:mod:`.stored.key_blocks`: a few hundred
   models a block): to ``membersDir``, or collected whole; the driver keeps counts and references
   (:class:`~.stored.key_models.KeyModels`), never the models.  A key whose fit raises fails the fit with
   a ``WorkerError`` naming the key and its traceback, or with ``onError="skip"`` keeps its row in
   its block with the reason, listed in ``model.failedGroups``.

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
import uuid
from typing import Any, List, Optional

import numpy as np
from pyspark import keyword_only
from pyspark.ml import Estimator

from .. import gpus as gpus_mod
from .. import launch, plan, serialization, tracking
from ..errors import ConfigurationError
from ..group_rows import SeedDraw
from . import validation
from .engine import groups, key_counts, streamed_keys
from .engine.fitting import Clone, GroupFitSpec, Inputs, fresh_copy
from .grouped_model import GroupedModel
from .member_records import FEATURES, LABEL
from .params import GroupedParams
from .stored import member_store
from .stored.key_models import KeyModels
from .stored.persistence import StageReadWrite

log = logging.getLogger(__name__)


class GroupedTrainer(Estimator, GroupedParams, StageReadWrite):
    """One clone of ``estimator`` per distinct value of ``groupCol`` (see the module docstring).

    Parameters (keyword): ``estimator``, ``groupCol``, ``featuresCols`` / ``featuresCol``,
    ``labelCol``, ``predictionCol``, ``minRows`` (1), ``onSmallGroups`` ("error" | "skip"),
    ``unseenKey`` ("error" | "null"), ``seed`` (0: each key's rows are ordered by a hash of it and
    the row, and an estimator whose ``random_state`` is None gets the key's own seed: the same
    models on any partitioning), ``membersDir``, ``onError`` ("raise" | "skip": ``model.failedGroups``),
    ``useGpu``, ``gpuMemoryPerMember``, ``mlflow``: as for :class:`~.BaggingClassifier`;
    ``keyTimeout`` (seconds; unset: none): a key whose fit runs longer is stopped and fails
    (:mod:`.engine.key_watch`: each task then fits in a child process, about a second to start);
    ``streamAbove`` (rows; unset: what one task's memory holds): a key with more rows trains from a
    stream with the estimator's ``partial_fit`` (:mod:`.engine.streamed_keys`, :mod:`.engine.stream`).
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
        gpuMemoryPerMember: Optional[str] = None,
        keyTimeout: Optional[float] = None,
        streamAbove: Optional[int] = None,
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
        """Rows per key in one job (:func:`.engine.key_counts.count_keys`); refuses null labels and
        features.  (the counts, the indices of the keys kept)."""
        from pyspark.sql import functions as F

        counts = key_counts.count_keys(
            prepared,
            self.getGroupCol(),
            {
                "null_labels": F.sum(F.when(F.col(LABEL).isNull(), 1).otherwise(0)),
                "null_features": F.sum(F.when(F.col(FEATURES).isNull(), 1).otherwise(0)),
            },
        )
        for what, param in (("null_labels", "labelCol"), ("null_features", "features")):
            nulls = counts.extra(what)
            bad = np.flatnonzero(nulls > 0)
            if bad.size:
                raise ConfigurationError(
                    f"{param}: {int(nulls.sum())} rows are null (keys "
                    f"{counts.python_keys(bad[:5])}); drop or impute them first."
                )
        keep = np.flatnonzero(counts.rows >= self.getMinRows())
        self._check_small(counts, keep)
        return counts, keep

    def _check_small(self, counts, kept: np.ndarray) -> None:
        key_col, n_small = self.getGroupCol(), counts.n - len(kept)
        small = np.flatnonzero(counts.rows < self.getMinRows())[:10]
        shown = list(zip(counts.python_keys(small), counts.rows[small].tolist()))
        if n_small and self.getOnSmallGroups() == "error":
            listed = ", ".join(f"{k!r}: {n}" for k, n in shown)
            raise ConfigurationError(
                f"{n_small} key(s) of {key_col!r} have fewer than minRows={self.getMinRows()} rows "
                f"({listed}{', ...' if n_small > 10 else ''}). Filter them out, lower minRows, or "
                "set onSmallGroups='skip' to train the others and list these in model.skippedGroups."
            )
        if n_small:
            log.warning(
                "GroupedTrainer: skipping %d key(s) with fewer than %d rows: %s",
                n_small,
                self.getMinRows(),
                [k for k, _ in shown],
            )
        if not len(kept):
            raise ConfigurationError(
                f"no key of {key_col!r} has minRows={self.getMinRows()} rows; nothing to fit."
            )

    def _fit(self, dataset):
        try:
            return tracking.tracked_fit(self, self._fit_keys, dataset)
        finally:  # the fit's own objects are gone now: 10^6 keys left ~60 MiB of freed heap resident
            launch.give_back_memory()

    def _fit_keys(self, dataset):
        self._check_params(dataset)
        timeout, stream_above = self.getKeyTimeout(), self.getStreamAbove()  # refused before any job
        blob = self._estimator_blob()
        est = serialization.loads(blob)
        key_col = self.getGroupCol()
        prepared, is_string_label = self._prepare(dataset)
        spark = launch.session_of(dataset)
        counts, keep = self._count_keys(prepared)
        bytes_per_row = ((len(self.getFeaturesCols()) or 1) + 2) * 8
        held, stream = streamed_keys.plan(
            spark, prepared, counts, keep, est, stream_above, bytes_per_row, LABEL
        )
        split = groups.by_key(
            prepared, counts, [FEATURES, LABEL], keep=keep, seed=int(self.getSeed()),
            key_cols=[key_col, FEATURES, LABEL], bytes_per_row=bytes_per_row, held_rows=held,
        )  # fmt: skip
        rows, columns = int(counts.rows[keep].max(initial=1)), len(self.getFeaturesCols() or ()) or 1
        need = plan.member_gpu_bytes(self.getUseGpu(), self.getGpuMemoryPerMember(), rows, columns)
        gpus, profile = gpus_mod.plan_models(spark, est, self.getUseGpu(), "useGpu", need)
        store = member_store.new_store(self.getMembersDir(), self.uid)
        fit_id = uuid.uuid4().hex
        state = {"label_is_string": is_string_label, **({"key_fold": counts.fold} if counts.fold else {})}
        spec = GroupFitSpec(
            Clone(blob, seeds=SeedDraw(int(self.getSeed()), split.n), gpus=gpus), Inputs((FEATURES,), LABEL),
            None, self.getOnError(), store, "key", (fit_id, split.n, state),
            key_timeout=timeout, stream=stream,
        )  # fmt: skip
        description = f"sparkml_dist: fitting {split.n} models by {key_col}"
        fitted = groups.fit_keys(split, spec, what="key", description=description, profile=profile)
        uri = store.uri if store else None
        models = KeyModels(split.key_array, fitted.rows, fitted.blocks, fit_id, uri, fold=counts.fold)
        model = GroupedModel(models=models, skipped=split.small, label_is_string=is_string_label)
        model.failedGroups = {split.key(i): why for i, why in fitted.failed.items()}
        return self._copyValues(model)
