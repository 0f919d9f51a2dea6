"""The pure parts of several-hosts runs: the world size of an elastic restart, the refusal of a
driver some tasks cannot reach, the host named when it falls silent, min_np's checks.  The same
code runs for real across hosts in tests/hosts."""

import itertools

import pytest

from sparkml_dist import ConfigurationError, InsufficientResourcesError
from sparkml_dist.runner import BarrierRunner, failures, protocol, sizing

pytestmark = pytest.mark.slow  # starts rank processes or waits on timeouts: not in make test-fast


@pytest.fixture(autouse=True)
def quick_settle(monkeypatch):
    monkeypatch.setattr(sizing, "SETTLE_S", 0.3)


def _counts(*values):
    seq = itertools.chain(values, itertools.repeat(values[-1]))
    return lambda spark: next(seq)


def test_a_restart_takes_the_fewest_slots_seen_while_a_lost_executor_is_counted_out():
    said = []
    world = sizing.restart_world(None, 4, 2, 1, 5.0, said.append, slots=_counts(4, 2, 2))
    assert world == 2 and "restarting with 2" in said[0]


def test_a_restart_waits_for_min_np_then_starts_with_what_came():
    world = sizing.restart_world(None, 8, 3, 1, 5.0, lambda s: None, slots=_counts(1, 1, 1, 1, 1, 1, 5))
    assert world == 5


def test_a_restart_never_exceeds_np_and_keeps_whole_tasks():
    assert sizing.restart_world(None, 4, 2, 1, 5.0, lambda s: None, slots=_counts(9)) == 4
    # two ranks per task (two GPUs each): 3 slots hold 6 ranks, np=8 -> 6
    assert sizing.restart_world(None, 8, 2, 2, 5.0, lambda s: None, slots=_counts(3)) == 6


def test_a_restart_with_fewer_than_min_np_slots_fails_naming_min_np():
    with pytest.raises(InsufficientResourcesError, match="min_np=3"):
        sizing.restart_world(None, 4, 3, 1, 0.5, lambda s: None, slots=_counts(2))


def test_min_np_is_checked_with_its_name():
    for bad, match in ((0, "min_np"), (5, "more than np=4"), ("2", "min_np")):
        with pytest.raises(ConfigurationError, match=match):
            BarrierRunner(4, min_np=bad, max_restarts=1)
    with pytest.raises(ConfigurationError, match="max_restarts"):
        BarrierRunner(4, min_np=2)
    with pytest.raises(ConfigurationError, match="local processes"):
        BarrierRunner(-4, min_np=2, max_restarts=1)
    assert BarrierRunner(4, min_np=2, max_restarts=1).min_np == 2


def _peer(host, driver=None):
    return {"host": host, "port": 1, "rows": 0, "gpus": None, "driver": driver}


def test_tasks_that_disagree_on_reaching_the_driver_refuse_the_run_naming_address_and_settings():
    channel = ("10.0.0.1", 4321)
    assert protocol.driver_reach_error([_peer("10.0.0.2"), _peer("10.0.0.3")], channel) is None
    none = [_peer("10.0.0.2", "timeout"), _peer("10.0.0.3", "timeout")]
    assert protocol.driver_reach_error(none, channel) is None  # nobody can: live logs off, training goes on
    some = [_peer("10.0.0.2"), _peer("10.0.0.3", "TimeoutError: timed out"), _peer("10.0.0.3", "x")]
    text = protocol.driver_reach_error(some, channel)
    assert "10.0.0.1 (port 4321) is unreachable from 10.0.0.3 (ranks 1, 2" in text
    assert "reachable from 10.0.0.2" in text and "spark.driver.host" in text and "SPARK_LOCAL_IP" in text


def test_the_error_names_a_host_none_of_whose_ranks_said_a_word():
    m = failures.Monitor(4, lambda s: None)
    for rank, host in enumerate(["10.0.0.2", "10.0.0.3", "10.0.0.2", "10.0.0.3"]):
        m.on_message({"type": protocol.FRAME_RENDEZVOUS, "rank": rank, "host": host})
    lost = ["RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer"]
    m.add_failure({"rank": 0, "message": "rank 0 exited with code 1", "phase": "run", "tail": lost})
    text = str(m.worker_error())
    assert "no word from ranks 1, 3 on 10.0.0.3" in text
    m.add_failure({"rank": 3, "message": "rank 3 exited with code 1", "phase": "run", "tail": lost})
    assert "no word" not in str(m.worker_error())  # a host that reported is not silent


def test_a_collective_that_timed_out_waiting_for_a_cut_off_host_names_that_host():
    m = failures.Monitor(4, lambda s: None)
    for rank, host in enumerate(["10.0.0.2", "10.0.0.3", "10.0.0.2", "10.0.0.3"]):
        m.on_message({"type": protocol.FRAME_RENDEZVOUS, "rank": rank, "host": host})
    timed_out = [
        "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:129] "
        "Timed out waiting 15000ms for send operation to complete"
    ]
    m.add_failure({"rank": 0, "message": "rank 0 exited with code 1", "phase": "run", "tail": timed_out})
    m.add_failure({"rank": 2, "message": "rank 2 exited with code 1", "phase": "run", "tail": timed_out})
    assert "no word from ranks 1, 3 on 10.0.0.3" in str(m.worker_error())


def test_a_rank_that_failed_by_itself_before_the_rendezvous_blames_no_healthy_host():
    m = failures.Monitor(2, lambda s: None)
    m.on_message({"type": protocol.FRAME_RENDEZVOUS, "rank": 0, "host": "10.0.0.2"})  # healthy, waiting
    m.add_failure(
        {"rank": 1, "message": "rank 1 exited with code 1", "phase": "start",
         "tail": ["ModuleNotFoundError: No module named 'mylib'"]}
    )  # fmt: skip
    text = str(m.worker_error())
    assert "rank 1 exited with code 1" in text and "no word" not in text and "10.0.0.2" not in text


def _lost(executor, reason="Command exited with code 137"):
    return RuntimeError(
        "Job aborted due to stage failure: Task 1 in stage 7.0 failed 1 times, most recent failure: "
        f"Lost task 1.0 in stage 7.0 (TID 31) (10.0.0.3 executor {executor}): ExecutorLostFailure "
        f"(executor {executor} exited caused by one of the running tasks) Reason: {reason}\n"
        "Driver stacktrace:\n"
        "\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages(DAGScheduler.scala:2898)"
    )


def test_two_hosts_lost_one_after_the_other_are_not_the_same_bug_and_restarts_go_on(monkeypatch):
    monkeypatch.setattr(failures, "FAILURE_GRACE_S", 0.01)
    tries = []
    for executor in ("1", "2"):  # two different machines, the same JVM frames
        err = failures.translate(_lost(executor), failures.Monitor(2, lambda s: None))
        assert err.lost_host == executor and "Spark lost executor" in str(err)
        tries.append(err)
    assert failures.restart_verdict(tries, max_restarts=3) == ""  # goes on (elastic: with fewer ranks)
    assert "max_restarts=1 used up" in failures.restart_verdict(tries, max_restarts=1)
    # the ranks left behind said only that their peer went away: still a lost machine
    m = failures.Monitor(2, lambda s: None)
    m.add_failure({"rank": 0, "message": "rank 0 exited with code 1", "phase": "run", "tail": lost_peer()})
    assert failures.translate(_lost("3"), m).lost_host == "3"
    # a rank whose own code failed when its executor went down too: the code is the cause
    m = failures.Monitor(2, lambda s: None)
    m.add_failure(
        {"rank": 0, "message": "rank 0 exited with code 1", "phase": "run", "tail": ["KeyError: 'x'"]}
    )
    same = [failures.translate(_lost("4"), m) for _ in range(2)]
    assert same[0].lost_host is None and "repeated identically" in failures.restart_verdict(same, 3)


def test_an_executor_that_died_silently_twice_is_a_lost_machine_not_the_same_bug(monkeypatch):
    """Executors on one host: the survivor's report (its peer went away) reaches the driver before
    Spark names the lost executor, and the job is cancelled; the rank that never said a word marks
    the loss, so two such losses do not stop the restarts as "the same failure"."""
    tries = []
    for _ in range(2):
        m = failures.Monitor(2, lambda s: None)
        for rank in (0, 1):
            m.on_message({"type": protocol.FRAME_RENDEZVOUS, "rank": rank, "host": "10.0.0.2"})
        peer_gone = {"rank": 0, "message": "rank 0 exited with code 1", "phase": "run", "tail": lost_peer()}
        m.add_failure(peer_gone)
        tries.append(m.worker_error())
    assert tries[0].lost_host == "rank 1's executor on 10.0.0.2", tries[0].lost_host
    assert failures.restart_verdict(tries, max_restarts=3) == ""
    # the silent rank's own failure arrives: it is the cause, and the same one twice is a bug
    m = failures.Monitor(2, lambda s: None)
    for rank in (0, 1):
        m.on_message({"type": protocol.FRAME_RENDEZVOUS, "rank": rank, "host": "10.0.0.2"})
    m.add_failure({"rank": 0, "message": "rank 0 exited with code 1", "phase": "run", "tail": lost_peer()})
    m.add_failure({"rank": 1, "message": "rank 1 exited with code 3", "phase": "run", "tail": ["KeyError"]})
    bug = [m.worker_error(), m.worker_error()]
    assert bug[0].lost_host is None and "repeated identically" in failures.restart_verdict(bug, 3)


def test_the_driver_stops_waiting_for_reports_once_the_silent_ranks_executor_is_gone():
    """Every report only says a peer went away: the driver waits up to 5 s for the root cause,
    unless Spark already dropped the silent rank's executor (a report from it can never come)."""
    import time

    def waited(gone):
        m = failures.Monitor(2, lambda s: None)
        for rank in (0, 1):
            m.on_message({"type": protocol.FRAME_RENDEZVOUS, "rank": rank, "host": "10.0.0.2"})
        asked = []
        m.executor_gone = lambda ranks: asked.append(ranks) or gone
        m.add_failure(
            {"rank": 0, "message": "rank 0 exited with code 1", "phase": "run", "tail": lost_peer()}
        )
        t = time.monotonic()
        m.wait_for_reports(grace=0.2, symptom_grace=3.0)
        return time.monotonic() - t, asked

    fast, asked = waited(True)
    assert fast < 0.5 and asked[0] == [1], (fast, asked)  # asked about the rank that said nothing
    slow, _ = waited(False)
    assert slow >= 2.9, slow


def lost_peer():
    return ["RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer"]


def test_a_rank_killed_from_outside_twice_is_no_bug_and_restarts_go_on():
    from sparkml_dist import WorkerError

    killed = [WorkerError("rank 1 was killed by signal 9 (SIGKILL)", rank=1, exit_code=-9) for _ in range(2)]
    assert failures.restart_verdict(killed, max_restarts=5) == ""  # the OOM killer, a preemption
    assert "max_restarts=1 used up" in failures.restart_verdict(killed, max_restarts=1)
    crashed = [WorkerError("rank 1 exited with code 3", rank=1, exit_code=3) for _ in range(2)]
    assert "repeated identically" in failures.restart_verdict(crashed, max_restarts=5)
