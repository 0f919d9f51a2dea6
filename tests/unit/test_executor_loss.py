"""The driver's side of ``executor_loss="replace"``: which lost executor's task joins the survivors,
and the arguments refused by name (the survival itself: tests/spark/test_restarts.py, standalone)."""

import time

import pytest

from sparkml_dist.errors import ConfigurationError
from sparkml_dist.runner import BarrierRunner, protocol
from sparkml_dist.runner.elastic.executor_loss import Replacements
from sparkml_dist.runner.peer_exchange import Announces


def _book(max_restarts=1, failing=False):
    failures, said = [], []
    book = Replacements(1, max_restarts, failures.append, lambda: failing or bool(failures), said.append)
    return book, failures, said


def test_a_task_announced_again_after_the_answer_joins_with_its_new_address_marked_replaces():
    book, failures, said = _book()
    got = {0: [], 1: [], "again": []}
    a = Announces(tasks=2, fallback_s=None, again=book.again, store=("10.0.0.1", 4242))
    a.add({"task": 0, "ranks": "[0]"}, got[0].append)
    a.add({"task": 1, "ranks": "[1]"}, got[1].append)
    store = {"store": ["10.0.0.1", 4242]}  # every answer names the driver's store
    assert got[1] == [{"type": protocol.FRAME_PEERS, "tasks": ["[0]", "[1]"], **store}]
    a.add({"task": 1, "ranks": "[1 elsewhere]", "attempt": 1}, got["again"].append)
    again = {"type": protocol.FRAME_PEERS, "tasks": ["[0]", "[1 elsewhere]"], "replaces": True, **store}
    assert got["again"] == [again]
    assert got[0] == got[1] and len(got[0]) == 1  # the survivors are told nothing
    assert not failures and "rank 1 lost with its executor" in said[0] and "(attempt 1)" in said[0]


def test_a_task_started_again_before_the_answer_is_no_replacement():
    book, failures, _ = _book()
    got = {0: [], 1: []}
    a = Announces(tasks=2, fallback_s=None, again=book.again)
    a.add({"task": 1, "ranks": "[1 first]"}, got[1].append)
    a.add({"task": 1, "ranks": "[1 again]", "attempt": 1}, got[1].append)
    a.add({"task": 0, "ranks": "[0]"}, got[0].append)
    assert got[0] == [{"type": protocol.FRAME_PEERS, "tasks": ["[0]", "[1 again]"]}]
    assert book.used == 0 and not failures


def test_past_max_restarts_or_in_a_failing_run_the_attempt_fails_instead():
    book, failures, _ = _book(max_restarts=1)
    assert book.again(1, 1) is True
    assert book.again(1, 2) is False  # the second replacement of one attempt, max_restarts=1
    assert "max_restarts=1" in failures[-1]["message"] and failures[-1]["rank"] == 1
    book, failures, _ = _book(max_restarts=5)
    assert book.again(0, 1) is True and not failures  # rank 0 too: the driver serves the store
    book, failures, _ = _book(failing=True)
    assert book.again(1, 1) is False and not failures  # cancelled with the job: nothing more to say


def test_ranks_that_left_a_decommissioned_executor_start_again_without_using_a_restart():
    """The decommission watch told rank 1 to leave (its executor is going): its task, run again
    by Spark, joins the others and costs none of max_restarts; its next loss is a loss again."""
    failures, said, leaving = [], [], {1}

    def left(ranks):
        gone = set(ranks) <= leaving
        leaving.difference_update(ranks)
        return gone

    book = Replacements(1, 1, failures.append, lambda: bool(failures), said.append, left=left)
    assert book.again(1, 1) is True and book.used == 0
    assert "rank 1 left its decommissioned executor" in said[-1] and "(attempt 1)" in said[-1]
    assert book.again(1, 2) is True and book.used == 1 and "lost with its executor" in said[-1]
    assert book.again(1, 3) is False and "max_restarts=1" in failures[-1]["message"]


def test_not_every_plain_task_in_within_start_timeout_fails_the_attempt_naming_the_slots():
    book, failures, _ = _book()
    got = []
    a = Announces(tasks=2, fallback_s=0.2, again=book.again, short=lambda n: book.short(n, 2, 0.2))
    a.add({"task": 0, "ranks": "[0]"}, got.append)
    time.sleep(0.6)
    assert got == []  # no allGather to fall back to
    assert "only 1 of the run's 2 tasks started within start_timeout=0.2s" in failures[0]["message"]


@pytest.mark.parametrize(
    "kwargs, named",
    [
        (dict(executor_loss="sometimes"), "executor_loss must be 'restart'"),
        (dict(executor_loss="replace"), "set max_restarts >= 1"),
        (dict(executor_loss="replace", max_restarts=1, backend="horovod"), "backend='torch' only"),
        (dict(executor_loss="replace", max_restarts=1, min_np=1, resize_wait=0), "resize_wait must be"),
        (dict(executor_loss="replace", max_restarts=1, resize_wait="30s"), "resize_wait must be"),
    ],
)
def test_executor_loss_refused_by_name_where_it_cannot_hold(kwargs, named):
    with pytest.raises(ConfigurationError, match=named):
        BarrierRunner(2, **kwargs)


def test_executor_loss_replace_refuses_local_processes():
    with pytest.raises(ConfigurationError, match="for Spark tasks"):
        BarrierRunner(-2, max_restarts=1, executor_loss="replace")


def test_a_task_whose_executor_spark_lost_too_often_names_spark_task_max_failures():
    """Spark counts a SIGKILLed executor as its task's failure: the run's error says the limit."""
    from sparkml_dist.runner.failures import Monitor, translate

    text = (
        "Job aborted due to stage failure: Task 1 in stage 3.0 failed 4 times, most recent failure: "
        "Lost task 1.3 in stage 3.0 (TID 9) (192.0.2.2 executor 7): ExecutorLostFailure (executor 7 "
        "exited caused by one of the running tasks) Reason: Command exited with code 137"
    )
    error = translate(RuntimeError(text), Monitor(2, lambda _: None))
    assert "Spark lost executor 7" in str(error) and "ran that task 4 times" in str(error)
    assert "spark.task.maxFailures" in str(error) and error.lost_host == "7"


def test_a_task_started_again_after_another_rank_finished_is_told_the_run_is_over():
    """The training is done: no group is left to join, so the task ends without its ranks
    (instead of a new rank waiting for a store that left with rank 0)."""
    failures, said, done = [], [], set()
    book = Replacements(1, 3, failures.append, lambda: False, said.append, lambda: bool(done))
    got = []
    a = Announces(tasks=2, fallback_s=None, again=book.again)
    a.add({"task": 0, "ranks": "[0]"}, got.append)
    a.add({"task": 1, "ranks": "[1]"}, got.append)
    done.add(0)  # rank 0's task reported its end
    a.add({"task": 1, "ranks": "[1 again]", "attempt": 1}, got.append)
    assert got[-1] == {"type": protocol.FRAME_PEERS, "over": True}
    assert book.used == 0 and not failures and "after the others finished" in said[-1]


def test_the_drivers_store_serves_clients_and_ends_with_its_object():
    import datetime
    import socket

    import torch.distributed as dist

    from sparkml_dist.runner.elastic.executor_loss import serve_store

    store = serve_store("127.0.0.1", 10.0)
    port = store.port
    client = dist.TCPStore("127.0.0.1", port, None, False, timeout=datetime.timedelta(seconds=5))
    client.set("k", "v")
    assert store.get("k") == b"v"
    del client, store
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_a_world_that_may_shrink_in_place_needs_streams_every_size_shares():
    """``min_np=2`` of ``np=4``: 3 ranks cannot share 4 streams; the error names the fix (12)."""
    from sparkml_dist.runner.data.resize import check_streams
    from sparkml_dist.runner.elastic.executor_loss import check_resizable_data

    with pytest.raises(ConfigurationError, match=r"streams=4, which a world of 3 ranks.*streams=12\)"):
        check_streams(4, min_np=2, world=4)
    check_streams(12, min_np=2, world=4)
    runner = BarrierRunner(2, max_restarts=1, min_np=1, executor_loss="replace")
    with pytest.raises(ConfigurationError, match="replicas"):
        check_resizable_data(runner, None, 2)
    check_resizable_data(runner, None, None)  # 2 streams: worlds of 1 and 2 share them


def test_the_console_names_the_host_a_lost_executors_ranks_ran_on():
    book, failures, said = _book()
    book.hosts.update({0: "10.0.0.2", 1: "10.0.0.3"})  # what the ranks announced at the rendezvous
    assert book.again(1, 1) is True and not failures
    assert said[-1].startswith("[sparkml_dist] rank 1 (on 10.0.0.3) lost with its executor"), said
    assert "a new rank 1 joins the others" in said[-1]
