"""Horovod without Spark tasks: placements, environments, GPU mapping, HorovodRunner's arguments,
np < 0 (ranks as processes on the driver) and log_to_driver. Needs Horovod (`make horovod`)."""

import pytest

from sparkml_dist import ConfigurationError, RunTimeoutError, WorkerError
from sparkml_dist.gpus import node_gpus
from sparkml_dist.horovod import HorovodRunner, log_to_driver
from sparkml_dist.runner import BarrierRunner, backends
from tests.support import horovod_helpers as hh
from tests.support.runner_checks import assert_no_rank_left

pytestmark = pytest.mark.slow  # starts rank processes or waits on timeouts: not in make test-fast


def test_slots_follow_horovodrun_placement():
    # ranks interleaved over two hosts, as Spark may place barrier tasks
    slots = backends.horovod_slots(["a", "b", "a", "a"])
    assert [(s["local_rank"], s["local_size"]) for s in slots] == [(0, 3), (0, 1), (1, 3), (2, 3)]
    assert [(s["cross_rank"], s["cross_size"]) for s in slots] == [(0, 2), (1, 2), (0, 1), (0, 1)]
    assert {s["size"] for s in slots} == {4} and [s["rank"] for s in slots] == [0, 1, 2, 3]


def test_env_is_what_hvd_init_reads():
    env = backends.horovod_env(2, ["a", "b", "a"], "a", 4321, "eth0", 90.4)
    assert env["HOROVOD_RANK"] == env["RANK"] == "2" and env["HOROVOD_SIZE"] == env["WORLD_SIZE"] == "3"
    assert env["HOROVOD_LOCAL_RANK"] == env["LOCAL_RANK"] == "1" and env["HOROVOD_LOCAL_SIZE"] == "2"
    assert env["HOROVOD_CROSS_RANK"] == "0" and env["HOROVOD_CROSS_SIZE"] == "1"
    assert env["HOROVOD_HOSTNAME"] == "a" and env["HOROVOD_GLOO_IFACE"] == "eth0"
    assert (env["HOROVOD_GLOO_RENDEZVOUS_ADDR"], env["HOROVOD_GLOO_RENDEZVOUS_PORT"]) == ("a", "4321")
    assert env["HOROVOD_CONTROLLER"] == env["HOROVOD_CPU_OPERATIONS"] == "gloo"
    assert env["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "90"
    assert "HOROVOD_GLOO_IFACE" not in backends.horovod_env(0, ["a"], "a", 1, None, 5)


def test_gpus_are_visible_in_local_rank_order_so_set_device_local_rank_works():
    hosts = ["a", "b", "a"]
    gpus = [["3"], ["0"], ["1"]]
    assert node_gpus(0, hosts, gpus) == ["3", "1"]  # local rank 0 -> index 0 = GPU 3
    assert node_gpus(2, hosts, gpus) == ["3", "1"]  # local rank 1 -> index 1 = GPU 1
    assert node_gpus(1, hosts, gpus) == ["0"]
    assert node_gpus(0, hosts, [None, None, None]) is None
    # a task with two GPUs: each rank sees only its own
    assert node_gpus(0, ["a", "a"], [["0", "1"], ["2"]]) == ["0", "1"]
    # two ranks sharing GPU 0 (fractional task amounts): each sees its own, from index 0
    assert node_gpus(1, ["a", "a"], [["0"], ["0"]]) == ["0"]


def test_log_to_driver_outside_a_rank_prints(capsys):
    log_to_driver("two\nlines")
    assert capsys.readouterr().out == "two\nlines\n"


def test_failure_in_local_mode_names_the_rank_and_cleans_up():
    with pytest.raises(WorkerError) as info:
        BarrierRunner(-2, backend="horovod", timeout=120).run(hh.fail_on, 0, "raise")
    assert info.value.rank == 0 and "injected horovod failure" in info.value.worker_traceback
    assert_no_rank_left()


def test_bad_arguments_are_refused_with_the_fix():
    with pytest.raises(ConfigurationError, match="driver_log_verbosity must be one of"):
        HorovodRunner(np=2, driver_log_verbosity="everything")
    with pytest.raises(ConfigurationError, match="np must be an integer"):
        HorovodRunner(np="2")
    with pytest.raises(ConfigurationError, match="HorovodRunner sets 'backend' itself"):
        HorovodRunner(np=2, backend="torch")
    with pytest.raises(TypeError):
        HorovodRunner(2)  # keyword-only, as sparkdl's


def test_np_negative_runs_processes_on_the_driver_and_streams_their_output():
    lines = []
    out = HorovodRunner(np=-2, log_sink=lines.append).run(hh.collectives)
    assert out["rank"] == 0 and out["sum"] == 3.0
    assert "[rank 1] rank 1 of 2 ready\n" in lines  # np < 0: every rank's output, as on Databricks
    assert_no_rank_left()


def test_a_rank_hanging_in_a_collective_is_stopped_by_timeout():
    with pytest.raises(RunTimeoutError, match=r"timeout=12s.*reached the rendezvous: \[0, 1\]"):
        HorovodRunner(np=-2, timeout=12).run(hh.fail_on, rank_to_fail=1, how="hang")
    assert_no_rank_left()
