"""A rank lost inside ``elastic.run``, started again in place while the others keep running.  [executor]

:mod:`sparkml_dist.runner.elastic` runs on the ranks, this module on their tasks. When a rank whose
function is inside ``elastic.run`` (its last ``EVENT_ELASTIC`` says so) dies,
its task starts a new process for the same rank (from the warm pool when there is one) with
``REPLACES_ENV`` set, in the same working directory, with the same function, rows and start
message, and goes on watching it; the driver shows one line. Rank 0's process serves the run's
store on the socket its task bound: with ``max_restarts`` the task keeps that socket open, so a
rank 0 started in its place serves a new store at the address every rank knows (the others
reconnect, see :mod:`sparkml_dist.runner.elastic.membership`). Not replaced (the task fails as
before and the run restarts from its checkpoint): a rank of a cancelled run, a rank that raised out
of ``elastic.run`` or returned from it, a rank past its task's ``max_restarts``.

**A spare.**  Once the rank it watches is inside ``elastic.run`` (with replacements left), the task
starts a *spare*: the next replacement's process, from the pool, which makes the imports the
function's first steps would (:meth:`~sparkml_dist.runner.backends.base.Backend.spare_preload`:
``torch._dynamo``, what a first optimizer imports, ~1 s) and waits for its start message; a lost
rank's place then goes to it at once, and a new spare is started once it is inside ``elastic.run``
in turn. An unused spare ends with its task.

The task holds one :class:`Replacement` per rank: what replacing it needs and changes (the spare,
the replacements left, the processes lost, the store socket kept) lives there, not in the task;
the task asks it whether a death is replaceable and for the process that takes the rank's place.

Example::

    replacement = Replacement(spec, rank, workdir, cwd, gpus, backend, anchor)
    replacement.keep_listener(listener)             # rank 0: its store socket, for a new rank 0
    replacement.arm(process)                         # a spare once the rank is inside elastic.run
    if replacement.replaceable(process, code, cancelled=False):
        process, line = replacement.take(process, code)
"""

from __future__ import annotations

import os
import threading
from typing import List, Tuple

from .. import protocol
from . import warm_pool
from .rank_process import RankProcess, exit_text

KEPT = ".kept"  # a second name of the rank's spilled rows, for a rank started in its place


def keep_rows(members) -> None:
    """A rank removes its spilled rows' file once it opened it: with ``max_restarts``, a second
    link keeps the rows for a rank started in its place (removed with the working directory)."""
    for m in members:
        spill = os.path.join(m.workdir, protocol.SPILL_FILE)
        if m.spec.max_restarts > 0 and os.path.exists(spill):
            os.link(spill, spill + KEPT)


class Replacement:
    """How one rank of a task is replaced in place (see the module docstring): its spare, the
    replacements made (``replaced``), the processes lost, the store socket kept for a new rank 0."""

    def __init__(self, spec, rank: int, workdir: str, cwd: str, gpus, backend, anchor: int) -> None:
        self.spec, self.rank, self.workdir, self.cwd, self.gpus = spec, rank, workdir, cwd, gpus
        self.backend, self.anchor = backend, anchor
        self.replaced = 0
        self.lost: List[RankProcess] = []
        self.listener = None  # rank 0's store socket, kept for a rank 0 started in its place
        self.spare: "RankProcess | None | bool" = None  # False: none is started any more
        self._lock = threading.Lock()

    def keep_listener(self, listener) -> None:
        """Keep rank 0's listening store socket when a rank 0 may be started in place of this one
        (``max_restarts``, a backend that keeps its port); else close it (the rank has its copy)."""
        spec = self.spec
        if self.rank == 0 and spec.max_restarts > 0 and not self.backend.framework_rebinds_port:
            self.listener = listener
        else:
            listener.close()

    def arm(self, process: RankProcess) -> None:
        """Start a spare once ``process`` is inside ``elastic.run`` (replacements left)."""
        if self.spec.max_restarts > self.replaced:
            process.on_event = self._on_event

    def _on_event(self, ev: dict) -> None:
        """The rank's control events (its reader thread): the spare starts in a thread of its own."""
        if ev.get("event") == protocol.EVENT_ELASTIC and ev.get("inside") is True and self.spare is None:
            threading.Thread(target=self._start_spare, daemon=True, name="sparkml_dist-spare").start()

    def _start_spare(self) -> None:
        with self._lock:
            if self.spare is None and self.replaced < self.spec.max_restarts:
                try:
                    self.spare = self._process(spare=True)
                except OSError:  # no spare: the next replacement starts as before
                    pass

    def _process(self, spare: bool = False) -> RankProcess:
        """The process of the next replacement (``spare``: started ahead, it waits)."""
        spec = self.spec
        env = {**spec.rank_env(self.rank, self.gpus), protocol.REPLACES_ENV: str(self.replaced + spare)}
        if spare:
            env[protocol.SPARE_ENV] = "1"
        warm = spec.warm_ranks and self.backend.warm_ranks and warm_pool.enabled()
        pool = warm_pool.Pool.of(env, self.backend.name, self.anchor) if warm else None
        fds = (self.listener.fileno(),) if self.listener is not None else ()
        if fds:
            env[protocol.STORE_FD_ENV] = str(fds[0])
        return RankProcess(self.rank, self.workdir, env, fds, self.cwd, pool)

    def replaceable(self, process: RankProcess, code: int, cancelled: bool) -> bool:
        """``process`` (the rank) ended with ``code`` inside ``elastic.run`` and may be replaced."""
        return (
            code != 0
            and process.seen.get(protocol.EVENT_ELASTIC, {}).get("inside") is True  # not raised out of it
            # a new rank 0 serves the store again, unless the driver serves it (plain tasks)
            and (self.rank != 0 or self.listener is not None or not self.spec.barrier)
            and self.replaced < self.spec.max_restarts
            and not cancelled
        )

    def take(self, lost: RankProcess, code: int) -> Tuple[RankProcess, str]:
        """The process that takes the place of ``lost`` (which ended with ``code``: kept, closed
        with the task, as its reaper would remove the rows now), its rows and function in place,
        armed for the next loss; and the line the driver shows."""
        spec = self.spec
        self.replaced += 1
        self.lost.append(lost)
        line = (
            f"[sparkml_dist] rank {self.rank} {exit_text(code)} inside elastic.run: a new rank "
            f"{self.rank} takes its place ({self.replaced} of max_restarts={spec.max_restarts}); "
            "the other ranks keep running"
        )
        spill = os.path.join(self.workdir, protocol.SPILL_FILE)
        if os.path.exists(spill + KEPT) and not os.path.exists(spill):
            os.link(spill + KEPT, spill)
        with open(os.path.join(self.workdir, protocol.FN_FILE), "wb") as fh:
            fh.write(spec.payload)
        with self._lock:
            spare, self.spare = self.spare, None
        if spare and spare.running:
            process = spare
        else:
            if spare:
                self.lost.append(spare)
            process = self._process()
        self.arm(process)
        return process, line

    def close(self) -> None:
        """At the task's end: the processes of the ranks it lost, its spare, and the socket it kept."""
        with self._lock:
            self.spare, spare = False, self.spare  # False: no spare is started from now on
        for process in self.lost + ([spare] if spare else []):
            process.close()
        if self.listener is not None:
            self.listener.close()
            self.listener = None
