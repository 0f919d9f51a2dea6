"""``sparkml-dist`` / ``python -m sparkml_dist``: command-line entry points.  [driver]

    sparkml-dist demo [--master local[*]]                 train and evaluate on a bundled dataset
    sparkml-dist ensemble --conf conf/ensemble_example.yaml [--master ...] [--function mod:fn]
    sparkml-dist run --np 2 train.py -- --epochs 3        a training script on 2 ranks (torchrun for Spark)
    sparkml-dist search --conf conf/search_example.yaml   a parameter search, every fit on Spark
    sparkml-dist tune --conf conf/tune_example.yaml       tune any training function (job file:
                                                          :mod:`sparkml_dist.tune.job`)
    sparkml-dist predict --model DIR --input PATH --output PATH   score rows (:mod:`.cli_predict`)

Under ``spark-submit`` pass this file (its imports are absolute) and omit ``--master``, so the
session spark-submit configured is used::

    spark-submit --master yarn "$(python -c 'import sparkml_dist.cli as c; print(c.__file__)')" \
        ensemble --conf job.yaml

Job file (YAML)::

    input: {path: data.parquet, format: parquet}       # csv: header and schema inferred
    task: classification                               # or regression
    estimator: {class: sklearn.tree.DecisionTreeClassifier, params: {max_depth: 8}}
    params: {numModels: 8, sampling: bootstrap, sampleRatio: 0.5, labelCol: label}
    # featuresCols defaults to every numeric column but the label and weight columns
    evaluate: {test_fraction: 0.2, seed: 0}            # optional hold-out metrics
    output: {model_path: out/model, overwrite: true}   # relative: under the job file's folder

Search job file (YAML)::

    input: {dataset: digits}       # a bundled scikit-learn dataset, or {path: ..., format: ...}
    labelCol: label                # featuresCols defaults to every numeric column but the label
    estimator: {class: sklearn.ensemble.RandomForestClassifier, params: {random_state: 0}}
    param_grid: {n_estimators: [50, 100], max_depth: [4, 8, null]}  # or param_distributions + n_iter
    cv: 3
    scoring: accuracy
    max_concurrent: null           # null: as many fits as slots and memory allow
    output: {results_csv: out/cv_results.csv, best_model: out/best.skops}
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
import tempfile
from typing import Optional, Sequence

from sparkml_dist import cli_predict, per_group_job

log = logging.getLogger("sparkml_dist.cli")

_DEFAULT_CONF = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf", "spark-local.yaml"
)


def _estimator(spec: Optional[dict]):
    if not spec:
        return None
    module, _, name = spec["class"].rpartition(".")
    if not module:
        raise SystemExit(
            f"estimator.class must be a dotted path such as "
            f"sklearn.tree.DecisionTreeClassifier, got {spec['class']!r}"
        )
    return getattr(importlib.import_module(module), name)(**(spec.get("params") or {}))


def run_ensemble_job(spark, job: dict) -> dict:
    """Train (and optionally evaluate and save) a bagging ensemble described by ``job``."""
    from pyspark.sql import types as T

    from sparkml_dist.ensemble import BaggingClassifier, BaggingRegressor

    task = job.get("task", "classification")
    if task not in ("classification", "regression"):
        raise SystemExit(f"task must be classification or regression, got {task!r}")
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
            raise SystemExit(f"input.dataset must be one of {_BUNDLED}, got {name!r}")
        from sklearn import datasets

        frame = getattr(datasets, f"load_{name}")(as_frame=True).frame
        frame = frame.rename(columns=lambda c: str(c).replace(" ", "_").replace("(", "").replace(")", ""))
        frame = frame.rename(columns={"target": label})
        return spark.createDataFrame(frame)
    return cli_predict.read_input(spark, spec)


def run_search_job(spark, job: dict) -> dict:
    """Run a ParallelSearchCV described by ``job``; report the best candidate and save results."""
    from pyspark.sql import types as T

    from sparkml_dist import model_formats
    from sparkml_dist.job_files import write_new
    from sparkml_dist.search import ParallelSearchCV

    label = job.get("labelCol", "label")
    df = _search_input(spark, job["input"], label)
    feats = job.get("featuresCols") or [
        f.name for f in df.schema.fields if isinstance(f.dataType, T.NumericType) and f.name != label
    ]
    if ("param_grid" in job) == ("param_distributions" in job):
        raise SystemExit("give exactly one of param_grid or param_distributions")
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
    scored = scored.cache()
    metrics = {
        "accuracy": MulticlassClassificationEvaluator(labelCol=label, metricName="accuracy").evaluate(scored)
    }
    if n_classes == 2:
        metrics["auc"] = BinaryClassificationEvaluator(labelCol=label).evaluate(scored)
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
    return run_ensemble_job(spark, job)


def _run_script(spark, args) -> int:
    from sparkml_dist.runner import BarrierRunner
    from sparkml_dist.runner.script import bundle, run_script

    with open(args.script) as fh:
        source = fh.read()
    files = bundle(
        args.script, *[[p for p in (v or "").split(",") if p] for v in (args.py_files, args.archives)]
    )
    script_args = args.script_args[1:] if args.script_args[:1] == ["--"] else args.script_args
    runner = BarrierRunner(
        args.np,
        backend=args.backend,
        log_ranks=args.log_ranks,
        start_timeout=args.start_timeout,
        timeout=args.timeout,
        use_gpu=args.use_gpu,
        spark=spark,
    )
    runner.run(run_script, source, os.path.abspath(args.script), script_args, files)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sparkml-dist", description=__doc__.split("\n")[0])
    parser.add_argument("--log-level", default="WARNING")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_ in (
        ("demo", "train and evaluate a bagged ensemble on a bundled dataset"),
        ("ensemble", "train a bagged ensemble from a job file"),
        ("search", "a parameter search from a job file, every fit on Spark"),
        ("run", "run a torch.distributed training script on barrier tasks"),
        ("tune", "tune any training function (module:function) from a job file, trials on Spark"),
        ("predict", "score a Parquet/CSV file with a saved model or network, written as Parquet"),
    ):
        p = sub.add_parser(name, help=help_)
        p.add_argument(
            "--master",
            default=None,
            help="local[*], local-cluster[...], connect:local[2], sc://host:port; omit under spark-submit",
        )
        p.add_argument("--spark-conf", default=None, help="YAML file of Spark settings")
        if name in ("ensemble", "search", "tune"):
            p.add_argument("--conf", required=True, help="YAML job file")
        if name == "ensemble":
            p.add_argument("--function", help="your own fn(data, key) per group (module:function)")
        if name == "predict":
            cli_predict.add_arguments(p)
        if name == "run":
            p.add_argument(
                "--np",
                type=int,
                required=True,
                help="ranks: > 0 Spark barrier tasks, < 0 local processes (no Spark)",
            )
            p.add_argument(
                "--backend",
                choices=("torch", "horovod"),
                default="torch",
                help="torch: a torchrun-style script; horovod: a horovodrun-style script",
            )
            p.add_argument("--log-ranks", default="all", help="'all', 'none' or a comma list of ranks")
            p.add_argument("--start-timeout", type=float, default=180.0)
            p.add_argument("--timeout", type=float, default=None)
            p.add_argument("--use-gpu", action="store_true")
            p.add_argument(
                "--py-files", default=None, help=".py/.zip/.egg/.whl files for sys.path (comma list)"
            )
            p.add_argument(
                "--archives",
                default=None,
                help="archives unpacked in each rank's directory (file#name, comma list)",
            )
            p.add_argument("script", help="the training script (read here, shipped to the ranks)")
            p.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script, after --")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")

    from sparkml_dist.session import get_session

    if args.command == "run" and args.np < 0:  # local processes: no Spark session at all
        return _run_script(None, args)
    conf_file = args.spark_conf
    if (
        conf_file is None
        and args.master
        and args.master.startswith(("local", "connect:local"))
        and os.path.exists(_DEFAULT_CONF)
    ):
        conf_file = _DEFAULT_CONF
    spark = get_session(args.master, conf_file=conf_file)
    try:
        if args.command == "demo":
            report = demo(spark)
        elif args.command == "run":
            return _run_script(spark, args)
        elif args.command == "predict":
            report = cli_predict.run(spark, args)
        else:
            import yaml

            from sparkml_dist.job_files import resolve_paths

            base = os.path.dirname(os.path.abspath(args.conf))
            with open(args.conf) as fh:
                job = resolve_paths(yaml.safe_load(fh), base)
            if args.command == "tune":
                from sparkml_dist.tune.job import run_tune_job

                report = run_tune_job(spark, job, base)
            elif getattr(args, "function", None):  # ensemble --function: your own fn per group
                report = per_group_job.run_per_group_job(spark, job, args.function, base)
            else:
                report = (run_search_job if args.command == "search" else run_ensemble_job)(spark, job)
        print(json.dumps(report, indent=2, default=str))
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
