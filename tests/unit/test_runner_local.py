"""BarrierRunner with np < 0: ranks as local processes on the driver, no Spark at all."""

import os
import time

import pytest

from sparkml_dist import ConfigurationError, InsufficientResourcesError, WorkerError
from sparkml_dist.runner import BarrierRunner
from tests.support import runner_helpers as h
from tests.support.runner_checks import RunnerChecks, assert_no_rank_left

pytestmark = pytest.mark.slow  # starts rank processes or waits on timeouts: not in make test-fast


@pytest.fixture
def spark():
    return None  # local mode needs no SparkSession


class TestLocalRunner(RunnerChecks):
    np_sign = -1


def test_a_rank_that_raised_is_the_cause_though_a_peer_reported_first_and_it_was_slow_to_exit():
    """Its peer's failure comes first and the others are stopped a moment later: the rank that
    raised said so before its slow exit, so it is named, not the peer nor "cancelled"."""
    with pytest.raises(WorkerError) as info:
        BarrierRunner(-2, timeout=120, log_ranks="none").run(h.raise_slow_to_exit, 1)
    err = info.value
    assert err.rank == 1 and err.exit_code == 1, str(err)
    assert "ValueError: failed by itself" in err.worker_traceback
    assert_no_rank_left()


def test_horovod_backend_without_horovod_says_how_to_install_it(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "horovod" else real(name, *a)
    )
    with pytest.raises(ConfigurationError, match=r"needs Horovod, which is not installed.*make horovod"):
        BarrierRunner(2, backend="horovod")


def test_bad_constructor_arguments():
    for kwargs, match in (
        (dict(np=0), "np must be a non-zero integer"),
        (dict(np=2, backend="mpi"), "backend must be one of"),
        (dict(np=2, timeout=0), "timeout must be a positive"),
        (dict(np=2, data_timeout=-1), "data_timeout must be a positive number of seconds up to 1e.09 or No"),
        (dict(np=2, log_ranks="some"), "log_ranks must be"),
        (dict(np=2, log_dir="s3://bucket/logs"), "log_dir must be a directory path every executor can write"),
        (dict(np=2, max_restarts=-1), "max_restarts must be an integer >= 0"),
        (
            dict(np=2, model_bytes=-5),
            r"model_bytes must be an integer >= 0 or None, got -5; the bytes one rank",
        ),
    ):
        with pytest.raises(ConfigurationError, match=match):
            BarrierRunner(**kwargs)


def test_joining_the_store_by_any_c10d_path_counts_as_starting():
    # init_device_mesh calls init_process_group through its own import: a hook on the name misses it
    assert BarrierRunner(-2, start_timeout=6, timeout=120).run(h.start_with_device_mesh, 8) == 2.0
    assert BarrierRunner(-2, start_timeout=6, timeout=120).run(h.start_with_rpc, 8) == 41
    assert_no_rank_left()


def test_rank_zero_returning_first_keeps_the_store_until_its_peers_are_done():
    # rank 0 returns at once; rank 1 uses the store 1.5 s later (a peer still finishing
    # init_process_group under load does the same): rank 0 hosts the store, so it stays, as
    # torchrun's agent does, instead of taking the store with it when its function returns
    out = BarrierRunner(-2, timeout=120).run(h.store_after_rank0_returns, 1.5, return_all=True)
    assert out == ["returned", "stored"]


def test_a_single_rank_that_never_distributes_is_not_killed_by_start_timeout():
    assert BarrierRunner(-1, start_timeout=2, timeout=60).run(h.never_distributes, 4) == "alone"


def _torchrun_rule(out, gpus):
    """torchrun's device rule held: every rank sees the host's GPUs in local-rank order, LOCAL_RANK
    picks its own (distinct) one, and context().device is that device."""
    assert [o["cuda_visible"] for o in out] == [",".join(gpus)] * len(gpus)
    assert [o["picked"] for o in out] == gpus  # set_device(LOCAL_RANK): rank r's own GPU
    assert [o["device"] for o in out] == [f"cuda:{i}" for i in range(len(gpus))]
    assert [(o["local_rank"], o["local_world_size"]) for o in out] == [
        (i, len(gpus)) for i in range(len(gpus))
    ]
    assert {o["group_rank"] for o in out} == {"0"} == {o["node_rank"] for o in out}


def test_local_ranks_follow_torchruns_device_rule(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")  # a 4-GPU machine; nothing touches CUDA
    _torchrun_rule(BarrierRunner(-4, use_gpu=True, timeout=60).run(h.gpu_view, return_all=True), list("0123"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    _torchrun_rule(BarrierRunner(-2, use_gpu=True, timeout=60).run(h.gpu_view, return_all=True), ["3", "5"])
    with pytest.raises(InsufficientResourcesError, match=r"3 ranks need 3 GPUs, but this machine shows 2"):
        BarrierRunner(-3, use_gpu=True).run(h.gpu_view)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(InsufficientResourcesError, match=r"shows 0 \(CUDA_VISIBLE_DEVICES: none\)"):
        BarrierRunner(-1, use_gpu=True).run(h.gpu_view)


def test_visible_gpus_reads_cuda_visible_devices_as_cuda_does():
    from sparkml_dist.gpus import visible as visible_gpus

    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "0,2"}) == ["0", "2"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-8a1b,GPU-77c0"}) == ["GPU-8a1b", "GPU-77c0"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "1,-1,3"}) == ["1"]  # CUDA stops at an invalid entry
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert visible_gpus({}) == []  # the CPU build of torch sees no device


def test_torch_distributor_local_mode_runs_on_the_driver(monkeypatch):
    from sparkml_dist.distributor import TorchDistributor

    out = TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(h.allreduce_rank_sum, x=1)
    assert out["sum"] == 3.0 and out["x"] == 1
    # pyspark's rule: more processes than the driver's GPUs run one per GPU
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4")
    out = TorchDistributor(num_processes=3, local_mode=True).run(h.gpu_view)
    assert out["cuda_visible"] == "4" and out["device"] == "cuda:0"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")  # the drop-in keeps torchrun's rule locally
    dist = TorchDistributor(num_processes=4, local_mode=True, timeout=60)
    _torchrun_rule(dist._runner(None).run(h.gpu_view, return_all=True), list("0123"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(InsufficientResourcesError, match="shows 0"):
        TorchDistributor(num_processes=1, local_mode=True, use_gpu=True).run(h.gpu_view)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigurationError, match="num_processes has to be a positive integer"):
            TorchDistributor(num_processes=bad)


def test_huge_lines_and_progress_bars_do_not_cost_a_rank_its_logs(tmp_path):
    from sparkml_dist import WorkerError

    out = []
    runner = BarrierRunner(-2, log_ranks="all", log_dir=str(tmp_path), timeout=120, log_sink=out.append)
    with pytest.raises(WorkerError) as err:
        runner.run(h.chatty)
    text = "".join(out)
    assert err.value.rank == 1 and "boom after the flood" in str(err.value)  # the failure report arrived
    assert "[rank 1] after the flood" in text and "[rank 0] after the flood" in text  # the channel survived
    assert "more bytes cut]" in text  # the 3 MB line, cut and saying so
    assert "progress 2000/2000" in text and text.count("progress ") < 10  # the bar's latest state
    logs = sorted(p.name for p in tmp_path.iterdir())
    assert len(logs) == 2 and logs[0].startswith("rank0-attempt1-") and logs[1].startswith("rank1-attempt1-")
    rank1 = (tmp_path / logs[1]).read_text()
    assert all(f"line {i} of rank 1" in rank1 for i in range(100)) and "ValueError: boom" in rank1


def test_log_dir_in_a_folder_others_can_write_is_refused_and_logs_are_private(tmp_path):
    """A world-writable folder (another user's /tmp/shared, say) is refused before any rank starts,
    on the driver and, for a folder made since, in the task; the files are 0600, not 0644."""
    import stat

    from sparkml_dist.runner.tasks import workdirs

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(ConfigurationError, match=r"log_dir=.*shared.* is writable by other users"):
        BarrierRunner(-2, log_dir=str(shared))
    with pytest.raises(ConfigurationError, match=r"log_dir=.*is writable by other users"):
        workdirs.open_log(str(shared), "rank0.log")
    (tmp_path / "link").symlink_to(tmp_path / "mine", target_is_directory=True)
    (tmp_path / "mine").mkdir()
    with pytest.raises(ConfigurationError, match=r"log_dir=.*link.*(link|without following)"):
        workdirs.open_log(str(tmp_path / "link"), "rank0.log")
    logs = tmp_path / "logs"
    BarrierRunner(-2, log_ranks="all", log_dir=str(logs), timeout=120).run(h.print_lines, 3)
    files = list(logs.iterdir())
    assert len(files) == 2 and all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files), files
    assert stat.S_IMODE(logs.stat().st_mode) == 0o700


@pytest.mark.parametrize("value", ["inf", "1e14", "nan", "-3"])
def test_a_timeout_flag_that_no_rank_could_hold_is_refused_naming_the_flag(value, capsys):
    from sparkml_dist.cli import _parser

    with pytest.raises(SystemExit) as exit_:
        _parser().parse_args(["run", "--np", "2", "--collective-timeout", value, "train.py"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "argument --collective-timeout" in err and "write none for no limit" in err, err
    with pytest.raises(ConfigurationError, match="collective_timeout must be a positive number of seconds"):
        BarrierRunner(-2, collective_timeout=float(value))


def test_rank_process_copies_every_line_to_the_task_stderr(tmp_path, capsys):
    from sparkml_dist.runner.tasks.rank_process import RankProcess

    p = RankProcess(3, str(tmp_path), {"PATH": os.environ.get("PATH", "")})  # exits at once: no task env
    p.watch(echo=True, log_path=str(tmp_path / "r3.log"))
    p._relay("stdout", "a line nobody streams")
    p.close()
    assert "[rank 3] a line nobody streams" in capsys.readouterr().err
    assert "a line nobody streams" in (tmp_path / "r3.log").read_text()


def test_a_rank_that_dies_before_its_start_message_is_reported_as_itself(monkeypatch):
    from sparkml_dist import WorkerError

    here = os.path.join(os.path.dirname(os.path.dirname(__file__)), "support", "dies_at_start")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
    with pytest.raises(WorkerError) as err:  # cold: the injection runs at an interpreter's start
        BarrierRunner(-2, timeout=60, warm_ranks=False).run(h.allreduce_rank_sum)
    # reported as itself whether the start message met the closed pipe ("... before it started")
    # or was buffered first: never as the supervisor's BrokenPipeError
    assert err.value.rank == 1 and err.value.exit_code == 7
    assert "rank 1 exited with code 7" in str(err.value) and "BrokenPipe" not in str(err.value)
    assert "cannot start: injected" in (err.value.worker_traceback or "") + str(err.value)
    assert_no_rank_left()


def test_sys_exit_inside_the_function_is_reported_as_an_early_exit():
    with pytest.raises(WorkerError, match="rank 0 exited with code 0 before returning a result"):
        BarrierRunner(-2, timeout=60).run(h.exits_with, 0, 0)
    with pytest.raises(WorkerError, match="rank 0 exited with code 4 before returning a result"):
        BarrierRunner(-2, timeout=60).run(h.exits_with, 0, 4)
    with pytest.raises(WorkerError, match="rank 1 exited with code 3"):
        BarrierRunner(-2, timeout=60).run(h.exits_with, 1, 3)
    assert BarrierRunner(-2, timeout=60).run(h.exits_with, 1, 0) == "returned"  # rank 1 owes no result
    assert_no_rank_left()


@pytest.mark.parametrize("how", ["sys.exit", "os._exit"])
def test_a_rank_that_leaves_a_collective_quietly_is_named_as_the_cause(how):
    """Rank 2 of 3 ends with code 0 inside the function while ranks 0 and 1 wait for it in an
    all-reduce: before, the error blamed the waiting ranks ("rank 1 exited with code 1 ... ranks [2]
    had already finished")."""
    import time

    start = time.monotonic()
    with pytest.raises(WorkerError) as err:
        BarrierRunner(-3, timeout=120, collective_timeout=30).run(h.leaves_a_collective, 2, how)
    text = str(err.value)
    assert text.startswith("rank 2 left the run: exited with code 0 before its function returned"), text
    assert err.value.rank == 2 and "had already finished" not in text
    assert time.monotonic() - start < 60
    assert BarrierRunner(-2, timeout=60).run(h.exits_with, 1, 0) == "returned"  # nobody waited: fine
    assert_no_rank_left()


@pytest.mark.parametrize("outcome", ["return", "raise", "hang"])
def test_children_in_their_own_session_are_killed_after_success_failure_or_timeout(outcome):
    import psutil

    marker = str(600 + ["return", "raise", "hang"].index(outcome) + 0.25)  # "sleep 600.25", ...

    def left():
        return [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]

    runner = BarrierRunner(-2, timeout=15 if outcome == "hang" else 60)
    if outcome == "return":
        assert runner.run(h.setsid_children, marker, outcome) == "done"
    else:
        with pytest.raises(Exception, match="failing after starting children|timeout"):
            runner.run(h.setsid_children, marker, outcome)
    deadline = time.monotonic() + 10
    while left() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left(), [p.info["cmdline"] for p in left()]


def _processes_with(marker):
    import psutil

    return [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
@pytest.mark.parametrize("outcome", ["return", "raise", "killed"])
def test_children_with_an_environment_of_their_own_end_with_the_rank(outcome, warm):
    """No token of the run in their environment, in sessions of their own: still ended, whether
    the rank returned, raised or was killed, cold or warm (the rank's keeper, or its pool, is their
    subreaper)."""
    marker = str(700 + 10 * warm + ["return", "raise", "killed"].index(outcome) + 0.25)
    runner = BarrierRunner(-2, timeout=60, warm_ranks=warm)
    if outcome == "return":
        assert runner.run(h.own_env_children, marker, outcome) == "done"
    else:
        with pytest.raises(Exception, match="failing after starting children|signal 9"):
            runner.run(h.own_env_children, marker, outcome)
    deadline = time.monotonic() + 10
    while _processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = _processes_with(marker)
    for p in left:
        p.kill()
    assert not left, [p.info["cmdline"] for p in left]


def test_a_rank_may_hold_several_gpus_for_one_process_multi_gpu_code(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    out = BarrierRunner(-2, use_gpu=True, gpus_per_rank=2, timeout=60).run(h.gpu_view, return_all=True)
    assert [o["cuda_visible"] for o in out] == ["0,1", "2,3"]  # each rank its own two, as cuda:0-1
    assert [o["devices"] for o in out] == [["cuda:0", "cuda:1"]] * 2 and {o["device"] for o in out} == {
        "cuda:0"
    }
    with pytest.raises(
        InsufficientResourcesError, match=r"2 GPUs per rank \(gpus_per_rank\): 3 ranks need 6"
    ):
        BarrierRunner(-3, use_gpu=True, gpus_per_rank=2).run(h.gpu_view)
    with pytest.raises(ConfigurationError, match="gpus_per_rank=2 needs use_gpu=True"):
        BarrierRunner(-1, gpus_per_rank=2)


def test_one_runner_runs_twice_at_once_from_two_threads():
    """A BarrierRunner is configuration only: two calls at once each get their own run (launcher,
    channel, rendezvous, attempts), and each gets its own ranks' all-reduce."""
    import threading

    lines = []
    runner = BarrierRunner(-2, log_ranks="all", log_sink=lines.append, timeout=120)
    out, errors = {}, []

    def call(x):
        try:
            out[x] = runner.run(h.allreduce_rank_sum, x, return_all=True)
        except Exception as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(x,)) for x in (1, 100)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert errors == []
    for x in (1, 100):
        assert [(o["sum"], o["x"], o["env"]["RANK"]) for o in out[x]] == [(3.0, x, "0"), (3.0, x, "1")]
    ports = {x: {o["env"]["MASTER_PORT"] for o in out[x]} for x in (1, 100)}
    assert len(ports[1]) == len(ports[100]) == 1 and ports[1] != ports[100]  # a rendezvous each
    assert sum("hello from rank" in line for line in lines) == 4


def test_the_runner_holds_configuration_only():
    """Nothing but __init__ assigns to a BarrierRunner: per-run state lives in runner.run.Run."""
    import ast
    import inspect

    from sparkml_dist.runner import runner as runner_module

    tree = ast.parse(inspect.getsource(runner_module))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "BarrierRunner")
    assigned = [
        f"{fn.name}: self.{t.attr}"
        for fn in cls.body
        if isinstance(fn, ast.FunctionDef) and fn.name != "__init__"
        for node in ast.walk(fn)
        for t in getattr(node, "targets", [getattr(node, "target", None)])
        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
    ]
    assert assigned == []


def test_env_reaches_every_rank_on_every_attempt_and_the_runners_own_names_are_refused(tmp_path):
    from sparkml_dist.runner.task_spec import TaskSpec

    env = {"NCCL_SOCKET_IFNAME": "eth0", "MY_API_TOKEN": "s3cr3t-value"}
    out = BarrierRunner(-2, env=env, max_restarts=1, timeout=120).run(
        h.env_on_every_attempt, list(env), str(tmp_path / "failed-once"), return_all=True
    )
    assert (tmp_path / "failed-once").exists() and out == [env, env]  # the second attempt had it too
    for bad in ({"RANK": "3"}, {"MASTER_ADDR": "x"}, {"SPARKML_DIST_WORKDIR": "/tmp"}):
        with pytest.raises(
            ConfigurationError, match=r"env=\{\.\.\.\} sets \['\w+'\], which the runner sets itself"
        ):
            BarrierRunner(-2, env=bad)
    spec = TaskSpec.__dataclass_fields__["env"]
    assert spec.repr is False  # a secret value never shows in a spec's repr or a log line


def test_a_rank_that_stops_moving_says_where_it_waits():
    lines = []
    out = BarrierRunner(-2, collective_timeout=8, log_ranks="none", log_sink=lines.append).run(
        h.stall_in_a_barrier, return_all=True
    )
    assert out == [0, 1]
    text = "".join(lines)
    # after a quarter of collective_timeout without moving: rank 0 waits in the barrier for rank 1,
    # which is still in its own code (the sleep): rank 0 names the barrier and who is not in it,
    # rank 1 says where it is
    stuck = [line for line in text.splitlines() if line.startswith("[rank 0] stuck collective: barrier #")]
    assert stuck and "rank 0 in it; not in it: rank 1 (after collective #" in stuck[0], text
    assert "runner_helpers.py:" in stuck[0] and "in stall_in_a_barrier)" in stuck[0], text
    busy = [line for line in text.splitlines() if line.startswith("[rank 1] at the same line for")]
    assert busy and "inside" not in busy[0] and "runner_helpers.py:" in busy[0], text


def test_a_rank_that_skips_an_all_reduce_is_named_on_the_console_and_in_the_error():
    lines = []
    runner = BarrierRunner(-3, collective_timeout=8, log_ranks="none", log_sink=lines.append, timeout=120)
    with pytest.raises(WorkerError) as err:
        runner.run(h.skip_an_all_reduce, skipper=1)
    text = "".join(lines)
    stuck = [line for line in text.splitlines() if "stuck collective:" in line]
    # one line for the collective, from the lowest rank in it, naming the rank that never came
    assert stuck and stuck[0].startswith("[rank 0] stuck collective: all_reduce #"), text
    assert "ranks 0, 2 in it; not in it: rank 1 (after collective #" in stuck[0], text
    assert "in skip_an_all_reduce)" in stuck[0] and not any(ln.startswith("[rank 2] stuck") for ln in stuck)
    seq = int(stuck[0].split("all_reduce #", 1)[1].split(" ", 1)[0])
    assert f"(after collective #{seq - 1}," in stuck[0]
    assert f"the stuck collective: all_reduce #{seq} has waited" in str(err.value)
    assert "not in it: rank 1" in str(err.value)
