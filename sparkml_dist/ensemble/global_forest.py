"""A forest whose every tree sees every row: XGBoost's random-forest mode across the ranks.  [driver]

:class:`GlobalForestClassifier` / :class:`GlobalForestRegressor` fit one forest in one barrier job
of the runner (:class:`~sparkml_dist.runner.BarrierRunner`, ``numWorkers`` ranks): each rank holds
a disjoint shard of the rows, and each tree grows from histograms all-reduced over all shards
(XGBoost's own distributed ``hist`` training, ``num_parallel_tree`` trees in one round,
``learning_rate=1``, rows and features sampled per tree and per split), so no tree is limited to a
share of the rows as a bagging member is.  The fitted model is a
:class:`~.BaggingClassificationModel` (``BaggingRegressionModel``) with one
member, the XGBoost forest: ``transform``, ``predict_proba``, save/load (XGBoost's own format,
signed or not), ``Pipeline`` and ``CrossValidator`` work as for any bagging model.

Before the barrier job, one Spark job counts the rows and checks them (null/inf features, bad
labels, a classifier's classes, ``maxBins`` against the rows); parameters are checked before
any job.  The same seed and rows give the same forest whatever the input's partitioning (rows are
dealt to ranks by a hash of their content).

Example::

    from sparkml_dist.ensemble import BaggingClassifier, GlobalForestClassifier

    forest = GlobalForestClassifier(numTrees=16, maxDepth=10, featuresCols=cols, numWorkers=4)
    model = forest.fit(train_df)                      # one barrier job of 4 ranks
    model.transform(test_df)                          # probability, prediction, rawPrediction
    BaggingClassifier.forest(strategy="global", numTrees=16, maxDepth=10)   # the same estimator
"""

from __future__ import annotations

from typing import List, Optional

import numpy as np
from pyspark import keyword_only
from pyspark.ml import Estimator
from pyspark.ml.param import TypeConverters
from pyspark.ml.param.shared import (
    HasLabelCol,
    HasPredictionCol,
    HasProbabilityCol,
    HasRawPredictionCol,
    HasSeed,
    HasWeightCol,
)
from pyspark.sql import functions as F

from .. import _spark_env, arg_checks, launch, partitioning, tracking
from ..errors import ConfigurationError, WorkerError
from . import _forest_rank, forest, validation
from .member_records import FEATURES, LABEL, WEIGHT, Member
from .models import BaggingClassificationModel, BaggingRegressionModel
from .params import HasEstimatorAndFeatures, declare
from .stored.persistence import StageReadWrite


def preset(is_classifier: bool, *, minInstancesPerNode: int = 1, maxDepth: Optional[int] = 10, **params):
    """``BaggingClassifier.forest(strategy="global", ...)``: the same names as the local preset
    (:func:`.forest.preset`) but ``minInstancesPerNode``, and
    ``subsamplingRate``, ``maxBins``, ``numWorkers`` too."""
    if minInstancesPerNode != 1:
        raise ConfigurationError(
            "minInstancesPerNode is a local-strategy parameter (scikit-learn's min_samples_leaf); "
            "strategy='global' grows XGBoost trees: leave it at 1."
        )
    if maxDepth is None:
        raise ConfigurationError("strategy='global' needs a maxDepth (an integer >= 1), not None")
    cls = GlobalForestClassifier if is_classifier else GlobalForestRegressor
    return cls(maxDepth=maxDepth, **params)


class _GlobalForestParams(HasEstimatorAndFeatures, HasLabelCol, HasWeightCol, HasPredictionCol, HasSeed):
    numTrees = declare("numTrees", "trees of the forest, >= 1", TypeConverters.toInt)
    maxDepth = declare("maxDepth", "depth of each tree, >= 1", TypeConverters.toInt)
    featureSubsetStrategy = declare(
        "featureSubsetStrategy",
        "features tried at each split: auto | all | sqrt | log2 | onethird | a fraction such as '0.3'",
        TypeConverters.toString,
    )
    subsamplingRate = declare(
        "subsamplingRate",
        "share of the rows each tree draws, without replacement, in (0, 1]",
        TypeConverters.toFloat,
    )
    maxBins = declare("maxBins", "histogram bins per feature, >= 2", TypeConverters.toInt)
    numWorkers = declare(
        "numWorkers", "ranks of the barrier job (default: the cluster's task slots)", TypeConverters.toInt
    )
    collectiveTimeout = declare(
        "collectiveTimeout",
        "seconds any wait of the fit may take: the ranks' start, XGBoost's bootstrap and each collective",
        TypeConverters.toInt,
    )

    def __init__(self, *args):
        super().__init__(*args)
        self._setDefault(
            featuresCol="features",
            featuresCols=[],
            labelCol="label",
            predictionCol="prediction",
            numTrees=16,
            maxDepth=10,
            featureSubsetStrategy="auto",
            subsamplingRate=0.632,
            maxBins=32,
            seed=42,
            collectiveTimeout=600,
        )

    def _checked(self) -> dict:
        """Every parameter checked, before any job."""
        rate = self.getOrDefault(self.subsamplingRate)
        if not isinstance(rate, (int, float)) or not 0.0 < rate <= 1.0:
            raise ConfigurationError(f"subsamplingRate must be in (0, 1], got {rate!r}")
        workers = self.getOrDefault(self.numWorkers) if self.isDefined(self.numWorkers) else None
        return {
            "trees": arg_checks.integer("numTrees", self.getOrDefault(self.numTrees), 1),
            "depth": arg_checks.integer("maxDepth", self.getOrDefault(self.maxDepth), 1),
            "share": forest.max_features(self.getOrDefault(self.featureSubsetStrategy), self._is_classifier),
            "rate": float(rate),
            "bins": arg_checks.integer("maxBins", self.getOrDefault(self.maxBins), 2),
            "workers": arg_checks.integer("numWorkers", workers, 1, none_ok=True),
            "timeout": arg_checks.integer("collectiveTimeout", self.getOrDefault(self.collectiveTimeout), 1),
        }


class _GlobalForest(Estimator, StageReadWrite):
    _is_classifier = False

    def _fit(self, dataset):
        return tracking.tracked_fit(self, self._fit_forest, dataset)

    def _fit_forest(self, dataset):
        import importlib.util

        from ..runner import BarrierRunner

        if importlib.util.find_spec("xgboost") is None:
            raise ConfigurationError(
                f"{type(self).__name__} grows its trees with XGBoost, which is not installed: "
                "pip install 'sparkml_dist[xgboost]' (on the driver and the executors)."
            )
        p = self._checked()
        max_classes = self._max_classes()
        weight_col = self.getWeightCol() if self.isDefined(self.weightCol) and self.getWeightCol() else ""
        prepared = dataset.select(*self._columns(dataset, weight_col))
        spark = launch.session_of(dataset)
        vectors = validation.is_vector_input(dataset, self.getFeaturesCol(), self.getFeaturesCols())
        width = validation.vector_shape(dataset, self.getFeaturesCol())[0] if vectors else None
        n_rows, info = self._check_rows(spark, dataset, prepared, weight_col, max_classes, width)
        if p["bins"] > n_rows:
            raise ConfigurationError(
                f"maxBins={p['bins']} is more than the {n_rows} rows to fit: lower maxBins "
                f"(at most {n_rows})."
            )
        workers = min(p["workers"] or self._slots(spark), n_rows)
        forest.check_rank_memory(
            self.getFeaturesCols() or self.getFeaturesCol(), n_rows, workers, info["n_features"],
            _spark_env.task_memory_budget(spark),
        )  # fmt: skip
        classes = info["classes"]
        params = forest.xgb_params(p, info["n_features"], classes, int(self.getSeed()))
        conf = _spark_env.conf_of(spark)
        data, columns = self._rank_columns(dataset, weight_col)
        t = p["timeout"]
        # never staged: the same rows and seed give the same forest however the input is partitioned
        runner = BarrierRunner(
            workers, spark=spark, log_ranks="none", start_timeout=t, collective_timeout=t, staging_dir=False
        )
        try:
            raw = runner.run_with_data(
                data,
                _forest_rank.train,
                params,
                classes and list(classes),
                columns,
                _spark_env.task_cpus(conf),
                t,
            )
        except WorkerError as exc:
            raise _forest_rank.explained(exc) from None
        model = self._member_model(raw)
        classes_idx = np.arange(len(classes)) if classes else None
        member = Member(0, model, np.arange(info["n_features"]), classes_idx, n_rows)
        fitted = self._model_class()(members=[member], n_features=info["n_features"], classes=classes)
        return self._copyValues(fitted)

    def _columns(self, dataset, weight_col: str) -> list:
        features = validation.features_column(dataset, self.getFeaturesCol(), self.getFeaturesCols())
        cols = [
            features.alias(FEATURES),
            validation.numeric_column(dataset, self.getLabelCol(), "labelCol").alias(LABEL),
        ]
        if weight_col:
            cols.append(validation.numeric_column(dataset, weight_col, "weightCol").alias(WEIGHT))
        return cols

    def _rank_columns(self, dataset, weight_col: str):
        """What the ranks read: the user's own columns where they are numbers or an array (a plain
        Parquet scan stays one: the ranks read its files, no shuffle), a vector as an array."""
        label, cols = self.getLabelCol(), list(self.getFeaturesCols())
        if not cols:
            feature = self.getFeaturesCol()
            if validation.is_vector_input(dataset, feature, []):
                from pyspark.ml.functions import vector_to_array

                dataset = dataset.withColumn(FEATURES, vector_to_array(dataset[feature]))
                feature = FEATURES
            cols = [feature]
        keep = list(dict.fromkeys(cols + [label] + ([weight_col] if weight_col else [])))
        return dataset.select(*keep), {"features": cols, "label": label, "weight": weight_col or None}

    def _check_rows(self, spark, dataset, prepared, weight_col: str, max_classes: int, width=None):
        """One job: the rows counted and checked as a bagging fit checks them (one group).
        ``width``: the features are vectors of that width (their values reach XGBoost as they are:
        NaN is missing, inf is refused by XGBoost in the ranks)."""
        aggs = validation.data_aggregates(
            self._is_classifier, bool(weight_col), max_classes, width is not None
        )
        with launch.job_scope(spark, "sparkml_dist: counting and checking the rows"):
            row = prepared.agg(
                F.count(F.lit(1)).alias("__rows"), *[c.alias(k) for k, c in aggs.items()]
            ).first()
        d = row.asDict()
        n_rows = int(d.pop("__rows"))
        if not n_rows:
            raise ConfigurationError("the input DataFrame is empty; there is nothing to fit.")
        stats = partitioning.GroupStats(num_groups=1, rows={0: n_rows}, extras={0: d})
        info = validation.check_data(
            stats,
            dataset,
            features_col=self.getFeaturesCol(),
            features_cols=self.getFeaturesCols(),
            label_col=self.getLabelCol(),
            weight_col=weight_col,
            allow_nan=True,  # XGBoost learns where missing values go
            is_classifier=self._is_classifier,
            counts_copies=False,
            max_classes=max_classes,
            vector_width=width,
        )
        return n_rows, info

    def _slots(self, spark) -> int:
        slots = _spark_env.registered_slots(spark) or _spark_env.master_slots(
            _spark_env.master_of(spark), _spark_env.conf_of(spark)
        )
        if not slots:
            raise ConfigurationError("cannot tell how many task slots this cluster has: set numWorkers.")
        return int(slots)

    def _member_model(self, raw: bytes):
        import xgboost as xgb

        model = xgb.XGBClassifier() if self._is_classifier else xgb.XGBRegressor()
        model.load_model(bytearray(raw))
        return model

    def _max_classes(self) -> int:
        return arg_checks.integer("maxClasses", self.getMaxClasses(), 2) if self._is_classifier else 0


class GlobalForestClassifier(_GlobalForest, _GlobalForestParams, HasProbabilityCol, HasRawPredictionCol):
    """A random forest whose trees each see every row, fitted by XGBoost across ``numWorkers`` ranks.

    Parameters (keyword): ``numTrees`` (16), ``maxDepth`` (10), ``featureSubsetStrategy``
    ("auto": 0.3 of the features per split; MLlib's values), ``subsamplingRate`` (0.632: the
    share of distinct rows a bootstrap sample holds), ``maxBins`` (32, MLlib's), ``numWorkers`` (the
    cluster's task slots), ``collectiveTimeout`` (600 s: the longest any wait of the fit may take,
    see :mod:`._forest_rank`), ``seed``, ``featuresCol`` / ``featuresCols``,
    ``labelCol``, ``weightCol``, ``predictionCol``, ``probabilityCol``, ``rawPredictionCol``, ``maxClasses``
    (1000), ``mlflow``.  See the module docstring.
    """

    _is_classifier = True
    maxClasses = declare("maxClasses", "most distinct label values accepted", TypeConverters.toInt)

    @keyword_only
    def __init__(
        self,
        *,
        numTrees: int = 16,
        maxDepth: int = 10,
        featureSubsetStrategy: str = "auto",
        subsamplingRate: float = 0.632,
        maxBins: int = 32,
        numWorkers: Optional[int] = None,
        collectiveTimeout: int = 600,
        seed: int = 42,
        featuresCol: str = "features",
        featuresCols: Optional[List[str]] = None,
        labelCol: str = "label",
        weightCol: Optional[str] = None,
        predictionCol: str = "prediction",
        probabilityCol: str = "probability",
        rawPredictionCol: str = "rawPrediction",
        maxClasses: int = 1000,
        mlflow: Optional[bool] = None,
    ):
        super().__init__()
        self._setDefault(probabilityCol="probability", rawPredictionCol="rawPrediction", maxClasses=1000)
        self._set(**self._input_kwargs)

    @keyword_only
    def setParams(self, **kwargs):
        return self._set(**self._input_kwargs)

    def getMaxClasses(self) -> int:
        return self.getOrDefault(self.maxClasses)

    def _model_class(self):
        return BaggingClassificationModel


class GlobalForestRegressor(_GlobalForest, _GlobalForestParams):
    """A random forest of regression trees, each fitted on every row by XGBoost across ranks; the
    parameters of :class:`GlobalForestClassifier` but the classifier-only ones."""

    @keyword_only
    def __init__(
        self,
        *,
        numTrees: int = 16,
        maxDepth: int = 10,
        featureSubsetStrategy: str = "auto",
        subsamplingRate: float = 0.632,
        maxBins: int = 32,
        numWorkers: Optional[int] = None,
        collectiveTimeout: int = 600,
        seed: int = 42,
        featuresCol: str = "features",
        featuresCols: Optional[List[str]] = None,
        labelCol: str = "label",
        weightCol: Optional[str] = None,
        predictionCol: str = "prediction",
        mlflow: Optional[bool] = None,
    ):
        super().__init__()
        self._set(**self._input_kwargs)

    @keyword_only
    def setParams(self, **kwargs):
        return self._set(**self._input_kwargs)

    def _model_class(self):
        return BaggingRegressionModel
