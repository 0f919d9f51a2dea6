"""What every rank must hold alike, checked with one small collective before it is used.  [rank]

A collective over tensors whose shapes or dtypes differ between the ranks does not fail by itself:
a broadcast of a (2, 3) array into a (3, 2) one, or of float32 bits into int32, lays the bytes
across the wrong places. :func:`check_alike` compares a digest of every rank's list of (dtype,
shape) with one 32-byte all-gather, and only when they differ gathers the lists themselves (as
JSON, never a pickle) to name the first tensor that differs with both ranks' shapes, on every
rank (so none is left waiting). :func:`check_same` does the same for a few settings (numbers and
strings) every rank must share. Used by :mod:`sparkml_dist.keras`'s broadcasts and by
:class:`~sparkml_dist.parallel.diloco.DiLoCo`.

Example::

    check_alike(list(model.parameters()), "DiLoCo", names=[n for n, _ in model.named_parameters()])
    check_same({"sync_every": 8}, "DiLoCo")
"""

from __future__ import annotations

import hashlib
import json
from typing import List, Optional, Sequence

from ..errors import ConfigurationError


def _gather_bytes(mine: bytes, group=None) -> Optional[List[bytes]]:
    """Every rank's ``mine``, or None when they are all the same (one 32-byte all-gather then)."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size(group)
    digest = torch.tensor(list(hashlib.sha256(mine).digest()), dtype=torch.uint8)
    digests = [torch.empty_like(digest) for _ in range(world)]
    dist.all_gather(digests, digest, group=group)
    if all(torch.equal(d, digests[0]) for d in digests):
        return None
    length = torch.tensor([len(mine)], dtype=torch.int64)
    lengths = [torch.empty_like(length) for _ in range(world)]
    dist.all_gather(lengths, length, group=group)
    longest = int(max(n.item() for n in lengths))
    padded = torch.zeros(longest, dtype=torch.uint8)
    padded[: len(mine)] = torch.tensor(list(mine), dtype=torch.uint8)
    out = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(out, padded, group=group)
    return [bytes(o[: int(n.item())].tolist()) for o, n in zip(out, lengths)]


def check_alike(tensors: Sequence, what: str, names: Optional[Sequence[str]] = None, group=None) -> None:
    """Refuse, on every rank, ``tensors`` whose shapes or dtypes differ between the ranks (see the
    module docstring); ``names``: the tensors' names for the refusal."""
    mine = json.dumps([[str(t.dtype).replace("torch.", ""), list(t.shape)] for t in tensors]).encode()
    every = _gather_bytes(mine, group)
    if every is None:
        return
    lists = [json.loads(b.decode()) for b in every]
    first = next(r for r in range(1, len(lists)) if lists[r] != lists[0])
    a, b = lists[0], lists[first]
    if len(a) != len(b):
        raise ConfigurationError(
            f"{what}: rank 0 passes {len(a)} tensors, rank {first} {len(b)}: every rank must pass the "
            "same tensors (the same model, built the same way)"
        )
    i = next(i for i in range(len(a)) if a[i] != b[i])
    name = f" {names[i]!r}" if names and i < len(names) and names[i] else ""
    raise ConfigurationError(
        f"{what}: mismatched shapes or dtypes of tensor {i}{name}: rank 0 has {tuple(a[i][1])} "
        f"{a[i][0]}, rank {first} has {tuple(b[i][1])} {b[i][0]}; every rank must pass the same "
        "shapes and dtypes (the same model, built the same way)"
    )


def check_same(settings: dict, what: str, group=None) -> None:
    """Refuse, on every rank, ``settings`` (JSON values) that differ between the ranks, naming
    the first that differs and both ranks' values."""
    every = _gather_bytes(json.dumps(settings, sort_keys=True).encode(), group)
    if every is None:
        return
    seen = [json.loads(b.decode()) for b in every]
    first = next(r for r in range(1, len(seen)) if seen[r] != seen[0])
    key = next(k for k in sorted(set(seen[0]) | set(seen[first])) if seen[0].get(k) != seen[first].get(k))
    raise ConfigurationError(
        f"{what}: {key}={seen[0].get(key)!r} on rank 0 but {seen[first].get(key)!r} on rank {first}: "
        "every rank must use the same value"
    )
