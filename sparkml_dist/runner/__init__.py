"""Barrier-mode data-parallel training on Spark (a HorovodRunner / TorchDistributor equivalent).

Driver side: :class:`BarrierRunner`.  Inside the training function (a rank process):
:func:`context`, :func:`init_process_group`, :func:`log_to_driver`, :func:`shard` and
:mod:`checkpoint` (save/load).  Importing this package imports neither torch nor pyspark; rank
processes import only what they use.

Map of the runner (where each module runs)::

    runner.py        [driver]    BarrierRunner: arguments, the restart loop, one attempt
    admission.py     [driver]    pre-flight: log_ranks, the function's payload, slots, encryption, GPUs
    sharding.py      [driver]    run_with_data: Parquet files read by the tasks, or rows moved by Spark
    launchers.py     [driver]    launch on Spark barrier tasks or local processes; wait; Deadline
    failures.py      [driver]    Monitor (the log channel's view), root cause, restart verdicts
    channel.py       [both]      the authenticated log channel (LogServer on the driver, LogClient)
    protocol.py      [anywhere]  every name and message between a task and its rank process
    backends.py      [anywhere]  Backend: TorchBackend, HorovodBackend (env, store, start, peers, GPUs)
    rendezvous.py    [anywhere]  pure: local ranks, torch.distributed's environment, a task's GPUs
    network.py       [anywhere]  this host's address and interface
    _task.py         [executor]  one barrier task: start, feed, exchange, await, result, clean up
    feeding.py       [executor]  the data phase: shards and the function into the ranks' directories
    data_watch.py    [executor]  DataWatch: the data phase bounded by progress (data_timeout)
    _rank_process.py [executor]  RankProcess: one rank's child process, its output and events, and
                                 the reaper that removes its process group and files with the task
    _rank.py         [rank]      the rank process's entry point
    _horovod.py      [rank]      horovod.torch import and Horovod's rendezvous server
    context.py, data.py, checkpoint.py, script.py   [rank]  what training functions call
    script_files.py  [driver+rank]  a script's folder, --py-files and --archives, shipped and unpacked

Spark's environment (masters, slots, memory, sessions, JVM calls) is read in
:mod:`sparkml_dist._spark_env` only.
"""

from . import checkpoint
from .context import RankContext, context, init_process_group, log_metrics, log_to_driver
from .data import Shard, shard

__all__ = [
    "BarrierRunner",
    "checkpoint",
    "context",
    "init_process_group",
    "log_to_driver",
    "log_metrics",
    "shard",
    "RankContext",
    "Shard",
]


def __getattr__(name):  # BarrierRunner is driver-side: loaded on first use, not in rank processes
    if name == "BarrierRunner":
        from .runner import BarrierRunner

        return BarrierRunner
    raise AttributeError(name)
