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
import json
import logging
import os
import sys
from typing import Optional, Sequence

from sparkml_dist.cli import predict as cli_predict
from sparkml_dist.cli import run_command

log = logging.getLogger("sparkml_dist.cli")

_HERE = os.path.dirname(os.path.abspath(__file__))
_DEFAULT_CONF = os.path.join(os.path.dirname(os.path.dirname(_HERE)), "conf", "spark-local.yaml")


def _parser() -> argparse.ArgumentParser:
    from sparkml_dist import __version__

    parser = argparse.ArgumentParser(
        prog="sparkml-dist",
        description="Distributed training on Spark: ensembles, per-group models, searches, tuning, "
        "barrier-mode training scripts and scoring, from the command line.",
        epilog="Guide: docs/cli.md; every user error ends in one line (the traceback: --log-level debug).",
    )
    parser.add_argument("--version", action="version", version=f"sparkml_dist {__version__}")
    parser.add_argument("--log-level", default="WARNING", help="WARNING (default), INFO or DEBUG")
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
            run_command.add_arguments(p)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command line: a user's mistake ends in one line on stderr (exit 2), a failed job in its
    error's first paragraph (exit 1); ``--log-level debug`` shows the whole traceback."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    from sparkml_dist.errors import ConfigurationError, SparkMLDistError

    try:
        return _command(args)
    except KeyboardInterrupt:
        print("sparkml-dist: interrupted", file=sys.stderr)
        return 130
    except (ConfigurationError, SparkMLDistError) as exc:
        if log.isEnabledFor(logging.DEBUG):
            raise
        first = str(exc).strip().split("\n\n")[0]
        print(f"sparkml-dist {args.command}: error: {first}", file=sys.stderr)
        print("(the whole traceback: sparkml-dist --log-level debug ...)", file=sys.stderr)
        return 2 if isinstance(exc, ConfigurationError) else 1


def _command(args) -> int:
    from sparkml_dist.cli import job_files

    job = base = None
    if args.command in ("ensemble", "search", "tune"):  # checked before any Spark session starts
        job, base = job_files.load_job(args.conf)
    elif args.command == "predict":
        cli_predict.check_arguments(args)
    elif args.command == "run" and not os.path.isfile(args.script):
        from sparkml_dist.errors import ConfigurationError

        raise ConfigurationError(f"the script {args.script} does not exist")
    fresh = job_files.new_paths(job or {})
    try:
        return _with_session(args, job, base)
    except BaseException:
        job_files.remove_new(fresh)  # a failed job leaves no empty or half-written output behind
        raise


def _with_session(args, job: Optional[dict], base: Optional[str]) -> int:
    from sparkml_dist.runner.launchers import local_processes
    from sparkml_dist.session import get_session

    if args.command == "run" and args.np != "auto" and local_processes(args.np):  # no Spark session
        return run_command.run(None, args)
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
        if args.command == "run":
            return run_command.run(spark, args)
        print(json.dumps(_report(spark, args, job, base), indent=2, default=str))
    finally:
        spark.stop()
    return 0


def _report(spark, args, job: Optional[dict], base: Optional[str]) -> dict:
    from sparkml_dist.cli import jobs

    if args.command == "demo":
        return jobs.demo(spark)
    if args.command == "predict":
        return cli_predict.run(spark, args)
    if args.command == "tune":
        from sparkml_dist.tune.job import run_tune_job

        return run_tune_job(spark, job, base)
    if getattr(args, "function", None):  # ensemble --function: your own fn per group
        from sparkml_dist.cli.per_group_job import run_per_group_job

        return run_per_group_job(spark, job, args.function, base)
    return (jobs.run_search_job if args.command == "search" else jobs.run_ensemble_job)(spark, job)


if __name__ == "__main__":
    sys.exit(main())
