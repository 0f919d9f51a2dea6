"""Bad input gets a ConfigurationError naming the column or parameter, before training."""

import numpy as np
import pytest
from pyspark.ml.linalg import Vectors
from pyspark.sql import functions as F
from sklearn.linear_model import LinearRegression, LogisticRegression
from sklearn.svm import SVC
from sklearn.tree import DecisionTreeClassifier

from sparkml_dist import ConfigurationError
from sparkml_dist.ensemble import BaggingClassifier, BaggingRegressor
from tests.conftest import masters

pytestmark = masters("local", "connect")


@pytest.fixture(scope="module")
def df(spark):
    rng = np.random.default_rng(0)
    rows = [(Vectors.dense(rng.normal(size=3)), float(i % 2), float(i), "s", [1.0, 2.0]) for i in range(60)]
    return spark.createDataFrame(rows, ["features", "label", "num", "text", "arr"])


@pytest.mark.parametrize(
    "params, match",
    [
        (dict(featuresCol="nope"), r"featuresCol='nope': no such column.*VectorAssembler"),
        (dict(featuresCol="text"), r"featuresCol='text' has type string; expected a vector"),
        (dict(featuresCols=["num", "text"]), r"featuresCols: column 'text' has type string"),
        (dict(featuresCols=["num", "zzz"]), r"featuresCols='zzz': no such column"),
        (dict(labelCol="text"), r"labelCol='text' has type string.*StringIndexer"),
        (dict(labelCol="missing"), r"labelCol='missing': no such column"),
        (dict(weightCol="text"), r"weightCol='text' has type string"),
        (dict(numModels=0), r"numModels must be an integer >= 1, got 0"),
        (dict(numModels=10_001), r"numModels=10001 is above 10000.*fewer, larger groups"),
        (dict(maxClasses=1), r"maxClasses must be an integer >= 2, got 1"),
        (dict(sampleRatio=0.0), r"sampleRatio must be in \(0, 1\], got 0.0"),
        (dict(featureRatio=1.5), r"featureRatio must be in \(0, 1\], got 1.5"),
        (dict(sampling="stratified"), r"sampling must be one of disjoint, bootstrap, subsample"),
        (dict(voting="mean"), r"voting must be one of \('soft', 'hard'\), got 'mean'"),
        (dict(estimator=SVC()), r"voting='soft' needs predict_proba\(\).*voting='hard'"),
        (dict(estimator=LinearRegression()), r"is a regressor; BaggingClassifier needs a classifier"),
        (dict(estimator="tree"), r"has no fit\(\) method"),
    ],
)
def test_bad_parameters_fail_before_any_spark_job(spark, df, params, match):
    if spark.__class__.__module__.startswith("pyspark.sql.connect"):
        before = None
    else:
        before = spark.sparkContext.statusTracker().getJobIdsForGroup(None)
    with pytest.raises(ConfigurationError, match=match):
        BaggingClassifier(numModels=params.pop("numModels", 2), **params).fit(df)
    if before is not None:
        assert spark.sparkContext.statusTracker().getJobIdsForGroup(None) == before


def test_unpicklable_estimator_is_named(df):
    import threading

    est = DecisionTreeClassifier()
    est.lock = threading.Lock()  # a closure-captured lock, captured by a closure
    with pytest.raises(ConfigurationError, match=r"cannot send estimator=.* to the executors: TypeError"):
        BaggingClassifier(estimator=est, numModels=2).fit(df)


def test_classifier_given_to_regressor(df):
    with pytest.raises(ConfigurationError, match="is a classifier; BaggingRegressor needs a regressor"):
        BaggingRegressor(estimator=DecisionTreeClassifier(), numModels=2).fit(df)


def test_empty_dataframe(df):
    with pytest.raises(ConfigurationError, match="input DataFrame is empty"):
        BaggingClassifier(numModels=2).fit(df.where("num < 0"))


def test_more_groups_than_rows(df):
    with pytest.raises(ConfigurationError, match="groups received no rows.*Lower numModels"):
        BaggingClassifier(numModels=200).fit(df.limit(5))


def test_few_rows_fill_every_group_evenly(df):
    # 30 models on 60 rows: hashing rows left some groups empty; dealing gives each exactly 2
    model = BaggingClassifier(numModels=30, estimator=DecisionTreeClassifier()).fit(df)
    assert model.groupSizes == [2] * 30


def test_a_continuous_label_is_not_fitted_as_thousands_of_classes(df):
    with pytest.raises(
        ConfigurationError, match=r"labelCol='num' has more than maxClasses=50 distinct .*Regressor"
    ):
        BaggingClassifier(numModels=2, labelCol="num", maxClasses=50).fit(df)
    model = BaggingClassifier(numModels=2, labelCol="num", maxClasses=60).fit(df)  # 60 classes: allowed
    assert model.numClasses == 60


def test_single_class_label(df):
    with pytest.raises(ConfigurationError, match=r"labelCol='label' has a single class \(1.0\)"):
        BaggingClassifier(numModels=2).fit(df.where("label = 1"))


def test_nan_and_inf_are_counted_and_located(spark):
    rows = [([1.0, float("nan") if i < 4 else 0.0, 2.0], float(i % 2)) for i in range(40)]
    nan_df = spark.createDataFrame(rows, ["features", "label"])
    with pytest.raises(
        ConfigurationError,
        match=r"NaN or null in 4 rows \(column 'features' at positions 1 \(4 rows\)\).*Imputer",
    ):
        BaggingClassifier(numModels=2, estimator=LogisticRegression()).fit(nan_df)
    # scikit-learn's trees declare allow_nan: NaN is passed through to them, not refused
    assert len(BaggingClassifier(numModels=2, estimator=DecisionTreeClassifier()).fit(nan_df).models) == 2
    cols = spark.createDataFrame(
        [(1.0, float("inf") if i == 3 else 1.0, float(i % 2)) for i in range(40)], ["a", "b", "label"]
    )
    with pytest.raises(ConfigurationError, match=r"\+/-inf in 1 rows \(column 'b': 1 rows\)"):
        BaggingClassifier(numModels=2, featuresCols=["a", "b"]).fit(cols)


def test_null_labels_ragged_vectors_and_negative_weights(spark):
    nulls = spark.createDataFrame(
        [([1.0], None if i == 0 else float(i % 2)) for i in range(20)], "features array<double>, label double"
    )
    with pytest.raises(ConfigurationError, match=r"labelCol='label': 1 rows have a null, NaN"):
        BaggingClassifier(numModels=2).fit(nulls)
    ragged = spark.createDataFrame(
        [([1.0] * (1 + i % 2), float(i % 2)) for i in range(20)], ["features", "label"]
    )
    with pytest.raises(ConfigurationError, match="vectors have between 1 and 2 values"):
        BaggingClassifier(numModels=2).fit(ragged)
    weights = spark.createDataFrame(
        [([1.0], float(i % 2), -1.0 if i == 5 else 1.0) for i in range(20)], ["features", "label", "w"]
    )
    with pytest.raises(
        ConfigurationError, match=r"weightCol='w': 1 rows have a null, NaN, infinite or negative"
    ):
        BaggingClassifier(numModels=2, weightCol="w").fit(weights)
    with pytest.raises(ConfigurationError, match="takes no sample_weight"):
        BaggingClassifier(numModels=2, weightCol="w", estimator=_NoWeights()).fit(weights)


class _NoWeights(DecisionTreeClassifier):
    def fit(self, X, y):  # noqa: D401 - deliberately drops sample_weight
        return super().fit(X, y)


def test_feature_columns_named_with_dots_and_backticks_are_read_as_named(spark):
    """featuresCols name top-level columns, whatever characters their names hold."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(80, 2))
    rows = [(float(a), float(b), float(a > 0)) for a, b in x]
    df = spark.createDataFrame(rows, ["a.b", "c`d", "label"])
    model = BaggingClassifier(
        estimator=DecisionTreeClassifier(max_depth=2), numModels=2, featuresCols=["a.b", "c`d"], seed=0
    ).fit(df)
    scored = model.transform(df).select("label", "prediction").collect()
    # the label is the sign of column "a.b": a model that read that column gets nearly all right
    assert np.mean([r.label == r.prediction for r in scored]) > 0.9
    bad = df.withColumn("c`d", F.when(F.col("label") > 0, float("inf")).otherwise(F.col("`c``d`")))
    with pytest.raises(ConfigurationError, match=r"column 'c`d': \d+ rows"):
        BaggingClassifier(numModels=2, featuresCols=["a.b", "c`d"]).fit(bad)


def test_executors_starting_another_python_are_named_before_a_fit_fails_on_it(spark, monkeypatch):
    import sys

    from sparkml_dist import _spark_env
    from sparkml_dist.errors import missing_module_hint

    if _spark_env.is_connect(spark):  # Connect: the server starts the executors; nothing to tell here
        assert _spark_env.executor_python_warning(spark) is None
        return
    assert _spark_env.executor_python_warning(spark) is None  # the suite starts them with its own
    monkeypatch.setenv("PYSPARK_PYTHON", "/usr/bin/python3")
    monkeypatch.setattr(_spark_env, "conf_of", lambda s: lambda key, default=None: default)
    said = _spark_env.executor_python_warning(spark)
    assert said and "/usr/bin/python3" in said and sys.executable in said and "PYSPARK_PYTHON=" in said
    hint = missing_module_hint("ModuleNotFoundError: No module named 'pyarrow'", "/usr/bin/python3")
    assert "the executors ran /usr/bin/python3, which cannot import 'pyarrow'" in hint
