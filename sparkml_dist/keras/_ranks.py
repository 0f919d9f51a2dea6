"""Where this process stands: ``init()``, ``rank()``, ``size()`` and the rest.  [rank]

``init()`` joins the runner's torch.distributed group (gloo on CPU, NCCL on GPUs, the runner's
collective timeout), or, outside the runner, the group a ``torchrun`` environment describes; with
no such environment the process is a world of one, so the same program runs on a laptop.

Example::

    init()
    print(rank(), size(), local_rank())
"""

from __future__ import annotations

import os

from ..errors import ConfigurationError
from ..runner import backends, protocol

_INITIALIZED = []  # [True] once init() ran in this process


def _backend_error(backend: str) -> ConfigurationError:
    return ConfigurationError(
        f"sparkml_dist.keras averages gradients through torch.distributed, which backend={backend!r} "
        "does not set up. Run the function with backend='torch' (BarrierRunner's default; "
        "HorovodRunner picks it for a function that imports sparkml_dist.keras). A tf.keras program "
        "runs under backend='tensorflow' with tf.distribute.MultiWorkerMirroredStrategy instead, "
        "a Keras 3 program on JAX under backend='jax' with keras.distribution.DataParallel."
    )


def init(comm=None, process_sets=None) -> None:
    """Join the ranks' process group (Horovod's ``hvd.init()``); a second call does nothing."""
    if comm is not None or process_sets:
        raise ConfigurationError(
            "init(comm=..., process_sets=...): MPI communicators and process sets are Horovod's; "
            "here every rank of the run takes part: call init() with no arguments"
        )
    backend = os.environ.get(protocol.BACKEND_ENV)
    if backend is not None and not backends.get(backend).torch_group:
        raise _backend_error(backend)
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        if protocol.RUN_ENV in os.environ:  # a rank of the runner: its group, device and timeout
            from ..runner.context import init_process_group

            init_process_group()
        else:  # torchrun's environment
            import torch

            gpu = torch.cuda.is_available()
            if gpu:
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group("nccl" if gpu else "gloo")
    _INITIALIZED[:] = [True]


def is_initialized() -> bool:
    return bool(_INITIALIZED)


def shutdown() -> None:
    """Leave the process group (the runner also does it when the function returns)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    _INITIALIZED.clear()


def _need_init(what: str) -> None:
    if not _INITIALIZED:
        raise ConfigurationError(
            f"sparkml_dist.keras.{what}() needs init() first: call hvd.init() at the start"
        )


def distributed() -> bool:
    """Whether collectives go over a process group (False in a world of one that made none)."""
    import torch.distributed as dist

    return dist.is_initialized()


def rank() -> int:
    """This process's rank, 0 .. size() - 1."""
    _need_init("rank")
    return int(os.environ.get("RANK", "0"))


def size() -> int:
    """The number of ranks."""
    _need_init("size")
    return int(os.environ.get("WORLD_SIZE", "1"))


def local_rank() -> int:
    """This process's rank among the ranks of its host."""
    _need_init("local_rank")
    return int(os.environ.get("LOCAL_RANK", "0"))


def local_size() -> int:
    """The number of ranks on this host."""
    _need_init("local_size")
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def cross_rank() -> int:
    """The number of this process's host among the run's hosts."""
    _need_init("cross_rank")
    return int(os.environ.get("GROUP_RANK", "0"))


def cross_size() -> int:
    """The number of hosts the run spans."""
    _need_init("cross_size")
    return int(os.environ.get("GROUP_WORLD_SIZE", "1"))
