"""The one per-group engine under bagging, GroupedTrainer and train_per_group: every capability on
all three, the same models on any partitioning, and keys that do not survive a trip through Python
never lose their rows."""

import datetime
import warnings

import numpy as np
import pandas as pd
import pytest
from sklearn.tree import DecisionTreeClassifier

from sparkml_dist import ConfigurationError, WorkerError
from sparkml_dist.ensemble import BaggingClassifier, GroupedTrainer, train_per_group
from tests.conftest import masters


def _rows(n=600, seed=0):
    rng = np.random.default_rng(seed)
    pdf = pd.DataFrame(rng.normal(size=(n, 3)), columns=["x1", "x2", "x3"])
    pdf["store"] = rng.choice(["a", "b", "c"], n)
    pdf["label"] = ((pdf.x1 + 0.5 * pdf.x2 + rng.normal(scale=0.5, size=n)) > 0).astype(float)
    return pdf


class FailOnFewRows(DecisionTreeClassifier):
    """Fails for the one group with fewer than 150 rows (store 'c' below)."""

    def fit(self, X, y, sample_weight=None):
        if len(y) < 150:
            raise ValueError("deliberate: too few rows")
        return super().fit(X, y, sample_weight=sample_weight)


def fn_tree(data, key):
    X, y = data
    if len(y) < 150:
        raise ValueError("deliberate: too few rows")
    return DecisionTreeClassifier(max_depth=3, random_state=0).fit(X, y)


def _trainers(df, **kw):
    """The three faces over one engine, each asked the same thing (membersDir, onError, GPUs off)."""
    cols = ["x1", "x2", "x3"]
    est = FailOnFewRows(max_depth=3)
    snake = {"members_dir": kw.get("membersDir"), "on_error": kw.get("onError", "raise")}
    return {
        "bagging": lambda: BaggingClassifier(estimator=est, numModels=3, featuresCols=cols, seed=1, **kw).fit(
            df
        ),
        "grouped": lambda: GroupedTrainer(estimator=est, groupCol="store", featuresCols=cols, **kw).fit(df),
        "per_group": lambda: train_per_group(df, fn_tree, group_col="store", features_cols=cols, **snake),
    }


def _failed(result):
    return result.skipped if hasattr(result, "skipped") else result.failedGroups


@masters(
    "local", "connect"
)  # membersDir is a local directory here: on several executors it needs shared storage
@pytest.mark.parametrize("face", ["bagging", "grouped", "per_group"])
def test_members_dir_and_on_error_work_on_every_trainer(spark, tmp_path, face):
    pdf = _rows()
    pdf.loc[pdf.store == "c", "store"] = np.where(np.arange((pdf.store == "c").sum()) < 100, "c", "b")
    df = spark.createDataFrame(pdf)
    small = df.limit(280) if face == "bagging" else df  # bagging: 3 groups of ~93 rows all fail
    with pytest.raises(WorkerError, match="deliberate: too few rows"):
        _trainers(small)[face]()
    if face == "bagging":  # a bagging fit where one member's share is small
        df = spark.createDataFrame(pd.concat([pdf, pdf.iloc[:100]]))
    fitted = _trainers(df, membersDir=str(tmp_path / "m"), onError="skip")[face]()
    failed = _failed(fitted)
    assert len(failed) == (0 if face == "bagging" else 1), failed
    if face != "bagging":
        assert "deliberate: too few rows" in failed["c"] and "Traceback" in failed["c"]
    assert (tmp_path / "m").is_dir() and any((tmp_path / "m").rglob("*.json"))  # written by the tasks


@masters("local")  # the order inside a group comes from the rows: no master can change it
def test_grouped_trainer_fits_the_same_models_on_any_partitioning(spark):
    pdf = _rows(900, seed=3)
    df = spark.createDataFrame(pdf)
    est = DecisionTreeClassifier(max_depth=6, max_features=0.7)  # random: seeded by the group's seed
    kw = dict(estimator=est, groupCol="store", featuresCols=["x1", "x2", "x3"], seed=5)
    one = GroupedTrainer(**kw).fit(df.coalesce(1))
    seven = GroupedTrainer(**kw).fit(df.repartition(7))
    X = pdf[["x1", "x2", "x3"]].to_numpy()
    for key in one.keys:
        a, b = one.models[key], seven.models[key]
        assert np.array_equal(a.tree_.value, b.tree_.value) and np.array_equal(
            a.predict_proba(X), b.predict_proba(X)
        )
    again = train_per_group(df.repartition(5), fn_random, group_col="store", seed=9)
    first = train_per_group(df.coalesce(1), fn_random, group_col="store", seed=9)
    assert [m.metrics for m in again.members] == [m.metrics for m in first.members]


def fn_random(data, key):
    """Uses numpy's global generator, as many user functions do: seeded per group by the engine."""
    return DecisionTreeClassifier(max_depth=2).fit(data[["x1"]], data["label"]), {
        "draw": float(np.random.rand())
    }


def _count_rows(data, key):
    return DecisionTreeClassifier(max_depth=1).fit(data[["x1"]], data["label"]), {"n": len(data)}


@masters("local", "oldest")  # keys travel through the driver the same way on every master
def test_keys_that_do_not_survive_python_never_lose_rows(spark):
    from pyspark.sql import functions as F

    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:  # the repeated autumn hour: 01:30 EDT and 01:30 EST are two instants
        base = spark.range(40).select(
            F.timestamp_seconds(F.lit(1793511000) + (F.col("id") % 2) * 3600).alias("ts"),
            (F.col("id") % 3).cast("double").alias("x1"),
            (F.col("id") % 2).cast("double").alias("label"),
            F.array((F.col("id") % 2).cast("int"), F.lit(1)).alias("arr"),
            F.unhex(F.when(F.col("id") % 2 == 0, "FF00").otherwise("61")).cast("string").alias("bad_text"),
        )
        plain = base.drop("bad_text")
        by_time = train_per_group(plain, _count_rows, group_col="ts")
        assert len(by_time.members) == 2 and [m.rows for m in by_time.members] == [20, 20]
        assert all(m.metrics["n"] == 20 for m in by_time.members)
        assert all(isinstance(m.group, datetime.datetime) for m in by_time.members)
        grouped = GroupedTrainer(
            estimator=DecisionTreeClassifier(max_depth=1), groupCol="ts", featuresCols=["x1"]
        ).fit(plain)
        assert grouped.groupSizes == {k: 20 for k in grouped.keys} and len(grouped.keys) == 2
        by_array = train_per_group(plain, _count_rows, group_col="arr")
        assert sorted(m.group for m in by_array.members) == [(0, 1), (1, 1)]
        assert sum(m.rows for m in by_array.members) == 40
        with pytest.raises(
            ConfigurationError, match=r"group_col='bad_text': the key b'\\xff\\x00' is not valid UTF-8"
        ):
            train_per_group(base.select("bad_text", "x1", "label"), _count_rows, group_col="bad_text")
    finally:
        spark.conf.unset("spark.sql.session.timeZone")


@masters("local")  # argument handling on the driver
def test_the_earlier_camel_case_keywords_still_work_with_a_deprecation_warning(spark):
    df = spark.createDataFrame(_rows(120))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        result = train_per_group(df, _count_rows, groupCol="store", onError="raise")
    assert [m.group for m in result.members] == ["a", "b", "c"]
    said = [str(w.message) for w in seen if issubclass(w.category, DeprecationWarning)]
    assert any("groupCol=...) is now group_col=" in s for s in said) and any("onError" in s for s in said)
    with pytest.raises(TypeError, match="unexpected keyword argument 'groupcol'"):
        train_per_group(df, _count_rows, groupcol="store")
