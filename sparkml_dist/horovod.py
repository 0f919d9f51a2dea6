"""A drop-in ``HorovodRunner``: Databricks' ``sparkdl.HorovodRunner`` API on any Spark.  [driver]

Code written for Databricks runs after changing only the import::

    # from sparkdl import HorovodRunner
    from sparkml_dist.horovod import HorovodRunner

    def train(learning_rate):
        import torch
        import horovod.torch as hvd
        hvd.init()
        model = torch.nn.Linear(64, 10)
        opt = torch.optim.SGD(model.parameters(), lr=learning_rate * hvd.size())
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        ...
        return model.state_dict()          # rank 0's value comes back

    state = HorovodRunner(np=2).run(train, learning_rate=0.01)

Each rank is a process of a Spark barrier task, launched by
:class:`sparkml_dist.runner.BarrierRunner` with ``backend="horovod"``: Horovod's Gloo rendezvous is
served by rank 0's process, so there is no mpirun, no ssh and no second cluster manager. Horovod
itself must be installed on the driver and executors (``make horovod``: Horovod 0.28.1 built with
PyTorch and Gloo). A Keras program that imports :mod:`sparkml_dist.keras` as ``hvd`` (Horovod's
Keras API on Keras 3, which Horovod cannot build against) runs on ``backend="torch"`` instead, and
needs no Horovod. Beyond sparkdl's API: :meth:`HorovodRunner.run_with_data` gives each rank its
shard of a DataFrame, and keyword options pass to BarrierRunner (``timeout``, ``use_gpu``, ...).
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

from . import _spark_env, arg_checks
from .errors import ConfigurationError
from .runner.context import log_to_driver

__all__ = ["HorovodRunner", "log_to_driver"]

VERBOSITIES = ("log_callback_only", "all")


class HorovodRunner:
    """Runs a Horovod training function on ``np`` ranks, as Databricks' ``sparkdl.HorovodRunner``.

    Args:
        np: number of ranks. ``np > 0``: a Spark barrier job of ``np`` tasks, one per task slot
            (too few slots: it waits up to ``start_timeout`` for executors of a cluster that can
            still grow, and fails at once, naming needed and available slots, only where the
            master can never hold ``np`` tasks). ``np < 0``:
            ``-np`` processes on the driver, no Spark job: for debugging; their output always goes
            to the cell. ``np = 0`` (deprecated by Databricks too): every task slot of the cluster.
        driver_log_verbosity: ``"log_callback_only"`` (default): the driver shows only what the
            ranks send with :func:`log_to_driver` (and the traceback of a failure);
            ``"all"``: every rank's stdout and stderr, prefixed with ``[rank r]``.
        **options: passed to :class:`sparkml_dist.runner.BarrierRunner` (``use_gpu``,
            ``timeout``, ``start_timeout``, ``max_restarts``, ``checkpoint_dir``, ``spark``,
            ``log_sink``, ...). ``use_gpu`` defaults to whether the cluster schedules GPUs.

    Example::

        hr = HorovodRunner(np=2, driver_log_verbosity="all")
        weights = hr.run(train, learning_rate=0.01)
    """

    def __init__(self, *, np: int, driver_log_verbosity: str = "log_callback_only", **options: Any) -> None:
        if not isinstance(np, int) or isinstance(np, bool):
            raise ConfigurationError(
                f"np must be an integer (np > 0: Spark tasks, np < 0: processes on the driver); got {np!r}"
            )
        arg_checks.one_of("driver_log_verbosity", driver_log_verbosity, VERBOSITIES)
        for reserved in ("backend", "log_ranks"):
            if reserved in options:
                raise ConfigurationError(
                    f"HorovodRunner sets {reserved!r} itself; use "
                    "sparkml_dist.runner.BarrierRunner to choose it"
                )
        if np == 0:
            warnings.warn(
                "HorovodRunner(np=0) (every task slot of the cluster) is deprecated, as on "
                "Databricks; pass the number of ranks explicitly.",
                FutureWarning,
                stacklevel=2,
            )
        self.num_processor = np
        self.driver_log_verbosity = driver_log_verbosity
        self._options = options

    def _runner(self, spark, main: Callable):
        """The BarrierRunner of one run; ``spark`` is the session (None only for np < 0)."""
        from .runner import BarrierRunner
        from .runner.launchers import local_processes

        np_ = self.num_processor or _all_slots(spark)
        local = local_processes(np_)
        options = dict(self._options)
        if "use_gpu" not in options:
            options["use_gpu"] = not local and _spark_env.schedules_gpus(_spark_env.conf_of(spark))
        everything = self.driver_log_verbosity == "all" or local
        return BarrierRunner(
            np_, backend=_backend(main), log_ranks="all" if everything else "none", **options
        )

    @staticmethod
    def _active(spark):
        return (
            spark
            if spark is not None
            else _spark_env.active_session(
                "HorovodRunner(np > 0)", "pass spark=..., or use np < 0 to run processes on the driver"
            )
        )

    def run(self, main: Callable, **kwargs) -> Any:
        """Run ``main(**kwargs)`` on every rank; returns rank 0's return value.

        ``main`` and ``kwargs`` are pickled with cloudpickle: import modules inside ``main``. A
        rank that fails raises :class:`sparkml_dist.errors.WorkerError` with its traceback, after
        every other rank was stopped.
        """
        spark = None if self.num_processor < 0 else self._active(self._options.get("spark"))
        return self._runner(spark, main).run(main, **kwargs)

    def run_with_data(self, df, main: Callable, **kwargs) -> Any:
        """As :meth:`run`, each rank reading its shard of ``df`` with ``sparkml_dist.runner.shard()``."""
        return self._runner(df.sparkSession, main).run_with_data(df, main, **kwargs)

    def __repr__(self) -> str:
        return f"HorovodRunner(np={self.num_processor}, driver_log_verbosity={self.driver_log_verbosity!r})"


def _backend(main: Callable) -> str:
    """Horovod's, unless ``main`` is a Keras program on :mod:`sparkml_dist.keras` that does not
    import Horovod: that one runs on torch.distributed (no Horovod needed)."""
    from . import serialization

    modules = serialization.imported_modules(main)
    keras = any(m == "sparkml_dist.keras" or m.startswith("sparkml_dist.keras.") for m in modules)
    horovod = any(m.split(".")[0] == "horovod" for m in modules)
    return "torch" if keras and not horovod else "horovod"


def _all_slots(spark) -> int:
    """np=0: every task slot (the runner's own count)."""
    from .runner.sizing import all_slots

    return all_slots(spark, "np=0")
