"""Spare executors kept warm (``executor_loss="replace"``, :mod:`sparkml_dist.runner.tasks.spares`):
the warm job's task starts the very pool that a rank of the run, any rank, a replacement too, is
forked from on that executor. No Spark: the warm task runs in a child process (its parent, this
process, stands for the executor's Spark daemon), and the run's ranks in tasks on a thread gang,
whose pool anchor is this process too."""

import multiprocessing
import os
import threading
import time

import psutil
import pyarrow as pa

from sparkml_dist import collection, serialization
from sparkml_dist.runner.settings import Logs, RankEnv, Timeouts
from sparkml_dist.runner.task_spec import TaskSpec
from sparkml_dist.runner.tasks import task as _task
from sparkml_dist.runner.tasks import warm_pool
from sparkml_dist.runner.tasks.gangs import ThreadGang
from sparkml_dist.runner.tasks.spares import Spares
from sparkml_dist.runner.tasks.warm_spare import warm_pool_here
from tests.support.runner_checks import assert_no_rank_left, pool_processes, pool_socket, standby_processes


def parent_pid():
    import psutil

    return psutil.Process().ppid()


def parent_and_preloaded():
    """Its parent, its pid, and whether a first step's imports were made before it ran."""
    import sys

    import psutil

    return psutil.Process().ppid(), os.getpid(), "torch._dynamo" in sys.modules


def _spec(env, warm=True, fn=parent_pid):
    return TaskSpec(
        timeouts=Timeouts(start=60.0, collective=60.0),
        run_id="t" + str(time.time_ns()),
        world_size=2,
        payload=serialization.dumps((fn, (), {}, True)),
        backend="torch",
        logs=Logs(ranks=()),
        channel=None,
        secret=b"s",
        return_all=True,
        max_result_bytes=1 << 30,
        env=RankEnv(user=tuple(env.items())),
        warm_ranks=warm,
    )


def _warm_in_child(spec) -> list:
    """``warm_pool_here`` in a child process (its parent, this one, is the anchor), its rows."""
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as p:
        return p.apply(_rows, (spec,))


def _rows(spec):
    return [b.to_pydict()["started"] for b in warm_pool_here(iter(()), spec)]


def _ranks(spec) -> list:
    """What each rank of ``spec`` returned, run by tasks on a thread gang (anchor: this process)."""
    gang, out = ThreadGang(2, timeout=60), {}

    def task(r):
        out[r] = list(_task.supervise(gang.member(r), iter(()), spec))

    threads = [threading.Thread(target=task, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    results = collection.decode(pa.Table.from_batches(out[0] + out[1]), [0, 1], what="rank")
    return [results[(k, 0)] for k in (0, 1)]


def test_the_warm_job_starts_the_pool_the_runs_ranks_are_forked_from():
    """Slow (~6 s): a pool imports torch."""
    env = {"POOL_TEST": f"spare-{os.urandom(4).hex()}"}  # a key no pool has yet
    before = {p.pid for p in pool_processes()}
    spec = _spec(env)
    assert _warm_in_child(spec) == [[1]]
    started = [p for p in pool_processes() if p.pid not in before]
    assert len(started) == 1, started  # the child ended; the pool it started stays (its anchor lives)
    pool = started[0]
    assert pool_socket(pool).startswith(f"{os.getpid()}-")  # anchored where rank tasks are
    again = _spec(env)  # another run of the same settings (a new run id: not part of the key)
    assert set(_ranks(again)) == {pool.pid}  # both ranks forked from the pool warmed ahead
    assert _warm_in_child(again) == [[1]] and pool.is_running()  # warming again keeps it
    assert [p.pid for p in pool_processes() if p.pid not in before] == [pool.pid]
    assert_no_rank_left()


def test_a_spare_executors_pool_hands_its_next_rank_to_a_standby_with_a_first_steps_imports():
    """Slow (~10 s): a pool imports torch, its standby torch._dynamo.  The lost executor's rank
    starts without that import (what its first optimizer would make while the survivors wait)."""
    env = {"POOL_TEST": f"standby-{os.urandom(4).hex()}"}
    before = {p.pid for p in pool_processes()}
    spec = _spec(env, fn=parent_and_preloaded)
    assert _warm_in_child(spec) == [[1]]
    (pool,) = [p for p in pool_processes() if p.pid not in before]
    deadline = time.time() + 60

    def standbys(ready=False):
        return [s for s in standby_processes(ready=ready) if s.ppid() == pool.pid]

    while not standbys(ready=True) and time.time() < deadline:  # its imports made
        time.sleep(0.2)
    (standby,) = standbys(ready=True)
    assert_no_rank_left()  # a standby is no rank: nothing leaks while it waits
    ranks = _ranks(_spec(env, fn=parent_and_preloaded))
    assert {r[0] for r in ranks} == {pool.pid}  # both the pool's children
    assert [r[1] for r in ranks if r[2]] == [standby.pid]  # one was the standby, its imports made
    assert not standby.is_running() and not standbys()  # it ended as that rank did
    assert _warm_in_child(spec) == [[1]]  # warmed again: a new standby
    while not standbys() and time.time() < deadline:
        time.sleep(0.2)
    again = standbys()
    assert len(again) == 1 and again[0].pid != standby.pid
    warm_pool._send(warm_pool.pool_dir().at(pool_socket(pool)), {"stop": True})
    pool.wait(30)
    gone, alive = psutil.wait_procs(again, timeout=10)
    assert gone and not alive  # it ends with its pool


def test_nothing_is_warmed_without_warm_ranks_or_where_no_spare_can_exist(monkeypatch):
    env = {"POOL_TEST": f"cold-{os.urandom(4).hex()}"}
    before = {p.pid for p in pool_processes()}
    assert _warm_in_child(_spec(env, warm=False)) == [[0]]
    monkeypatch.setenv(warm_pool.WARM_ENV, "0")
    assert _warm_in_child(_spec(env)) == [[0]]
    assert [p for p in pool_processes() if p.pid not in before] == []
    assert Spares.start(None, _spec(env), 2, ready=lambda: True) is None  # local processes (np < 0)
    assert psutil.Process().is_running()
