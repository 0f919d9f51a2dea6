"""MLflow tracking of every job type, read back through mlflow.search_runs; logged models load with
mlflow.pyfunc and predict the same numbers as transform."""

import numpy as np
import pandas as pd
import pytest

mlflow = pytest.importorskip("mlflow")  # the dev extra installs it; the package works without it

from sklearn.linear_model import LinearRegression  # noqa: E402
from sklearn.tree import DecisionTreeClassifier  # noqa: E402

from sparkml_dist import mlflow_flavor, tune  # noqa: E402
from sparkml_dist.ensemble import BaggingClassifier, GroupedTrainer  # noqa: E402
from sparkml_dist.runner import BarrierRunner  # noqa: E402
from sparkml_dist.search import ParallelSearchCV  # noqa: E402
from tests.conftest import IS_CONNECT, masters  # noqa: E402
from tests.support import tune_helpers as th  # noqa: E402

pytestmark = masters("local", "connect")


@pytest.fixture(scope="module")
def tracking(tmp_path_factory):
    """A SQLite tracking store and an experiment whose artifacts live in a temporary directory."""
    root = tmp_path_factory.mktemp("mlflow")
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{root}/mlflow.db")
    exp = mlflow.create_experiment("sparkml_dist-tests", artifact_location=str(root / "artifacts"))
    mlflow.set_experiment(experiment_id=exp)
    yield exp
    mlflow.set_tracking_uri(previous)


def runs(exp, name=None):
    found = mlflow.search_runs(experiment_ids=[exp])
    return found if name is None else found[found["tags.mlflow.runName"] == name]


@pytest.fixture(scope="module")
def data(spark):
    rng = np.random.default_rng(0)
    pdf = pd.DataFrame(rng.normal(size=(300, 3)), columns=["a", "b", "c"])
    pdf["label"] = (pdf.a + pdf.b > 0).astype(float)
    pdf["k"] = np.where(pdf.c > 0, "p", "n")
    return pdf, spark.createDataFrame(pdf)


def test_a_bagging_fit_in_an_active_run_logs_one_nested_run_and_a_pyfunc_model(tracking, data):
    pdf, df = data
    with mlflow.start_run(run_name="notebook") as outer:
        model = BaggingClassifier(featuresCols=["a", "b", "c"], numModels=3, seed=1).fit(df)
    found = runs(tracking, "BaggingClassifier")
    assert len(found) == 1
    row = found.iloc[0]
    assert row["tags.mlflow.parentRunId"] == outer.info.run_id
    assert row["params.numModels"] == "3" and row["metrics.models"] == 3.0
    assert row["metrics.group_rows_min"] == 100 and row["metrics.fit_seconds"] > 0
    loaded = mlflow.pyfunc.load_model(f"runs:/{row.run_id}/model")
    expected = np.array([r.prediction for r in model.transform(df).select("prediction").collect()])
    np.testing.assert_array_equal(loaded.predict(pdf[["a", "b", "c"]]), expected)
    again = mlflow_flavor.load_model(f"runs:/{row.run_id}/model")  # the pyspark.ml model
    np.testing.assert_array_equal(again.predict(pdf[["a", "b", "c"]]), expected)
    if not IS_CONNECT:  # MLflow's spark flavor: a PipelineModel holding the ensemble
        from mlflow import spark as mlflow_spark

        pipeline = mlflow_spark.load_model(f"runs:/{row.run_id}/model")
        scored = pipeline.transform(df).select("prediction").collect()
        np.testing.assert_array_equal([r.prediction for r in scored], expected)


def test_a_grouped_fit_logs_its_model_and_mlflow_false_logs_nothing(tracking, data):
    pdf, df = data
    kw = dict(estimator=LinearRegression(), groupCol="k", featuresCols=["a", "b"], labelCol="c")
    model = GroupedTrainer(**kw, mlflow=True).fit(df)
    found = runs(tracking, "GroupedTrainer")
    assert len(found) == 1 and found.iloc[0]["metrics.models"] == 2.0
    loaded = mlflow.pyfunc.load_model(f"runs:/{found.iloc[0].run_id}/model")
    expected = np.array([r.prediction for r in model.transform(df).select("prediction").collect()])
    np.testing.assert_allclose(loaded.predict(pdf[["a", "b", "k"]]), expected, rtol=1e-12)
    with mlflow.start_run(run_name="quiet"):
        GroupedTrainer(**kw, mlflow=False).fit(df)
    assert len(runs(tracking, "GroupedTrainer")) == 1


def test_a_search_logs_a_parent_and_a_child_per_candidate(tracking, data):
    pdf, _ = data
    X, y = pdf[["a", "b", "c"]].to_numpy(), pdf["label"].to_numpy()
    grid = {"max_depth": [1, 3, 5]}
    search = ParallelSearchCV(DecisionTreeClassifier(random_state=0), grid, cv=3, mlflow=True).fit(X, y)
    parent = runs(tracking, "ParallelSearchCV")
    assert len(parent) == 1
    assert parent.iloc[0]["metrics.best_score"] == pytest.approx(search.best_score_)
    assert parent.iloc[0]["params.best.max_depth"] == str(search.best_params_["max_depth"])
    children = runs(tracking)
    children = children[children["tags.mlflow.parentRunId"] == parent.iloc[0].run_id]
    assert sorted(children["params.max_depth"]) == ["1", "3", "5"]
    for _, child in children.iterrows():
        i = [str(p["max_depth"]) for p in search.cv_results_["params"]].index(child["params.max_depth"])
        assert child["metrics.mean_test_score"] == pytest.approx(search.cv_results_["mean_test_score"][i])


def test_a_tuning_logs_a_child_per_trial_with_its_learning_curve(spark, tracking):
    space = {"x": [0.3, 0.9], "steps": 4, "pause": 0.0}
    result = tune.Tuner(th.curve, space, metric="loss", sampler="grid", max_trials=2, mlflow=True).run()
    parent = runs(tracking, "Tuner")
    assert len(parent) == 1 and parent.iloc[0]["metrics.best_value"] == pytest.approx(result.best_value)
    assert parent.iloc[0]["params.best.x"] == "0.3"
    children = runs(tracking)
    children = children[children["tags.mlflow.parentRunId"] == parent.iloc[0].run_id]
    assert sorted(children["tags.mlflow.runName"]) == ["trial 0", "trial 1"]
    assert set(children["tags.sparkml_dist.state"]) == {"complete"}
    client = mlflow.tracking.MlflowClient()
    for _, child in children.iterrows():
        history = client.get_metric_history(child.run_id, "loss")
        assert sorted(m.step for m in history) == [0, 1, 2, 3]  # every report, at its step


def test_rank_zero_metrics_reach_the_runner_run(spark, tracking):
    assert BarrierRunner(2, mlflow=True, start_timeout=120).run(th.log_from_ranks) == 0
    found = runs(tracking, "BarrierRunner")
    found = found[found["params.function"] == "log_from_ranks"]
    assert len(found) == 1 and found.iloc[0]["params.np"] == "2"
    history = mlflow.tracking.MlflowClient().get_metric_history(found.iloc[0].run_id, "loss")
    assert sorted((m.step, m.value) for m in history) == [(0, 1.0), (1, 0.5), (2, pytest.approx(1 / 3))]
    assert found.iloc[0]["metrics.rank"] == 0.0  # rank 1's never arrived
    assert found.iloc[0]["metrics.attempts"] == 1.0


def test_each_ranks_step_times_are_metrics_of_the_runners_run(spark, tracking):
    from tests.support import timing_helpers

    assert BarrierRunner(2, mlflow=True, start_timeout=120).run(timing_helpers.marked_steps, 6) == 6
    found = runs(tracking, "BarrierRunner")
    found = found[found["params.function"] == "marked_steps"]
    assert len(found) == 1
    row = found.iloc[0]
    assert row["metrics.rank0_steps"] == 6.0 and row["metrics.rank1_steps"] == 6.0
    assert row["metrics.rank1_step_s"] >= 6 * 0.01 and "metrics.rank0_comm_s" in row


@masters("local")  # mlflow.pyspark.ml.autolog reads the SparkContext: classic Spark only
def test_autolog_records_our_estimator_params_in_its_own_run(tracking, data):
    _, df = data
    import mlflow.pyspark.ml

    mlflow.pyspark.ml.autolog(log_models=False, silent=True)
    try:
        BaggingClassifier(featuresCols=["a", "b"], numModels=2, sampling="bootstrap").fit(df)
    finally:
        mlflow.pyspark.ml.autolog(disable=True)
    auto = runs(tracking)
    auto = auto[auto["tags.mlflow.autologging"] == "pyspark.ml"]
    assert len(auto) == 1
    assert auto.iloc[0]["params.sampling"] == "bootstrap" and auto.iloc[0]["metrics.models"] == 2.0


def test_mlflow_calls_inside_a_rank_land_in_the_jobs_run(spark, tracking):
    """The tracking URI and the job's run id reach the ranks: a plain mlflow.log_metric in a rank
    logs into the BarrierRunner's run, with no glue in the function."""
    run_id = BarrierRunner(2, mlflow=True, start_timeout=120).run(th.mlflow_from_rank_zero)
    found = runs(tracking, "BarrierRunner")
    found = found[found.run_id == run_id]
    assert len(found) == 1 and found.iloc[0]["metrics.logged_by_mlflow_in_the_rank"] == 7.0
