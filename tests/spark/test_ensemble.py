"""BaggingClassifier / BaggingRegressor end to end on a real SparkSession."""

import os

import numpy as np
import pandas as pd
import pytest
from pyspark.ml.linalg import Vectors
from sklearn.datasets import make_classification, make_regression
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.tree import DecisionTreeClassifier, DecisionTreeRegressor

from sparkml_dist import WorkerError
from sparkml_dist.ensemble import (
    BaggingClassificationModel,
    BaggingClassifier,
    BaggingRegressionModel,
    BaggingRegressor,
)
from sparkml_dist.formats import store as model_store
from tests.conftest import masters

COLS = [f"f{i}" for i in range(6)]


@pytest.fixture(scope="module")
def data3():
    X, y = make_classification(
        n_samples=900, n_features=6, n_informative=4, n_redundant=0, n_classes=3, random_state=0
    )
    return X, y.astype(float)


@pytest.fixture(scope="module")
def cols_df(spark, data3):
    X, y = data3
    pdf = pd.DataFrame(X, columns=COLS)
    pdf["label"] = y
    return spark.createDataFrame(pdf)


@pytest.fixture(scope="module")
def vec_df(spark, data3):
    X, y = data3
    return spark.createDataFrame([(Vectors.dense(x), float(t)) for x, t in zip(X, y)], ["features", "label"])


def _scored(model, df):
    out = model.transform(df).toPandas()
    return out["prediction"].to_numpy(), np.stack(out["probability"].map(lambda v: v.toArray()))


@masters("local", "connect", "cluster", "oldest")  # what separate executor JVMs can change
def test_fit_transform_matches_local_predict_and_learns(cols_df, data3):
    X, y = data3
    model = BaggingClassifier(
        estimator=DecisionTreeClassifier(max_depth=6), numModels=4, featuresCols=COLS, seed=1
    ).fit(cols_df)
    assert isinstance(model, BaggingClassificationModel)
    assert len(model.models) == 4 and model.classes == (0.0, 1.0, 2.0)
    assert sum(model.groupSizes) == len(X)  # disjoint: every row used exactly once
    pred, prob = _scored(model, cols_df)
    local_X = cols_df.toPandas()[COLS].to_numpy()
    assert np.allclose(prob, model.predict_proba(local_X))
    assert np.array_equal(pred, model.predict(cols_df.toPandas()[COLS]))
    assert (pred == cols_df.toPandas()["label"].to_numpy()).mean() > 0.75


@masters("local")
def test_a_fit_reads_its_input_once_before_the_fitting_job(spark, cols_df):
    """The checks and the group sizes come from the job that deals the rows: a fit runs that job
    and the fitting job (each with its shuffle stages, one job each under adaptive execution) and
    nothing more; a slow fit of a large input was mostly jobs re-reading it before the fit."""
    sc = spark.sparkContext
    sc.setJobGroup("count-the-jobs", "a bagging fit")
    try:
        BaggingClassifier(
            estimator=DecisionTreeClassifier(max_depth=3), numModels=4, featuresCols=COLS, seed=1
        ).fit(cols_df)
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    jobs = [sc.statusTracker().getJobInfo(j) for j in sc.statusTracker().getJobIdsForGroup("count-the-jobs")]
    stages = [s for j in jobs for s in j.stageIds]
    names = {sc.statusTracker().getStageInfo(s).name for s in stages if sc.statusTracker().getStageInfo(s)}
    # dealing: count per key bucket (2 jobs); fitting: window, repartition, fit (3 jobs)
    assert len(jobs) <= 5, (len(jobs), names)


def test_same_seed_identical_predictions_after_repartitioning(vec_df, data3):
    X, _ = data3
    est = BaggingClassifier(numModels=3, sampling="bootstrap", sampleRatio=0.6, featureRatio=0.7, seed=5)
    a = est.fit(vec_df.repartition(1)).predict_proba(X)
    b = est.fit(vec_df.repartition(5)).predict_proba(X)
    c = est.copy({est.seed: 6}).fit(vec_df).predict_proba(X)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    forest = BaggingClassifier.forest(numTrees=3, maxDepth=6, seed=5)  # trees sample features per split
    assert np.array_equal(
        forest.fit(vec_df.repartition(1)).predict_proba(X), forest.fit(vec_df.repartition(4)).predict_proba(X)
    )


def test_array_features_hard_voting_and_feature_subsets(spark, data3):
    X, y = data3
    df = spark.createDataFrame([(x.tolist(), float(t)) for x, t in zip(X, y)], ["feats", "y"])
    model = BaggingClassifier(
        estimator=LogisticRegression(),
        numModels=3,
        featuresCol="feats",
        labelCol="y",
        voting="hard",
        featureRatio=0.5,
        seed=2,
        probabilityCol="p",
        rawPredictionCol="",
    ).fit(df)
    assert all(len(m.features) == 3 for m in model.models)
    out = model.transform(df)
    assert "rawPrediction" not in out.columns and "p" in out.columns
    raw = model.predict_raw(X)
    assert np.all(raw.sum(axis=1) == 3)  # vote counts
    pdf = out.toPandas()
    assert np.allclose(
        np.stack(pdf["p"].map(lambda v: v.toArray())), model.predict_proba(np.stack(pdf["feats"]))
    )


@masters("local")
def test_members_that_miss_a_class_still_vote_correctly(spark):
    # one of the 3 classes is so rare that most groups never see it
    rng = np.random.default_rng(0)
    X = rng.normal(size=(600, 3))
    y = (X[:, 0] > 0).astype(float)
    X[:4, 1] += 20  # 4 rows over 5 groups: at least one member never sees class 7
    y[:4] = 7.0
    df = spark.createDataFrame([(Vectors.dense(x), float(t)) for x, t in zip(X, y)], ["features", "label"])
    model = BaggingClassifier(estimator=DecisionTreeClassifier(max_depth=3), numModels=5, seed=3).fit(df)
    assert model.classes == (0.0, 1.0, 7.0)
    assert any(len(m.classes) < 3 for m in model.models)
    assert model.predict_proba(X).shape == (600, 3)
    # class 7's probability comes only from the members that saw it, each in the right column
    seen = [m for m in model.models if 7.0 in list(m.classes)]
    assert seen
    own = sum(m.model.predict_proba(X[:4, m.features])[:, list(m.classes).index(7.0)] for m in seen)
    assert np.allclose(model.predict_proba(X[:4])[:, 2], own / 5) and own.max() > 0


@masters("local")
def test_members_pulled_out_predict_the_users_labels(spark):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(300, 4))
    y = np.where(X[:, 0] > 0.5, 7.0, np.where(X[:, 1] > 0, 3.0, -1.0))
    df = spark.createDataFrame([(Vectors.dense(x), float(t)) for x, t in zip(X, y)], ["features", "label"])
    model = BaggingClassifier(
        estimator=DecisionTreeClassifier(max_depth=4), numModels=3, featureRatio=0.75, voting="hard", seed=1
    ).fit(df)
    assert model.classes == (-1.0, 3.0, 7.0)
    for m in model.models:
        own = m.model.predict(X[:, m.features])
        assert set(own) <= {-1.0, 3.0, 7.0} and np.array_equal(own, m.predict(X))
        assert list(m.model.classes_) == list(m.classes) and m.model.get_depth() <= 4  # the tree's own API
        assert m.model.predict_proba(X[:, m.features]).shape == (300, len(m.classes))
    votes = np.stack([m.predict(X) for m in model.models])
    unanimous = (votes == votes[0]).all(axis=0)
    assert unanimous.any() and np.array_equal(model.predict(X)[unanimous], votes[0][unanimous])


@masters("local")
def test_regressor_mean_of_members(spark):
    X, y = make_regression(n_samples=500, n_features=4, noise=0.1, random_state=0)
    df = spark.createDataFrame([(Vectors.dense(x), float(t)) for x, t in zip(X, y)], ["features", "label"])
    model = BaggingRegressor(
        estimator=DecisionTreeRegressor(max_depth=5), numModels=3, sampling="subsample", sampleRatio=0.5
    ).fit(df)
    assert isinstance(model, BaggingRegressionModel)
    pdf = model.transform(df).toPandas()
    X_local = np.stack(pdf["features"].map(lambda v: v.toArray()))
    expected = np.mean([m.model.predict(X_local) for m in model.models], axis=0)
    assert np.allclose(pdf["prediction"], expected)
    assert np.corrcoef(pdf["prediction"], pdf["label"])[0, 1] > 0.8


@masters("local")
def test_weight_column_reaches_the_members(spark):
    X = np.array([[0.0], [1.0]] * 50)
    y = np.array([0.0, 1.0] * 50)
    X = np.vstack([X, [[0.0]] * 10])
    y = np.concatenate([y, [1.0] * 10])  # at x=0: 50 rows say 0, 10 rows say 1
    w = np.where((X[:, 0] == 0) & (y == 1), 100.0, 1.0)
    df = spark.createDataFrame(
        [(Vectors.dense(a), float(b), float(c)) for a, b, c in zip(X, y, w)], ["features", "label", "w"]
    )
    plain = BaggingClassifier(estimator=DecisionTreeClassifier(), numModels=1).fit(df)
    weighted = BaggingClassifier(estimator=DecisionTreeClassifier(), numModels=1, weightCol="w").fit(df)
    assert plain.predict(np.array([[0.0]]))[0] == 0.0
    assert weighted.predict(np.array([[0.0]]))[0] == 1.0


@masters("local")
def test_nan_accepted_by_estimators_that_handle_missing_values(spark, data3):
    X, y = data3
    X = X.copy()
    X[::10, 2] = np.nan
    df = spark.createDataFrame([(x.tolist(), float(t)) for x, t in zip(X, y)], ["features", "label"])
    model = BaggingClassifier(estimator=HistGradientBoostingClassifier(max_iter=20), numModels=2).fit(df)
    assert np.isfinite(model.predict_proba(X)).all()


@masters("local")
def test_xgboost_members(spark, data3):
    xgb = pytest.importorskip("xgboost")
    X, y = data3
    df = spark.createDataFrame([(Vectors.dense(x), float(t)) for x, t in zip(X, y)], ["features", "label"])
    model = BaggingClassifier(
        estimator=xgb.XGBClassifier(n_estimators=10, max_depth=3), numModels=2, seed=4
    ).fit(df)
    assert (model.predict(X) == y).mean() > 0.8


@masters("local", "connect", "cluster")  # what separate executor JVMs can change
def test_failing_member_raises_worker_error_naming_the_group(spark, data3):
    from sparkml_dist.partitioning import SplitSpec, group_seeds
    from tests.support.helpers import FailingClassifier

    X, y = data3
    df = spark.createDataFrame([(Vectors.dense(x), float(t)) for x, t in zip(X, y)], ["features", "label"])
    bad = group_seeds(SplitSpec(num_groups=3, seed=8))[2]
    with pytest.raises(WorkerError) as info:
        BaggingClassifier(estimator=FailingClassifier(bad_state=bad), numModels=3, seed=8).fit(df)
    assert info.value.group == 2
    assert "deliberate failure" in info.value.worker_traceback
    assert "Traceback" in info.value.worker_traceback


@masters("local", "connect", "cluster", "oldest")  # what separate executor JVMs can change
def test_save_load_roundtrip(tmp_path, vec_df, data3):
    X, _ = data3
    est = BaggingClassifier(estimator=DecisionTreeClassifier(max_depth=4), numModels=3, voting="hard", seed=9)
    model, again = est.fit(vec_df), est.fit(vec_df)
    assert model.uid.startswith("BaggingClassificationModel_") and len({est.uid, model.uid, again.uid}) == 3
    path = str(tmp_path / "bag")
    model.write().overwrite().save(path)
    model.write().overwrite().save(path)  # overwrite works
    assert sorted(os.listdir(tmp_path)) == ["bag"]  # nothing staged or replaced is left beside it
    loaded = BaggingClassificationModel.load(path)
    assert loaded.uid == model.uid and loaded.getVoting() == "hard"
    assert isinstance(loaded.getEstimator(), DecisionTreeClassifier)
    assert np.array_equal(loaded.predict_proba(X), model.predict_proba(X))
    pred, _ = _scored(loaded, vec_df)
    pred0, _ = _scored(model, vec_df)
    assert np.array_equal(pred, pred0)
    est_path = str(tmp_path / "est")
    BaggingClassifier(numModels=7, sampling="subsample", sampleRatio=0.3).save(est_path)
    est = BaggingClassifier.load(est_path)
    assert est.getNumModels() == 7 and est.getSampleRatio() == pytest.approx(0.3)


def test_an_overwrite_that_fails_leaves_the_old_model_whole(tmp_path, vec_df, data3, monkeypatch):
    X, _ = data3
    old = BaggingClassifier(estimator=DecisionTreeClassifier(max_depth=2), numModels=2, seed=1).fit(vec_df)
    new = BaggingClassifier(estimator=DecisionTreeClassifier(max_depth=5), numModels=3, seed=2).fit(vec_df)
    path = str(tmp_path / "bag")
    old.save(path)

    def fail(*args, **kwargs):
        raise OSError("disk full while committing")

    monkeypatch.setattr(model_store.ModelStore, "commit", fail)  # metadata and members already written
    with pytest.raises(OSError, match="disk full"):
        new.write().overwrite().save(path)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["bag"]
    assert np.array_equal(BaggingClassificationModel.load(path).predict_proba(X), old.predict_proba(X))
    new.write().overwrite().save(path)
    assert np.array_equal(BaggingClassificationModel.load(path).predict_proba(X), new.predict_proba(X))


@masters("cluster")  # local[N] never retries a task
def test_task_lost_on_first_attempt_gives_the_same_members(spark, tmp_path):
    """a Python worker dies mid-fit; the retried task yields the same members."""
    import os

    from tests.support.helpers import CrashOnceClassifier

    X, y = make_classification(n_samples=400, n_features=5, random_state=0)
    df = spark.createDataFrame([(Vectors.dense(x), float(t)) for x, t in zip(X, y)], ["features", "label"])
    marker = str(tmp_path / "crashed-once")
    retried = BaggingClassifier(
        estimator=CrashOnceClassifier(marker=marker, max_depth=4),
        numModels=3,
        sampling="bootstrap",
        sampleRatio=0.7,
        seed=3,
    ).fit(df)
    assert os.path.exists(marker)  # a worker really died on the first attempt
    plain = BaggingClassifier(
        estimator=DecisionTreeClassifier(max_depth=4),
        numModels=3,
        sampling="bootstrap",
        sampleRatio=0.7,
        seed=3,
    ).fit(df)
    assert [m.group for m in retried.models] == [0, 1, 2]
    assert retried.groupSizes == plain.groupSizes  # the same rows per group
    assert np.array_equal(retried.predict_proba(X), plain.predict_proba(X))


def test_members_written_by_the_executors_stay_off_the_driver(tmp_path, vec_df, data3, monkeypatch):
    import gc
    import weakref

    from sparkml_dist import collection
    from sparkml_dist.ensemble import member_records
    from sparkml_dist.ensemble.stored import member_store

    X, _ = data3
    collected = []
    decode = collection.decode
    monkeypatch.setattr(
        collection, "decode", lambda t, *a, **k: collected.append(t.nbytes) or decode(t, *a, **k)
    )
    params = dict(estimator=DecisionTreeClassifier(max_depth=8), numModels=4, seed=3)
    kept = BaggingClassifier(**params).fit(vec_df)
    stored = BaggingClassifier(membersDir=str(tmp_path / "members"), **params).fit(vec_df)
    monkeypatch.undo()
    assert isinstance(stored._members, member_store.LazyMembers)
    assert collected[1] * 4 < collected[0]  # what came back through Spark: file metadata only
    assert stored.groupSizes == kept.groupSizes
    assert np.array_equal(stored.predict_proba(X), kept.predict_proba(X))
    assert np.array_equal(_scored(stored, vec_df)[1], _scored(kept, vec_df)[1])  # executors read the store
    assert [m.predict(X).tolist() for m in stored.models] == [m.predict(X).tolist() for m in kept.models]

    refs, most = [], []
    load, record = member_store.LazyMembers._load, member_records.to_record

    def counted_load(self, i):
        m = load(self, i)
        refs.append(weakref.ref(m))
        return m

    def counted_record(m):
        gc.collect()
        most.append(sum(r() is not None for r in refs))
        return record(m)

    monkeypatch.setattr(member_store.LazyMembers, "_load", counted_load)
    monkeypatch.setattr(member_records, "to_record", counted_record)
    path = str(tmp_path / "saved")
    stored.save(path)
    assert most == [1, 1, 1, 1]  # saving holds one member at a time
    monkeypatch.undo()

    def no_loading(self, i):
        raise AssertionError("groupSizes loaded a member")

    lazy = BaggingClassificationModel.read().lazy().load(path)
    monkeypatch.setattr(member_store.LazyMembers, "_load", no_loading)
    assert lazy.groupSizes == kept.groupSizes and isinstance(lazy._members, member_store.LazyMembers)
    monkeypatch.undo()
    assert np.array_equal(lazy.predict_proba(X), kept.predict_proba(X))


@masters("local", "connect")  # local masters deal the driver's GPUs (clusters: the e2e fake discovery test)
def test_members_fit_on_the_drivers_gpus_on_a_local_master_and_say_which(cols_df, monkeypatch):
    from sparkml_dist import ConfigurationError
    from tests.support.helpers import DeviceRecorder

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")  # nothing touches CUDA: the device is recorded
    model = BaggingClassifier(estimator=DeviceRecorder(), numModels=4, featuresCols=COLS, useGpu=True).fit(
        cols_df
    )
    assert [m.model.fitted_on_ for m in model.models] == ["cuda:2", "cuda:5", "cuda:2", "cuda:5"]
    assert model.models[0].model.get_params()["device"] == "cuda:2"
    with pytest.raises(
        ConfigurationError, match="useGpu=True but DecisionTreeClassifier has no 'device' parameter"
    ):
        BaggingClassifier(estimator=DecisionTreeClassifier(), featuresCols=COLS, useGpu=True).fit(cols_df)


@masters("local", "connect")
def test_the_gpu_plan_says_when_gpu_memory_is_unknown_and_refuses_more_members_than_gpus_hold(
    cols_df, monkeypatch, caplog
):
    """The documents' N_total rule for GPUs (sparkml_dist.plan) on a local master, whose tasks
    all run at once: unknown GPU memory is said, not skipped; known memory bounds the members."""
    import logging

    from sparkml_dist import InsufficientResourcesError
    from tests.support.helpers import DeviceRecorder

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")  # one GPU; nothing touches CUDA
    spark = cols_df.sparkSession
    bag = dict(estimator=DeviceRecorder(), numModels=2, featuresCols=COLS, useGpu=True)
    with caplog.at_level(logging.WARNING, logger="sparkml_dist.plan"):
        BaggingClassifier(**bag).fit(cols_df)
    assert "GPU memory unknown (set spark.sparkml_dist.gpu.memory" in caplog.text
    spark.conf.set("spark.sparkml_dist.gpu.memory", "3g")
    try:
        with pytest.raises(InsufficientResourcesError, match=r"slots.*1 member\(s\) of 2.0 GiB.*local\[1\]"):
            BaggingClassifier(gpuMemoryPerMember="2g", **bag).fit(cols_df)  # 2 slots, 1 fits the GPU
        with pytest.raises(InsufficientResourcesError, match=r"gpuMemoryPerMember.*3.00 GiB"):
            BaggingClassifier(gpuMemoryPerMember="4g", **bag).fit(cols_df)
        model = BaggingClassifier(gpuMemoryPerMember="1g", **bag).fit(cols_df)  # 3 fit: 2 at once
        assert [m.model.fitted_on_ for m in model.models] == ["cuda:3", "cuda:3"]
    finally:
        spark.conf.unset("spark.sparkml_dist.gpu.memory")


@masters("local", "connect")  # local masters deal the driver's GPUs (clusters: the e2e fake discovery test)
def test_search_candidates_fit_on_the_drivers_gpus(spark, monkeypatch):
    from sparkml_dist.search import ParallelSearchCV
    from tests.support.helpers import DeviceRecorder, on_gpu_one

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    X, y = make_classification(n_samples=60, n_features=3, n_informative=2, n_redundant=0, random_state=0)
    df = spark.createDataFrame(pd.DataFrame(X, columns=["a", "b", "c"]).assign(label=y.astype(float)))
    grid = {"alpha": [0.0, 1.0]}
    kw = dict(cv=2, scoring=on_gpu_one, progress=False, refit=False)
    on_gpu = ParallelSearchCV(DeviceRecorder(), grid, use_gpu=True, **kw)
    on_gpu.fit(df, featuresCols=["a", "b", "c"], labelCol="label")
    assert list(on_gpu.cv_results_["mean_test_score"]) == [1.0, 1.0]  # every fit on cuda:1
    on_cpu = ParallelSearchCV(DeviceRecorder(), grid, **kw).fit(
        df, featuresCols=["a", "b", "c"], labelCol="label"
    )
    assert list(on_cpu.cv_results_["mean_test_score"]) == [0.0, 0.0]
