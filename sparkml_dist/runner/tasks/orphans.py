"""What warm ranks leave behind: re-parented to their pool, killed once their rank ended.  [executor]

A cold rank's leftovers are found by the reaper beside it (its process group, its session, its
token in ``/proc/PID/environ``).  A process a *warm* rank forked without ``exec`` shows the pool's
environment there (the one the pool was started with), so one that also left the rank's session
(a double fork, a daemon) would escape that reaper.  The pool (:mod:`.pool_server`) is therefore
a *child subreaper* (``PR_SET_CHILD_SUBREAPER``): such a process, once orphaned, becomes the pool's
child instead of init's.  The pool's children that are not its ranks are such orphans; each is
killed (with its process group when it leads one) once every rank that was running when it was
first seen has ended, the rank it came from being one of those; what it leaves in turn is
re-parented to the pool and ended the same way.

Example::

    subreaper()                   # in the pool, before it forks ranks
    left = Orphans()
    left.end(live=set(ranks))     # after reaping a child: kill what may belong to no running rank
"""

from __future__ import annotations

import os
import signal
from typing import Dict, List, Set


def subreaper() -> bool:
    """Make this process the child subreaper of its descendants (Linux); False where it cannot."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def children(pid: int) -> List[int]:
    """The processes whose parent is ``pid`` (from ``/proc``)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()  # after "pid (comm) ": state, ppid, ...
        if len(fields) > 1 and fields[1] == str(pid).encode():
            out.append(int(name))
    return out


def kill(pid: int) -> None:
    """SIGKILL to ``pid``, and to its process group when it leads one (a daemon's)."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def end_all() -> None:
    """Kill every child of this process (the pool's end)."""
    for pid in children(os.getpid()):
        kill(pid)


class Orphans:
    """The pool's children that are not ranks, and the ranks each may have come from."""

    def __init__(self) -> None:
        self.maybe_of: Dict[int, Set[int]] = {}

    def forget(self, pid: int) -> None:
        """``pid`` was reaped (its number may be reused)."""
        self.maybe_of.pop(pid, None)

    def end(self, live: Set[int]) -> None:
        """Kill each orphan no running rank may own: ``live`` are the running ranks' pids."""
        for pid in children(os.getpid()):
            if pid in live:
                continue
            maybe = self.maybe_of.setdefault(pid, set(live))
            maybe &= live
            if not maybe:
                kill(pid)
