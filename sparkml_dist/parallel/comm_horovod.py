"""Horovod's ``DistributedOptimizer`` with the settings :func:`sparkml_dist.parallel.comm.ddp` takes.  [rank]

Runs inside a function given to ``BarrierRunner(backend="horovod")`` (or
:class:`sparkml_dist.horovod.HorovodRunner`): the same names as for DDP
(:mod:`sparkml_dist.runner.comm_settings`), so a program switches backend without renaming its
settings.
"""

from __future__ import annotations

import os
from typing import Any, Optional

import torch

from ..errors import ConfigurationError
from ..runner import comm_settings

__all__ = ["horovod"]


def horovod(
    optimizer: torch.optim.Optimizer,
    model: torch.nn.Module,
    *,
    bucket_cap_mb: Optional[float] = None,
    accumulate: Optional[int] = None,
    compression: Optional[str] = None,
    cycle_time_ms: Optional[float] = None,
    hierarchical: Optional[bool] = None,
    **options: Any,
):
    """``optimizer`` in Horovod's ``DistributedOptimizer`` with the same settings as :func:`ddp`.

    A setting left None takes the run's (``BarrierRunner(backend="horovod", comm={...})``), else
    Horovod's own default. ``bucket_cap_mb`` is Horovod's fusion threshold, ``cycle_time_ms`` its
    cycle time, ``hierarchical`` its hierarchical all-reduce (NCCL): Horovod reads these three when
    ``hvd.init()`` starts it, so this calls ``hvd.init()`` with them when nothing has yet, and
    refuses values other than those Horovod started with. ``accumulate=k`` is
    ``backward_passes_per_step=k``; ``compression="fp16"`` is ``hvd.Compression.fp16``. Other
    keyword arguments go to ``hvd.DistributedOptimizer``.

    Example::

        import horovod.torch as hvd
        opt = comm.horovod(torch.optim.SGD(model.parameters(), lr=0.1), model, compression="fp16")
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    """
    import horovod.torch as hvd

    settings = comm_settings.resolve(
        {
            "bucket_cap_mb": bucket_cap_mb,
            "accumulate": accumulate,
            "compression": compression,
            "cycle_time_ms": cycle_time_ms,
            "hierarchical": hierarchical,
        }
    )
    comm_settings.check_values("comm.horovod", settings, (None, "fp16"), backend="horovod")
    wanted = comm_settings.horovod_env(settings)
    if not hvd.is_initialized():
        os.environ.update(wanted)
        hvd.init()
    else:
        differ = sorted(k for k, v in wanted.items() if os.environ.get(k) != v)
        if differ:
            raise ConfigurationError(
                f"comm.horovod: Horovod already started (hvd.init()) without {differ}, which it reads "
                "only when it starts: give them as BarrierRunner(backend='horovod', comm={...}), or call "
                "comm.horovod before hvd.init()"
            )
    return hvd.DistributedOptimizer(
        optimizer,
        named_parameters=model.named_parameters(),
        compression=hvd.Compression.fp16 if settings["compression"] == "fp16" else hvd.Compression.none,
        backward_passes_per_step=settings["accumulate"],
        **options,
    )
