"""Helpers for code running inside a rank process.  [rank]

Example::

    from sparkml_dist.runner import context, init_process_group
    init_process_group()            # gloo on CPU, NCCL with use_gpu=True; the runner's timeout
    ctx = context()                 # rank, world_size, local_rank, local_world_size, device
    log_to_driver("epoch 3: loss 0.12")   # shown on the driver whatever log_ranks is
    ctx.log_metrics(3, loss=0.12)   # rank 0's reach the driver's MLflow run (BarrierRunner(mlflow=...))

An unchanged script that calls ``torch.distributed.init_process_group()`` itself works too: the
runner sets MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional, Tuple

from ..errors import ConfigurationError
from ..gpus import DEVICE_ENV, DEVICES_ENV
from . import backends, protocol, rank_channel


@dataclass(frozen=True)
class RankContext:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: str  # "cpu", or the rank's GPU: "cuda:<LOCAL_RANK>" when a node's GPUs are all visible
    use_gpu: bool
    devices: Tuple[str, ...] = ()  # every GPU of the rank ("cuda:0", "cuda:1" with gpus_per_rank=2)

    def log_metrics(self, step: Optional[int] = None, **metrics) -> None:
        """:func:`log_metrics`: rank 0's metrics reach the run's MLflow run."""
        log_metrics(step, **metrics)


def context() -> RankContext:
    """Where this rank stands; only inside a function run by :class:`BarrierRunner`."""
    if protocol.RUN_ENV not in os.environ:
        raise ConfigurationError(
            "sparkml_dist.runner.context() is only available inside a function run by BarrierRunner"
        )
    use_gpu = os.environ.get(protocol.USE_GPU_ENV) == "1"
    return RankContext(
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        device=f"cuda:{os.environ.get(DEVICE_ENV, '0')}" if use_gpu else "cpu",
        use_gpu=use_gpu,
        devices=tuple(f"cuda:{i}" for i in os.environ.get(DEVICES_ENV, "0").split(",")) if use_gpu else (),
    )


def log_to_driver(message: str) -> None:
    """Show ``message`` in the driver's output (the notebook cell), whatever ``log_ranks`` is.

    Prefixed with ``[rank r]`` like streamed lines. Outside a function run by the runner, prints it.
    """
    for line in str(message).splitlines() or [""]:
        if not rank_channel.send_log(line):
            print(line, flush=True)


def log_metrics(step: Optional[int] = None, **metrics) -> None:
    """Log metrics (numbers) at ``step`` to the driver's MLflow run of this BarrierRunner run.

    Rank 0's reach the run (one run per job, not per rank); other ranks' calls do nothing, so every
    rank may call it.  Outside a rank, or when the run is not tracked, nothing is logged.
    """
    from ..tracking import metric_values

    values = metric_values("log_metrics", step, metrics, step_required=False)
    if os.environ.get("RANK") == "0":
        rank_channel.send_metrics(step, values)


def init_process_group(backend: str = None, **kwargs) -> None:
    """``torch.distributed.init_process_group`` with the right backend and the runner's timeout."""
    import torch
    import torch.distributed as dist

    ctx = context()
    if backend is None:
        backend = "nccl" if ctx.use_gpu else "gloo"
    if ctx.use_gpu:
        torch.cuda.set_device(torch.device(ctx.device))
    kwargs.setdefault("timeout", backends.collective_timeout())
    dist.init_process_group(backend=backend, **kwargs)
    from . import checkpoint

    checkpoint.verify_pending()  # a checkpoint loaded before the group: the ranks agree on its step
