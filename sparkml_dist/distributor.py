"""A drop-in ``TorchDistributor``: pyspark's ``TorchDistributor`` API on this package's runner.  [driver]

Code written for ``pyspark.ml.torch.distributor`` runs after changing only the import::

    # from pyspark.ml.torch.distributor import TorchDistributor
    from sparkml_dist.distributor import TorchDistributor

    def train(lr):
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")            # RANK, WORLD_SIZE, MASTER_ADDR... are set
        ...
        return model.state_dict()                  # rank 0's value comes back

    state = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(train, 1e-3)
    TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run("train.py", "--epochs", "3")

Semantics kept from pyspark: ``num_processes`` counts training processes; ``local_mode=True`` runs
them on the driver (on its GPUs with ``use_gpu``: one process per GPU, and ``num_processes``
larger than the GPUs is lowered to their number, with a warning); ``local_mode=False`` runs one
Spark barrier task per process; ``run(function, *args, **kwargs)`` returns rank 0's return value;
``run(path, *args)`` runs the script as ``__main__`` with ``args`` as its command line and
returns None; ``use_gpu`` defaults to True, as in pyspark.  What comes with the runner: rank
logs streamed to the cell, a failure naming its rank with its traceback, timeouts, restarts and
checkpoints (pass ``BarrierRunner`` options as keywords: ``timeout=``, ``max_restarts=``, ...).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Optional, Union

from . import _spark_env
from .errors import ConfigurationError
from .gpus import assign_local
from .gpus import local as local_gpus

log = logging.getLogger(__name__)

IGNORE_SSL_CONF = "pytorch.spark.distributor.ignoreSsl"  # pyspark's opt-in, honoured as is


class TorchDistributor:
    """pyspark's ``TorchDistributor``, backed by :class:`~sparkml_dist.runner.BarrierRunner`.

    Args:
        num_processes: training processes (ranks), >= 1.
        local_mode: run them on the driver (True, pyspark's default) or as Spark barrier tasks.
        use_gpu: one GPU per process (default True, as pyspark); NCCL then.
        **options: passed to ``BarrierRunner`` (``spark``, ``timeout``, ``start_timeout``,
            ``max_restarts``, ``checkpoint_dir``, ``log_ranks``, ...).
    """

    def __init__(self, num_processes: int = 1, local_mode: bool = True, use_gpu: bool = True, **options: Any):
        auto = num_processes == "auto"  # every GPU (use_gpu), else every task slot / driver core
        if not auto and (
            not isinstance(num_processes, int) or isinstance(num_processes, bool) or num_processes < 1
        ):
            raise ConfigurationError(
                f"num_processes has to be a positive integer or 'auto', got {num_processes!r}"
            )
        for reserved in ("np", "backend", "nodes"):
            if reserved in options:
                raise ConfigurationError(
                    f"TorchDistributor sets {reserved!r} itself; "
                    "use sparkml_dist.runner.BarrierRunner to choose it"
                )
        self.num_processes = num_processes
        self.local_mode = bool(local_mode)
        self.use_gpu = bool(use_gpu)
        self._options = options

    def _ranks(self, spark) -> Any:
        """pyspark's rules for how many ranks run, given the GPUs; ``"auto"``: every GPU with
        ``use_gpu``, else every driver core (local mode) or task slot (the runner counts those)."""
        if self.num_processes == "auto":
            if not self.local_mode:
                return "auto"
            return len(local_gpus(spark)[0]) if self.use_gpu else (os.cpu_count() or 1)
        if not self.use_gpu:
            return self.num_processes
        if self.local_mode:
            available = len(local_gpus(spark)[0])
            if 0 < available < self.num_processes:
                log.warning(
                    "num_processes=%d is more than the %d GPU(s) of the driver: running %d processes",
                    self.num_processes,
                    available,
                    available,
                )
                return available
            assign_local(spark, self.num_processes, True, True)  # none at all: the runner's error
        # on a cluster, tasks holding k GPUs run k processes each (num_processes a multiple of k)
        return self.num_processes

    def _runner(self, spark):
        from .runner import BarrierRunner

        options = dict(self._options)
        if spark is not None:
            options.setdefault("spark", spark)
            ignore_ssl = _spark_env.conf_of(spark)(IGNORE_SSL_CONF, "false")
            if str(ignore_ssl).lower() == "true":
                options.setdefault("allow_unencrypted", True)
        n = self._ranks(spark)
        # pyspark's node rules: local mode is one torchrun node; on a cluster each task is a node
        # (LOCAL_RANK 0 and GROUP_RANK = the task's number with one process per task)
        options["nodes"] = "host" if self.local_mode else "task"
        return BarrierRunner(
            n if n == "auto" else (-n if self.local_mode else n), use_gpu=self.use_gpu, **options
        )

    def _session(self):
        spark = self._options.get("spark")
        if spark is not None or self.local_mode:
            return spark
        return _spark_env.active_session(
            "TorchDistributor(local_mode=False)", "start a SparkSession, or pass spark=..."
        )

    def run(self, train_object: Union[Callable, str], *args: Any, **kwargs: Any) -> Optional[Any]:
        """Run a function (``train_object(*args, **kwargs)``; rank 0's return value) or a script
        (``train_object`` a path, ``args`` its command-line arguments; returns None) on every rank.
        Errors name ``num_processes``, this API's name for the runner's ``np``."""
        from .errors import SparkMLDistError

        try:
            return self._run(train_object, *args, **kwargs)
        except SparkMLDistError as exc:
            renamed = in_callers_names(exc)
            if renamed is exc:
                raise
            raise renamed from None

    def _run(self, train_object: Union[Callable, str], *args: Any, **kwargs: Any) -> Optional[Any]:
        runner = self._runner(self._session())
        if isinstance(train_object, str):
            if kwargs:
                raise ConfigurationError(
                    "a training script takes command-line arguments only: pass them as strings in "
                    f"*args, not keywords ({', '.join(kwargs)})"
                )
            from .runner.script import bundle, run_script

            path = os.path.abspath(train_object)
            if not os.path.isfile(path):
                raise ConfigurationError(f"train_object: no training script at {train_object!r}")
            with open(path) as fh:
                source = fh.read()
            runner.run(run_script, source, path, [str(a) for a in args], bundle(path))  # + its folder
            return None
        if not callable(train_object):
            raise ConfigurationError(
                f"train_object must be a function or the path of a script, got {type(train_object).__name__}"
            )
        return runner.run(train_object, *args, **kwargs)

    def __repr__(self) -> str:
        return (
            f"TorchDistributor(num_processes={self.num_processes}, local_mode={self.local_mode}, "
            f"use_gpu={self.use_gpu})"
        )


_NP = __import__("re").compile(r"\b(np)\b(?!\.)")


def in_callers_names(exc: BaseException) -> BaseException:
    """``exc`` with the runner's ``np`` called ``num_processes``, as this API's caller knows it (the
    same error class and attributes; ``exc`` itself when it does not mention ``np``)."""
    import copy

    text = exc.args[0] if exc.args and isinstance(exc.args[0], str) else ""
    if not _NP.search(text):
        return exc
    renamed = copy.copy(exc)
    renamed.args = (_NP.sub("num_processes", text), *exc.args[1:])
    return renamed
