"""The ranks of one barrier task, awaited together.  [executor]

A task runs one rank, or one per GPU it holds (``TaskSpec.ranks_per_task``); :func:`await_all`
waits until each has reached the rendezvous and exited 0, and when one fails gives its siblings
:data:`SIBLING_GRACE_S` to end by themselves (a rank that lost its peer fails too, a moment
later), stops the rest, and raises the root cause among them as the driver would name it.
:func:`clean_work_dir` removes the machine's kept working directory once every rank succeeded.

Example::

    await_all(members, cancel)      # members: the task's ranks (tasks.task._RankTask)
"""

from __future__ import annotations

import shutil
import threading
import time
from typing import Optional

from .. import protocol


class _Either:
    """Set when either event is (``b`` may be None): a rank stops on a cancel or a sibling's failure."""

    def __init__(self, a: threading.Event, b: Optional[threading.Event]) -> None:
        self.a, self.b = a, b

    def is_set(self) -> bool:
        return self.a.is_set() or (self.b is not None and self.b.is_set())

    def wait(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while not self.is_set() and time.monotonic() < end:
            time.sleep(0.02)
        return self.is_set()


SIBLING_GRACE_S = 1.0  # after a rank of the task fails, how long its siblings may end by themselves


def await_all(members: list, cancel: Optional[threading.Event]) -> None:
    """Every rank reaches the rendezvous and exits 0.  When one fails, its siblings get
    SIBLING_GRACE_S to end by themselves (a rank that lost its peer fails too, a moment later),
    then the rest are stopped; the task raises the root cause among them, as the driver tells it."""
    if len(members) == 1:
        members[0].await_rendezvous()
        members[0].await_exit()
        return
    stop, failed, lock, errors = threading.Event(), threading.Event(), threading.Lock(), []

    def one(m) -> None:
        try:
            m.await_rendezvous()
            m.await_exit()
        except BaseException as exc:
            with lock:
                errors.append(exc)
            failed.set()

    for m in members:
        m.cancel = _Either(stop, cancel)
    threads = [threading.Thread(target=one, args=(m,), daemon=True) for m in members]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads) and not failed.wait(0.1):
        pass
    if failed.is_set():
        end = time.monotonic() + SIBLING_GRACE_S
        for t in threads:
            t.join(max(0.0, end - time.monotonic()))
        with lock:
            for m, t in zip(members, threads):
                m.silent = t.is_alive()  # stopped by us, not failed: nothing of its own to report
        stop.set()
    for t in threads:
        t.join()
    if errors:
        details = [protocol.parse_failure(str(e)) for e in errors]
        known = [(d, e) for d, e in zip(details, errors) if d is not None]
        if not known:
            raise errors[0]
        root = protocol.root_cause([d for d, _ in known], members[0].backend.peer_lost)
        raise next(e for d, e in known if d is root)


def clean_work_dir(members: list) -> None:
    """Every rank succeeded: once all tasks are here, the machine's first rank removes the kept
    working directory (``clean_work_dir=True``)."""
    members[0].gang.allgather("done")
    if any(m.local_rank == 0 for m in members):
        shutil.rmtree(members[0].cwd, ignore_errors=True)
