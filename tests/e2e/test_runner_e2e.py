"""The runner as users start it: `sparkml-dist run`, and GPU pinning with a fake discovery script."""

import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT, only_local


def _py(*args, timeout=400):
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


@only_local
def test_cli_runs_an_unchanged_ddp_script_on_barrier_tasks():
    proc = _py(
        "-m",
        "sparkml_dist",
        "run",
        "--np",
        "2",
        "--master",
        "local[2]",
        "examples/ddp_train.py",
        "--",
        "--steps",
        "25",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[rank 0] final loss" in proc.stdout and "after 25 steps on 2 ranks" in proc.stdout


@only_local
def test_cli_runs_an_unchanged_horovodrun_script():
    proc = _py(
        "-m",
        "sparkml_dist",
        "run",
        "--backend",
        "horovod",
        "--np",
        "2",
        "--master",
        "local[2]",
        "examples/hvd_train.py",
        "--",
        "--steps",
        "15",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[rank 0] final loss" in proc.stdout and "after 15 steps on 2 ranks" in proc.stdout


@only_local
def test_a_script_that_imports_its_siblings_runs_unchanged(tmp_path):
    import io
    import shutil
    import tarfile

    folder = tmp_path / "ddp-tutorial-series"
    shutil.copytree(os.path.join(ROOT, "tests", "e2e", "ddp_tutorial"), folder)
    (tmp_path / "extra_lib.py").write_text("VALUE = 42\n")
    with tarfile.open(tmp_path / "vocab.tgz", "w:gz") as tf:
        info = tarfile.TarInfo("words.txt")
        info.size = 4
        tf.addfile(info, io.BytesIO(b"a b\n"))
    proc = _py(
        *("-m", "sparkml_dist", "run", "--np", "2", "--master", "local[2]"),
        *("--py-files", str(tmp_path / "extra_lib.py"), "--archives", f"{tmp_path / 'vocab.tgz'}#vocab"),
        *(str(folder / "multinode.py"), "--", "2", "--batch_size", "16"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        line = next(ln for ln in proc.stdout.splitlines() if f"rank {rank} trained 2 epochs" in ln)
        shipped, cwd = re.search(r"datautils from (\S+);.*cwd (\S+)", line).groups()
        assert shipped == os.path.join(cwd, "script-src")  # the rank's copy, not the driver's folder
        assert "vocab ['a', 'b']; extra 42" in line


@only_local
def test_cli_run_failure_exits_non_zero(tmp_path):
    script = tmp_path / "bad.py"
    script.write_text("import sys\nprint('about to fail')\nsys.exit(3)\n")
    proc = _py("-m", "sparkml_dist", "run", "--np", "-2", str(script))
    assert proc.returncode != 0
    assert "exited with code 3" in proc.stderr


@only_local
@pytest.mark.parametrize("mode", ["conf", "profile"])
def test_each_rank_is_pinned_to_the_gpu_spark_assigned(tmp_path, mode):
    script = tmp_path / "gpus.sh"
    script.write_text('#!/bin/sh\necho \'{"name": "gpu", "addresses": ["0", "1"]}\'\n')
    script.chmod(0o755)
    proc = _py("tests/e2e/gpu_assignment_job.py", str(script), mode)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.split("RESULT ", 1)[1].splitlines()[0])
    assert [r["rank"] for r in out] == [0, 1]
    assert sorted(r["cuda_visible"] for r in out) == ["0", "1"]  # one distinct GPU per rank
    assert all(r["device"] == "cuda:0" for r in out)
    if mode == "profile":  # four trials, two at once (the executor's two GPUs), one GPU each
        trials = json.loads(proc.stdout.split("TUNE ", 1)[1].splitlines()[0])
        assert [t["state"] for t in trials] == ["complete"] * 4
        assert all(t["gpus"] in ("0", "1") and t["device"] == f"cuda:{t['gpus']}" for t in trials)
        assert {t["gpus"] for t in trials} == {"0", "1"}


@only_local
def test_a_task_holding_two_gpus_runs_two_ranks(tmp_path):
    script = tmp_path / "gpus.sh"
    script.write_text('#!/bin/sh\necho \'{"name": "gpu", "addresses": ["0", "1"]}\'\n')
    script.chmod(0o755)
    proc = _py("tests/e2e/gpu_assignment_job.py", str(script), "multi")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.split("RESULT ", 1)[1].splitlines()[0])
    ranks, refusal = out[:4], out[4]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    # each task's two ranks split its two GPUs; each rank sees one, as cuda:0
    assert (
        sorted(r["cuda_visible"] for r in ranks[:2])
        == ["0", "1"]
        == sorted(r["cuda_visible"] for r in ranks[2:])
    )
    assert all(r["device"] == "cuda:0" for r in ranks)
    assert [r["local"] for r in ranks] == [[0, 4], [1, 4], [2, 4], [3, 4]]  # one host, four ranks on it
    values = sorted(v for r in ranks for v in r["values"])
    assert values == [float(i) for i in range(40)] and min(len(r["values"]) for r in ranks) >= 5
    assert "np=3 ranks cannot fill tasks of 2 GPUs" in refusal["np=3"]


@only_local
def test_cli_runs_the_pipeline_parallel_example_on_barrier_tasks():
    proc = _py(
        "-m",
        "sparkml_dist",
        "run",
        "--np",
        "2",
        "--master",
        "local[2]",
        "examples/pipeline_train.py",
        "--",
        "--steps",
        "40",
        "--schedule",
        "simple",
        "--balance",
        "memory",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[rank 0] pipeline: 16 layers in 2 stages on 2 rank(s)" in proc.stdout
    final, first = (
        float(v) for v in re.search(r"final loss ([\d.]+) \(first ([\d.]+)\)", proc.stdout).groups()
    )
    assert final < first / 2


@only_local
def test_cli_runs_the_fsdp2_example_on_local_ranks():
    proc = _py("-m", "sparkml_dist", "run", "--np", "-2", "examples/fsdp_train.py", "--", "--steps", "5")
    assert proc.returncode == 0, proc.stderr[-3000:]
    held, total = (int(v) for v in re.search(r"rank 0 holds (\d+) of (\d+) parameters", proc.stdout).groups())
    assert held < total and abs(2 * held - total) < total // 10  # about half of every tensor
