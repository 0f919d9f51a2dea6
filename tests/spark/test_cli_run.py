"""`sparkml-dist run` in-process on the pass's session: unchanged torchrun / horovodrun scripts on
barrier tasks (the command's argv and exit codes: tests/e2e/test_cli.py and test_runner_e2e.py)."""

import argparse
import io
import os
import re
import shutil
import tarfile

from sparkml_dist.cli import _run_script
from tests.conftest import ROOT, masters


def _run(spark, script, *script_args, **kw):
    args = dict(np=2, backend="torch", log_ranks="all", start_timeout=180.0, timeout=None, use_gpu=False,
                py_files=None, archives=None)  # fmt: skip
    args.update(kw)
    return _run_script(spark, argparse.Namespace(script=script, script_args=["--", *script_args], **args))


@masters("local")
def test_an_unchanged_ddp_script_runs_on_barrier_tasks(spark, capsys):
    assert _run(spark, os.path.join(ROOT, "examples", "ddp_train.py"), "--steps", "25") == 0
    out = capsys.readouterr().out
    assert "[rank 0] final loss" in out and "after 25 steps on 2 ranks" in out


@masters("local")
def test_an_unchanged_horovodrun_script_runs(spark, capsys):
    assert (
        _run(spark, os.path.join(ROOT, "examples", "hvd_train.py"), "--steps", "15", backend="horovod") == 0
    )
    out = capsys.readouterr().out
    assert "[rank 0] final loss" in out and "after 15 steps on 2 ranks" in out


@masters("local")
def test_an_unchanged_multi_worker_strategy_script_runs(spark, capsys):
    script = os.path.join(ROOT, "examples", "tf_train.py")
    assert _run(spark, script, "--epochs", "3", backend="tensorflow", log_ranks="0") == 0
    out = capsys.readouterr().out
    final, first = (
        float(v) for v in re.search(r"final loss ([\d.]+) \(first ([\d.]+)\) on 2 workers", out).groups()
    )
    assert final < first


@masters("local")
def test_the_pipeline_parallel_example_runs_on_barrier_tasks(spark, capsys):
    script = os.path.join(ROOT, "examples", "pipeline_train.py")
    assert _run(spark, script, "--steps", "40", "--schedule", "simple", "--balance", "memory") == 0
    out = capsys.readouterr().out
    assert "[rank 0] pipeline: 16 layers in 2 stages on 2 rank(s)" in out
    final, first = (float(v) for v in re.search(r"final loss ([\d.]+) \(first ([\d.]+)\)", out).groups())
    assert final < first / 2


@masters("local")
def test_a_script_that_imports_its_siblings_runs_unchanged(spark, tmp_path, monkeypatch, capsys):
    folder = tmp_path / "ddp-tutorial-series"
    shutil.copytree(os.path.join(ROOT, "tests", "e2e", "ddp_tutorial"), folder)
    (tmp_path / "extra_lib.py").write_text("VALUE = 42\n")
    with tarfile.open(tmp_path / "vocab.tgz", "w:gz") as tf:
        info = tarfile.TarInfo("words.txt")
        info.size = 4
        tf.addfile(info, io.BytesIO(b"a b\n"))
    launch = tmp_path / "launch"
    launch.mkdir()
    monkeypatch.chdir(launch)  # where the command is started: the ranks' working directory
    code = _run(
        spark, str(folder / "multinode.py"), "2", "--batch_size", "16",
        py_files=str(tmp_path / "extra_lib.py"), archives=f"{tmp_path / 'vocab.tgz'}#vocab",
    )  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    for rank in (0, 1):
        line = next(ln for ln in out.splitlines() if f"rank {rank} trained 2 epochs" in ln)
        shipped, cwd = re.search(r"datautils from (\S+);.*cwd (\S+)", line).groups()
        assert shipped.endswith("script-src") and not shipped.startswith(str(folder))  # the rank's copy
        assert cwd == str(launch)  # torchrun's rule: where the command was started
        assert "vocab ['a', 'b']; extra 42" in line
    assert (launch / "vocab" / "words.txt").read_text() == "a b\n"  # unpacked there, once


@masters("local")
def test_comm_settings_on_the_command_line_reach_comm_ddp_in_an_unchanged_script(spark, capsys, tmp_path):
    script = tmp_path / "comm_train.py"
    script.write_text(
        "import torch, torch.distributed as dist\n"
        "from sparkml_dist.parallel import comm\n"
        "dist.init_process_group('gloo')\n"
        "net = comm.ddp(torch.nn.Linear(4, 1))\n"
        "print('settings', net.accumulate, net.bucket_bytes_cap, net.static_graph)\n"
        "dist.barrier()\n"
    )
    comm = ["accumulate=3", "bucket_cap_mb=1", "static_graph=true"]
    assert _run(spark, str(script), comm=comm, env=[]) == 0
    out = capsys.readouterr().out
    assert out.count("settings 3 1048576 True") == 2, out[-2000:]  # both ranks
