"""``sparkml-dist run``: a training script on the ranks, every ``BarrierRunner`` argument a flag.  [driver]

One table (:data:`FLAGS`) makes the flags and the keywords they become, so the command line takes
what the API takes (``tests/e2e/test_cli.py`` fails when a ``BarrierRunner`` argument has no flag;
``spark=`` is the command's session, ``--master``, and ``log_sink=`` its console). ``--input`` feeds
the ranks as ``run_with_data`` does: a Parquet path or a table name, read on the driver, each
rank's rows as ``sparkml_dist.runner.shard()`` in the script; ``--replicas`` and ``--streams`` are
``run_with_data``'s.

Example::

    sparkml-dist run --np 4 --max-restarts 2 --checkpoint-dir /dbfs/ckpt/run1 \\
        --input /data/train.parquet train.py -- --epochs 3
"""

from __future__ import annotations

import argparse
import os
from typing import Any, NamedTuple, Optional


def _seconds(text: str) -> Optional[float]:
    """A timeout flag's value: seconds (finite, positive, at most ``arg_checks.MAX_SECONDS``) or
    none; argparse names the flag in its refusal."""
    from ..arg_checks import MAX_SECONDS

    if text.strip().lower() in ("none", "null", ""):
        return None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= MAX_SECONDS:  # nan and inf fail too
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of seconds between 0 and {MAX_SECONDS:g}; write none for no limit"
        )
    return value


def _staging(text: str):
    return False if text.strip().lower() in ("false", "no", "off") else text


def _mlflow(text: str) -> Optional[bool]:
    return {"auto": None, "on": True, "true": True, "off": False, "false": False}[text.strip().lower()]


class Flag(NamedTuple):
    flag: str
    keyword: str
    kind: Any  # a type, "flag" (store_true), "optional" (--x / --no-x) or "pairs" (NAME=VALUE, repeated)
    default: Any
    help: str


FLAGS = (
    Flag("--backend", "backend", str, "torch", ""),  # its choices and help: the backends' registry
    Flag("--use-gpu", "use_gpu", "flag", False, "one GPU per rank, NCCL"),
    Flag("--gpus-per-rank", "gpus_per_rank", int, 1, "GPUs each rank holds (with --use-gpu)"),
    Flag("--nodes", "nodes", str, "host", "what LOCAL_RANK counts: host (torchrun's rule) or task"),
    Flag("--env", "env", "pairs", None, "NAME=VALUE: a variable for every rank (repeat it)"),
    Flag("--comm", "comm", "pairs", None, "NAME=VALUE: a communication setting (bucket_cap_mb=100, "
         "accumulate=4, compression=fp16|powersgd, ...; repeat it)"),
    Flag("--log-ranks", "log_ranks", str, "all", "whose output streams: all, none, or a comma list"),
    Flag("--log-dir", "log_dir", str, None, "every rank's whole output, one file per rank and attempt"),
    Flag("--mlflow", "mlflow", _mlflow, "auto", "log the run to MLflow: auto (a run is active), on, off"),
    Flag("--start-timeout", "start_timeout", _seconds, 180.0, "seconds to reach the rendezvous"),
    Flag("--data-timeout", "data_timeout", _seconds, 300.0, "seconds a shard may stop arriving"),
    Flag("--timeout", "timeout", _seconds, None, "seconds for the whole run, restarts included"),
    Flag("--collective-timeout", "collective_timeout", _seconds, None, "seconds a collective may block"),
    Flag("--allow-unencrypted", "allow_unencrypted", "flag", False, "run on an encrypted cluster anyway"),
    Flag("--allow-unauthenticated", "allow_unauthenticated", "flag", False,
         "run on a cluster with spark.authenticate anyway"),
    Flag("--max-restarts", "max_restarts", int, 0, "start again after a failure, up to this many times"),
    Flag("--min-np", "min_np", int, None, "elastic restarts: the fewest ranks a restart may run with"),
    Flag("--checkpoint-dir", "checkpoint_dir", str, None, "where checkpoint.save/load write and read"),
    Flag("--model-bytes", "model_bytes", int, None, "bytes one rank's model needs (refused if none fits)"),
    Flag("--read-files", "read_files", "optional", True, "--no-read-files: deal the rows through Spark"),
    Flag("--staging-dir", "staging_dir", _staging, None, "where a computed --input is written once "
         "(false: never)"),
    Flag("--work-dir", "work_dir", str, None, "the directory every rank runs in"),
    Flag("--clean-work-dir", "clean_work_dir", "flag", False, "remove the default work dir after a success"),
    Flag("--warm-ranks", "warm_ranks", "optional", True, "--no-warm-ranks: every rank a new interpreter"),
    Flag("--roles", "roles", "pairs", None, "ROLE=COUNT with --backend tensorflow: parameter servers (and "
         "the chief) beside the --np workers, the script on the chief (ps=2; repeat it)"),
    Flag("--executor-loss", "executor_loss", str, "restart", "what a lost executor costs: restart (every "
         "rank, from the checkpoint) or replace (only its ranks, inside elastic.run)"),
    Flag("--resize-wait", "resize_wait", float, 30.0, "with --executor-loss replace and --min-np: "
         "seconds the others wait for a lost executor's ranks before going on without them"),
)  # fmt: skip
NOT_FLAGS = {"spark": "--master (the command's session)", "log_sink": "the console"}
DATA_FLAGS = (
    Flag("--input", "input", str, None, "a Parquet path or a table: each rank's rows as shard()"),
    Flag(
        "--replicas", "replicas", int, None, "run_with_data(replicas=): ranks of a replica read the same rows"
    ),
    Flag("--streams", "streams", int, None, "run_with_data(streams=): the same order on any world size"),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``sparkml-dist run``."""
    from ..runner.backends import BACKENDS

    p.add_argument(
        "--np",
        type=lambda v: v if v == "auto" else int(v),
        required=True,
        help="ranks: > 0 Spark barrier tasks, < 0 local processes (no Spark), auto: every GPU "
        "(--use-gpu) or task slot",
    )
    for f in FLAGS + DATA_FLAGS:
        if f.kind == "flag":
            p.add_argument(f.flag, dest=f.keyword, action="store_true", help=f.help)
        elif f.kind == "optional":
            p.add_argument(f.flag, dest=f.keyword, action=argparse.BooleanOptionalAction, default=f.default,
                           help=f.help)  # fmt: skip
        elif f.kind == "pairs":
            p.add_argument(
                f.flag, dest=f.keyword, action="append", default=[], metavar="NAME=VALUE", help=f.help
            )
        elif f.keyword == "backend":
            summary = "; ".join(f"{name}: {b.summary}" for name, b in BACKENDS.items())
            p.add_argument(f.flag, dest=f.keyword, choices=tuple(BACKENDS), default=f.default, help=summary)
        else:
            choices = ("host", "task") if f.keyword == "nodes" else None
            p.add_argument(
                f.flag, dest=f.keyword, type=f.kind, default=f.default, choices=choices, help=f.help
            )
    p.add_argument("--py-files", default=None, help=".py/.zip/.egg/.whl files for sys.path (comma list)")
    p.add_argument(
        "--archives", default=None, help="archives unpacked in each rank's directory (file#name, comma list)"
    )
    p.add_argument("script", help="the training script (read here, shipped to the ranks)")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script, after --")


def runner_options(args) -> dict:
    """``BarrierRunner``'s keywords from the parsed flags."""

    out = {}
    for f in FLAGS:
        value = getattr(args, f.keyword)
        if f.kind == "pairs":
            value = _pairs(f.flag, value, _setting if f.keyword in ("comm", "roles") else str) or None
        out[f.keyword] = value
    return out


def run(spark, args) -> int:
    """Run the script on ``--np`` ranks (with ``--input``: each rank's rows as ``shard()``)."""
    from ..errors import ConfigurationError
    from ..runner import BarrierRunner
    from ..runner.script import bundle, run_script

    with open(args.script) as fh:
        source = fh.read()
    files = bundle(
        args.script, *[[p for p in (v or "").split(",") if p] for v in (args.py_files, args.archives)]
    )
    script_args = args.script_args[1:] if args.script_args[:1] == ["--"] else args.script_args
    runner = BarrierRunner(args.np, spark=spark, **runner_options(args))
    call = (source, os.path.abspath(args.script), script_args, files)
    if not args.input:
        if args.replicas or args.streams:
            raise ConfigurationError("--replicas and --streams shape --input's rows: give --input too")
        runner.run(run_script, *call)
    else:
        if spark is None:
            raise ConfigurationError("--input is read by Spark: run on Spark tasks (--np > 0, --master ...)")
        df = _input(spark, args.input)
        runner.run_with_data(df, run_script, *call, replicas=args.replicas, streams=args.streams)
    _print_times()
    return 0


def _print_times() -> None:
    """Where each rank's time went (``sparkml_dist.runner.last_run()``), as a table, and the advice."""
    from ..runner import last_run

    report = last_run()
    if report is not None:
        print(f"where the time went (seconds, totals per rank):\n{report.table()}{report.advice}", flush=True)


def _input(spark, where: str):
    """``--input``: a Parquet path (a directory or file, or any URI), else a table's name; one that
    Spark cannot find is a one-line error naming the flag."""
    from pyspark.errors import AnalysisException

    from ..errors import ConfigurationError

    path = "/" in where or "://" in where or os.path.exists(where) or where.endswith(".parquet")
    try:
        return spark.read.parquet(where) if path else spark.table(where)
    except AnalysisException as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        what = "a Parquet path" if path else "a table name (a path needs a / in it)"
        raise ConfigurationError(f"--input {where!r}, read as {what}, cannot be read: {reason}") from None


def _pairs(flag: str, items, value) -> dict:
    """``NAME=VALUE`` arguments of a repeated ``flag`` as a dict, each value read by ``value``."""
    out = {}
    for item in items or []:
        name, sep, text = item.partition("=")
        if not sep or not name:
            from ..errors import ConfigurationError

            raise ConfigurationError(f"{flag} {item!r}: write it as NAME=VALUE")
        out[name] = value(text)
    return out


def _setting(text: str):
    """A ``--comm`` value: a number, true/false, none, or the text itself (``fp16``)."""
    import json

    lowered = text.strip().lower()
    if lowered in ("none", "null"):
        return None
    try:
        return json.loads(lowered)  # 100, 2.5, true, false
    except ValueError:
        return text
