"""What a process hands to its collectives, measured: bytes by dtype and by operation.  [rank]

:func:`meter` counts, while it is open, every tensor this process gives to a collective:
torch.distributed's ``all_reduce``, ``broadcast``, ``all_gather_into_tensor``,
``reduce_scatter_tensor`` (what DDP's communication hooks, PowerSGD, DiLoCo and FSDP2's Python
paths call) and Horovod's ``allreduce_async_`` / ``grouped_allreduce_async_`` (what its
``DistributedOptimizer`` calls, after its compression). So a compression setting is checked by
what it sends — float16 tensors, PowerSGD's low-rank factors — not by its name. The count is of
the tensors handed over (a ring all-reduce of ``b`` bytes sends about ``2 (n - 1) / n * b`` per
rank), from every thread of the process, including the autograd threads DDP's hooks run on.

Example::

    from sparkml_dist.parallel import traffic

    with traffic.meter() as sent:
        for x, y in batches:
            loss_fn(net(x), y).backward()   # net = comm.ddp(model, compression="fp16")
            opt.step(); opt.zero_grad()
    sent.bytes                  # every tensor byte handed to a collective meanwhile
    sent.by_dtype               # {"float16": ...}: what travelled
"""

from __future__ import annotations

import contextlib
import threading
from typing import Dict, Iterator, List

_TORCH_OPS = ("all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor")
_HOROVOD_OPS = ("allreduce_async_", "grouped_allreduce_async_")


class Sent:
    """What was handed to collectives while a :func:`meter` was open."""

    def __init__(self) -> None:
        self.bytes = 0
        self.calls = 0
        self.by_dtype: Dict[str, int] = {}
        self.by_op: Dict[str, int] = {}

    def add(self, op: str, tensors) -> None:
        for t in tensors:
            size = int(t.numel()) * int(t.element_size())
            dtype = str(t.dtype).replace("torch.", "")
            self.bytes += size
            self.by_dtype[dtype] = self.by_dtype.get(dtype, 0) + size
            self.by_op[op] = self.by_op.get(op, 0) + size
        self.calls += 1

    def __repr__(self) -> str:
        return f"Sent(bytes={self.bytes}, calls={self.calls}, by_dtype={self.by_dtype})"


_open: List[Sent] = []
_lock = threading.Lock()
_installed: set = set()


def _counting(op: str, original, tensors_of):
    def counted(*args, **kwargs):
        if _open:
            tensors = tensors_of(args, kwargs)
            with _lock:
                for sent in _open:
                    sent.add(op, tensors)
        return original(*args, **kwargs)

    counted._sparkml_dist_original = original  # type: ignore[attr-defined]
    return counted


def _first(args, kwargs, name="tensor"):
    t = args[0] if args else kwargs.get(name)
    return list(t) if isinstance(t, (list, tuple)) else [t]


def _input(args, kwargs):
    """The input of ``all_gather_into_tensor(out, in)`` / ``reduce_scatter_tensor(out, in)``."""
    return [args[1] if len(args) > 1 else kwargs.get("input")]


def _install() -> None:
    """Wrap the collectives once per process (the wrappers count only while a meter is open)."""
    import sys

    import torch.distributed as dist

    owners = [(dist, op, _input if op in ("all_gather_into_tensor", "reduce_scatter_tensor") else _first)
              for op in _TORCH_OPS]  # fmt: skip
    if "horovod.torch" in sys.modules:
        from horovod.torch import mpi_ops, optimizer

        owners += [(m, op, _first) for m in (mpi_ops, optimizer) for op in _HOROVOD_OPS if hasattr(m, op)]
    for owner, op, tensors_of in owners:
        if (id(owner), op) in _installed:
            continue
        _installed.add((id(owner), op))
        setattr(owner, op, _counting(op, getattr(owner, op), tensors_of))


@contextlib.contextmanager
def meter() -> Iterator[Sent]:
    """Count what this process hands to collectives until the block ends (see the module)."""
    _install()
    sent = Sent()
    with _lock:
        _open.append(sent)
    try:
        yield sent
    finally:
        with _lock:
            _open.remove(sent)
