"""pyspark.ml Params of the ensemble stages: bagging and grouped, estimators and models.  [driver]"""

from __future__ import annotations

from typing import Optional

from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import (
    HasFeaturesCol,
    HasLabelCol,
    HasPredictionCol,
    HasProbabilityCol,
    HasRawPredictionCol,
    HasSeed,
    HasWeightCol,
)

from .. import _spark_env, arg_checks
from ..errors import ConfigurationError


def declare(name: str, doc: str, converter) -> Param:
    """A class-level pyspark.ml Param (``Params._dummy()`` parent, as pyspark's own shared params)."""
    return Param(Params._dummy(), name, doc, typeConverter=converter)


def _tracking_flag(value):
    if value is None or isinstance(value, bool):
        return value
    raise TypeError(f"mlflow must be True, False or None, got {value!r}")


class HasEstimatorAndFeatures(HasFeaturesCol):
    """What every per-group trainer takes: the estimator to clone and the feature columns."""

    estimator = declare(
        "estimator",
        "scikit-learn-API estimator cloned for each model (bagging default: a decision tree)",
        None,
    )
    featuresCols = declare(
        "featuresCols",
        "numeric feature columns, used instead of featuresCol when set",
        TypeConverters.toListString,
    )

    mlflow = declare(
        "mlflow",
        "log the fit to MLflow (params, figures, the model): True, False, or unset (when a run is active)",
        _tracking_flag,
    )

    def getEstimator(self):
        return self.getOrDefault(self.estimator) if self.isDefined(self.estimator) else None

    def getMlflow(self):
        return self.getOrDefault(self.mlflow) if self.isDefined(self.mlflow) else None

    def getFeaturesCols(self):
        return self.getOrDefault(self.featuresCols)


class _PerGroupParams(Params):
    """What every per-group trainer takes (the per-group engine: :mod:`.engine.groups`)."""

    membersDir = declare(
        "membersDir",
        "storage every executor and the driver share (s3://, hdfs://, /dbfs/...): executors write the "
        "fitted models there and the model loads them lazily, instead of collecting them",
        TypeConverters.toString,
    )
    onError = declare(
        "onError",
        "a group whose fit fails: raise (default: the fit fails naming it, with its traceback) | skip "
        "(the others are kept; model.failedGroups says why)",
        TypeConverters.toString,
    )
    useGpu = declare(
        "useGpu",
        "fit each model on a GPU of its task: the estimator's device parameter is set to that GPU "
        "(XGBoost: device='cuda:<n>'); the tasks ask one GPU each on clusters that schedule GPUs",
        TypeConverters.toBoolean,
    )

    gpuMemoryPerMember = declare(
        "gpuMemoryPerMember",
        "with useGpu: the GPU memory one member needs, as Spark writes memory ('6g', '512m'); how many "
        "members share a GPU comes from it (sparkml_dist.plan). Unset: estimated from the largest "
        "member's rows",
        TypeConverters.toString,
    )

    def __init__(self, *args):
        super().__init__(*args)
        self._setDefault(onError="raise", useGpu=False)

    def getGpuMemoryPerMember(self) -> int:
        """The bytes ``gpuMemoryPerMember`` says, 0 when unset (the planner estimates)."""
        if not self.isDefined(self.gpuMemoryPerMember) or not self.getOrDefault(self.gpuMemoryPerMember):
            return 0
        text = self.getOrDefault(self.gpuMemoryPerMember)
        try:
            value = _spark_env.parse_bytes(text)
        except ValueError:
            value = 0
        if value <= 0:
            raise ConfigurationError(
                f"gpuMemoryPerMember={text!r} is not an amount of memory: write it as Spark "
                "does, e.g. '6g' or '512m'"
            )
        return value

    def getMembersDir(self) -> str:
        return self.getOrDefault(self.membersDir) if self.isDefined(self.membersDir) else ""

    def getOnError(self) -> str:
        return arg_checks.one_of("onError", self.getOrDefault(self.onError), ("raise", "skip"))

    def getUseGpu(self) -> bool:
        return self.getOrDefault(self.useGpu)


class _BaggingParams(
    _PerGroupParams, HasEstimatorAndFeatures, HasLabelCol, HasWeightCol, HasPredictionCol, HasSeed
):
    numModels = declare("numModels", "number of members (groups), >= 1", TypeConverters.toInt)
    sampling = declare(
        "sampling",
        "how rows are split into groups: disjoint | bootstrap | subsample",
        TypeConverters.toString,
    )
    sampleRatio = declare(
        "sampleRatio",
        "share of rows per group in (0, 1] (Poisson rate for bootstrap)",
        TypeConverters.toFloat,
    )
    featureRatio = declare(
        "featureRatio",
        "share of feature columns drawn per group in (0, 1] (random subspace)",
        TypeConverters.toFloat,
    )
    oobScore = declare(
        "oobScore",
        "after fitting, score each row with the members that did not see it (bootstrap/subsample): "
        "model.oobScore_, accuracy or R^2 (model.oobMetrics_: + AUC, or RMSE)",
        TypeConverters.toBoolean,
    )

    def __init__(self, *args):
        super().__init__(*args)
        self._setDefault(
            featuresCol="features",
            labelCol="label",
            predictionCol="prediction",
            featuresCols=[],
            numModels=10,
            sampling="disjoint",
            sampleRatio=1.0,
            featureRatio=1.0,
            seed=42,
            oobScore=False,
        )

    def getOobScore(self) -> bool:
        return self.getOrDefault(self.oobScore)

    def getNumModels(self) -> int:
        return self.getOrDefault(self.numModels)

    def getSampling(self) -> str:
        return self.getOrDefault(self.sampling)

    def getSampleRatio(self) -> float:
        return self.getOrDefault(self.sampleRatio)

    def getFeatureRatio(self) -> float:
        return self.getOrDefault(self.featureRatio)


class ClassifierParams(_BaggingParams, HasProbabilityCol, HasRawPredictionCol):
    voting = declare(
        "voting",
        "soft (average member probabilities) or hard (majority of member predictions)",
        TypeConverters.toString,
    )
    maxClasses = declare(
        "maxClasses",
        "most distinct label values a classifier accepts (a continuous label is refused, not fitted)",
        TypeConverters.toInt,
    )

    def __init__(self, *args):
        super().__init__(*args)
        self._setDefault(
            probabilityCol="probability", rawPredictionCol="rawPrediction", voting="soft", maxClasses=1000
        )

    def getVoting(self) -> str:
        return self.getOrDefault(self.voting)

    def getMaxClasses(self) -> int:
        return self.getOrDefault(self.maxClasses)


class RegressorParams(_BaggingParams):
    pass


SMALL_GROUP_POLICIES = ("error", "skip")
UNSEEN_POLICIES = ("error", "null")


class GroupedParams(_PerGroupParams, HasEstimatorAndFeatures, HasLabelCol, HasPredictionCol, HasSeed):
    groupCol = declare("groupCol", "column whose distinct values get one model each", TypeConverters.toString)
    minRows = declare("minRows", "fewest rows a key needs to get a model (>= 1)", TypeConverters.toInt)
    onSmallGroups = declare(
        "onSmallGroups",
        "keys with fewer than minRows rows: error (default) | skip (reported in skippedGroups)",
        TypeConverters.toString,
    )
    unseenKey = declare(
        "unseenKey", "transform of a key without a model: error (default) | null", TypeConverters.toString
    )
    streamAbove = declare(
        "streamAbove",
        "keys with more rows train from a stream with the estimator's partial_fit, holding a chunk of "
        "rows at a time (unset: the rows one task's memory holds; 0: every key)",
        TypeConverters.toInt,
    )
    keyTimeout = declare(
        "keyTimeout",
        "seconds one key's fit may take (unset: no bound); each task then fits its keys in a child "
        "process that it kills when a fit runs past it: the key fails (onError decides)",
        TypeConverters.toFloat,
    )

    def __init__(self, *args):
        super().__init__(*args)
        self._setDefault(
            featuresCol="features",
            labelCol="label",
            predictionCol="prediction",
            featuresCols=[],
            minRows=1,
            onSmallGroups="error",
            unseenKey="error",
            seed=0,
        )

    def getGroupCol(self) -> str:
        return self.getOrDefault(self.groupCol)

    def getMinRows(self) -> int:
        return self.getOrDefault(self.minRows)

    def getOnSmallGroups(self) -> str:
        return self.getOrDefault(self.onSmallGroups)

    def getUnseenKey(self) -> str:
        return self.getOrDefault(self.unseenKey)

    def getStreamAbove(self) -> Optional[int]:
        value = self.getOrDefault(self.streamAbove) if self.isDefined(self.streamAbove) else None
        return arg_checks.integer("streamAbove", value, 0, none_ok=True, fix="rows, or leave it unset")

    def getKeyTimeout(self) -> Optional[float]:
        value = self.getOrDefault(self.keyTimeout) if self.isDefined(self.keyTimeout) else None
        return arg_checks.seconds(
            "keyTimeout", value, fix="seconds one key's fit may take, or leave it unset"
        )

    def _check_params(self, df) -> None:
        if not self.isDefined(self.groupCol) or not self.getGroupCol():
            raise ConfigurationError("groupCol is not set: name the column whose values get one model each")
        if self.getGroupCol() not in df.columns:
            raise ConfigurationError(
                f"groupCol={self.getGroupCol()!r} is not a column; the DataFrame has {df.columns}"
            )
        arg_checks.integer("minRows", self.getMinRows(), 1)
        arg_checks.one_of("onSmallGroups", self.getOnSmallGroups(), SMALL_GROUP_POLICIES)
        arg_checks.one_of("unseenKey", self.getUnseenKey(), UNSEEN_POLICIES)
