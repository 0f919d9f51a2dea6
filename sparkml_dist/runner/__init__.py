"""Barrier-mode data-parallel training on Spark (a HorovodRunner / TorchDistributor equivalent).  [anywhere]

Driver side: :class:`BarrierRunner`.  Inside the training function (a rank process):
:func:`context`, :func:`init_process_group`, :func:`log_to_driver`, :func:`shard`, :func:`step`
and :mod:`checkpoint` (save/load); after a run, on the driver, :func:`last_run` (where each rank's
time went).  Importing this package imports neither torch nor pyspark; rank
processes import only what they use.

Where each module of the runner runs and what it holds: the module map in docs/design.md.

Spark's environment (masters, slots, memory, sessions, JVM calls) is read in
:mod:`sparkml_dist._spark_env` only.
"""

from . import checkpoint
from .context import RankContext, context, init_process_group, log_metrics, log_to_driver
from .data.shard import Shard, shard
from .timing import step

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
    "last_run",
    "step",
]


def __getattr__(name):  # BarrierRunner is driver-side: loaded on first use, not in rank processes
    if name == "BarrierRunner":
        from .runner import BarrierRunner

        return BarrierRunner
    if name == "last_run":  # the driver's report of the last run's step times
        from .timing.report import last_run

        return last_run
    if name == "stage_once":  # a DataFrame written once for the runs of a tuning
        from .data.plan import stage_once

        return stage_once
    raise AttributeError(name)
