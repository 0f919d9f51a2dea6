"""Sparse vector columns (HashingTF, CountVectorizer, one-hot) reach members as CSR, never expanded:
bagging, grouped training and the search fit and predict on a 2^18-column hashed space that
would need gigabytes per task dense."""

import numpy as np
import pytest
from pyspark.ml.feature import HashingTF
from pyspark.ml.linalg import Vectors
from pyspark.sql import functions as F
from scipy import sparse
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV, KFold
from sklearn.tree import DecisionTreeClassifier

from sparkml_dist import ConfigurationError
from sparkml_dist.ensemble import BaggingClassifier, GroupedTrainer
from sparkml_dist.errors import WorkerError
from sparkml_dist.feature_arrays import vectors_to_csr
from sparkml_dist.search import ParallelSearchCV
from tests.conftest import masters

WIDTH = 1 << 18


def _hashed(spark, n, seed=0):
    """``n`` rows of 20 hashed words (a vocabulary of 2,000) over 2^18 columns, a label that depends
    on a few words, and a key column: what HashingTF gives a text pipeline."""
    word = lambda i: F.concat(F.lit("w"), (F.abs(F.xxhash64(F.lit(seed), "id", i)) % 2000).cast("string"))  # noqa: E731
    words = spark.range(n).select(
        "id",
        F.transform(F.sequence(F.lit(1), F.lit(20)), word).alias("words"),
        (F.col("id") % 3).alias("key"),
    )
    hot = F.exists("words", lambda w: w.isin("w1", "w2", "w3", "w4", "w5", "w6", "w7", "w8", "w9", "w10"))
    labelled = words.withColumn("label", (hot | (F.col("id") % 7 == 0)).cast("double"))
    return HashingTF(inputCol="words", outputCol="tf", numFeatures=WIDTH).transform(labelled).drop("words")


def _local(df, col="tf"):
    table = df.orderBy("id").select("id", col, "label", "key").toArrow()
    return vectors_to_csr(table.column(col)), table.column("label").to_numpy(), table


def test_bagging_fits_and_predicts_a_hashed_space_without_expanding_it(spark):
    df = _hashed(spark, 3000).cache()
    bag = BaggingClassifier(estimator=LogisticRegression(max_iter=200), numModels=2, featuresCol="tf", seed=3)
    model = bag.fit(df)  # dense, a group would need ~6 GiB: refused before fitting
    assert model.numFeatures == WIDTH
    assert all(m.model.coef_.shape == (1, WIDTH) for m in model.models)
    X, y, _ = _local(df)
    scored = model.transform(df).orderBy("id").select("probability", "prediction").toPandas()
    proba = np.vstack([v.toArray() for v in scored["probability"]])
    assert np.allclose(proba, model.predict_proba(X), atol=1e-12)  # transform = local, from CSR
    assert np.array_equal(scored["prediction"].to_numpy(), model.predict(X))
    assert (model.predict(X) == y).mean() > 0.8
    df.unpersist()


@masters("local")
def test_a_sparse_fit_is_the_dense_fit(spark):
    rng = np.random.default_rng(1)
    n, width = 300, 40
    X = sparse.random(n, width, density=0.1, random_state=2, format="csr")
    y = (X @ rng.normal(size=width) > 0).astype(float)
    rows = [
        (
            i,
            Vectors.sparse(width, X[i].indices.tolist(), X[i].data.tolist()),
            Vectors.dense(X[i].toarray()[0]),
            float(y[i]),
        )
        for i in range(n)
    ]
    df = spark.createDataFrame(rows, ["id", "sv", "dv", "label"])
    fits = {
        col: BaggingClassifier(estimator=LogisticRegression(C=0.5), numModels=1, featuresCol=col).fit(df)
        for col in ("sv", "dv")
    }
    sv, dv = (fits[c].models[0].model for c in ("sv", "dv"))
    assert np.allclose(sv.coef_, dv.coef_, atol=1e-6) and np.allclose(sv.intercept_, dv.intercept_, atol=1e-6)
    assert np.array_equal(fits["sv"].predict(X), fits["dv"].predict(X.toarray()))
    # several trees on sparse vectors: transform from sparse rows = the members on dense numpy rows
    trees = BaggingClassifier(
        estimator=DecisionTreeClassifier(max_depth=4), numModels=3, sampling="bootstrap", featuresCol="sv"
    ).fit(df)
    scored = trees.transform(df).orderBy("id").toPandas()
    assert np.allclose(
        np.vstack([v.toArray() for v in scored["probability"]]), trees.predict_proba(X.toarray())
    )


@masters("local")
def test_a_model_that_needs_dense_input_is_named_with_the_column(spark):
    df = _hashed(spark, 4000)
    with pytest.raises(
        ConfigurationError, match=r"featuresCol='tf'.*HistGradientBoostingClassifier.*scipy\.sparse"
    ):
        BaggingClassifier(estimator=HistGradientBoostingClassifier(), numModels=1, featuresCol="tf").fit(df)
    bad = spark.createDataFrame(
        [(Vectors.sparse(5, [1], [float("nan") if i == 7 else 1.0]), float(i % 2)) for i in range(40)],
        ["tf", "label"],
    )
    with pytest.raises(WorkerError, match=r"featuresCol='tf': 1 values are NaN"):
        BaggingClassifier(estimator=LogisticRegression(), numModels=1, featuresCol="tf").fit(bad)


@masters("local", "connect")
def test_grouped_training_and_search_keep_vectors_sparse(spark):
    df = _hashed(spark, 1500, seed=4).cache()
    X, y, table = _local(df)
    keys = table.column("key").to_numpy()
    grouped = GroupedTrainer(
        estimator=LogisticRegression(max_iter=300), groupCol="key", featuresCol="tf"
    ).fit(df)
    for k in range(3):
        local = LogisticRegression(max_iter=300).fit(X[keys == k], y[keys == k])
        fitted = grouped.models[k]
        assert np.allclose(fitted.coef_, local.coef_, atol=1e-8)
    scored = grouped.transform(df).orderBy("id").select("prediction").toPandas()["prediction"].to_numpy()
    assert np.array_equal(scored, grouped.predict(X, keys))

    grid = {"C": [0.1, 1.0]}
    search = ParallelSearchCV(LogisticRegression(max_iter=300), grid, cv=KFold(3)).fit(
        df.orderBy("id"), featuresCols=["tf"], labelCol="label"
    )
    local = GridSearchCV(LogisticRegression(max_iter=300), grid, cv=KFold(3)).fit(X, y)
    assert sparse.issparse(X) and search.best_params_ == local.best_params_
    assert np.allclose(search.cv_results_["mean_test_score"], local.cv_results_["mean_test_score"])
    df.unpersist()
