"""Helpers for code running inside a rank process.  [executor: inside a rank process]

    from sparkml_dist.runner import context, init_process_group
    init_process_group()            # gloo on CPU, NCCL with use_gpu=True; the runner's timeout
    ctx = context()                 # rank, world_size, local_rank, local_world_size, device

An unchanged script that calls ``torch.distributed.init_process_group()`` itself works too: the
runner sets MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import ConfigurationError
from . import _rank


@dataclass(frozen=True)
class RankContext:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: str          # "cpu", or "cuda:0" (the task's GPU; CUDA_VISIBLE_DEVICES is pinned)
    use_gpu: bool


def context() -> RankContext:
    """Where this rank stands; only inside a function run by :class:`BarrierRunner`."""
    if _rank.RUN_ENV not in os.environ:
        raise ConfigurationError("sparkml_dist.runner.context() is only available inside a function "
                                 "run by BarrierRunner")
    use_gpu = os.environ.get(_rank.USE_GPU_ENV) == "1"
    return RankContext(
        rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        device="cuda:0" if use_gpu else "cpu", use_gpu=use_gpu)


def init_process_group(backend: str = None, **kwargs) -> None:
    """``torch.distributed.init_process_group`` with the right backend and the runner's timeout."""
    import torch
    import torch.distributed as dist

    ctx = context()
    if backend is None:
        backend = "nccl" if ctx.use_gpu else "gloo"
    if ctx.use_gpu:
        torch.cuda.set_device(0)
    kwargs.setdefault("timeout", _rank.collective_timeout())
    dist.init_process_group(backend=backend, **kwargs)
