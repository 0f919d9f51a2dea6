"""What the driver hands each barrier task: its :class:`TaskSpec`.  [anywhere]

Built on the driver by :class:`~sparkml_dist.runner.run.Run`, pickled into the barrier job (or
handed to the threads of local processes), read by :mod:`sparkml_dist.runner.tasks.task`: plain
values only.  Where the ranks' rows come from is the data room's own spec
(:mod:`sparkml_dist.runner.data.spec`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from . import protocol
from .data.spec import Data
from .roles import Roles
from .settings import Logs, Placement, RankEnv, Timeouts, WorkDir


@dataclass(frozen=True)
class TaskSpec:
    """Everything a barrier task needs, as plain values built on the driver; the runner's settings
    in their groups (:mod:`.settings`)."""

    run_id: str
    world_size: int
    payload: bytes  # serialized (main, args, kwargs, want_result)
    backend: str  # a name in backends.BACKENDS
    channel: Optional[Tuple[str, int]]  # the driver's log server, or None
    secret: bytes
    return_all: bool
    max_result_bytes: int
    timeouts: Timeouts = Timeouts()
    placement: Placement = Placement()
    logs: Logs = Logs()  # whose lines stream (this attempt's ranks), every rank's output kept where
    workdir: WorkDir = WorkDir()
    env: RankEnv = field(default=RankEnv(), repr=False)  # values may be secrets: never shown
    data: Data = None  # where the ranks' shards come from: None (no data), SparkRows, ParquetSlices
    local_gpus: Optional[Tuple[str, ...]] = None  # rank r's GPU, when the ranks share the driver's machine
    ranks_per_task: int = 1  # a task holding k GPUs runs k ranks, one per GPU
    attempt: int = 1
    launch: Optional[Tuple[str, str]] = None  # (driver host, driver's cwd): torchrun's cwd rule
    job: str = "function"  # names the kept working directory on executors
    exchange: str = "gang"  # how tasks exchange addresses: "gang" (allGather) or "driver" (peer_exchange)
    warm_ranks: bool = True  # ranks forked from a warm pool when the backend allows (tasks.warm_pool)
    max_restarts: int = 0  # how often a rank lost inside elastic.run is replaced in place (tasks.replace)
    echo: bool = True  # copy rank lines to the task's stderr (not on local masters: that is the console)
    roles: Optional[Roles] = None  # a chief and parameter servers beside the workers (runner.roles)
    # "restart": one barrier stage, a lost executor ends it; "replace": plain tasks, Spark retries
    # only a lost executor's tasks and their ranks join the survivors (elastic.executor_loss)
    executor_loss: str = "restart"

    @property
    def barrier(self) -> bool:
        """The ranks' tasks form a barrier stage (else plain tasks: ``executor_loss="replace"``)."""
        return self.executor_loss != "replace"

    @property
    def resizes(self) -> bool:
        """The world may shrink and grow in place (``executor_loss="replace"`` with ``min_np``)."""
        return any(name == protocol.RESIZE_ENV for name, _ in self.env.items())

    def rank_env(self, rank: int, gpus: Optional[List[str]]) -> Dict[str, str]:
        """The environment rank ``rank``'s process starts with (the rendezvous comes later, in its
        start message): this process's, without Spark's secrets, plus the run's settings."""
        env = {
            **protocol.without_spark_secrets(os.environ),
            **dict(self.env.items()),
            "RANK": str(rank),
            "WORLD_SIZE": str(self.world_size),
            "PYTHONUNBUFFERED": "1",
            protocol.TIMEOUT_ENV: str(self.timeouts.collective),
            protocol.START_TIMEOUT_ENV: str(self.timeouts.start or ""),
            protocol.BACKEND_ENV: self.backend,
            protocol.RUN_ENV: self.run_id,
            protocol.USE_GPU_ENV: "1" if self.placement.use_gpu else "0",
        }
        if gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        return env
