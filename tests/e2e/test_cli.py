"""The sparkml-dist command itself, as a user runs it: the README's example job as written, and the
argv and exit codes of every command (a user's mistake: one line, exit 2, before Spark starts).
The jobs' own behaviour is tested in-process: tests/spark/test_cli_jobs.py."""

import json
import os
import subprocess
import sys
import time

import pytest
import yaml

from tests.conftest import ROOT, masters


def _cli(*args, timeout=400):
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    return subprocess.run(
        [sys.executable, "-m", "sparkml_dist", *args], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


@masters("local")
def test_the_readme_example_job_runs_as_written(tmp_path):
    proc = _cli("ensemble", "--conf", "conf/ensemble_example.yaml", "--master", "local[2]")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert report["members"] == 8 and report["metrics"]["accuracy"] > 0.8
    assert os.path.isdir(os.path.join(ROOT, "conf", "out", "ensemble_model", "metadata"))


def _job(tmp_path, name, job):
    (tmp_path / name).write_text(yaml.safe_dump(job) if not isinstance(job, str) else job)
    return str(tmp_path / name)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["ensemble", "--conf", "{missing}"], "cannot read the job file"),
        (["search", "--conf", "{list}"], "top level must be a mapping.*got list"),
        (["tune", "--conf", "{broken}"], r"not valid YAML \(line 2\)"),
        (["ensemble", "--conf", "{no_input}"], r"input.path .*nothing.csv does not exist"),
        (["predict", "--model", "{missing}", "--input", "x", "--output", "y"], "--model .* does not exist"),
        (["run", "--np", "2", "{missing}"], "the script .* does not exist"),
    ],
    ids=["ensemble", "search", "tune", "input", "predict", "run"],
)
def test_a_users_mistake_is_one_line_and_exit_2_before_spark_starts(tmp_path, argv, message):
    import re

    files = {
        "missing": str(tmp_path / "missing.yaml"),
        "list": _job(tmp_path, "list.yaml", ["input", "params"]),
        "broken": _job(tmp_path, "broken.yaml", "input: {path: a\nparams: [\n"),
        "no_input": _job(
            tmp_path, "j.yaml", {"input": {"path": "nothing.csv"}, "output": {"model_path": "out"}}
        ),
    }
    start = time.monotonic()
    proc = _cli(*[a.format(**files) for a in argv], timeout=60)
    assert proc.returncode == 2 and time.monotonic() - start < 30  # no JVM was started
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2 and re.search(message, lines[0]) and "Traceback" not in proc.stderr
    assert lines[0].startswith(f"sparkml-dist {argv[0]}: error: ")
    assert not (tmp_path / "out").exists()  # no output folder made for a job that never ran
    debug = _cli("--log-level", "debug", *[a.format(**files) for a in argv], timeout=60)
    assert debug.returncode != 0 and "Traceback" in debug.stderr  # the whole story when asked


def test_version_and_help_say_what_the_command_is():
    version = _cli("--version", timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("sparkml_dist ")
    helped = _cli("--help", timeout=60)
    assert helped.returncode == 0 and "[driver]" not in helped.stdout and "``" not in helped.stdout
    assert "{demo,ensemble,search,run,tune,predict}" in helped.stdout


def test_every_barrier_runner_argument_is_a_flag_of_run():
    """The command line takes what the API takes: a BarrierRunner keyword with no flag fails
    here (spark= is the command's --master, log_sink= its console)."""
    import inspect

    from sparkml_dist.cli import _parser, run_command
    from sparkml_dist.runner import BarrierRunner

    keywords = set(inspect.signature(BarrierRunner.__init__).parameters) - {"self", "np"}
    flagged = {f.keyword for f in run_command.FLAGS}
    assert keywords - flagged == set(run_command.NOT_FLAGS), keywords - flagged
    assert flagged <= keywords  # no flag for a keyword that is gone
    argv = ["run", "--np", "2", "--max-restarts", "1", "--min-np", "1", "--checkpoint-dir", "/c",
            "--gpus-per-rank", "1", "--timeout", "none", "--collective-timeout", "30", "--no-read-files",
            "--staging-dir", "false", "--mlflow", "off", "--env", "A=1", "--comm", "accumulate=2",
            "--log-dir", "/l", "--work-dir", "/w", "--clean-work-dir", "--model-bytes", "1024",
            "t.py"]  # fmt: skip
    options = run_command.runner_options(_parser().parse_args(argv))
    assert options["max_restarts"] == 1 and options["min_np"] == 1 and options["checkpoint_dir"] == "/c"
    assert (
        options["timeout"] is None
        and options["collective_timeout"] == 30.0
        and options["read_files"] is False
    )
    assert options["staging_dir"] is False and options["mlflow"] is False and options["env"] == {"A": "1"}
    assert (
        options["comm"] == {"accumulate": 2} and options["clean_work_dir"] and options["model_bytes"] == 1024
    )
    assert BarrierRunner(2, spark=object(), **options).min_np == 1  # every value is one the runner takes
    argv = ["run", "--np", "2", "--backend", "tensorflow", "--roles", "ps=2", "--roles", "chief=1", "t.py"]
    options = run_command.runner_options(_parser().parse_args(argv))
    assert options["roles"] == {"ps": 2, "chief": 1}
    assert BarrierRunner(2, spark=object(), **options).world_size == 5  # the chief, 2 workers, 2 servers
    table = open(os.path.join(ROOT, "docs", "cli.md")).read()
    assert all(f"| `{f.flag}" in table for f in run_command.FLAGS + run_command.DATA_FLAGS)  # one table
