"""Fused all-reduce and broadcast of torch tensors over torch.distributed.  [rank]

What :mod:`sparkml_dist.keras` averages and broadcasts with: Keras 3 on the torch backend keeps
every variable and gradient as a torch tensor, so the ranks' process group (gloo on CPU, NCCL on
GPUs) carries them.  Tensors are packed into buckets of at most ``HOROVOD_FUSION_THRESHOLD``
bytes (Horovod's variable and default, 64 MiB), one collective per bucket rather than one per
tensor: Horovod's fusion buffer.

Example::

    allreduce_([grad_a, grad_b], average=True)     # in place, one collective for both
    broadcast_([w_a, w_b], root=0)                 # w_a, w_b: rank 0's values on every rank
"""

from __future__ import annotations

import os
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

DEFAULT_FUSION_BYTES = 64 * 1024 * 1024
FUSION_ENV = "HOROVOD_FUSION_THRESHOLD"


def fusion_bytes() -> int:
    """The bucket size: ``HOROVOD_FUSION_THRESHOLD`` bytes (0: one tensor per collective)."""
    raw = os.environ.get(FUSION_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_FUSION_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        from ..errors import ConfigurationError

        raise ConfigurationError(f"{FUSION_ENV}={raw!r}: expected a number of bytes (>= 0), e.g. 67108864")
    return value


def buckets(tensors: Sequence, limit: int) -> Iterator[List[int]]:
    """Indices of ``tensors`` grouped by (dtype, device), each group cut at ``limit`` bytes."""
    groups: Dict[Tuple[object, object], List[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.dtype, t.device), []).append(i)
    for members in groups.values():
        bucket: List[int] = []
        size = 0
        for i in members:
            n = tensors[i].numel() * tensors[i].element_size()
            if bucket and size + n > limit:
                yield bucket
                bucket, size = [], 0
            bucket.append(i)
            size += n
        if bucket:
            yield bucket


def allreduce_(
    tensors: Sequence,
    average: bool = True,
    compression=None,
    prescale: float = 1.0,
    postscale: float = 1.0,
    group=None,
) -> None:
    """Sum (``average``: then divide by the world size) each tensor over the ranks, in place.

    ``compression``: :class:`sparkml_dist.keras.Compression` (``fp16`` sends floating buckets as
    float16); ``prescale`` / ``postscale``: factors applied before and after the sum.
    """
    import torch
    import torch.distributed as dist

    world = dist.get_world_size(group)
    post = postscale / world if average else postscale
    for index in buckets(tensors, fusion_bytes()):
        parts = [tensors[i] for i in index]
        flat = torch.cat([p.reshape(-1) for p in parts]) if len(parts) > 1 else parts[0].reshape(-1).clone()
        if prescale != 1.0:
            flat.mul_(prescale)
        wire, ctx = compression.compress(flat) if compression is not None else (flat, None)
        dist.all_reduce(wire, group=group)
        flat = compression.decompress(wire, ctx) if compression is not None else wire
        if post != 1.0 and flat.is_floating_point():
            flat.mul_(post)
        elif post != 1.0:  # integers: scaled in float64, truncated back (Horovod's integer average)
            flat = (flat.to(torch.float64) * post).to(parts[0].dtype)
        _scatter(flat, parts)


def broadcast_(tensors: Sequence, root: int = 0, group=None) -> None:
    """Every tensor takes rank ``root``'s value, in place; any dtypes, in buckets of bytes."""
    import torch
    import torch.distributed as dist

    as_bytes = [t.detach().contiguous().view(-1).view(torch.uint8) for t in tensors]
    for index in buckets(as_bytes, fusion_bytes()):
        parts = [as_bytes[i] for i in index]
        flat = torch.cat(parts) if len(parts) > 1 else parts[0].clone()
        dist.broadcast(flat, src=root, group=group)
        offset = 0
        for i in index:
            n = as_bytes[i].numel()
            target = tensors[i]
            with torch.no_grad():
                target.copy_(flat[offset : offset + n].view(target.dtype).view(target.shape))
            offset += n


def allgather(tensor, group=None):
    """``tensor`` of every rank, concatenated along the first axis (first dimensions may differ)."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size(group)
    rows = torch.tensor([tensor.shape[0] if tensor.dim() else 1], device=tensor.device)
    sizes = [torch.zeros_like(rows) for _ in range(world)]
    dist.all_gather(sizes, rows, group=group)
    tensor = tensor.reshape(1) if tensor.dim() == 0 else tensor
    most = int(max(s.item() for s in sizes))
    padded = torch.zeros((most,) + tuple(tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
    padded[: tensor.shape[0]] = tensor
    out = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(out, padded, group=group)
    return torch.cat([o[: int(s.item())] for o, s in zip(out, sizes)])


def _scatter(flat, parts: Sequence) -> None:
    import torch

    offset = 0
    with torch.no_grad():
        for p in parts:
            n = p.numel()
            p.copy_(flat[offset : offset + n].view(p.shape))
            offset += n


class NoneCompressor:
    """Send tensors as they are."""

    @staticmethod
    def compress(tensor) -> Tuple[object, Optional[object]]:
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor:
    """Send floating tensors as float16 (half the bytes), restored to their dtype after."""

    @staticmethod
    def compress(tensor):
        import torch

        if tensor.is_floating_point() and tensor.dtype != torch.float16:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)


class Compression:
    """Horovod's gradient compression choices: ``Compression.none``, ``Compression.fp16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
