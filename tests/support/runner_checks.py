"""Runner behaviour checks shared by the local-mode (np<0) and Spark (np>0) test modules."""

import socket
import threading
import time

import psutil
import pytest

from sparkml_dist import ConfigurationError, RunTimeoutError, WorkerError
from sparkml_dist.runner import BarrierRunner
from sparkml_dist.runner.tasks import standby
from sparkml_dist.runner.tasks.keeper import KEEPER_MARK
from sparkml_dist.runner.tasks.warm_pool import POOL_MARK
from tests.support import runner_helpers as h

RANK_MARK = "sparkml_dist.runner.tasks.rank import run"
SUITE_ENV = "SPARKML_DIST_TEST_SUITE"  # set once per pytest run (tests/conftest.py), inherited by
# every process the run starts (Spark's JVMs, their Python workers, the ranks): the leak check sees
# only this run's ranks, so a pass can run beside another suite or a user's own job.


def _cmdline(p) -> str:
    return " ".join(p.cmdline() or [])


def is_rank(p) -> bool:
    """A rank started cold (``python -c RANK_ENTRY``), or its keeper, or a rank forked by a warm pool
    (its parent a pool)."""
    cmd = _cmdline(p)
    if RANK_MARK in cmd or KEEPER_MARK in cmd:
        return True
    if is_standby(p):
        return False
    return POOL_MARK in cmd and p.ppid() > 1 and POOL_MARK in _cmdline(psutil.Process(p.ppid()))


def is_standby(p) -> bool:
    """A pool's standby (:mod:`sparkml_dist.runner.tasks.standby`): forked ahead, not a rank yet."""
    try:
        return p.name().startswith(standby.NAME.decode())
    except psutil.Error:
        return False


def pool_socket(p) -> str:
    """The name of the socket pool process ``p`` serves (``<anchor>-<key>.sock``; its directory is
    ``warm_pool.pool_dir()``): read from the process's own sockets, never from its command line."""
    import os

    for conn in p.net_connections(kind="unix"):
        if conn.laddr and conn.laddr.endswith(".sock"):
            return os.path.basename(conn.laddr)
    return ""


def pool_processes(suite=None):
    """The warm pools (not their ranks) this pytest run's processes started."""
    return _mine(lambda p: POOL_MARK in _cmdline(p) and not is_rank(p) and not is_standby(p), suite)


def standby_processes(suite=None, ready=False):
    """The pools' standbys this pytest run's processes started (they end with their pool);
    ``ready``: only those that made their imports."""
    return _mine(lambda p: is_standby(p) and (not ready or p.name() == standby.NAME.decode()), suite)


def rank_processes(suite=None):
    """The rank processes this pytest run started (``suite``: another run's id)."""
    return _mine(is_rank, suite)


def _mine(test, suite=None):
    import os

    mine = suite or os.environ[SUITE_ENV]
    out = []
    for p in psutil.process_iter():
        try:
            if test(p) and p.environ().get(SUITE_ENV) == mine:
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def assert_no_rank_left(within=10.0):
    deadline = time.time() + within
    while rank_processes() and time.time() < deadline:
        time.sleep(0.2)
    left = rank_processes()
    assert left == [], "rank processes survived the run: " + "; ".join(map(describe, left))


def describe(p) -> str:
    """What a test's failure message says of a process: enough to find what started it."""
    try:
        parent = psutil.Process(p.ppid())
        return (
            f"pid {p.pid} {p.name()!r} ({p.status()}, {time.time() - p.create_time():.0f} s old), "
            f"parent {parent.pid} {parent.name()!r}: {_cmdline(p)[:160]!r}"
        )
    except psutil.Error as exc:
        return f"pid {p.pid} ({exc.__class__.__name__})"


class RunnerChecks:
    """Subclasses set ``np_sign`` (+1 Spark tasks, -1 local processes) and provide ``spark``."""

    np_sign = 1

    def runner(self, n=2, **kw):
        return BarrierRunner(self.np_sign * n, **kw)

    def test_run_returns_rank0_and_all(self, spark):
        lines = []
        r = self.runner(2, log_ranks="all", log_sink=lines.append)
        res = r.run(h.allreduce_rank_sum, 7)
        assert res["sum"] == 3.0 and res["x"] == 7
        env = res["env"]
        assert env["RANK"] == "0" and env["WORLD_SIZE"] == "2" and env["LOCAL_WORLD_SIZE"] == "2"
        assert int(env["MASTER_PORT"]) > 0
        both = self.runner(2, log_ranks="none", log_sink=lines.append).run(
            h.allreduce_rank_sum, 1, return_all=True
        )
        assert [b["env"]["RANK"] for b in both] == ["0", "1"]
        assert {b["env"]["LOCAL_RANK"] for b in both} == {"0", "1"}
        assert "[rank 0] hello from rank 0\n" in lines and "[rank 1] hello from rank 1\n" in lines
        assert sum("hello" in x for x in lines) == 2  # log_ranks="none" streamed nothing
        assert_no_rank_left()

    @pytest.mark.parametrize("fail_rank", [0, 1])
    def test_rank_raises(self, spark, fail_rank):
        t = time.time()
        with pytest.raises(WorkerError) as info:
            self.runner(2, timeout=120).run(h.fail_on, fail_rank, "raise")
        assert time.time() - t < 60
        err = info.value
        assert err.rank == fail_rank and err.exit_code == 1
        assert "injected failure at step 2" in err.worker_traceback
        assert "ValueError" in err.worker_traceback
        assert_no_rank_left()

    def test_rank_exits(self, spark):
        with pytest.raises(WorkerError, match="rank 1 exited with code 7") as info:
            self.runner(2, timeout=120).run(h.fail_on, 1, "exit")
        assert info.value.exit_code == 7
        assert_no_rank_left()

    def test_rank_sigkilled(self, spark):
        t = time.time()
        with pytest.raises(WorkerError, match=r"rank 0 was killed by signal 9 \(SIGKILL\)"):
            self.runner(2, timeout=120).run(h.fail_on, 0, "kill")
        assert time.time() - t < 60
        assert_no_rank_left()

    def test_rank_never_reaches_rendezvous(self, spark):
        t = time.time()
        with pytest.raises(WorkerError, match=r"ranks \[1\] did not reach the rendezvous") as info:
            self.runner(2, start_timeout=8, timeout=120).run(h.sleep_before_init, 1, 300)
        assert time.time() - t < 60
        assert info.value.rank == 1
        assert_no_rank_left()

    def test_wall_clock_timeout_cancels_everything(self, spark):
        t = time.time()
        with pytest.raises(RunTimeoutError, match=r"timeout=6s"):
            self.runner(2, timeout=6).run(h.fail_on, 1, "hang", 0)
        assert time.time() - t < 40
        assert_no_rank_left(within=20)

    def test_slow_rank_that_finishes_is_not_a_failure(self, spark):
        # rank 1 sleeps 5 s before init_process_group, within start_timeout=20
        assert self.runner(2, start_timeout=20, timeout=120).run(h.sleep_before_init, 1, 5) == "done"
        assert_no_rank_left()

    def test_unpicklable_function_is_refused_on_the_driver(self, spark):
        lock = threading.Lock()

        def main():
            with lock:
                return 1

        with pytest.raises(ConfigurationError, match=r"captures 'lock' \(_thread.lock\)"):
            self.runner(2).run(main)

    def test_two_runs_at_once_and_a_busy_port(self, spark):
        blocker = socket.socket()
        blocker.bind(("0.0.0.0", 0))
        blocker.listen(1)
        results, errors = [], []

        def go(x):
            try:
                results.append(self.runner(2, timeout=180).run(h.allreduce_rank_sum, x))
            except Exception as exc:  # noqa: BLE001 - asserted below
                errors.append(exc)

        threads = [threading.Thread(target=go, args=(x,)) for x in (1, 2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(300)
        blocker.close()
        assert not errors, errors
        assert sorted(r["x"] for r in results) == [1, 2]
        assert len({r["env"]["MASTER_PORT"] for r in results}) == 2
        assert_no_rank_left()

    def test_ctrl_c_on_the_driver_cancels_the_run(self, spark):
        import os
        import signal

        timer = threading.Timer(6.0, lambda: os.kill(os.getpid(), signal.SIGINT))
        t = time.time()
        timer.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                self.runner(2, timeout=300).run(h.fail_on, 1, "hang", 0)
        finally:
            timer.cancel()
        assert time.time() - t < 60
        assert_no_rank_left(within=20)
