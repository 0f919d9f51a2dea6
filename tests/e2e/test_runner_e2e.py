"""The runner as users start it: `sparkml-dist run` where its own process matters (exit codes, the
console, the environment), and GPU pinning with a fake discovery script; the scripts' own runs on the
pass's session: tests/spark/test_cli_run.py."""

import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT, masters


def _py(*args, timeout=400):
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


@masters("local")
def test_cli_run_failure_exits_non_zero(tmp_path):
    script = tmp_path / "bad.py"
    script.write_text("import sys\nprint('about to fail')\nsys.exit(3)\n")
    proc = _py("-m", "sparkml_dist", "run", "--np", "-2", str(script))
    assert proc.returncode != 0
    assert "exited with code 3" in proc.stderr


@masters("local")
@pytest.mark.parametrize("mode", ["conf", "profile"])
def test_each_rank_is_pinned_to_the_gpu_spark_assigned(tmp_path, mode):
    script = tmp_path / "gpus.sh"
    script.write_text('#!/bin/sh\necho \'{"name": "gpu", "addresses": ["0", "1"]}\'\n')
    script.chmod(0o755)
    proc = _py("tests/e2e/gpu_assignment_job.py", str(script), mode)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.split("RESULT ", 1)[1].splitlines()[0])
    assert [r["rank"] for r in out] == [0, 1]
    # torchrun's rule: both ranks see the host's two GPUs, LOCAL_RANK picks a distinct one each
    assert out[0]["cuda_visible"] == out[1]["cuda_visible"] and sorted(out[0]["cuda_visible"].split(",")) == [
        "0",
        "1",
    ]
    assert sorted(r["picked"] for r in out) == ["0", "1"]
    assert [r["device"] for r in out] == ["cuda:0", "cuda:1"]
    if mode == "profile":  # four trials, two at once (the executor's two GPUs), one GPU each
        trials = json.loads(proc.stdout.split("TUNE ", 1)[1].splitlines()[0])
        assert [t["state"] for t in trials] == ["complete"] * 4
        assert all(t["gpus"] in ("0", "1") and t["device"] == f"cuda:{t['gpus']}" for t in trials)
        assert {t["gpus"] for t in trials} == {"0", "1"}
        members = json.loads(proc.stdout.split("BAG ", 1)[1].splitlines()[0])
        assert len(members) == 4 and set(members) <= {"cuda:0", "cuda:1"}  # each on its task's GPU
        too_big = json.loads(proc.stdout.split("TOO_BIG ", 1)[1].splitlines()[0])
        assert too_big.startswith("InsufficientResourcesError") and "20.00 GiB" in too_big
        assert "16.00 GiB (spark.sparkml_dist.gpu.memory)" in too_big
        plan = proc.stdout.split("PLAN ", 1)[1].splitlines()[0]
        assert plan == (
            "1 executor(s) x min(2 slots by CPU, 2 tasks by GPU (2 GPUs, 1 GPU per task; 2 member(s) "
            "of 6.0 GiB in a GPU of 16.0 GiB)) = 2 members at once"
        )


@masters("local")
def test_a_task_holding_two_gpus_runs_two_ranks(tmp_path):
    # each worker of the machine is handed the next two addresses (a real machine's GPUs are
    # distinct across its executors)
    script = tmp_path / "gpus.sh"
    script.write_text(
        "#!/bin/sh\n"
        f'exec 9>"{tmp_path}/lock"; flock 9\n'
        f'n=$(cat "{tmp_path}/next" 2>/dev/null || echo 0); echo $((n + 2)) > "{tmp_path}/next"\n'
        'echo "{\\"name\\": \\"gpu\\", \\"addresses\\": [\\"$n\\", \\"$((n + 1))\\"]}"\n'
    )
    script.chmod(0o755)
    proc = _py("tests/e2e/gpu_assignment_job.py", str(script), "multi")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.split("RESULT ", 1)[1].splitlines()[0])
    ranks, refusal = out[:4], out[4]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    # one host, four ranks on two executors of two GPUs each: every rank sees the host's four GPUs
    # in local-rank order, and LOCAL_RANK picks a distinct one (torchrun's rule)
    assert [r["local"] for r in ranks] == [[0, 4], [1, 4], [2, 4], [3, 4]]
    assert len({r["cuda_visible"] for r in ranks}) == 1 and sorted(
        ranks[0]["cuda_visible"].split(",")
    ) == list("0123")
    assert sorted(r["picked"] for r in ranks) == list("0123")
    assert [r["device"] for r in ranks] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    values = sorted(v for r in ranks for v in r["values"])
    assert values == [float(i) for i in range(40)] and min(len(r["values"]) for r in ranks) >= 5
    assert "np=3 ranks cannot fill tasks of 2 GPUs" in refusal["np=3"]


@masters("local")
def test_cli_runs_the_fsdp2_example_on_local_ranks():
    proc = _py("-m", "sparkml_dist", "run", "--np", "-2", "examples/fsdp_train.py", "--", "--steps", "5")
    assert proc.returncode == 0, proc.stderr[-3000:]
    held, total = (int(v) for v in re.search(r"rank 0 holds (\d+) of (\d+) parameters", proc.stdout).groups())
    assert held < total and abs(2 * held - total) < total // 10  # about half of every tensor


def _run_in(cwd, *args, env=None, timeout=400):
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, **(env or {}))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    command = [sys.executable, "-m", "sparkml_dist", "run", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@masters("local")
def test_a_script_resumes_from_the_checkpoint_it_wrote_next_to_itself_and_each_line_shows_once(tmp_path):
    """torchrun's working-directory rule: ranks on the launching machine run where the command was
    started, so ./checkpoints written by one run is there for the next; each rank line is printed
    once in the console (a local master's task stderr is that console)."""
    script = os.path.join(ROOT, "tests", "e2e", "resume_script.py")
    for start in (0, 3):
        proc = _run_in(tmp_path, "--np", "2", "--master", "local[2]", script)
        assert proc.returncode == 0, proc.stderr[-3000:]
        console = proc.stdout + proc.stderr
        for rank in (0, 1):
            line = f"rank {rank} started at step {start} in {tmp_path}"
            assert console.count(line) == 1, (line, console[-3000:])
    assert json.loads((tmp_path / "checkpoints" / "state.json").read_text()) == {"step": 6}


@masters("local")
def test_accelerates_own_test_script_runs_unchanged(tmp_path):
    pytest.importorskip("accelerate")
    from accelerate.test_utils import scripts

    script = os.path.join(os.path.dirname(scripts.__file__), "test_script.py")
    proc = _run_in(tmp_path, "--np", "2", "--master", "local[2]", script, env={"ACCELERATE_USE_CPU": "true"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "**Test reinstantiated state**" in proc.stdout
    assert "Main process was not first" not in proc.stdout + proc.stderr


@masters("local")
@pytest.mark.parametrize(
    "where", [("--np", "-2"), ("--np", "2", "--master", "local[2]")], ids=["np<0", "local[2]"]
)
def test_set_device_local_rank_picks_each_ranks_own_gpu(tmp_path, where):
    """torch.cuda.set_device(int(os.environ["LOCAL_RANK"])) through `sparkml-dist run --use-gpu`,
    with a CUDA stand-in recording the call: every rank lands on its own assigned GPU.  Cold ranks:
    the stand-in is a sitecustomize that patches torch in each rank's own interpreter."""
    log = tmp_path / "set_device.jsonl"
    env = {
        "CUDA_VISIBLE_DEVICES": "5,7",  # the driver's two GPUs
        "FAKE_CUDA_LOG": str(log),
        "PYTHONPATH": os.path.join(ROOT, "tests", "support", "fake_cuda"),
    }
    script = os.path.join(ROOT, "tests", "e2e", "set_device_script.py")
    proc = _run_in(tmp_path, *where, "--use-gpu", "--no-warm-ranks", script, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    calls = sorted(json.loads(line)["rank"] for line in log.read_text().splitlines())
    picked = {json.loads(line)["rank"]: json.loads(line)["gpu"] for line in log.read_text().splitlines()}
    assert calls == [0, 1] and picked == {0: "5", 1: "7"}


def test_the_gpu_check_says_what_it_skipped_without_a_gpu():
    proc = _py("scripts/gpu_check.py", timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "no GPU: skipped 7 checks" in proc.stdout


def test_a_users_error_in_a_rank_is_a_short_console_ending_with_their_file_and_line():
    """Spark's task-failure traces, the peer's secondary "connection closed" traceback and the
    runner's own frames stay off the console: at most 40 lines, the WorkerError last, naming the
    user's file and line."""
    script = os.path.join(ROOT, "tests", "e2e", "quiet_failure", "run.py")
    proc = _py(script, os.path.join(ROOT, "conf", "spark-local.yaml"))
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert proc.returncode == 1 and len(lines) <= 40, "\n".join(lines)
    user_file = os.path.join(ROOT, "tests", "e2e", "quiet_failure", "user_train.py")
    assert (
        lines[-1] == "ValueError: my bug in rank 1" and f'File "{user_file}", line 11, in train' in lines[-3]
    )
    assert not any("SPARKML_DIST_RANK_FAILURE" in ln or "Connection closed by peer" in ln for ln in lines)
    assert any(ln.startswith("sparkml_dist.errors.WorkerError: rank 1 exited with code 1") for ln in lines)


@masters("local")
def test_a_sessions_runs_fork_warm_ranks_and_its_pools_end_with_spark_stop():
    """Its own local[2] session (~40 s): spark.stop() has to end the pool that session's executor
    started, which the pass's shared session cannot show."""
    proc = _py("tests/e2e/warm_ranks_job.py", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.split("RESULT ", 1)[1].splitlines()[0])
    (first, _), (second, _) = out["runs"]
    assert len(out["pools"]) == 1  # one pool for the executor's ranks, started by the first run
    assert set(first) == set(second) == set(out["pools"])  # both runs' ranks forked from it
    assert out["after_stop"] == []
