"""A pool's standby: the next rank's process, forked ahead with what a first step imports.  [executor]

A warm pool (:mod:`.pool_server`) forks ranks from an interpreter that imported the framework but
not ``torch._dynamo``, what a rank's first optimizer imports (~1-2 s here): a pool that had imported
it made a DDP script's rank hang at its end 1 time in 3 (:mod:`sparkml_dist.runner.backends`).  A
rank lost inside its task has a spare that made that import ahead (:mod:`.replace`); the rank of a
lost *executor*, whose task Spark runs again on another executor, had none, and its start was
mostly that import while the survivors waited.  So the driver's warm job on a spare executor
(:mod:`.warm_spare`) asks that executor's pool for a *standby* (``{"standby": true}``): one process
forked from the pool, in a session of its own, that makes the backend's spare imports
(:meth:`~sparkml_dist.runner.backends.base.Backend.spare_preload`), says it is ready and waits on a
socket pair with its pool.  The next rank asked of the pool once its standby is ready is handed to
it (the request and its descriptors, as the pool received and checked them) instead of forked; it
is the pool's child, so its pid, its exit code and its kill reach the task as a forked rank's do.
Nothing is forked from a standby; it ends with its pool (the pair closes), and the pool makes
another only when asked again (the warm job comes back every ``REFRESH_S``: :mod:`.spares`).

Example (in the pool)::

    standby = Standby.fork(before=close_inherited, preload=backend.spare_preload)
    ...
    if standby.ready and standby.hand(request, fds):   # else: fork the rank as before
        pid = standby.pid
"""

from __future__ import annotations

import json
import os
import socket
import traceback
from typing import Callable, List, Optional, Tuple

from .rank_request import MAX_FDS, MAX_REQUEST, close_all, parse_request, start_rank

READY = b"r"
# its name (``ps``, /proc/PID/comm): not yet a rank; with "-" while it still imports
NAME = b"rank-standby"


def _name(name: bytes) -> bytes:
    """Set this process's name (``PR_SET_NAME``, 15 bytes at most); the one it had."""
    import ctypes

    libc, old = ctypes.CDLL(None, use_errno=True), ctypes.create_string_buffer(16)
    libc.prctl(16, old, 0, 0, 0)  # PR_GET_NAME
    libc.prctl(15, ctypes.c_char_p(name), 0, 0, 0)  # PR_SET_NAME
    return old.value


class Standby:
    """The pool's side of its standby: the process, its end of the pair, whether it said ready."""

    def __init__(self, pid: int, end: socket.socket) -> None:
        self.pid, self.end, self.ready = pid, end, False

    @classmethod
    def fork(cls, before: Callable[[], None], preload: Callable[[], None]) -> "Standby":
        """Fork it: in the child ``before()`` (close what the pool holds), a session of its own,
        ``preload()``, then wait for a request and become that rank (:func:`.start_rank`)."""
        pool_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pid = os.fork()
        if pid == 0:
            try:
                pool_end.close()
                before()
                os.setsid()
                was = _name(NAME + b"-")
                preload()
                _name(NAME)
                child_end.sendall(READY)
                taken = _wait(child_end)
                if taken is not None:
                    child_end.close()
                    _name(was)  # a rank, named as a forked one is
                    start_rank(*taken, os.getppid())
            except BaseException:
                traceback.print_exc()
            os._exit(1)
        child_end.close()
        return cls(pid, pool_end)

    def heard(self) -> bool:
        """Its end is readable: True once it said ready, False when it is gone (the pair closed)."""
        try:
            data = self.end.recv(1)
        except OSError:
            data = b""
        self.ready = self.ready or data == READY
        return bool(data)

    def hand(self, request: dict, fds: List[int]) -> bool:
        """Send it ``request`` with ``fds`` (the pool closes its copies after); False where it
        could not take them (it ended meanwhile): the pool forks the rank instead."""
        try:
            socket.send_fds(self.end, [b"q"], fds)
            self.end.sendall((json.dumps(request) + "\n").encode())
        except OSError:
            return False
        return True

    def close(self) -> None:
        """The pool's end closed: a standby still waiting ends (its read sees the end)."""
        self.end.close()


def _wait(end: socket.socket) -> Optional[Tuple[dict, List[int]]]:
    """In the standby: the request its pool hands it and the descriptors with it; None when the
    pool ended (or sent what is not a rank's request)."""
    mark, fds, _, _ = socket.recv_fds(end, 1, MAX_FDS)
    data = bytearray()
    while mark and not data.endswith(b"\n") and len(data) <= MAX_REQUEST:
        chunk = end.recv(65536)
        if not chunk:
            break
        data += chunk
    request = parse_request(bytes(data), len(fds)) if data.endswith(b"\n") else None
    if request is None or "env" not in request:
        close_all(fds)
        return None
    return request, fds
