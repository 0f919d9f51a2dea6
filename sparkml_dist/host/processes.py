"""A process and everything it started, found and ended together.  [executor]

A process a function starts (a subprocess, a data loader's workers, a daemon that double-forked
or left for a session of its own) must end with the run that started it.  Two pieces do that here:

* :func:`subreaper` makes a process the *child subreaper* of its descendants (Linux's
  ``PR_SET_CHILD_SUBREAPER``): whatever they leave orphaned is re-parented to it instead of to
  init, so it stays a descendant and can be found;
* :func:`kill_tree` ends a process and all its descendants, found through ``/proc`` (each
  process's parent): every one found is stopped first (``SIGSTOP``: it can start nothing more),
  the walk repeated until no new one appears, then each is killed, with its process group when
  it leads one.

Used by the warm rank pools (:mod:`sparkml_dist.runner.tasks.orphans`), the cold ranks' keepers
(:mod:`sparkml_dist.runner.tasks.keeper`) and the child that fits keys within a per-key timeout
(:mod:`sparkml_dist.ensemble.engine.key_watch`).

Example::

    subreaper()                   # first thing in a process whose descendants must not escape
    kill_tree(child.pid)          # the child and whatever it started, wherever it went
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


def parents() -> Dict[int, int]:
    """{pid: its parent's pid} of every process ``/proc`` shows."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()  # after "pid (comm) ": state, ppid, ...
        if len(fields) > 1:
            out[int(name)] = int(fields[1])
    return out


def children(pid: int) -> List[int]:
    """The processes whose parent is ``pid``."""
    return [p for p, parent in parents().items() if parent == pid]


def descendants(pid: int) -> Set[int]:
    """Every process below ``pid`` (its children, theirs, ...), not ``pid`` itself."""
    below: Dict[int, List[int]] = {}
    for p, parent in parents().items():
        below.setdefault(parent, []).append(p)
    found, todo = set(), list(below.get(pid, ()))
    while todo:
        p = todo.pop()
        if p not in found:
            found.add(p)
            todo.extend(below.get(p, ()))
    return found


def kill(pid: int) -> None:
    """SIGKILL to ``pid``, and to its process group when it leads one (a daemon's)."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def kill_descendants(pid: int, rounds: int = 20) -> None:
    """Kill every descendant of ``pid`` (see the module docstring), not ``pid`` itself."""
    stopped: Set[int] = set()
    for _ in range(rounds):
        new = descendants(pid) - stopped
        if not new:
            break
        for p in new:
            try:
                os.kill(p, signal.SIGSTOP)  # it forks nothing more while the walk goes on
            except (ProcessLookupError, PermissionError):
                pass
        stopped |= new
    for p in stopped:
        kill(p)


def kill_tree(pid: int) -> None:
    """Kill ``pid`` and all its descendants; ``pid`` last, so that what its descendants leave is
    re-parented to it (a subreaper) rather than to init meanwhile."""
    kill_descendants(pid)
    kill(pid)
