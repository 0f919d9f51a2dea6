"""One rank process, started by the barrier task with ``python -c`` calling :func:`main`.  [executor: child of a barrier task]

Started by the barrier task (:mod:`sparkml_dist.runner._task`) with RANK/WORLD_SIZE set.  Steps:

1. die with the task (``PR_SET_PDEATHSIG``), so a killed task never leaves a rank behind;
2. rank 0: host the rendezvous on the listening socket its task passed down (torch: a TCPStore,
   started at once; horovod: Horovod's HTTP store, once the ranks' placements are known);
3. read the rendezvous environment (MASTER_ADDR/PORT or HOROVOD_*, LOCAL_RANK, ...) from stdin;
4. report reaching the rendezvous when ``init_process_group`` (or ``hvd.init``) is called;
5. map the shard, load ``(main, args, kwargs)``, call it, write the result for the task;
6. run the ``atexit`` handlers and leave with ``os._exit`` (as ``multiprocessing`` children do):
   tearing down an interpreter that holds torch and a process group costs ~0.7 s otherwise.

Control messages to the task are JSON lines on the file descriptor in SPARKML_DIST_CTRL_FD.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import threading
from datetime import timedelta

WORKDIR_ENV = "SPARKML_DIST_WORKDIR"
CTRL_ENV = "SPARKML_DIST_CTRL_FD"
PARENT_ENV = "SPARKML_DIST_PARENT_PID"
TIMEOUT_ENV = "SPARKML_DIST_COLLECTIVE_TIMEOUT"
BACKEND_ENV = "SPARKML_DIST_BACKEND"
RUN_ENV = "SPARKML_DIST_RUN_ID"
USE_GPU_ENV = "SPARKML_DIST_USE_GPU"
STORE_FD_ENV = "SPARKML_DIST_STORE_FD"
DEVICE_ENV = "SPARKML_DIST_CUDA_DEVICE"  # this rank's index in CUDA_VISIBLE_DEVICES (horovod)
FN_FILE = "fn.pkl"
RESULT_FILE = "result.pkl"


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    parent = int(os.environ.get(PARENT_ENV, "0") or 0)
    if parent and os.getppid() != parent:  # the task died before prctl took effect
        os._exit(1)


class _Ctrl:
    def __init__(self, fd: int) -> None:
        self._fh = os.fdopen(fd, "w", buffering=1)
        self._lock = threading.Lock()

    def send(self, **message) -> None:
        with self._lock:  # log_to_driver may be called from the function's threads
            self._fh.write(json.dumps(message) + "\n")
            self._fh.flush()


CTRL: "_Ctrl | None" = None  # this process's channel to its task, once main() runs


def send_log(text: str) -> bool:
    """Send one log line to the driver through the task (False outside a rank process)."""
    if CTRL is None:
        return False
    CTRL.send(event="log", text=text)
    return True


def collective_timeout() -> timedelta:
    return timedelta(seconds=float(os.environ.get(TIMEOUT_ENV, "1800")))


def _host_store(world_size: int, fd: int):
    """The rendezvous store, served on the socket the task bound and listens on (fd)."""
    import socket

    import torch.distributed as dist

    with socket.socket(fileno=os.dup(fd)) as s:
        port = s.getsockname()[1]
    return dist.TCPStore("0.0.0.0", port, world_size, is_master=True, wait_for_workers=False,
                         timeout=collective_timeout(), master_listen_fd=fd)


def report_first_call(owners, name: str, on_call) -> None:
    """Replace function ``name`` on each of ``owners`` (modules) by one that calls ``on_call()`` first.

    How a rank reports reaching the rendezvous: ``torch.distributed.init_process_group`` or
    ``hvd.init``, however the function imported it (module attribute looked up at call time).
    """
    import functools

    original = getattr(owners[0], name)
    if getattr(original, "_sparkml_dist_hook", False):
        return

    @functools.wraps(original)
    def hooked(*args, **kwargs):
        on_call()
        return original(*args, **kwargs)

    hooked._sparkml_dist_hook = True  # type: ignore[attr-defined]
    for owner in owners:
        setattr(owner, name, hooked)


def main() -> int:
    global CTRL
    _die_with_parent()
    workdir = os.environ[WORKDIR_ENV]
    ctrl = CTRL = _Ctrl(int(os.environ[CTRL_ENV]))
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    backend = os.environ.get(BACKEND_ENV, "torch")

    store = None
    if backend == "torch":
        import torch.distributed  # noqa: F401 - every rank imports torch while rank 0 starts the store
        if rank == 0:
            store = _host_store(world, int(os.environ[STORE_FD_ENV]))  # held for the life of this process
    elif backend == "horovod":
        from . import _horovod

        hvd = _horovod.import_horovod_torch()  # imported while the task writes the shard and gathers peers
    line = sys.stdin.readline()
    if not line:
        return 1  # the task went away before the rendezvous
    message = json.loads(line)
    os.environ.update(message["env"])
    reached = lambda: ctrl.send(event="rendezvous")  # noqa: E731
    if backend == "torch":
        import torch.distributed as dist

        report_first_call([dist], "init_process_group", reached)
    elif backend == "horovod":
        if rank == 0:  # served before any rank can call hvd.init(): peers wait in the backlog
            store = _horovod.serve_rendezvous(int(os.environ[STORE_FD_ENV]), message["slots"])
        report_first_call([hvd.mpi_ops, hvd], "init", reached)

    from . import data
    from .. import serialization

    data.load_from_env()
    with open(os.path.join(workdir, FN_FILE), "rb") as fh:
        fn, args, kwargs, want_result = serialization.loads(fh.read())
    os.unlink(os.path.join(workdir, FN_FILE))
    result = fn(*args, **kwargs)
    if want_result:
        blob = serialization.dumps(result)
        tmp = os.path.join(workdir, RESULT_FILE + ".tmp")
        with open(tmp, "wb") as fh:
            fh.write(blob)
        os.replace(tmp, os.path.join(workdir, RESULT_FILE))
    ctrl.send(event="done")
    del store
    return 0


def run() -> None:
    """Process entry point: ``main()``, then a fast exit that still runs ``atexit`` handlers."""
    import atexit
    import traceback

    try:
        code = main()
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if not isinstance(stop.code, int) and stop.code is not None:
            print(stop.code, file=sys.stderr)
    except BaseException:  # the rank failed: its traceback is what the driver reports
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    run()
