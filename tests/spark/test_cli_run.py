"""`sparkml-dist run` in-process on the pass's session: unchanged torchrun / horovodrun scripts on
barrier tasks (the command's argv and exit codes: tests/e2e/test_cli.py and test_runner_e2e.py)."""

import io
import os
import re
import shutil
import tarfile

from sparkml_dist.cli import _parser, run_command
from tests.conftest import ROOT, masters


def _run(spark, script, *script_args, flags=(), **kw):
    """``sparkml-dist run --np 2 [flags] script -- script_args`` on the pass's session, with
    ``kw`` set on the parsed arguments (as the flags would)."""
    args = _parser().parse_args(["run", "--np", "2", *flags, script, "--", *script_args])
    for name, value in kw.items():
        setattr(args, name, value)
    return run_command.run(spark, args)


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


@masters("local")
def test_max_restarts_and_checkpoint_dir_on_the_command_line_resume_after_a_killed_rank(
    spark, capsys, tmp_path
):
    """Rank 1 is SIGKILLed once at step 4; with --max-restarts 1 --checkpoint-dir the second attempt
    resumes from the last checkpoint (step 3) and ends with the steps counted once."""
    script = tmp_path / "resume_train.py"
    marker = tmp_path / "killed-once"
    script.write_text(
        "import os, signal, torch, torch.distributed as dist\n"
        "from sparkml_dist.runner import checkpoint\n"
        "dist.init_process_group('gloo')\n"
        "state = checkpoint.load()\n"
        "start = state['step'] + 1 if state else 0\n"
        "total = state['total'] if state else 0\n"
        "for step in range(start, 8):\n"
        f"    if step == 4 and dist.get_rank() == 1 and not os.path.exists({str(marker)!r}):\n"
        f"        open({str(marker)!r}, 'w').close()\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    t = torch.ones(1)\n"
        "    dist.all_reduce(t)\n"
        "    total += int(t.item())\n"
        "    checkpoint.save({'step': step, 'total': total}, step)\n"
        "print('resumed from', start, 'total', total)\n"
    )
    flags = ["--max-restarts", "1", "--checkpoint-dir", str(tmp_path / "ckpt"), "--log-ranks", "0"]
    assert _run(spark, str(script), flags=flags) == 0
    out = capsys.readouterr().out
    assert marker.exists() and "attempt 1 failed" in out and "signal 9" in out
    assert "[rank 0] resumed from 4 total 16" in out  # 8 steps x 2 ranks, each counted once


@masters("local")
def test_input_on_the_command_line_feeds_each_rank_its_shard(spark, capsys, tmp_path):
    path = str(tmp_path / "rows")
    spark.range(0, 100, 1, 3).selectExpr("id", "id * 0.5 as x").write.parquet(path)
    script = tmp_path / "shard_train.py"
    script.write_text(
        "import torch.distributed as dist\n"
        "from sparkml_dist.runner import shard\n"
        "dist.init_process_group('gloo')\n"
        "ids = shard().to_numpy(['id']).ravel()\n"
        "print('rows', len(ids), 'sum', int(ids.sum()))\n"
    )
    assert _run(spark, str(script), flags=["--input", path]) == 0
    out = capsys.readouterr().out
    rows = [
        tuple(int(v) for v in re.search(r"rows (\d+) sum (\d+)", ln).groups())
        for ln in out.splitlines()
        if "rows " in ln
    ]
    assert sorted(n for n, _ in rows) == [50, 50] and sum(s for _, s in rows) == sum(range(100))


@masters("local")
def test_an_input_spark_cannot_find_is_one_line_naming_the_flag(spark, tmp_path):
    import pytest

    from sparkml_dist.errors import ConfigurationError

    script = tmp_path / "s.py"
    script.write_text("print('never runs')\n")
    cases = ((str(tmp_path / "nothing_here"), "a Parquet path"), ("no_such_table", "a table name"))
    for where, read_as in cases:
        with pytest.raises(ConfigurationError) as info:
            _run(spark, str(script), flags=["--input", where])
        text = str(info.value)
        assert text.startswith(f"--input {where!r}, read as {read_as}") and "\n" not in text, text
