"""GroupedTrainer: one model per key, trained where the key's rows land."""

import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import LinearRegression
from sklearn.tree import DecisionTreeClassifier

from sparkml_dist import ConfigurationError, WorkerError
from sparkml_dist.ensemble import GroupedModel, GroupedTrainer
from tests.conftest import masters


@pytest.fixture(scope="module")
def sales():
    rng = np.random.default_rng(0)
    n = 600
    pdf = pd.DataFrame(
        {
            "store": rng.choice(["a", "b", "c", "d"], n),
            "price": rng.normal(size=n),
            "promo": rng.normal(size=n),
        }
    )
    slope = pdf.store.map({"a": 1.0, "b": 2.0, "c": -1.0, "d": 0.5})
    pdf["sales"] = slope * pdf.price + 0.3 * pdf.promo + rng.normal(scale=0.01, size=n)
    return pdf


def trainer(**kw):
    args = dict(
        estimator=LinearRegression(), groupCol="store", featuresCols=["price", "promo"], labelCol="sales"
    )
    args.update(kw)
    return GroupedTrainer(**args)


@masters("local", "connect", "cluster", "oldest")  # what separate executor JVMs can change
def test_one_model_per_key_equals_local_fits_and_transform_uses_them(spark, sales):
    df = spark.createDataFrame(sales).repartition(3)
    model = trainer().fit(df)
    assert model.keys == ["a", "b", "c", "d"]
    assert model.groupSizes == sales.store.value_counts().sort_index().to_dict()
    for key, fitted in model.models.items():
        rows = sales[sales.store == key]
        local = LinearRegression().fit(rows[["price", "promo"]].to_numpy(), rows.sales.to_numpy())
        np.testing.assert_allclose(fitted.coef_, local.coef_, rtol=1e-9)
    out = model.transform(df).toPandas()
    expected = model.predict(out[["price", "promo"]].to_numpy(), out.store.tolist())
    np.testing.assert_allclose(out.prediction.to_numpy(), expected)
    assert np.abs(out.prediction - out.sales).max() < 0.1  # each key's own slope


def test_unseen_keys_error_or_predict_null(spark, sales):
    model = trainer().fit(spark.createDataFrame(sales))
    new = spark.createDataFrame(
        pd.DataFrame({"store": ["a", "zz"], "price": [1.0, 1.0], "promo": [0.0, 0.0], "sales": [0.0, 0.0]})
    )
    with pytest.raises(Exception, match=r"keys \['zz'\] were not seen in training"):
        model.transform(new).collect()
    out = model.copy({model.unseenKey: "null"}).transform(new).toPandas()
    assert out.prediction.isna().tolist() == [False, True]


def test_small_keys_are_reported_not_dropped(spark, sales):
    df = spark.createDataFrame(
        pd.concat([sales, pd.DataFrame({"store": ["tiny"], "price": [1.0], "promo": [1.0], "sales": [1.0]})])
    )
    with pytest.raises(
        ConfigurationError, match=r"1 key\(s\) of 'store' have fewer than minRows=5 rows \('tiny': 1\)"
    ):
        trainer(minRows=5).fit(df)
    model = trainer(minRows=5, onSmallGroups="skip").fit(df)
    assert model.skippedGroups == {"tiny": 1} and "tiny" not in model.keys


def test_bad_input_is_named(spark, sales):
    df = spark.createDataFrame(sales)
    with pytest.raises(ConfigurationError, match="groupCol='shop' is not a column"):
        trainer(groupCol="shop").fit(df)
    with pytest.raises(ConfigurationError, match="featuresCols: column 'store'"):
        trainer(featuresCols=["price", "store"]).fit(df)
    nulls = spark.createDataFrame(sales.assign(store=sales.store.where(sales.index > 2, None)))
    with pytest.raises(ConfigurationError, match="groupCol='store' is null in 3 rows"):
        trainer().fit(nulls)
    with pytest.raises(ConfigurationError, match="onSmallGroups must be one of"):
        trainer(onSmallGroups="drop").fit(df)
    with pytest.raises(ConfigurationError, match="the input DataFrame is empty"):
        trainer().fit(df.limit(0))
    with pytest.raises(ConfigurationError, match="no key of 'store' has minRows=100000 rows"):
        trainer(minRows=100000, onSmallGroups="skip").fit(df)


def test_a_key_whose_fit_fails_is_named(spark, sales):
    from tests.support.helpers import FailOnKeyRegressor

    with pytest.raises(WorkerError, match=r"fitting key 'c' \(\d+ rows\): ValueError: injected"):
        trainer(estimator=FailOnKeyRegressor(bad_slope_sign=-1)).fit(spark.createDataFrame(sales))


def test_string_labels_and_save_load(spark, sales, tmp_path):
    pdf = sales.assign(label=np.where(sales.sales > 0, "up", "down"))
    df = spark.createDataFrame(pdf)
    model = GroupedTrainer(
        estimator=DecisionTreeClassifier(max_depth=3, random_state=0),
        groupCol="store",
        featuresCols=["price", "promo"],
        labelCol="label",
    ).fit(df)
    before = model.transform(df).select("prediction").toPandas().prediction.tolist()
    assert set(before) <= {"up", "down"}
    model.write().overwrite().save(str(tmp_path / "m"))
    loaded = GroupedModel.load(str(tmp_path / "m"))
    assert loaded.keys == model.keys and loaded.getGroupCol() == "store"
    assert loaded.transform(df).select("prediction").toPandas().prediction.tolist() == before


def test_vector_features_sparse_or_dense_predict_as_fitted(spark, sales):
    from pyspark.ml.linalg import Vectors

    rows = [
        (
            r.store,
            Vectors.sparse(2, [0], [r.price]) if i % 2 else Vectors.dense([r.price, r.promo]),
            float(r.sales),
        )
        for i, r in enumerate(sales.itertuples())
    ]
    df = spark.createDataFrame(rows, ["store", "features", "sales"])
    model = GroupedTrainer(estimator=LinearRegression(), groupCol="store", labelCol="sales").fit(df)
    out = model.transform(df).toPandas()
    dense = np.array([v.toArray() for v in out.features])
    np.testing.assert_allclose(out.prediction.to_numpy(), model.predict(dense, out.store.tolist()))


@masters("local", "connect")  # the store is a local directory: on several executors it needs shared storage
def test_a_stored_model_with_a_failed_key_as_a_table_saved_and_loaded(spark, sales, tmp_path):
    from sklearn.linear_model import LogisticRegression

    pdf = sales.assign(label=(sales.sales > 0).astype(int))
    pdf.loc[pdf.store == "c", "label"] = 1  # one class only: LogisticRegression refuses to fit "c"
    df = spark.createDataFrame(pdf)
    model = GroupedTrainer(
        estimator=LogisticRegression(), groupCol="store", featuresCols=["price", "promo"], labelCol="label",
        membersDir=str(tmp_path / "members"), onError="skip",
    ).fit(df)  # fmt: skip
    assert model.keys == ["a", "b", "d"] and "only one class" in model.failedGroups["c"]
    assert all(b.meta is not None and b.data is None for b in model._models.blocks)  # files, not bytes
    table = model.members_table(spark)  # the blocks themselves, read by Spark
    rows = table.select("group", "format").toPandas().sort_values("group")
    assert rows.group.tolist() == ["a", "b", "c", "d"]
    assert rows.format.tolist() == ["estimator_state", "estimator_state", "failed", "estimator_state"]
    back = GroupedModel.from_table(table, groupCol="store", featuresCols=["price", "promo"])
    assert back.keys == model.keys and list(back.failedGroups) == ["c"]
    X, keys = pdf[["price", "promo"]].to_numpy(), ["a"] * len(pdf)
    assert np.array_equal(back.predict(X, keys), model.predict(X, keys))
    with pytest.raises(ValueError, match=r"keys \['c'\] have no model: their fit failed"):
        model.predict(X[:2], ["c", "a"])
    model.write().overwrite().save(str(tmp_path / "saved"))
    loaded = GroupedModel.load(str(tmp_path / "saved"))
    assert loaded.keys == model.keys and list(loaded.failedGroups) == ["c"]
    scored = loaded.copy({loaded.unseenKey: "null"}).transform(df).toPandas()
    assert (
        scored[scored.store == "c"].prediction.isna().all()
        and scored[scored.store != "c"].prediction.notna().all()
    )
    signed = model.members_table(spark, key="k" * 16)  # every row's digest an HMAC: built on the driver
    assert GroupedModel.from_table(signed, key="k" * 16, groupCol="store").keys == model.keys
    with pytest.raises(Exception, match="does not match its sha256"):
        GroupedModel.from_table(signed, groupCol="store")


@masters("local")
def test_keys_are_equal_as_spark_holds_them_equal(spark, tmp_path):
    """-0.0 and 0.0 are one key to Spark, so they are to the model; under UTF8_LCASE 'a' and 'A'
    are one key (before: models[-0.0] a KeyError, predict said 'not seen in training'); a
    collation whose equality Python cannot follow is refused by name."""
    from pyspark.sql import functions as F

    rows = [(k, float(i), 2.0 * i + (k or 0)) for i, k in enumerate([0.0, -0.0, 1.0] * 4)]
    df = spark.createDataFrame(rows, "k double, x double, y double")
    model = GroupedTrainer(estimator=LinearRegression(), groupCol="k", featuresCols=["x"], labelCol="y").fit(
        df
    )
    assert len(model.keys) == 2 and model.models[-0.0] is model.models[0.0]
    assert model.predict(np.array([[1.0], [1.0]]), [-0.0, 0.0]).tolist() == pytest.approx([2.0, 2.0])
    words = spark.createDataFrame([("A", 1.0), ("a", 2.0), ("b", 3.0), ("B", 4.0)] * 3, "k string, x double")
    lcase = words.withColumn("k", F.col("k").cast("string collate UTF8_LCASE")).withColumn(
        "y", F.col("x") * 3
    )
    model = GroupedTrainer(estimator=LinearRegression(), groupCol="k", featuresCols=["x"], labelCol="y").fit(
        lcase
    )
    assert len(model.keys) == 2
    scored = model.transform(lcase).toPandas()
    local = model.predict(scored[["x"]].to_numpy(), scored.k.tolist())  # 'a' and 'B' as Spark scored them
    np.testing.assert_allclose(local, scored.prediction.to_numpy())
    assert model.models["a"] is model.models["A"] and model.models["b"] is model.models["B"]
    model.write().save(str(tmp_path / "lcase"))
    again = GroupedModel.load(str(tmp_path / "lcase"))
    np.testing.assert_allclose(again.predict(np.array([[2.0]]), ["a"]), [6.0])
    back = GroupedModel.from_table(model.members_table(spark), groupCol="k", featuresCols=["x"])
    np.testing.assert_allclose(back.predict(np.array([[2.0]]), ["b"]), [6.0])
    ci = words.withColumn("k", F.col("k").cast("string collate UNICODE_CI")).withColumn("y", F.col("x"))
    with pytest.raises(ConfigurationError, match=r"groupCol='k' is text collated UNICODE_CI.*UTF8_LCASE"):
        GroupedTrainer(estimator=LinearRegression(), groupCol="k", featuresCols=["x"], labelCol="y").fit(ci)
