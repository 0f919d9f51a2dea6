"""Horovod's value collectives for Keras programs: allreduce, allgather, broadcast.  [rank]

Each takes what a Keras program holds (a number, a NumPy array, a Keras variable or tensor, a torch
tensor) and returns a new value, leaving the input as it was: a torch tensor for a torch tensor or
Keras variable, a NumPy array otherwise.  In a world of one they return the value itself.

Example::

    mean_loss = hvd.allreduce(loss)                  # the average over the ranks
    every_id = hvd.allgather(np.array([hvd.rank()]))
    hvd.broadcast_variables(model.variables, root_rank=0)
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

from ..errors import ConfigurationError
from ..parallel.agreement import check_alike
from . import _collectives, _ranks

Average = "average"
Sum = "sum"
Adasum = "adasum"
OPS = (Average, Sum)


def reduce_op(op: Optional[str], average: Optional[bool]) -> str:
    """The operation of Horovod's ``(average=..., op=...)`` pair (``op`` wins; Average by default)."""
    if op is not None and average is not None:
        raise ConfigurationError("pass op=hvd.Average or op=hvd.Sum, not average= as well")
    if op is None:
        op = Sum if average is False else Average
    if op == Adasum:
        raise ConfigurationError(
            "op=hvd.Adasum is not available in sparkml_dist.keras: use op=hvd.Average (the default), "
            "or op=hvd.Sum"
        )
    if op not in OPS:
        raise ConfigurationError(f"op must be hvd.Average or hvd.Sum, got {op!r}")
    return op


def _as_tensor(value: Any):
    """(a new torch tensor holding ``value``, whether to give a torch tensor back)."""
    import numpy as np
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().clone(), True
    inner = getattr(value, "value", None)  # a Keras variable on the torch backend
    if isinstance(inner, torch.Tensor):
        return inner.detach().clone(), True
    return torch.from_numpy(np.array(value)), False


def _back(tensor, torch_out: bool):
    return tensor if torch_out else tensor.cpu().numpy()


def allreduce(
    value,
    name: Optional[str] = None,
    average: Optional[bool] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    op: Optional[str] = None,
    compression=_collectives.Compression.none,
):
    """The sum (``op=hvd.Sum``) or average (default) of ``value`` over the ranks."""
    op = reduce_op(op, average)
    _ranks._need_init("allreduce")
    tensor, torch_out = _as_tensor(value)
    if _ranks.distributed():
        check_alike([tensor], "hvd.allreduce", [name])
        _collectives.allreduce_([tensor], op == Average, compression, prescale_factor, postscale_factor)
    elif prescale_factor * postscale_factor != 1.0:
        tensor = tensor * (prescale_factor * postscale_factor)
    return _back(tensor, torch_out)


def allgather(value, name: Optional[str] = None):
    """Every rank's ``value`` concatenated along the first axis, in rank order."""
    _ranks._need_init("allgather")
    tensor, torch_out = _as_tensor(value)
    if _ranks.distributed():
        tensor = _collectives.allgather(tensor)
    return _back(tensor.reshape(1) if tensor.dim() == 0 else tensor, torch_out)


def broadcast(value, root_rank: int, name: Optional[str] = None):
    """Rank ``root_rank``'s ``value``, on every rank."""
    _ranks._need_init("broadcast")
    tensor, torch_out = _as_tensor(value)
    if _ranks.distributed():
        root = _root(root_rank)
        check_alike([tensor], "hvd.broadcast", [name])
        _collectives.broadcast_([tensor], root=root)
    return _back(tensor, torch_out)


def broadcast_variables(variables: Iterable, root_rank: int) -> None:
    """Assign rank ``root_rank``'s values to ``variables`` (Keras variables) on every rank."""
    _ranks._need_init("broadcast_variables")
    variables = list(variables)
    if not variables or not _ranks.distributed():
        return
    values = [_as_tensor(v)[0] for v in variables]
    root = _root(root_rank)
    names = [getattr(v, "path", None) or getattr(v, "name", None) for v in variables]
    check_alike(values, "hvd.broadcast_variables", names)  # one by one, named
    _collectives.broadcast_(values, root=root)
    for v, t in zip(variables, values):
        v.assign(t)


def _root(root_rank: int) -> int:
    world = _ranks.size()
    if not isinstance(root_rank, int) or not 0 <= root_rank < world:
        raise ConfigurationError(f"root_rank must be a rank, 0 .. {world - 1}; got {root_rank!r}")
    return root_rank
