"""train_per_group: the user's own function per group, inside the executors; members as a table."""

import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.neighbors import KNeighborsClassifier

from sparkml_dist import ConfigurationError, WorkerError
from sparkml_dist.ensemble import BaggingClassifier, GroupModels, train_per_group
from sparkml_dist.formats.checks import UnsafeModelError
from tests.conftest import masters


def _stores(n=1200, seed=0):
    rng = np.random.default_rng(seed)
    store = rng.choice(["a", "b", "c"], size=n)
    X = rng.normal(size=(n, 2))
    shift = {"a": 0.0, "b": 1.0, "c": -1.0}
    y = (X[:, 0] + np.array([shift[s] for s in store]) + 0.5 * rng.normal(size=n) > 0).astype(int)
    return pd.DataFrame({"store": store, "x1": X[:, 0], "x2": X[:, 1], "label": y})


def fit_logistic(data, key):
    """A user's function on a pandas DataFrame: a model and a metric of its own."""
    model = LogisticRegression(C=1.0, tol=1e-10, max_iter=1000).fit(data[["x1", "x2"]], data["label"])
    return model, {"train_acc": model.score(data[["x1", "x2"]], data["label"]), "n": len(data)}


@masters("local", "connect", "cluster", "oldest")  # what separate executor JVMs can change
def test_a_function_per_key_equals_fitting_each_key_locally(spark):
    pdf = _stores()
    result = train_per_group(spark.createDataFrame(pdf).repartition(4), fit_logistic, group_col="store")
    assert [m.group for m in result.members] == ["a", "b", "c"] and not result.skipped
    for m in result.members:
        part = pdf[pdf.store == m.group]
        local = LogisticRegression(C=1.0, tol=1e-10, max_iter=1000).fit(part[["x1", "x2"]], part["label"])
        np.testing.assert_allclose(m.model.coef_, local.coef_, atol=1e-8)
        assert m.rows == len(part) and m.metrics["n"] == len(part) and 0.5 < m.metrics["train_acc"] <= 1


def returns_a_lambda(data, key):
    """A 'model' no safe format can store (its code would have to travel)."""
    return (lambda x: x) if key == "b" else fit_logistic(data, key)


@masters("local", "connect")  # the store is a local directory: on several executors it needs shared storage
def test_members_dir_keeps_the_models_out_of_the_driver_until_read(spark, tmp_path):
    import os

    pdf = _stores(600)
    df = spark.createDataFrame(pdf)
    result = train_per_group(df, fit_logistic, group_col="store", members_dir=str(tmp_path / "members"))
    [run] = os.listdir(tmp_path / "members")
    written = os.listdir(tmp_path / "members" / run / "objects")
    # the models of each task's run of keys in one block: a members table of its own (Parquet)
    assert 1 <= len(written) <= 3 and all(n.endswith(".parquet") for n in written), written
    stored = spark.read.parquet(str(tmp_path / "members" / run / "objects"))
    assert sorted(r.group for r in stored.select("group").collect()) == ["a", "b", "c"]
    assert all(m._model is None for m in result.members) and f"in {tmp_path}" in repr(result.members[0])
    plain = train_per_group(df, fit_logistic, group_col="store")
    for m, p in zip(result.members, plain.members):
        np.testing.assert_allclose(m.model.coef_, p.model.coef_, atol=1e-12)  # read on first use
        assert m.metrics == p.metrics and m.rows == p.rows
    back = GroupModels.from_table(result.to_table(spark))
    assert [m.group for m in back.members] == ["a", "b", "c"]
    with pytest.raises(WorkerError, match=r"group 'b'.*no safe model format can store"):
        train_per_group(df, returns_a_lambda, group_col="store", members_dir=str(tmp_path / "again"))
    with pytest.raises(ConfigurationError, match=r"resources\['gpus'\] must be"):
        train_per_group(df, fit_logistic, group_col="store", resources={"gpus": -1})
    with pytest.raises(ConfigurationError, match="resources must be a dict"):
        train_per_group(df, fit_logistic, group_col="store", resources={"memory": 2})
    asked = train_per_group(df, fit_logistic, group_col="store", resources={"cpus": 1})
    assert [m.group for m in asked.members] == ["a", "b", "c"]


def memorize(data, key):
    X, y = data
    return KNeighborsClassifier(n_neighbors=1).fit(X, y)


@masters("local")  # executor-side logic: the same on every master
def test_num_groups_deal_the_rows_bagging_deals(spark):
    pdf = _stores(600, seed=1)[["x1", "x2", "label"]]
    df = spark.createDataFrame(pdf).repartition(3)
    ours = train_per_group(df, memorize, num_groups=3, features_cols=["x1", "x2"], label_col="label", seed=11)
    bag = BaggingClassifier(
        estimator=KNeighborsClassifier(n_neighbors=1),
        numModels=3,
        featuresCols=["x1", "x2"],
        labelCol="label",
        seed=11,
    ).fit(df.repartition(5))
    for m, member in zip(ours.members, bag.models):
        mine = np.sort(m.model._fit_X.view("f8,f8"), axis=0)
        theirs = np.sort(member.model._fit_X.view("f8,f8"), axis=0)
        assert np.array_equal(mine, theirs) and m.rows == len(theirs)
    assert sum(m.rows for m in ours.members) == len(pdf)


def sparse_fit(data, key):
    from scipy import sparse

    X, y = data
    assert sparse.isspmatrix_csr(X) and X.shape[1] == 2**18 + 1  # never densified
    return LogisticRegression(max_iter=200).fit(X, y), {"nnz_per_row": X.nnz / X.shape[0]}


@masters("local")  # executor-side logic: the same on every master
def test_sparse_vector_columns_reach_the_function_as_csr(spark):
    from pyspark.ml.feature import HashingTF, Tokenizer

    rng = np.random.default_rng(3)
    words = np.array(["good", "great", "fine", "bad", "awful", "poor", "the", "a", "movie", "plot"])
    texts, labels = [], []
    for i in range(400):
        positive = i % 2
        picks = (
            rng.choice(words[:3] if positive else words[3:6], size=3).tolist()
            + rng.choice(words[6:], 2).tolist()
        )
        texts.append(" ".join(picks))
        labels.append(positive)
    df = spark.createDataFrame(pd.DataFrame({"text": texts, "label": labels, "bias": 1.0}))
    tf = HashingTF(numFeatures=2**18, inputCol="words", outputCol="tf").transform(
        Tokenizer(inputCol="text", outputCol="words").transform(df)
    )
    result = train_per_group(tf, sparse_fit, num_groups=2, features_cols=["tf", "bias"], label_col="label")
    for m in result.members:
        assert 2 <= m.metrics["nnz_per_row"] <= 6  # distinct tokens + the dense bias column
    X_probe = result.members[0].model.coef_
    assert X_probe.shape == (1, 2**18 + 1)


def fail_on_b(data, key):
    if key == "b":
        raise ValueError("no model for b")
    return fit_logistic(data, key)


@masters("local")  # executor-side logic: the same on every master
def test_a_failing_group_is_named_with_its_traceback_or_skipped(spark):
    df = spark.createDataFrame(_stores(300))
    with pytest.raises(WorkerError, match="group 'b'.*ValueError: no model for b") as err:
        train_per_group(df, fail_on_b, group_col="store")
    assert "fail_on_b" in str(err.value) + str(getattr(err.value, "worker_traceback", ""))
    kept = train_per_group(df, fail_on_b, group_col="store", on_error="skip")
    assert [m.group for m in kept.members] == ["a", "c"] and list(kept.skipped) == ["b"]
    assert "ValueError: no model for b" in kept.skipped["b"]


def returns_nothing_for_a(data, key):
    if key == "a":
        return None
    if key == "b":
        import threading

        return threading.Lock()  # cannot travel back to the driver
    return fit_logistic(data, key)


@masters("local")  # executor-side logic: the same on every master
def test_a_function_returning_nothing_or_an_unstorable_object_is_named(spark):
    df = spark.createDataFrame(_stores(300))
    kept = train_per_group(df, returns_nothing_for_a, group_col="store", on_error="skip")
    assert [m.group for m in kept.members] == ["c"]
    assert "fn returned no model: end it with `return model`" in kept.skipped["a"]
    assert "group 'b'" in kept.skipped["b"] and "lock" in kept.skipped["b"].lower()
    with pytest.raises(WorkerError, match="group 'a'.*returned no model"):
        train_per_group(df, returns_nothing_for_a, group_col="store")


@masters("local", "connect")
def test_bad_arguments_are_refused_before_any_job(spark):
    df = spark.createDataFrame(_stores(30))
    cases = [
        (dict(), "give group_col"),
        (dict(group_col="store", num_groups=2), "not both"),
        (dict(group_col="nope"), "group_col='nope' is not a column"),
        (dict(num_groups=2, features_cols=["store"]), "column 'store' is string"),
        (
            dict(num_groups=2, features_cols=["x1"], label_col="y"),
            "label_col: column 'y' is not in the DataFrame",
        ),
        (dict(group_col="store", on_error="ignore"), "on_error must be one of"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ConfigurationError, match=message):
            train_per_group(df, fit_logistic, **kwargs)
    lock = __import__("threading").Lock()
    with pytest.raises(ConfigurationError, match="captures 'lock'"):
        train_per_group(df, lambda data, key: lock, group_col="store")


@masters("local", "connect")
def test_members_as_a_table_round_trip_and_a_forged_row_is_refused(spark, tmp_path):
    from pyspark.sql import functions as F

    result = train_per_group(spark.createDataFrame(_stores(600)), fit_logistic, group_col="store")
    table = result.to_table(spark)
    assert table.columns == ["group", "rows", "format", "model", "metrics", "record", "sha256"]
    table.write.parquet(str(tmp_path / "members"))
    stored = spark.read.parquet(str(tmp_path / "members"))
    assert {r.format for r in stored.select("format").collect()} == {"estimator_state"}  # a linear model
    best = stored.orderBy(F.col("metrics")["train_acc"].desc()).first().group  # SQL over the members
    assert best == max(result.members, key=lambda m: m.metrics["train_acc"]).group
    back = GroupModels.from_table(stored)
    X = pd.DataFrame(np.random.default_rng(0).normal(size=(5, 2)), columns=["x1", "x2"])
    for a, b in zip(result.members, back.members):
        assert a.group == b.group and np.array_equal(a.model.predict(X), b.model.predict(X))
    forged = stored.withColumn(
        "model", F.when(F.col("group") == "a", F.lit(b"\x80\x04junk")).otherwise(F.col("model"))
    )
    with pytest.raises(UnsafeModelError, match="group 'a' does not match its sha256"):
        GroupModels.from_table(forged)
    swapped = stored.withColumn("group", F.when(F.col("group") == "a", "b").otherwise(F.col("group")))
    with pytest.raises(UnsafeModelError, match="does not match its sha256"):  # store a's model served as b's
        GroupModels.from_table(swapped)
    with pytest.raises(UnsafeModelError, match="written with 3 rows and holds 2"):
        GroupModels.from_table(stored.where("group != 'c'"))


@masters("local", "connect")
def test_bagging_and_grouped_models_go_through_a_members_table_and_back(spark, tmp_path):
    from pyspark.sql import functions as F
    from sklearn.tree import DecisionTreeClassifier

    from sparkml_dist.ensemble import BaggingClassificationModel, GroupedModel, GroupedTrainer

    pdf = _stores(900, seed=4)
    df = spark.createDataFrame(pdf)
    bag = BaggingClassifier(
        estimator=DecisionTreeClassifier(max_depth=4),
        numModels=4,
        featureRatio=0.5,
        featuresCols=["x1", "x2"],
    ).fit(df)
    bag.members_table().write.parquet(str(tmp_path / "bag"))
    stored = spark.read.parquet(str(tmp_path / "bag"))
    assert stored.count() == 4 and stored.where("rows > 0").count() == 4
    back = BaggingClassificationModel.from_table(stored, featuresCols=["x1", "x2"])
    X = pdf[["x1", "x2"]].to_numpy()
    assert np.array_equal(back.predict_proba(X), bag.predict_proba(X)) and back.numClasses == 2
    a = bag.transform(df).select("prediction").toPandas()
    b = back.transform(df).select("prediction").toPandas()
    assert a.equals(b)
    changed = F.regexp_replace("record", '"n_rows": ', '"n_rows": 9')  # a record edited, its digest not
    swapped = stored.withColumn("record", F.when(F.col("group") == "0", changed).otherwise(F.col("record")))
    with pytest.raises(UnsafeModelError, match="group '0' does not match its sha256"):
        BaggingClassificationModel.from_table(swapped)
    grouped = GroupedTrainer(
        estimator=LogisticRegression(), groupCol="store", featuresCols=["x1", "x2"], labelCol="label"
    ).fit(df)
    again = GroupedModel.from_table(grouped.members_table(spark), groupCol="store", featuresCols=["x1", "x2"])
    assert again.keys == grouped.keys == ["a", "b", "c"]
    assert np.array_equal(again.predict(X, pdf["store"]), grouped.predict(X, pdf["store"]))
