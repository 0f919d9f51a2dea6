"""One rank process, started by the barrier task with ``python -c`` calling :func:`run`.  [rank]

Started by the barrier task (:mod:`sparkml_dist.runner.tasks.task`) with RANK/WORLD_SIZE set; every name
and message it exchanges with the task is in :mod:`sparkml_dist.runner.protocol`.  Steps:

1. die with the task (``PR_SET_PDEATHSIG``), so a killed task never leaves a rank behind;
2. prepare the backend (:mod:`sparkml_dist.runner.backends`): imports, and on rank 0 the
   rendezvous store on the listening socket its task passed down;
3. read the start message (the rendezvous environment) from stdin and join: the backend reports
   reaching the rendezvous when the function connects to the store (any c10d path) or calls
   ``init_process_group`` (or ``hvd.init``);
4. map the shard, load ``(main, args, kwargs)``, call it (watched: a rank that stops moving says
   where, :mod:`.stall_watch`; its steps timed, :mod:`sparkml_dist.runner.timing`), write the
   result for the task;
5. run the ``atexit`` handlers and leave with ``os._exit`` (as ``multiprocessing`` children do):
   tearing down an interpreter that holds torch and a process group costs ~0.7 s otherwise.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading

from .. import backends, protocol, rank_channel


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    parent = int(os.environ.get(protocol.PARENT_ENV, "0") or 0)
    if parent and os.getppid() != parent:  # the task died before prctl took effect
        os._exit(1)


def _once(fn):
    """``fn`` run by the first of several callers only (a store watcher and a function hook)."""
    lock, done = threading.Lock(), []

    def call() -> None:
        with lock:
            if done:
                return
            done.append(True)
        fn()

    return call


def main() -> int:
    _die_with_parent()
    workdir = os.environ[protocol.WORKDIR_ENV]
    ctrl = rank_channel.open_channel(int(os.environ[protocol.CTRL_ENV]))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    backend = backends.get(os.environ.get(protocol.BACKEND_ENV, "torch"))
    store_fd = int(os.environ[protocol.STORE_FD_ENV]) if protocol.STORE_FD_ENV in os.environ else None

    for name, value in backend.env_defaults.items():  # KERAS_BACKEND, ...: the environment's own win
        os.environ.setdefault(name, value)
    first = None
    if os.environ.get(protocol.SPARE_ENV) == "1":  # a spare: its imports now, its store once it takes over
        backend.spare_preload()
        first = sys.stdin.readline()
    state = backend.prepare(rank, world, store_fd)  # held for the life of this process
    message = protocol.read_start_message(sys.stdin.readline() if first is None else first)
    if message is None:
        return 1  # the task went away before the rendezvous
    os.environ.update(message["env"])
    state = backend.join(state, rank, message, store_fd, _once(lambda: ctrl.send(protocol.EVENT_RENDEZVOUS)))
    if os.environ.get(protocol.REPLACES_ENV):  # in place of a rank lost inside elastic.run
        from ..elastic import membership

        membership.join_on_init()  # its init_process_group joins the survivors' next group

    from ... import serialization
    from ..data import shard as data

    data.load_from_env()
    fn_path = os.path.join(workdir, protocol.FN_FILE)
    with open(fn_path, "rb") as fh:
        fn, args, kwargs, want_result = serialization.loads(fh.read())
    os.unlink(fn_path)
    from ..timing import hooks as timing
    from ..timing.clock import CLOCK
    from . import stall_watch

    serve = backend.role_main(state)  # a server of a run with roles (runner.roles): no user code
    if serve is None:  # a server waits on its peers by design: not a stall
        stall_watch.watch(threading.get_ident(), rank_channel.send_log)  # a rank that stops moving says where
    timing.install()  # each step's data wait, compute and communication, whatever the framework
    result = fn(*args, **kwargs) if serve is None else serve(workdir)
    CLOCK.final(timing.last_landed())
    _the_function_returned()
    _finish_checkpoints()
    if want_result:
        blob = serialization.dumps(result)
        tmp = os.path.join(workdir, protocol.RESULT_FILE + ".tmp")
        with open(tmp, "wb") as fh:
            fh.write(blob)
        os.replace(tmp, os.path.join(workdir, protocol.RESULT_FILE))
    ctrl.send(protocol.EVENT_DONE)
    backend.finish(state)  # rank 0's store stays until its peers are done with it
    del state
    return 0


def _the_function_returned() -> None:
    """Inside ``elastic.run`` runs: a rank still joining the group (started in place of one lost
    after the last collective) then ends, with nothing left to train."""
    module = sys.modules.get("sparkml_dist.runner.elastic.membership")
    if module is not None:
        module.function_returned()


def _finish_checkpoints() -> None:
    """Wait for a checkpoint still being written in the background (``save(blocking=False)``)."""
    module = sys.modules.get("sparkml_dist.runner.checkpoint")
    if module is not None:
        module.finish()


def print_user_traceback(exc: BaseException) -> None:
    """``exc``'s traceback on stderr from the user's function down: the runner's own frames (this
    module's) are left out, so the first frame shown is the user's file and line."""
    import traceback

    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb if tb is not None else exc.__traceback__)


def run() -> None:
    """Process entry point: ``main()``, then a fast exit that still runs ``atexit`` handlers."""
    import atexit

    try:
        code = main()
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if not isinstance(stop.code, int) and stop.code is not None:
            print(stop.code, file=sys.stderr)
        # the task says "exited with code n before its function returned"
        rank_channel.send(protocol.EVENT_EXIT, code=code)
    except BaseException as exc:  # the rank failed: its traceback is what the driver reports
        print_user_traceback(exc)
        code = 1
        sys.stderr.flush()
        # said before a slow exit: stopped meanwhile, it is still the cause
        rank_channel.send(protocol.EVENT_RAISED)
        _finish_checkpoints()  # a consistent copy being written is the restart's starting point
    try:
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    run()
