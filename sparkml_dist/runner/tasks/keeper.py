"""A cold rank's keeper: the small process that starts it and outlives it.  [executor]

A rank must take with it whatever it started, even a process that left for a session of its own
with an environment of its own (nothing of the run in it to find it by).  Only an ancestor that
outlives the rank can see such a process; a warm rank has its pool (:mod:`.pool_server`).  A cold
rank has its keeper: ``python -c KEEPER_ENTRY FD``, started by the task (:mod:`.warm_rank`) with one
end of a socket pair, speaking the pool's protocol on it: it reads the rank's request (its
environment, directory and descriptors), forks, and the child takes a session of its own and
executes ``python -c RANK_ENTRY`` (a new interpreter: everything a cold rank was); the keeper
answers ``{"pid": n}``, then ``{"exit": code}`` when the rank ends.  It is the *child subreaper*
of everything below it (:mod:`sparkml_dist.host.processes`), so once the rank has ended it kills
whatever the rank left behind, then ends itself.  When the task's end of the socket closes (the
task ended or was killed) it kills the rank and everything below it at once.  It imports nothing
but the standard library and this package's small process modules (~20 ms), never the framework.

Example::

    keeper = subprocess.Popen([sys.executable, "-c", KEEPER_ENTRY, str(theirs.fileno())],
                              pass_fds=(theirs.fileno(),), start_new_session=True)
    socket.send_fds(mine, [request_line], [stdin, stdout, stderr, ctrl])   # then read the replies
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import sys
from typing import List, Optional

from .rank_request import MAX_FDS, MAX_REQUEST, close_all, parse_request, reply, take_descriptors

KEEPER_MARK = "sparkml_dist.runner.tasks.keeper"  # in a keeper's command line
KEEPER_ENTRY = f"import sys; from {KEEPER_MARK} import main; main(int(sys.argv[1]))"


def _receive(conn: socket.socket):
    """The request line and its descriptors (None when the task went away or sent nonsense)."""

    data, fds = bytearray(), []
    while not data.endswith(b"\n"):
        try:
            chunk, got, _, _ = socket.recv_fds(conn, 65536, MAX_FDS)
        except OSError:
            chunk, got = b"", []
        fds.extend(got)
        data += chunk
        if not chunk or len(data) > MAX_REQUEST or len(fds) > MAX_FDS:
            close_all(fds)
            return None, []
    request = parse_request(bytes(data), len(fds))
    if request is None or "env" not in request:  # a pool's stop or standby: no rank to keep
        close_all(fds)
        return None, []
    return request, fds


def _exec_rank(request: dict, fds: List[int], keeper: int) -> None:
    """(in the forked child) become a new interpreter running the rank's entry."""
    from .. import protocol

    os.setsid()
    env = take_descriptors(request, fds, keeper)
    for name in (protocol.CTRL_ENV, protocol.STORE_FD_ENV):
        if name in env:
            os.set_inheritable(int(env[name]), True)
    os.chdir(request["cwd"])
    os.execve(sys.executable, [sys.executable, "-c", protocol.RANK_ENTRY], env)


def _wait_rank(conn: socket.socket, pid: int) -> Optional[int]:
    """The rank's exit code; None when the task's end closed first (the rank is then killed)."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    with selectors.DefaultSelector() as sel:
        sel.register(conn, selectors.EVENT_READ, "task")
        sel.register(wake_r, selectors.EVENT_READ, "wake")
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            for key, _ in sel.select(timeout=1.0):
                if key.data == "wake":
                    os.read(wake_r, 4096)
                elif not _recv_one(conn):  # the task's end closed: it ended, or was killed
                    return None


def _recv_one(conn: socket.socket) -> bool:
    try:
        return conn.recv(1) != b""
    except OSError:
        return False


def main(fd: int) -> None:
    """Serve one cold rank over socket ``fd`` (see the module docstring), then end."""
    from ...host.processes import kill, kill_descendants, subreaper

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a notebook's interrupt is for the driver
    subreaper()
    conn = socket.socket(fileno=fd)
    request, fds = _receive(conn)
    if request is None:
        os._exit(1)
    pid = os.fork()
    if pid == 0:
        try:
            conn.close()
            _exec_rank(request, fds, os.getppid())
        finally:
            os._exit(127)  # exec failed; its error went to the rank's stderr
    close_all(fds)
    reply(conn, {"pid": pid}, pid)  # with a pidfd: the task signals this process, none other
    code = _wait_rank(conn, pid)
    if code is None:  # killed with everything below it; the exit code no one reads
        kill(pid)
        kill_descendants(os.getpid())
        os.waitpid(pid, 0)
        os._exit(1)
    kill_descendants(os.getpid())  # what the rank left behind, re-parented here
    reply(conn, {"exit": code})
    os._exit(0)
