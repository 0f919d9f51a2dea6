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
"""

from __future__ import annotations

import os
import threading
import time

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


def close_listener(task, listener) -> None:
    """The rank process has its own copy of the listening socket; rank 0's task keeps one too
    when a rank 0 may be started in place of this one (``max_restarts``, a backend that keeps its
    port), else closes it."""
    if task.rank == 0 and task.spec.max_restarts > 0 and not task.backend.framework_rebinds_port:
        task.listener = listener
    else:
        listener.close()


def close(task) -> None:
    """At the task's end: the processes of the ranks it lost, its spare, and the socket it kept."""
    with _LOCK:
        task.spare, spare = False, task.spare  # False: no spare is started from now on
    for process in task.lost + ([spare] if spare else []):
        process.close()
    if task.listener is not None:
        task.listener.close()
        task.listener = None


_LOCK = threading.Lock()


def arm(task) -> None:
    """Start a spare for ``task``'s rank once it is inside ``elastic.run`` (replacements left)."""
    if task.spec.max_restarts > task.replaced:
        task.process.on_event = lambda ev: _on_event(task, ev)


def _on_event(task, ev: dict) -> None:
    """The rank's control events (its reader thread): the spare starts in a thread of its own."""
    if ev.get("event") == protocol.EVENT_ELASTIC and ev.get("inside") is True and task.spare is None:
        threading.Thread(target=_start_spare, args=(task,), daemon=True, name="sparkml_dist-spare").start()


def _start_spare(task) -> None:
    with _LOCK:
        if task.spare is None and task.replaced < task.spec.max_restarts:
            try:
                task.spare = _rank_process(task, spare=True)
            except OSError:  # no spare: the next replacement starts as before
                pass


def _rank_process(task, spare: bool = False) -> RankProcess:
    """The process of the task's next replacement (``spare``: started ahead, it waits)."""
    spec = task.spec
    env = {**spec.rank_env(task.rank, task.gpus), protocol.REPLACES_ENV: str(task.replaced + spare)}
    if spare:
        env[protocol.SPARE_ENV] = "1"
    warm = spec.warm_ranks and task.backend.warm_ranks and warm_pool.enabled()
    pool = warm_pool.Pool.of(env, task.backend.name, task.gang.pool_anchor()) if warm else None
    fds = (task.listener.fileno(),) if task.listener is not None else ()
    if fds:
        env[protocol.STORE_FD_ENV] = str(fds[0])
    return RankProcess(task.rank, task.workdir, env, fds, task.cwd, pool)


def replaceable(task, code: int) -> bool:
    """The rank ``task`` watched ended with ``code`` inside ``elastic.run`` and may be replaced."""
    process = task.process
    return (
        code != 0
        and process.seen.get(protocol.EVENT_ELASTIC, {}).get("inside") is True  # not raised out of it
        and (task.rank != 0 or task.listener is not None)  # a new rank 0 serves the store again
        and task.replaced < task.spec.max_restarts
        and not task.cancelled()
    )


def replace(task, code: int) -> None:
    """Start rank ``task.rank`` again and watch it as the first one (its rendezvous, its exit)."""
    spec = task.spec
    task.replaced += 1
    task.lost.append(task.process)  # closed with the task: its reaper would remove the rows now
    task._report(
        protocol.FRAME_LINE,
        stream="log",
        text=f"[sparkml_dist] rank {task.rank} {exit_text(code)} inside elastic.run: a new rank "
        f"{task.rank} takes its place ({task.replaced} of max_restarts={spec.max_restarts}); "
        "the other ranks keep running",
    )
    spill = os.path.join(task.workdir, protocol.SPILL_FILE)
    if os.path.exists(spill + KEPT) and not os.path.exists(spill):
        os.link(spill + KEPT, spill)
    with open(os.path.join(task.workdir, protocol.FN_FILE), "wb") as fh:
        fh.write(spec.payload)
    with _LOCK:
        spare, task.spare = task.spare, None
    if spare and spare.running:
        task.process = spare
    else:
        if spare:
            task.lost.append(spare)
        task.process = _rank_process(task)
    arm(task)
    task.process.watch(**task.watch_args)
    task.started = time.monotonic()
    task.send_start(task.start_message)
    task.await_rendezvous()
    task.await_exit()
