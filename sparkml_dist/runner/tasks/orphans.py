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
    left.end(live=set(ranks), keep={standby})  # after a reap: kill what may belong to no running rank
"""

from __future__ import annotations

import os
from typing import Dict, Set

from ...host.processes import children, kill, kill_descendants, subreaper

__all__ = ["Orphans", "end_all", "subreaper"]


def end_all() -> None:
    """Kill every descendant of this process (the pool's end): its ranks, what they started in
    sessions of their own while still running (the pool is their subreaper: once their rank is
    killed they would be its children, but it is about to end), and what those left."""
    kill_descendants(os.getpid())


class Orphans:
    """The pool's children that are not ranks, and the ranks each may have come from."""

    def __init__(self) -> None:
        self.maybe_of: Dict[int, Set[int]] = {}

    def forget(self, pid: int) -> None:
        """``pid`` was reaped (its number may be reused)."""
        self.maybe_of.pop(pid, None)

    def end(self, live: Set[int], keep: Set[int] = frozenset()) -> None:
        """Kill each orphan no running rank may own: ``live`` are the running ranks' pids; ``keep``
        the pool's other children (its standby), never killed here and owning no orphan (a
        standby forks nothing: counted an owner, it kept every orphan alive as long as it waited)."""
        for pid in children(os.getpid()):
            if pid in live or pid in keep:
                continue
            maybe = self.maybe_of.setdefault(pid, set(live))
            maybe &= live
            if not maybe:
                kill(pid)
