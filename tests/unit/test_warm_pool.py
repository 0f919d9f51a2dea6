"""Warm ranks (np < 0: the pool's anchor is this process): forked from a pool that imported torch,
kept between runs, one pool per environment, gone with its anchor, closed to strangers."""

import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import psutil
import pytest

from sparkml_dist import RunTimeoutError
from sparkml_dist.runner import BarrierRunner
from sparkml_dist.runner.tasks import warm_pool, warm_rank
from sparkml_dist.runner.tasks.keeper import KEEPER_MARK
from tests.support.runner_checks import assert_no_rank_left, is_rank, pool_processes, pool_socket


def parent_and_draw():
    """This rank's parent process (a pool, or the task), its pid, and a draw of numpy's global RNG."""
    import numpy as np
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    me = psutil.Process()
    parent = me.parent()
    keeper = KEEPER_MARK in " ".join(parent.cmdline())  # a cold rank's: its keeper's parent is the task
    return {"parent": me.ppid(), "pid": me.pid, "draw": float(np.random.rand()), "sum": t.item(),
            "omp": os.environ.get("OMP_NUM_THREADS"), "cwd": os.getcwd(), "argv": sys.argv,
            "cold_of": parent.ppid() if keeper else None}  # fmt: skip


def _run(**kw):
    return BarrierRunner(-2, log_ranks="none", **kw).run(parent_and_draw, return_all=True)


def _warm_run(**kw):
    """A run whose ranks came from a pool: the first of a new environment starts it (its ranks
    forked from it once it has imported torch)."""
    out = _run(**kw)
    assert all(o["cold_of"] is None for o in out), "a rank started cold"
    return out


def test_a_first_run_forks_its_ranks_from_the_pool_it_starts_and_they_behave_as_cold_ones():
    env = {"OMP_NUM_THREADS": "1", "POOL_TEST": f"first-{os.urandom(4).hex()}"}  # no pool has it yet
    out = _warm_run(env=env)
    pools = {o["parent"] for o in out}
    assert len(pools) == 1 and pools != {os.getpid()}
    pool = psutil.Process(pools.pop())
    assert warm_pool.POOL_MARK in " ".join(pool.cmdline()) and not is_rank(pool)
    assert [o["sum"] for o in out] == [2.0, 2.0] and {o["omp"] for o in out} == {"1"}
    assert all(o["argv"] == ["-c"] for o in out)  # as `python -c RANK_ENTRY` has it
    assert all(o["cwd"] != "/" for o in out)  # the rank's own working directory, not the pool's
    again = _run(env=env)
    assert {o["parent"] for o in again} == {pool.pid}  # kept between runs
    draws = [o["draw"] for o in out + again]
    assert len(set(draws)) == 4  # numpy reseeded in each fork: no two ranks share a stream
    cold = _run(env={"OMP_NUM_THREADS": "1"}, warm_ranks=False)
    assert [o["cold_of"] for o in cold] == [os.getpid()] * 2  # each from a keeper of its own
    assert len({o["parent"] for o in cold}) == 2
    assert_no_rank_left()


class _FailingPool:
    """A socket where a pool's would be, whose server takes each rank request (its descriptors
    closed) and then ``answer``s it: "close" (a pool that ended before forking) or "silent" (one
    whose import hangs: the connection stays open, unanswered)."""

    def __init__(self, directory: str, anchor: int, answer: str) -> None:
        self.answer, self.requests, self.held = answer, 0, []
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(os.path.join(directory, f"{anchor}-failing.sock"))
        self.listener.listen(8)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            data = b""
            while not data.endswith(b"\n"):
                chunk, fds, _, _ = socket.recv_fds(conn, 1 << 20, 8)
                for fd in fds:
                    os.close(fd)
                if not chunk:
                    break
                data += chunk
            self.requests += 1
            self.held.append(conn) if self.answer == "silent" else conn.close()


@pytest.mark.parametrize("answer", ["close", "silent"])
def test_a_pool_that_fails_the_request_gets_the_rank_started_cold(answer, monkeypatch):
    directory = tempfile.mkdtemp(prefix="pool-", dir="/tmp")  # short: a Unix socket's path is
    pool = _FailingPool(directory, os.getpid(), answer)
    opened = warm_pool.PoolDir.open(directory)
    of = lambda cls, env, backend, anchor: cls(opened, "failing", backend, anchor)  # noqa: E731
    monkeypatch.setattr(warm_pool.Pool, "of", classmethod(of))
    monkeypatch.setattr(warm_rank, "PID_WAIT_S", 2.0)
    started = time.monotonic()
    out = _run(env={"POOL_TEST": "failing"})
    assert pool.requests == 2  # both ranks were asked of it
    assert {o["cold_of"] for o in out} == {os.getpid()} and [o["sum"] for o in out] == [2.0, 2.0]
    assert time.monotonic() - started < 60
    pool.listener.close()
    shutil.rmtree(directory)
    assert_no_rank_left()


def test_a_pool_stopped_just_after_it_took_the_request_gets_the_rank_started_cold(monkeypatch):
    """Another task making room stops a pool and removes its socket between this task's request and
    its mark of the pool as in use (seen once in CI: the request's thread died on the missing socket,
    the rank never started, and the run waited out its timeout)."""
    directory = tempfile.mkdtemp(prefix="pool-", dir="/tmp")
    pool = _FailingPool(directory, os.getpid(), "close")
    opened = warm_pool.PoolDir.open(directory)
    of = lambda cls, env, backend, anchor: cls(opened, "failing", backend, anchor)  # noqa: E731
    monkeypatch.setattr(warm_pool.Pool, "of", classmethod(of))
    send_fds = socket.send_fds

    def send_then_vanish(conn, buffers, fds):
        sent = send_fds(conn, buffers, fds)
        if conn.family == socket.AF_UNIX and str(conn.getpeername()).startswith(directory):
            os.unlink(conn.getpeername())  # as _make_room does to the pool it stops
        return sent

    monkeypatch.setattr(warm_rank.socket, "send_fds", send_then_vanish)
    monkeypatch.setattr(warm_pool.Pool, "start", lambda self, env: None)  # no new pool at that path
    started = time.monotonic()
    out = BarrierRunner(-2, log_ranks="none", timeout=60).run(parent_and_draw, return_all=True)
    assert pool.requests >= 1 and not os.path.exists(os.path.join(directory, f"{os.getpid()}-failing.sock"))
    assert {o["cold_of"] for o in out} == {os.getpid()} and [o["sum"] for o in out] == [2.0, 2.0]
    assert time.monotonic() - started < 30
    pool.listener.close()
    shutil.rmtree(directory)
    assert_no_rank_left()


def test_a_rank_killed_before_its_pool_forks_it_is_never_forked():
    """A task cancelled while the pool it started still imports torch: its rank ends at once
    (-SIGKILL) and is never started; a request whose connection ended before the pool read it
    (its task gone meanwhile) forks nothing."""
    env = {**os.environ, "POOL_TEST": f"killed-{os.urandom(4).hex()}"}
    pool = warm_pool.Pool.of(env, "torch", os.getpid())
    pool.start(env)  # returns once the pool's socket accepts; its import goes on
    server = next(p for p in pool_processes() if pool_socket(p) == pool.name)
    pids = []
    proc = pool.fork(env, "/tmp", (sys.stderr.fileno(),), pids.append)
    proc.kill()
    assert proc.wait(1) == -signal.SIGKILL and proc.pid is None
    pipes = [os.pipe() for _ in range(4)]
    with socket.socket(socket.AF_UNIX) as s:  # a whole request, then the task is gone
        s.connect(pool.path)
        line = json.dumps({"env": {"RANK": "0", "WORLD_SIZE": "1"}, "cwd": "/tmp"}).encode() + b"\n"
        socket.send_fds(s, [line], [r for r, _ in pipes])
        s.shutdown(socket.SHUT_WR)
        s.settimeout(60)  # read once the pool has imported torch and serves
        assert s.recv(100) == b"", "the pool forked a rank for a request whose task had gone"
    assert server.children() == [] and pids == [] and proc.pid is None
    for r, w in pipes:
        os.close(r)
        os.close(w)
    proc.close()
    server.kill()


def test_runs_with_another_environment_never_share_a_pool():
    a = _warm_run(env={"OMP_NUM_THREADS": "1", "POOL_TEST": "a"})
    b = _warm_run(env={"OMP_NUM_THREADS": "1", "POOL_TEST": "b"})
    assert {o["parent"] for o in a}.isdisjoint({o["parent"] for o in b})
    assert len(pool_processes()) <= warm_pool.MAX_POOLS  # the least recently used ones stop


def test_rendezvous_variables_another_launcher_left_behind_keep_the_pool(monkeypatch):
    """TorchDistributor leaves its run's MASTER_PORT, rendezvous id and data file in the Spark
    Python worker it ran in, which Spark reuses for our next task: the next run is still warm, and
    its ranks still see what their process environment holds (as a cold rank would)."""
    env = {"OMP_NUM_THREADS": "1", "POOL_TEST": "leftover"}
    first = _warm_run(env=env)
    pool = {o["parent"] for o in first}
    for n in (1, 2):
        monkeypatch.setenv("MASTER_PORT", str(29500 + n))
        monkeypatch.setenv("PYSPARK_TORCH_DISTRIBUTOR_RDZV_ID", f"rdzv-{n}")
        monkeypatch.setenv("SPARK_PARTITION_ARROW_DATA_FILE", f"/tmp/gone-{n}.arrow")
        again = _run(env=env)
        assert {o["parent"] for o in again} == pool and [o["sum"] for o in again] == [2.0, 2.0]
    # a setting a framework reads at its import is still another pool
    other = _warm_run(env={**env, "OMP_NUM_THREADS": "2"})
    assert {o["parent"] for o in other}.isdisjoint(pool)
    key = warm_pool.pool_key
    assert key({"MASTER_PORT": "1"}, "torch") == key({"MASTER_PORT": "2"}, "torch")


def leave_a_daemon():
    """Fork a daemon as a library would: a double fork, its own session, no exec (so it shows the
    pool's environment, not the rank's); its pid comes back."""
    import os
    import time

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(w, str(os.getpid()).encode())
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.closerange(3, 1024)
            time.sleep(600)
        os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    return {"daemon": int(os.read(r, 32)), "parent": psutil.Process().ppid()}


def test_a_daemon_a_warm_rank_leaves_behind_ends_with_it():
    env = {"OMP_NUM_THREADS": "1", "POOL_TEST": "daemon"}
    pool = {o["parent"] for o in _warm_run(env=env)}
    out = BarrierRunner(-2, log_ranks="none", env=env).run(leave_a_daemon, return_all=True)
    assert {o["parent"] for o in out} == pool  # they were warm ranks
    daemons = [o["daemon"] for o in out]
    deadline = time.time() + 10
    while any(_running(d) for d in daemons) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(_running(d) for d in daemons), "a warm rank's daemon outlived its rank"
    assert psutil.Process(pool.pop()).is_running()  # the pool itself goes on


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_an_orphan_is_ended_only_once_every_rank_it_may_belong_to_has_ended_and_a_standby_owns_none():
    """Orphans.end in a process of its own (its children are the pool's 'ranks' and 'orphans')."""
    script = textwrap.dedent(
        """
        import subprocess, time
        from sparkml_dist.runner.tasks.orphans import Orphans
        rank = subprocess.Popen(["sleep", "60"])
        orphan = subprocess.Popen(["sleep", "60"])
        left = Orphans()
        left.end(live={rank.pid})
        time.sleep(0.2)
        assert orphan.poll() is None, "killed while a rank it may belong to runs"
        rank.kill(); rank.wait()
        left.forget(rank.pid)
        left.end(live=set())
        assert orphan.wait(5) == -9, orphan.returncode
        later = subprocess.Popen(["sleep", "60"])  # found when no rank runs: ended at once
        left.end(live=set())
        assert later.wait(5) == -9
        # the pool's standby (a child, no rank) is kept, and owns no orphan: one found while only
        # it waits is ended at once (counted an owner, it kept a rank's daemon for the pool's life)
        standby = subprocess.Popen(["sleep", "60"])
        daemon = subprocess.Popen(["sleep", "60"])
        left.end(live=set(), keep={standby.pid})
        assert daemon.wait(5) == -9
        time.sleep(0.2)
        assert standby.poll() is None, "the standby was killed as an orphan"
        standby.kill(); standby.wait()
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "ok", done.stderr


def test_the_pool_ignores_malformed_requests_and_strangers_and_keeps_serving():
    out = _warm_run(env={"POOL_TEST": "hostile"})
    pool = psutil.Process(out[0]["parent"])
    path = os.path.join(warm_pool.pool_dir().path, pool_socket(pool))
    cmdline = " ".join(pool.cmdline())  # which any user can read: neither the socket nor its directory
    assert ".sock" not in cmdline and warm_pool.pool_dir().path not in cmdline
    for junk in (b"{not json\n", json.dumps({"env": {"A": 1}, "cwd": "/"}).encode() + b"\n", b"x" * 70000):
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(path)
            s.sendall(junk)
    with socket.socket(socket.AF_UNIX) as s:  # a rank request without its descriptors
        s.connect(path)
        s.sendall(json.dumps({"env": {}, "cwd": "/"}).encode() + b"\n")
        s.settimeout(10)
        assert s.recv(100) == b""  # dropped, not forked
    # another user cannot even reach the socket (the directory is 0700), nor would be served
    connect = f"import os, socket; os.setuid(65534); socket.socket(socket.AF_UNIX).connect({path!r})"
    nobody = subprocess.run([sys.executable, "-c", connect], capture_output=True, text=True)
    assert nobody.returncode != 0 and "PermissionError" in nobody.stderr
    assert {o["parent"] for o in _run(env={"POOL_TEST": "hostile"})} == {pool.pid}


def test_a_pool_directory_others_can_enter_is_refused(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    shared = tmp_path / f"sparkml_dist-pool-{os.getuid()}"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    assert warm_pool.pool_dir() is None  # every rank then starts cold
    shared.rmdir()
    shared.symlink_to(tmp_path)
    assert warm_pool.pool_dir() is None
    shared.unlink()
    assert warm_pool.pool_dir().path == str(shared) and (shared.stat().st_mode & 0o777) == 0o700


def test_the_pool_and_its_ranks_end_with_the_process_that_anchors_it(tmp_path):
    """A driver (np < 0) killed with SIGKILL: its pool, and a rank it was running, go with it.
    Slow (~10 s): a driver of its own, two runs to warm its pool."""
    script = tmp_path / "driver.py"
    script.write_text(
        textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {os.getcwd()!r})
        from tests.unit.test_warm_pool import _warm_run
        from sparkml_dist.runner import BarrierRunner
        out = _warm_run(env={{"POOL_TEST": "anchor"}})
        print(out[0]["parent"], flush=True)
        BarrierRunner(-2, log_ranks="none", env={{"POOL_TEST": "anchor"}}).run(time.sleep, 600)
    """)
    )
    driver = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pool = psutil.Process(int(driver.stdout.readline()))
        deadline = time.time() + 60
        while len([c for c in pool.children() if is_rank(c)]) < 2 and time.time() < deadline:
            time.sleep(0.2)
        ranks = pool.children()
        assert len(ranks) == 2
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    gone, alive = psutil.wait_procs([pool, *ranks], timeout=15)
    assert alive == []


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_what_ranks_started_with_their_own_environment_ends_when_the_driver_is_killed(tmp_path, warm):
    """A driver (np < 0) killed with SIGKILL while its ranks hang, each having started a process in
    a session of its own with an environment of its own (no token of the run to find it by): the
    pool, or each cold rank's keeper, ends it.  Slow (~10 s): a driver of its own."""
    marker = f"{800 + warm}.25"
    script = tmp_path / "driver.py"
    script.write_text(
        textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.getcwd()!r})
        from sparkml_dist.runner import BarrierRunner
        from tests.support import runner_helpers as h
        BarrierRunner(-2, log_ranks="none", warm_ranks={warm}).run(h.own_env_children, {marker!r}, "hang")
    """)
    )

    def left():
        return [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]

    driver = subprocess.Popen([sys.executable, str(script)])
    try:
        deadline = time.time() + 60
        while len(left()) < 4 and time.time() < deadline:  # 2 ranks x (a child, a daemon)
            time.sleep(0.2)
        assert len(left()) == 4
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    deadline = time.time() + 15
    while left() and time.time() < deadline:
        time.sleep(0.2)
    stayed = left()
    for p in stayed:
        p.kill()
    assert not stayed, [p.info["cmdline"] for p in stayed]
    assert_no_rank_left()


# ------------------------------------------------------------------ another user on a shared TMPDIR
NOBODY = 65534


class _Stranger:
    """Another user's process (uid 65534, forked from this one: no interpreter of ours to execute)
    serving a Unix socket at ``path``; :meth:`heard` is what connections sent it, in bytes."""

    def __init__(self, path):
        out_r, out_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the stranger: bind as uid 65534, count what each connection sends
            try:
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                os.closerange(3, out_w)  # nothing of the test's (pytest's pipes) held open
                os.closerange(out_w + 1, 65536)
                os.setgid(NOBODY)
                os.setuid(NOBODY)
                s = socket.socket(socket.AF_UNIX)
                s.bind(path)
                s.listen(8)
                os.write(out_w, b"ready\n")
                while True:
                    conn, _ = s.accept()
                    conn.settimeout(3)
                    got = 0
                    try:
                        while chunk := conn.recv(65536):
                            got += len(chunk)
                    except OSError:
                        pass
                    os.write(out_w, f"{got}\n".encode())
            finally:
                os._exit(0)
        os.close(out_w)
        self.out = os.fdopen(out_r)
        assert self.out.readline().strip() == "ready"

    def heard(self):
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        return [int(line) for line in self.out.read().split() if int(line)]


def _forked(pool, env) -> bool:
    """Whether a rank asked of ``pool`` was forked by a pool (not started cold); killed after."""
    r, w = os.pipe()
    proc = pool.fork(env, "/tmp", (w,), lambda pid: None)
    os.close(w)
    try:
        deadline = time.monotonic() + 60
        while proc.pid is None and time.monotonic() < deadline:
            time.sleep(0.1)
        return proc.pid is not None and not proc.cold
    finally:
        proc.kill()
        proc.close()
        os.close(r)
        for p in pool_processes():
            if pool_socket(p) == pool.name:
                p.kill()


@pytest.fixture
def shared_tmp(monkeypatch):
    """TMPDIR on a shared folder anyone can write, without the sticky bit (where another user, uid
    65534, can reach it: pytest's own tmp_path is this user's only)."""
    import tempfile

    base = tempfile.mkdtemp(prefix="shared-", dir="/tmp")
    os.chmod(base, 0o755)
    shared = os.path.join(base, "shared")
    os.mkdir(shared)
    os.chmod(shared, 0o777)
    monkeypatch.setattr(tempfile, "tempdir", shared)
    yield pathlib.Path(shared)
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.skipif(os.getuid() != 0, reason="plays another user: needs root (CI and this machine are)")
def test_a_pool_directory_swapped_after_its_check_is_never_used(shared_tmp):
    """Another user renames our pool directory away and puts theirs, with a socket of the pool's
    name, in its place: the rank's request still reaches our own directory (through the descriptor
    its check opened) and the stranger receives nothing (before: the rank's environment, token and
    start message)."""
    shared = shared_tmp
    env = {**os.environ, "POOL_TEST": f"swapped-{os.urandom(4).hex()}"}
    pool = warm_pool.Pool.of(env, "torch", os.getpid())
    ours = pool.directory.path
    os.rename(ours, str(shared / "moved-away"))
    os.mkdir(ours, 0o700)
    os.chown(ours, NOBODY, NOBODY)
    stranger = _Stranger(os.path.join(ours, pool.name))
    try:
        assert _forked(pool, env)  # by our own pool, in our directory
        assert os.path.exists(shared / "moved-away" / pool.name)
    finally:
        heard = stranger.heard()
    assert heard == []


@pytest.mark.skipif(os.getuid() != 0, reason="plays another user: needs root (CI and this machine are)")
def test_a_socket_another_user_serves_at_the_pools_name_gets_nothing(shared_tmp):
    """A socket served by another user's process at our pool's very name (in our directory): the
    task checks who serves it (SO_PEERCRED) before sending a byte, replaces it with a pool of ours,
    and the rank is forked warm."""
    env = {**os.environ, "POOL_TEST": f"peer-{os.urandom(4).hex()}"}
    pool = warm_pool.Pool.of(env, "torch", os.getpid())
    theirs = shared_tmp.parent / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    stranger = _Stranger(str(theirs / "s.sock"))
    try:
        os.rename(theirs / "s.sock", pool.path)  # as root only could: the test's stand-in for a race
        assert _forked(pool, env)
    finally:
        heard = stranger.heard()
    assert heard == []


class _LyingPool(_FailingPool):
    """A pool (of this user) that answers each request with another process's pid, no pidfd."""

    def __init__(self, directory, anchor, victim):
        self.victim = victim
        super().__init__(directory, anchor, "silent")

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            data = b""
            while not data.endswith(b"\n"):
                chunk, fds, _, _ = socket.recv_fds(conn, 1 << 20, 8)
                for fd in fds:
                    os.close(fd)
                if not chunk:
                    break
                data += chunk
            self.requests += 1
            conn.sendall(json.dumps({"pid": self.victim}).encode() + b"\n")
            self.held.append(conn)


def test_a_pid_a_pool_names_without_a_pidfd_is_never_signalled(monkeypatch):
    """A pool that answers with the pid of some other process of ours (a session leader), and no
    pidfd of it: the rank is started cold and that process is never killed (before: the task took
    the pid as its rank's, waited for it to reach the rendezvous, then SIGKILLed its group)."""
    victim = subprocess.Popen(["sleep", "120"], start_new_session=True)
    directory = tempfile.mkdtemp(prefix="pool-", dir="/tmp")
    pool = _LyingPool(directory, os.getpid(), victim.pid)
    opened = warm_pool.PoolDir.open(directory)
    monkeypatch.setattr(warm_pool.Pool, "of", classmethod(lambda cls, e, b, a: cls(opened, "failing", b, a)))
    try:
        out = BarrierRunner(-2, log_ranks="none", timeout=60, start_timeout=15).run(
            parent_and_draw, return_all=True
        )
        assert pool.requests == 2 and [o["sum"] for o in out] == [2.0, 2.0]
        assert {o["cold_of"] for o in out} == {os.getpid()}
        assert victim.poll() is None, "a process the pool named was killed"
    finally:
        victim.kill()
        victim.wait()
        pool.listener.close()
        shutil.rmtree(directory)
    assert_no_rank_left()


@pytest.mark.parametrize("request_line", [b'{"standby": true}\n', b'{"stop": true}\n', b"{not json\n"])
def test_a_keeper_sent_what_is_no_rank_request_starts_nothing(request_line):
    """A keeper speaks the pool's protocol but keeps one rank: a pool's own requests (a stop, a
    standby) and junk are refused, nothing forked, no pid answered."""
    from sparkml_dist.runner.tasks.keeper import KEEPER_ENTRY

    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    keeper = subprocess.Popen(
        [sys.executable, "-c", KEEPER_ENTRY, str(theirs.fileno())], pass_fds=(theirs.fileno(),)
    )
    theirs.close()
    with mine:
        mine.sendall(request_line)
        mine.settimeout(30)
        assert mine.recv(100) == b""  # closed without an answer: no rank forked for it
    assert keeper.wait(30) == 1


def test_a_rank_this_process_could_not_signal_is_killed_by_its_pool(monkeypatch):
    """The task's own kill of a warm rank (through its pidfd) missing it, as it would with that
    descriptor lost: the pool, the rank's parent, kills it once the task's end of the request
    stops sending. The run is stopped at its timeout and nothing is left (before: the rank ran on
    for its hour, and the cancel waited its 30 s for the rank's exit)."""
    from tests.support import runner_helpers as h

    monkeypatch.setattr(warm_rank, "killpg", lambda pid, pidfd: None)
    t = time.monotonic()
    with pytest.raises(RunTimeoutError, match=r"timeout=8s"):
        BarrierRunner(-2, log_ranks="none", timeout=8).run(h.fail_on, 1, "hang", 0)
    assert time.monotonic() - t < 30  # the timeout, then the kill (missed: 8 + the cancel's 30 s)
    assert_no_rank_left()
