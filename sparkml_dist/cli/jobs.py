"""What the ``ensemble``, ``search`` and ``demo`` commands run: a bagging or search job.  [driver]

:func:`run_ensemble_job` and :func:`run_search_job` take a checked job file
(:func:`sparkml_dist.cli.job_files.load_job`) and a SparkSession; :func:`demo` writes the bundled
breast-cancer data to Parquet and runs an ensemble job on it.  Each returns the report the command
prints (JSON).
"""

from __future__ import annotations

import importlib
import os
import tempfile
from typing import Optional

from ..errors import ConfigurationError
from . import predict as cli_predict


def _estimator(spec: Optional[dict]):
    if not spec:
        return None
    module, _, name = spec["class"].rpartition(".")
    if not module:
        raise ConfigurationError(
            f"estimator.class must be a dotted path such as "
            f"sklearn.tree.DecisionTreeClassifier, got {spec['class']!r}"
        )
    return getattr(importlib.import_module(module), name)(**(spec.get("params") or {}))


def run_ensemble_job(spark, job: dict) -> dict:
    """Train (and optionally evaluate and save) a bagging ensemble described by ``job``."""
    from pyspark.sql import types as T

    from ..ensemble import BaggingClassifier, BaggingRegressor

    task = job.get("task", "classification")
    if task not in ("classification", "regression"):
        raise ConfigurationError(f"task must be classification or regression, got {task!r}")
    df = cli_predict.read_input(spark, job["input"])
    params = dict(job.get("params") or {})
    label = params.setdefault("labelCol", "label")
    if not params.get("featuresCols") and "featuresCol" not in params:
        skip = {label, params.get("weightCol")}
        params["featuresCols"] = [
            f.name for f in df.schema.fields if isinstance(f.dataType, T.NumericType) and f.name not in skip
        ]
    cls = BaggingClassifier if task == "classification" else BaggingRegressor
    est = cls(estimator=_estimator(job.get("estimator")), **params)
    ev = job.get("evaluate") or {}
    frac = float(ev.get("test_fraction", 0) or 0)
    train, test = df.randomSplit([1 - frac, frac], seed=int(ev.get("seed", 0))) if frac else (df, None)
    model = est.fit(train)
    report = {"task": task, "members": len(model.models), "group_rows": model.groupSizes}
    if test is not None:
        report["metrics"] = _evaluate(
            model.transform(test), task, label, len(getattr(model, "classes", ()) or ())
        )
    out = job.get("output") or {}
    if out.get("model_path"):
        writer = model.write()
        if out.get("overwrite", True):
            writer = writer.overwrite()
        writer.save(out["model_path"])
        report["model_path"] = out["model_path"]
    return report


_BUNDLED = ("iris", "digits", "wine", "breast_cancer", "diabetes")


def _search_input(spark, spec: dict, label: str):
    """The search's DataFrame: a bundled scikit-learn dataset or a table on disk."""
    if "dataset" in spec:
        name = spec["dataset"]
        if name not in _BUNDLED:
            raise ConfigurationError(f"input.dataset must be one of {_BUNDLED}, got {name!r}")
        from sklearn import datasets

        frame = getattr(datasets, f"load_{name}")(as_frame=True).frame
        frame = frame.rename(columns=lambda c: str(c).replace(" ", "_").replace("(", "").replace(")", ""))
        frame = frame.rename(columns={"target": label})
        return spark.createDataFrame(frame)
    return cli_predict.read_input(spark, spec)


def run_search_job(spark, job: dict) -> dict:
    """Run a ParallelSearchCV described by ``job``; report the best candidate and save results."""
    from pyspark.sql import types as T

    from .. import formats as model_formats
    from ..formats.files import write_new
    from ..search import ParallelSearchCV

    label = job.get("labelCol", "label")
    df = _search_input(spark, job["input"], label)
    feats = job.get("featuresCols") or [
        f.name for f in df.schema.fields if isinstance(f.dataType, T.NumericType) and f.name != label
    ]
    if ("param_grid" in job) == ("param_distributions" in job):
        raise ConfigurationError("give exactly one of param_grid or param_distributions")
    dists = job.get("param_distributions")
    search = ParallelSearchCV(
        _estimator(job["estimator"]),
        job.get("param_grid"),
        param_distributions=dists,
        n_iter=int(job.get("n_iter", 10)),
        scoring=job.get("scoring"),
        cv=job.get("cv"),
        random_state=job.get("random_state"),
        max_concurrent=job.get("max_concurrent"),
        return_train_score=bool(job.get("return_train_score", False)),
    )
    search.fit(df, featuresCols=feats, labelCol=label)
    import pandas as pd

    results = pd.DataFrame(search.cv_results_)
    report = {
        "candidates": len(results),
        "fits": len(results) * search.n_splits_,
        "best_params": search.best_params_,
        "best_score": float(search.best_score_),
        "top": results.sort_values("rank_test_score")
        .head(5)[["params", "mean_test_score", "std_test_score"]]
        .to_dict("records"),
    }
    out = job.get("output") or {}
    if out.get("results_csv"):
        write_new(out["results_csv"], results.to_csv(index=False).encode())
        report["results_csv"] = out["results_csv"]
    if out.get("best_model"):  # skops (or XGBoost's own format): loading it runs no code
        fmt, data = model_formats.encode(search.best_estimator_)
        write_new(out["best_model"], data)
        report["best_model"], report["best_model_format"] = out["best_model"], fmt
    return report


def _evaluate(scored, task: str, label: str, n_classes: int) -> dict:
    from pyspark.ml.evaluation import (
        BinaryClassificationEvaluator,
        MulticlassClassificationEvaluator,
        RegressionEvaluator,
    )

    if task == "regression":
        return {m: RegressionEvaluator(labelCol=label, metricName=m).evaluate(scored) for m in ("rmse", "r2")}
    scored = scored.cache()  # scored once for both metrics, then let go: a notebook may run many jobs
    try:
        accuracy = MulticlassClassificationEvaluator(labelCol=label, metricName="accuracy")
        metrics = {"accuracy": accuracy.evaluate(scored)}
        if n_classes == 2:
            metrics["auc"] = BinaryClassificationEvaluator(labelCol=label).evaluate(scored)
    finally:
        scored.unpersist()
    return metrics


def demo(spark) -> dict:
    """Breast-cancer data -> Parquet -> 8 bagged trees -> hold-out metrics -> saved model."""
    import pandas as pd
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer(as_frame=True)
    pdf = data.frame.rename(columns=lambda c: c.replace(" ", "_"))
    pdf["target"] = pdf["target"].astype(float)
    work = tempfile.mkdtemp(prefix="sparkml_dist_demo_")
    path = os.path.join(work, "breast_cancer.parquet")
    spark.createDataFrame(pd.DataFrame(pdf)).write.mode("overwrite").parquet(path)
    job = {
        "input": {"path": path},
        "task": "classification",
        "estimator": {"class": "sklearn.tree.DecisionTreeClassifier", "params": {"max_depth": 6}},
        "params": {
            "numModels": 8,
            "sampling": "bootstrap",
            "sampleRatio": 0.6,
            "featureRatio": 0.7,
            "labelCol": "target",
            "seed": 7,
        },
        "evaluate": {"test_fraction": 0.25, "seed": 1},
        "output": {"model_path": os.path.join(work, "model")},
    }
    report = run_ensemble_job(spark, job)
    acc, auc = (report.get("metrics", {}).get(k, float("nan")) for k in ("accuracy", "auc"))
    report["what_happened"] = (
        f"trained {report['members']} bagged decision trees on {sum(report['group_rows'])} rows of the "
        f"breast-cancer data (as Parquet in {work}), one tree per bootstrap group inside the executors; "
        f"held-out accuracy {acc:.3f}, AUC {auc:.3f}; "
        f"the model is saved in {report['model_path']}"
    )
    report["try_next"] = [
        f"sparkml-dist predict --model {report['model_path']} --input {path} --output scored.parquet",
        "sparkml-dist ensemble --conf conf/ensemble_example.yaml --master 'local[*]'  (your own job file)",
        "docs/install.md: the quickstart in Python; docs/ensembles.md: forests, your own estimators",
    ]
    return report
