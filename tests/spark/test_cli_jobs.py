"""The command line's jobs, run in-process on the pass's session (job files read and checked as
``sparkml-dist`` reads them); tests/e2e/test_cli.py runs the command itself for its argv and exit
codes."""

import argparse
import json
import os

import numpy as np
import pandas as pd
import yaml

from sparkml_dist.cli import jobs, predict
from sparkml_dist.cli.job_files import load_job
from tests.conftest import ROOT, masters


def _job(tmp_path, job):
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    return load_job(str(tmp_path / "job.yaml"))


def _predict(spark, **kw):
    args = dict(format="parquet", builder=None, input_cols=None, return_type="array<float>", batch_size=1024,
                overwrite=False, keep_vectors=False)  # fmt: skip
    return predict.run(spark, argparse.Namespace(**{**args, **kw}))


@masters("local")  # the jobs run Spark as any fit does: tested there on every master
def test_ensemble_job_from_csv_trains_evaluates_and_saves(spark, tmp_path):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 4))
    pdf = pd.DataFrame(X, columns=list("abcd"))
    pdf["y"] = (X[:, 0] + X[:, 1] > 0).astype(float)
    pdf.to_csv(tmp_path / "train.csv", index=False)
    job = {
        "input": {"path": str(tmp_path / "train.csv")},
        "task": "classification",
        "estimator": {"class": "sklearn.tree.DecisionTreeClassifier", "params": {"max_depth": 4}},
        "params": {"numModels": 3, "labelCol": "y"},
        "evaluate": {"test_fraction": 0.25},
        "output": {"model_path": str(tmp_path / "model")},
    }
    persisted = spark.sparkContext._jsc.sc().getPersistentRDDs  # what the session holds cached
    before = persisted().size()
    report = jobs.run_ensemble_job(spark, _job(tmp_path, job)[0])
    assert persisted().size() == before  # the scored test set was cached for its two metrics, then let go
    assert report["members"] == 3 and sum(report["group_rows"]) > 250
    assert report["metrics"]["accuracy"] > 0.85 and report["metrics"]["auc"] > 0.9
    assert (tmp_path / "model" / "metadata").is_dir()
    manifest = json.loads((tmp_path / "model" / "data" / "manifest.json").read_text())
    # the base estimator, then each member's record (item 0) and model (item 1), none a pickle
    assert sorted((o["group"], o["item"]) for o in manifest["objects"]) == [(-1, 0)] + [
        (g, i) for g in range(3) for i in (0, 1)
    ]
    assert "pickle" not in {o["format"] for o in manifest["objects"]}
    scored = _predict(
        spark, model=str(tmp_path / "model"), format="csv", input=str(tmp_path / "train.csv"),
        output=str(tmp_path / "scored"),
    )  # fmt: skip
    assert scored["kind"] == "BaggingClassificationModel" and scored["rows"] == 400
    out = pd.read_parquet(tmp_path / "scored")
    assert (out["prediction"] == out["y"]).mean() > 0.85  # the saved ensemble, scoring on Spark
    probability = np.stack(out["probability"].to_numpy())  # an array per row, not a vector struct
    assert probability.shape == (400, 2) and np.allclose(probability.sum(axis=1), 1.0)


@masters("local")  # the jobs run Spark as any fit does: tested there on every master
def test_demo_job(spark):
    report = jobs.demo(spark)
    assert report["members"] == 8 and report["metrics"]["auc"] > 0.95
    assert "trained 8 bagged decision trees" in report["what_happened"]  # what it did, what to try next
    assert report["try_next"][0].startswith(f"sparkml-dist predict --model {report['model_path']}")


@masters("local")  # the jobs run Spark as any fit does: tested there on every master
def test_search_job_on_bundled_data_matches_scikit_learn(spark, tmp_path):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import GridSearchCV
    from sklearn.tree import DecisionTreeClassifier

    from sparkml_dist import formats as model_formats

    job = yaml.safe_load(open(os.path.join(ROOT, "conf", "search_example.yaml")))
    job["estimator"] = {"class": "sklearn.tree.DecisionTreeClassifier", "params": {"random_state": 0}}
    job["param_grid"] = {"max_depth": [4, 8, None], "min_samples_leaf": [1, 3]}
    job["output"] = {"results_csv": str(tmp_path / "results.csv"), "best_model": str(tmp_path / "best.skops")}
    report = jobs.run_search_job(spark, _job(tmp_path, job)[0])
    X, y = load_digits(return_X_y=True)
    ref = GridSearchCV(
        DecisionTreeClassifier(random_state=0), job["param_grid"], cv=3, scoring="accuracy"
    ).fit(X, y)
    assert report["candidates"] == 6 and report["fits"] == 18
    assert report["best_params"] == ref.best_params_ and report["best_score"] == ref.best_score_
    assert len(pd.read_csv(tmp_path / "results.csv")) == 6
    best = model_formats.decode(report["best_model_format"], (tmp_path / "best.skops").read_bytes())
    assert (best.predict(X) == ref.best_estimator_.predict(X)).all()


@masters("local")  # the jobs run Spark as any fit does: tested there on every master
def test_tune_job_runs_the_example_function_shipped_by_value(spark, tmp_path):
    import shutil

    # the job and its function in a folder the executors' Python workers do not have on their path
    shutil.copy(os.path.join(ROOT, "examples", "tune_digits.py"), tmp_path / "tune_digits.py")
    job = yaml.safe_load(open(os.path.join(ROOT, "conf", "tune_example.yaml")))
    job["function"] = "tune_digits:train"  # module:function beside the job (the example names a file)
    job["space"]["epochs"] = 3
    job.update(max_trials=4, sampler="random", early_stopping=None)
    job["output"] = {"trials_csv": str(tmp_path / "trials.csv")}
    from sparkml_dist.tune.job import run_tune_job

    report = run_tune_job(spark, *_job(tmp_path, job))
    assert report["trials"] == 4 and report["states"] == {"complete": 4}
    assert set(report["best_params"]) == {"lr", "hidden", "epochs"} and report["best_value"] < 2.3
    trials = pd.read_csv(tmp_path / "trials.csv", float_precision="round_trip")  # read back exactly
    assert (trials["steps"] == 3).all() and trials["value"].min() == report["best_value"]


@masters("local")  # the jobs run Spark as any fit does: tested there on every master
def test_predict_scores_a_file_with_a_saved_network_built_by_the_named_builder(spark, tmp_path):
    import torch

    from sparkml_dist.formats import networks as torch_models
    from tests.support.parallel_helpers import build_model

    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 16)).astype(np.float32)
    pd.DataFrame({"id": np.arange(300), "features": list(X)}).to_parquet(tmp_path / "rows.parquet")
    net = build_model(layers=2)
    torch_models.save(str(tmp_path / "net"), net, builder=build_model, builder_kwargs={"layers": 2})
    report = _predict(
        spark, model=str(tmp_path / "net"), builder="tests.support.parallel_helpers:build_model",
        input_cols="features", input=str(tmp_path / "rows.parquet"), output=str(tmp_path / "scored"),
    )  # fmt: skip
    assert report["kind"] == "network" and report["rows"] == 300
    out = pd.read_parquet(tmp_path / "scored").sort_values("id")
    with torch.no_grad():
        want = net.eval()(torch.from_numpy(X)).numpy()
    np.testing.assert_allclose(np.stack(out["prediction"].to_numpy()), want, rtol=1e-6, atol=1e-6)


@masters("local")  # the jobs run Spark as any fit does: tested there on every master
def test_ensemble_with_your_own_function_per_group_writes_the_members_table(spark, tmp_path):
    rng = np.random.default_rng(1)
    pdf = pd.DataFrame({"store": rng.choice(["north", "south", "east"], 300), "x": rng.normal(size=300)})
    pdf["label"] = (pdf["x"] > 0).astype(int)
    pdf.to_csv(tmp_path / "sales.csv", index=False)
    (tmp_path / "mymodels.py").write_text(
        "from sklearn.linear_model import LogisticRegression\n\n"
        "def fit(data, key):\n"
        "    model = LogisticRegression().fit(data[['x']], data['label'])\n"
        "    return model, {'acc': model.score(data[['x']], data['label'])}\n"
    )
    job = {
        "input": {"path": str(tmp_path / "sales.csv")},
        "params": {"group_col": "store"},
        "output": {"members_table": "out/members"},  # under the job file's folder
    }
    from sparkml_dist.cli.per_group_job import run_per_group_job

    report = run_per_group_job(spark, *_job(tmp_path, job)[:1], "mymodels:fit", str(tmp_path))
    assert report["groups"] == 3 and sum(report["rows"].values()) == 300 and not report["skipped"]
    assert all(m["acc"] > 0.9 for m in report["metrics"].values())
    table = pd.read_parquet(tmp_path / "out" / "members")
    assert sorted(table["group"]) == ["east", "north", "south"] and set(table["format"]) == {
        "estimator_state"
    }
