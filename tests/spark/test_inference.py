"""predict_batch: a DataFrame scored across the cluster, as pyspark's predict_batch_udf would, with
the predict function made once per Python worker."""

import os

import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.tree import DecisionTreeClassifier

from sparkml_dist import ConfigurationError
from sparkml_dist.inference import predict_batch
from tests.conftest import masters
from tests.support import png


def _data(n=100_000, d=5, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = (X[:, 0] - X[:, 1] + 0.3 * rng.normal(size=n) > 0).astype(int)
    return X, y


def _frame(spark, X, y, parts=6):
    pdf = pd.DataFrame({"id": np.arange(len(X)), "features": list(X), "label": y})
    return spark.createDataFrame(pdf).repartition(parts)


class LogisticPredictor:
    """make_predict_fn: records its call (one line per call, with the worker's pid) in ``log``."""

    def __init__(self, coef, intercept, log):
        self.coef, self.intercept, self.log = coef, intercept, log

    def __call__(self):
        with open(self.log, "a") as fh:
            fh.write(f"{os.getpid()}\n")
        coef, intercept = self.coef, self.intercept

        def predict(features):
            assert features.ndim == 2 and features.dtype == np.float64
            return 1.0 / (1.0 + np.exp(-(features @ coef + intercept)))

        return predict


@masters("local", "connect", "cluster", "oldest")  # what separate executor JVMs can change
def test_scores_equal_local_prediction_and_the_function_is_made_once_per_worker(spark, tmp_path):
    X, y = _data()
    local = LogisticRegression().fit(X, y)
    log = str(tmp_path / "made.log")
    df = _frame(spark, X, y)
    scored = predict_batch(
        df,
        LogisticPredictor(local.coef_[0], local.intercept_[0], log),
        input_cols=["features"],
        return_type="double",
        output_col="p",
        batch_size=4000,
    )
    assert scored.columns == ["id", "features", "label", "p"]
    out = scored.select("id", "p").toPandas().sort_values("id")
    assert len(out) == len(X)
    np.testing.assert_allclose(out["p"].to_numpy(), local.predict_proba(X)[:, 1], rtol=1e-12)
    pids = open(log).read().split()
    assert len(pids) == len(set(pids)) >= 1  # once per Python worker, whatever the tasks and batches
    assert len(pids) <= 6  # never once per batch (25 batches here)


@masters("local", "connect")
def test_a_fitted_model_travels_in_a_safe_format_and_predicts_like_it_does_locally(spark):
    X, y = _data(20_000, 4, seed=1)
    tree = DecisionTreeClassifier(max_depth=5, random_state=0).fit(X, y)
    pdf = pd.DataFrame({f"f{j}": X[:, j] for j in range(4)} | {"id": np.arange(len(X))})
    df = spark.createDataFrame(pdf).repartition(3)
    labels = predict_batch(df, model=tree, input_cols=["f0", "f1", "f2", "f3"], return_type="bigint")
    got = labels.select("id", "prediction").toPandas().sort_values("id")["prediction"].to_numpy()
    assert np.array_equal(got, tree.predict(X))
    proba = predict_batch(
        df,
        model=tree,
        input_cols=["f0", "f1", "f2", "f3"],
        method="predict_proba",
        return_type="array<double>",
    )
    rows = proba.select("id", "prediction").toPandas().sort_values("id")["prediction"]
    np.testing.assert_allclose(np.stack(rows.to_numpy()), tree.predict_proba(X))


def _png_predictor():
    from tests.support import png as codec

    def predict(image, label):
        means = np.array([codec.decode(b).mean() for b in image])
        return {"mean": means, "bright": (means > 127).astype(np.int32), "label": label}

    return predict


@masters("local", "connect")
def test_binary_inputs_arrive_as_bytes_and_a_struct_output_is_filled_by_name(spark):
    rng = np.random.default_rng(2)
    images = rng.integers(0, 256, size=(40, 4, 4), dtype=np.uint8)
    pdf = pd.DataFrame({"image": [png.encode(im) for im in images], "label": np.arange(40)})
    df = spark.createDataFrame(pdf)
    scored = predict_batch(
        df,
        _png_predictor,
        input_cols=["image", "label"],
        return_type="struct<mean:double,bright:int,label:bigint>",
        batch_size=7,
    )
    out = scored.select("prediction.*").toPandas().sort_values("label")
    np.testing.assert_allclose(out["mean"].to_numpy(), images.reshape(40, -1).mean(axis=1))
    assert out["bright"].tolist() == (images.reshape(40, -1).mean(axis=1) > 127).astype(int).tolist()


@masters("local", "connect")
def test_bad_columns_and_arguments_are_refused_before_any_job(spark):
    df = spark.createDataFrame(pd.DataFrame({"a": [1.0, 2.0], "s": ["x", "y"]})).selectExpr(
        "a", "s", "map('k', a) AS m"
    )
    make = lambda: lambda a: a  # noqa: E731
    cases = [
        (dict(input_cols=["nope"]), "input column 'nope' is not in the DataFrame"),
        (dict(input_cols=["m"]), "input column 'm' is map<string,double>"),
        (dict(input_cols="a"), "input_cols must be a non-empty list"),
        (dict(input_cols=["a"], output_col="a"), "output_col='a' is already a column"),
        (dict(input_cols=["a"], return_type="not a type"), "return_type='not a type'"),
        (dict(input_cols=["a"], batch_size=0), "batch_size must be"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ConfigurationError, match=message):
            predict_batch(df, make, **kwargs)
    with pytest.raises(ConfigurationError, match="not both"):
        predict_batch(df, make, model=object(), input_cols=["a"])
    with pytest.raises(ConfigurationError, match="has no predict"):
        predict_batch(df, model=object(), input_cols=["a"])


@masters("local", "connect")
def test_a_saved_ensemble_scores_by_its_directory_as_its_transform_does(spark, tmp_path):
    from sparkml_dist.ensemble import BaggingClassifier

    X, y = _data(3000, 3, seed=3)
    pdf = pd.DataFrame(
        {f"f{j}": X[:, j] for j in range(3)} | {"label": y.astype(float), "id": np.arange(len(X))}
    )
    df = spark.createDataFrame(pdf).repartition(2)
    cols = ["f0", "f1", "f2"]
    model = BaggingClassifier(
        estimator=DecisionTreeClassifier(max_depth=4), numModels=3, featuresCols=cols, labelCol="label"
    ).fit(df)
    model.write().save(str(tmp_path / "bagging"))
    want = model.transform(df).select("id", "prediction", "probability").toPandas().sort_values("id")
    labels = predict_batch(df, model=str(tmp_path / "bagging"), input_cols=cols, output_col="y_hat")
    got = labels.select("id", "y_hat").toPandas().sort_values("id")
    assert labels.columns == [*df.columns, "y_hat"]
    assert np.array_equal(got["y_hat"].to_numpy(), want["prediction"].to_numpy())
    proba = predict_batch(df, model=model, input_cols=cols, method="predict_proba")
    rows = proba.select("id", "prediction").toPandas().sort_values("id")["prediction"]
    np.testing.assert_allclose(
        np.stack(rows.to_numpy()), np.stack([v.toArray() for v in want["probability"]])
    )


@masters("local", "connect")
def test_vector_columns_arrive_as_two_dimensional_arrays(spark):
    from pyspark.ml.feature import VectorAssembler

    X, y = _data(500, 3, seed=4)
    pdf = pd.DataFrame({"a": X[:, 0], "b": X[:, 1], "c": X[:, 2], "id": np.arange(500)})
    df = VectorAssembler(inputCols=["a", "b", "c"], outputCol="v").transform(spark.createDataFrame(pdf))
    scored = predict_batch(df, _row_sums, input_cols=["v"], batch_size=64)
    got = scored.select("id", "prediction").toPandas().sort_values("id")["prediction"].to_numpy()
    np.testing.assert_allclose(got, X.sum(axis=1))


def _row_sums():
    return lambda v: v.sum(axis=1)


@masters("local", "connect", "oldest")
def test_a_model_that_knows_its_feature_names_gets_the_columns_by_name(spark):
    """The columns given in another order than the model was fitted on: matched by name (503 of
    1,000 right before, without a word); a missing or unknown name refused before any job."""
    import xgboost as xgb

    from sparkml_dist.ensemble import BaggingClassifier

    X, y = _data(1000, 3, seed=4)
    pdf = pd.DataFrame({"a": X[:, 0], "b": X[:, 1] * 3, "c": X[:, 2] - 1})
    pdf["y"] = y
    df = spark.createDataFrame(pdf.assign(id=np.arange(len(pdf))))
    shuffled = ["c", "a", "b"]
    models = {
        "sklearn": DecisionTreeClassifier(max_depth=6, random_state=0).fit(pdf[["a", "b", "c"]], y),
        "xgboost": xgb.XGBClassifier(n_estimators=20, max_depth=3).fit(pdf[["a", "b", "c"]], y),
        "bagging": BaggingClassifier(numModels=2, featuresCols=["a", "b", "c"], labelCol="y").fit(df),
    }
    for name, model in models.items():
        got = predict_batch(df, model=model, input_cols=shuffled, return_type="double")
        got = got.select("id", "prediction").toPandas().sort_values("id")["prediction"].to_numpy()
        want = model.predict(pdf[["a", "b", "c"]].to_numpy() if name != "sklearn" else pdf[["a", "b", "c"]])
        assert np.array_equal(got, np.asarray(want, dtype=float)), name
        with pytest.raises(
            ConfigurationError, match=r"fitted on the features \['a', 'b', 'c'\].*lacks \['b'\]"
        ):
            predict_batch(df, model=model, input_cols=["a", "c"])
    with pytest.raises(ConfigurationError, match=r"has \['id'\], which it does not know"):
        predict_batch(df, model=models["sklearn"], input_cols=["a", "b", "c", "id"])
    plain = DecisionTreeClassifier(max_depth=6, random_state=0).fit(pdf[["a", "b", "c"]].to_numpy(), y)
    kept = predict_batch(
        df, model=plain, input_cols=["a", "b", "c"], return_type="double"
    )  # no names: as given
    got = kept.select("id", "prediction").toPandas().sort_values("id")["prediction"].to_numpy()
    assert np.array_equal(got, plain.predict(pdf[["a", "b", "c"]].to_numpy()).astype(float))
