"""BaggingClassifier / BaggingRegressor: one scikit-learn-API model per group.  [driver]

``fit``: validate parameters and columns (no Spark job) -> split rows into groups
(:func:`.engine.groups.by_split`, one sizing/validation job) -> fit one clone of
``estimator`` per group inside the executors (the per-group engine,
:func:`.engine.groups.fit`) -> a model holding the members.

Example::

    from sklearn.tree import DecisionTreeClassifier
    from sparkml_dist.ensemble import BaggingClassifier

    bag = BaggingClassifier(estimator=DecisionTreeClassifier(max_depth=10), numModels=16,
                            sampling="bootstrap", sampleRatio=0.25, featureRatio=0.8, seed=7)
    model = bag.fit(train_df)                 # train_df: "features" vector column, "label" column
    scored = model.transform(test_df)         # + prediction, probability, rawPrediction
    model.predict_proba(X_numpy)              # the same numbers, locally
    model.write().overwrite().save("/models/bag")
"""

from __future__ import annotations

import logging
from typing import Any, List, Optional

from pyspark import keyword_only
from pyspark.ml import Estimator

from .. import _spark_env, arg_checks, feature_arrays, launch, partitioning, plan, serialization, tracking
from .. import gpus as gpus_mod
from ..errors import ConfigurationError
from . import forest, global_forest, validation
from .engine import groups
from .engine.fitting import Clone, GroupFitSpec, Inputs
from .member_records import FEATURES, LABEL, WEIGHT

# models saved by sparkml_dist 0.1 name this module as their class's home (pyspark imports it)
from .models import BaggingClassificationModel, BaggingRegressionModel  # noqa: F401
from .params import ClassifierParams, RegressorParams
from .scoring import oob
from .stored import member_store
from .stored.persistence import StageReadWrite

log = logging.getLogger(__name__)

_NAMES = {
    "num_groups": "numModels",
    "sampling": "sampling",
    "sample_ratio": "sampleRatio",
    "feature_ratio": "featureRatio",
}


def _default_estimator(is_classifier: bool):
    from sklearn.tree import DecisionTreeClassifier, DecisionTreeRegressor

    return DecisionTreeClassifier() if is_classifier else DecisionTreeRegressor()


class _BaggingEstimator(Estimator, StageReadWrite):
    _is_classifier = False

    @classmethod
    def forest(cls, *, strategy: str = "local", **kwargs):
        """A random forest in MLlib's parameter names (:func:`.forest.preset`);
        ``strategy="global"``: every tree sees every row (:mod:`.global_forest`)."""
        if arg_checks.one_of("strategy", strategy, ("local", "global")) == "global":
            return global_forest.preset(cls._is_classifier, **kwargs)
        return forest.preset(cls, **kwargs)

    def _resolved_estimator(self):
        est = self.getEstimator()
        return est if est is not None else _default_estimator(self._is_classifier)

    def _max_classes(self) -> int:
        if not self._is_classifier:
            return 0
        return arg_checks.integer("maxClasses", self.getMaxClasses(), 2)

    def _split_spec(self) -> partitioning.SplitSpec:
        return partitioning.SplitSpec(
            num_groups=self.getNumModels(),
            sampling=self.getSampling(),
            sample_ratio=self.getSampleRatio(),
            feature_ratio=self.getFeatureRatio(),
            seed=int(self.getSeed()),
            names=_NAMES,
        )

    def _check_estimator(self, est, has_weight: bool) -> bytes:
        for method in ("fit", "predict"):
            if not callable(getattr(est, method, None)):
                raise ConfigurationError(
                    f"estimator={est!r} has no {method}() method; pass a "
                    "scikit-learn-API estimator such as DecisionTreeClassifier()."
                )
        try:
            from sklearn.base import is_classifier, is_regressor

            if self._is_classifier and is_regressor(est):
                raise ConfigurationError(
                    f"estimator={est!r} is a regressor; BaggingClassifier needs a "
                    "classifier (or use BaggingRegressor)."
                )
            if not self._is_classifier and is_classifier(est):
                raise ConfigurationError(
                    f"estimator={est!r} is a classifier; BaggingRegressor needs a "
                    "regressor (or use BaggingClassifier)."
                )
        except ImportError:  # pragma: no cover - scikit-learn is a dependency
            pass
        if self._is_classifier:
            arg_checks.one_of("voting", self.getVoting(), ("soft", "hard"))
        if self._is_classifier and self.getVoting() == "soft" and not hasattr(est, "predict_proba"):
            raise ConfigurationError(
                f"voting='soft' needs predict_proba(), which estimator={est!r} lacks; set voting='hard'."
            )
        if has_weight:
            import inspect

            if "sample_weight" not in inspect.signature(est.fit).parameters:
                raise ConfigurationError(
                    f"weightCol={self.getWeightCol()!r} is set but estimator="
                    f"{est!r}.fit() takes no sample_weight; unset weightCol."
                )
        return serialization.travelling(est, f"estimator={est!r}")

    def _prepare(self, dataset, weight_col: str):
        """The features, label (and weight) columns as fit reads them, and the columns rows are keyed by."""
        cols = [
            validation.features_column(dataset, self.getFeaturesCol(), self.getFeaturesCols()).alias(
                FEATURES
            ),
            validation.numeric_column(dataset, self.getLabelCol(), "labelCol").alias(LABEL),
        ]
        if weight_col:
            cols.append(validation.numeric_column(dataset, weight_col, "weightCol").alias(WEIGHT))
        key_cols = [FEATURES, LABEL] + ([WEIGHT] if weight_col else [])
        return dataset.select(*cols), key_cols

    def _check_groups(self, spark, dataset, stats, spec, est, weight_col, vectors, width, stored) -> dict:
        """Check the data from the counting job's findings; returns check_data's findings (and
        whether vectors reach the members sparse)."""
        if not stats.rows and dataset.isEmpty():
            raise ConfigurationError("the input DataFrame is empty; there is nothing to fit.")
        info = validation.check_data(
            stats,
            dataset,
            features_col=self.getFeaturesCol(),
            features_cols=self.getFeaturesCols(),
            label_col=self.getLabelCol(),
            weight_col=weight_col,
            allow_nan=validation.estimator_allows_nan(est),
            is_classifier=self._is_classifier,
            counts_copies=spec.sampling != "disjoint",
            max_classes=self._max_classes(),
            vector_width=width,
        )
        info["subsets"] = partitioning.feature_subsets(info["n_features"], spec)
        info["vectors"], info["sparse_ok"] = vectors, vectors and feature_arrays.accepts_sparse(est)
        self._check_group_memory(spark, stats, spec, info, stored, est)
        log.info("%s: %s", type(self).__name__, stats.summary())
        return info

    def _check_group_memory(self, spark, stats, spec, info: dict, stored: float, est) -> None:
        """No group larger than a task can hold: dense rows, or CSR rows where vectors stay sparse."""
        widest = max(len(s) for s in info["subsets"])
        width = info["n_features"]
        sparse = info["sparse_ok"] and stored < feature_arrays.SPARSE_SHARE * width
        per_row = 12.0 * (stored * widest / width + 2) if sparse else 8.0 * (widest + 4)
        try:
            partitioning.check_groups(
                stats, spec, bytes_per_row=per_row * 4, budget_bytes=_spark_env.task_memory_budget(spark)
            )
        except ConfigurationError as exc:
            if not info["vectors"] or info["sparse_ok"]:
                raise
            raise ConfigurationError(
                f"{exc} featuresCol={self.getFeaturesCol()!r} holds vectors of {width} entries, which "
                f"estimator={est!r} needs dense (it does not take scipy.sparse input): use one that "
                "does (LogisticRegression, SGDClassifier, trees and forests, XGBoost, LightGBM) to keep "
                "them sparse, or make the vectors narrower (e.g. HashingTF's numFeatures)."
            ) from None

    def _fit(self, dataset):
        return tracking.tracked_fit(self, self._fit_members, dataset)

    def _fit_members(self, dataset):
        spec = self._split_spec()
        if self.getOobScore():
            oob.check(spec.sampling)
        max_classes = self._max_classes()  # checked before any job
        est = self._resolved_estimator()
        weight_col = self.getWeightCol() if self.isDefined(self.weightCol) and self.getWeightCol() else ""
        blob = self._check_estimator(est, bool(weight_col))
        prepared, key_cols = self._prepare(dataset, weight_col)
        spark = launch.session_of(dataset)
        vectors = validation.is_vector_input(dataset, self.getFeaturesCol(), self.getFeaturesCols())
        width, stored = validation.vector_shape(dataset, self.getFeaturesCol()) if vectors else (None, 0.0)
        aggs = validation.data_aggregates(self._is_classifier, bool(weight_col), max_classes, vectors)
        split = groups.by_split(prepared, spec, key_cols, extra_aggs=aggs)
        info = self._check_groups(spark, dataset, split.stats, spec, est, weight_col, vectors, width, stored)
        rows = int(split.stats.counts().max())  # the largest member's: its GPU memory estimated from it
        need = plan.member_gpu_bytes(self.getUseGpu(), self.getGpuMemoryPerMember(), rows, info["n_features"])
        gpus, profile = gpus_mod.plan_models(spark, est, self.getUseGpu(), "useGpu", need)
        recipe = Clone(
            blob,
            seeds=tuple(partitioning.group_seeds(spec)),
            member=True,
            classes=tuple(info["classes"] or ()),
            feature_subsets=tuple(tuple(int(i) for i in s) for s in info["subsets"]),
            gpus=gpus,
        )
        inputs = Inputs(
            features=(FEATURES,),
            label=LABEL,
            weight=WEIGHT if weight_col else None,
            n_features=info["n_features"],
            check_values=validation.estimator_allows_nan(est) if vectors else None,
            what=f"featuresCol={self.getFeaturesCol()!r}",
        )
        store = member_store.new_store(self.getMembersDir(), self.uid)
        fitted = groups.fit(
            split,
            GroupFitSpec(recipe, inputs, split.keys, self.getOnError(), store),
            what="group",
            description=f"sparkml_dist: fitting {spec.num_groups} models",
            profile=profile,
            # rows reach each task in key order where vectors stay sparse: its CSR matrix is built in place
            frame=split.frame.sortWithinPartitions(partitioning.GROUP_COL, partitioning.KEY_COL)
            if info["sparse_ok"]
            else None,
        )
        members = (
            [r.model for r in fitted.results if r is not None]
            if store is None
            else member_store.LazyMembers(store.uri, fitted.stored)
        )
        model = self._model_class()(members=members, n_features=info["n_features"], classes=info["classes"])
        model.failedGroups = dict(fitted.skipped)  # onError="skip": {group: its error}
        if self.getOobScore():
            model.oobMetrics_ = oob.score(model, prepared, spec, key_cols)
            model.oobScore_ = model.oobMetrics_.get("accuracy" if self._is_classifier else "r2")
        return self._copyValues(model)


class BaggingClassifier(_BaggingEstimator, ClassifierParams):
    """Bagged ensemble of scikit-learn-API classifiers, one per group of rows (and columns).

    Parameters (all keyword): ``estimator`` (default ``DecisionTreeClassifier()``), ``numModels``
    (10), ``sampling`` ("disjoint" | "bootstrap" | "subsample"), ``sampleRatio`` (1.0),
    ``featureRatio`` (1.0), ``seed`` (42), ``featuresCol`` ("features": a vector or array column) or
    ``featuresCols`` (numeric columns), ``labelCol``, ``weightCol``, ``predictionCol``,
    ``probabilityCol``, ``rawPredictionCol``, ``voting`` ("soft" | "hard"), ``membersDir`` (shared
    storage where executors write the members, for ensembles too big to collect), ``maxClasses`` (1000:
    a label with more distinct values is refused, naming the column, instead of fitting a
    continuous label as thousands of classes), ``useGpu`` (False: each member fitted on a GPU of its
    task through the estimator's ``device`` parameter, e.g. XGBoost's; ``model.models[i].model.
    get_params()["device"]`` says which; how many share a GPU at once: ``gpuMemoryPerMember`` and
    :mod:`sparkml_dist.plan`).

    Labels are numbers; classes are their sorted distinct values, and ``probability`` follows that
    order (labels 0..C-1, as MLlib uses, give class ``i`` at index ``i``).
    """

    _is_classifier = True

    @keyword_only
    def __init__(
        self,
        *,
        estimator: Any = None,
        numModels: int = 10,
        sampling: str = "disjoint",
        sampleRatio: float = 1.0,
        featureRatio: float = 1.0,
        seed: int = 42,
        featuresCol: str = "features",
        featuresCols: Optional[List[str]] = None,
        labelCol: str = "label",
        weightCol: Optional[str] = None,
        predictionCol: str = "prediction",
        probabilityCol: str = "probability",
        rawPredictionCol: str = "rawPrediction",
        voting: str = "soft",
        maxClasses: int = 1000,
        membersDir: Optional[str] = None,
        mlflow: Optional[bool] = None,
        useGpu: bool = False,
        gpuMemoryPerMember: Optional[str] = None,
        oobScore: bool = False,
        onError: str = "raise",
    ):
        super().__init__()
        self._set(**self._input_kwargs)

    @keyword_only
    def setParams(self, **kwargs):
        return self._set(**self._input_kwargs)

    def _model_class(self):
        return BaggingClassificationModel


class BaggingRegressor(_BaggingEstimator, RegressorParams):
    """Bagged ensemble of scikit-learn-API regressors; predictions are the members' mean.

    Same parameters as :class:`BaggingClassifier` without the classifier-only ones
    (``probabilityCol``, ``rawPredictionCol``, ``voting``); default estimator
    ``DecisionTreeRegressor()``.
    """

    @keyword_only
    def __init__(
        self,
        *,
        estimator: Any = None,
        numModels: int = 10,
        sampling: str = "disjoint",
        sampleRatio: float = 1.0,
        featureRatio: float = 1.0,
        seed: int = 42,
        featuresCol: str = "features",
        featuresCols: Optional[List[str]] = None,
        labelCol: str = "label",
        weightCol: Optional[str] = None,
        predictionCol: str = "prediction",
        membersDir: Optional[str] = None,
        mlflow: Optional[bool] = None,
        useGpu: bool = False,
        gpuMemoryPerMember: Optional[str] = None,
        oobScore: bool = False,
        onError: str = "raise",
    ):
        super().__init__()
        self._set(**self._input_kwargs)

    @keyword_only
    def setParams(self, **kwargs):
        return self._set(**self._input_kwargs)

    def _model_class(self):
        return BaggingRegressionModel
