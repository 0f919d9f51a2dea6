"""Setting a pipeline up on a rank: process group, device, the split every rank agrees on.  [rank]

Rank 0 measures the layers' costs and cuts the model (:mod:`.split`); the
counts and per-stage costs reach every rank in one broadcast of a float tensor.
"""

from __future__ import annotations

import os
from typing import List, Tuple

import torch
import torch.distributed as dist

from ..stages import partition, stage_sums
from . import costs as _costs
from .blocks import on_meta
from .layout import Layout


def ensure_process_group() -> None:
    if dist.is_initialized():
        return
    from ..runner import protocol
    from ..runner.context import init_process_group

    if protocol.RUN_ENV in os.environ:
        init_process_group()
    else:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")


def default_device() -> torch.device:
    from ..runner import protocol

    if protocol.RUN_ENV in os.environ:
        from ..runner.context import context

        return torch.device(context().device)
    return torch.device("cpu")


def choose_split(blocks, balance, layout, micro, microbatches, device) -> Tuple[List[int], List[float]]:
    """Rank 0 measures and cuts; every rank receives the same counts and per-stage costs."""
    n_stages = layout.stages
    packed = torch.zeros(2 * n_stages, dtype=torch.float64, device=device)
    if layout.rank == 0:
        if isinstance(balance, str):
            measure = _costs.compute_costs if balance == "compute" else None
            costs = (
                measure(blocks, micro, device)
                if measure
                else _costs.memory_costs(blocks, micro, microbatches)
            )
            counts = partition(costs, n_stages)
        else:
            counts, costs = list(balance), [1.0] * len(blocks)
        packed[:n_stages] = torch.tensor(counts, dtype=torch.float64)
        packed[n_stages:] = torch.tensor(stage_sums(costs, counts), dtype=torch.float64)
    dist.broadcast(packed, src=0)
    packed = packed.cpu()
    return [int(c) for c in packed[:n_stages]], [float(c) for c in packed[n_stages:]]


def describe(layout: Layout, spans, costs, balance, schedule) -> str:
    unit = {"compute": "ms", "memory": "MiB"}.get(balance if isinstance(balance, str) else "", "layers")
    scale = {"ms": 1e3, "MiB": 1 / 2**20, "layers": 1.0}[unit]
    per_rank = layout.stages // layout.pp_ranks
    kind = {
        ("simple", False): "GPipe",
        ("simple", True): "looped GPipe",
        ("interleaved", False): "1F1B",
        ("interleaved", True): "interleaved 1F1B",
    }[(schedule, per_rank > 1)]
    parts = ", ".join(
        f"stage {s} layers {a}-{b - 1} ({c * scale:.3g} {unit})"
        for s, ((a, b), c) in enumerate(zip(spans, costs))
    )
    return (
        f"pipeline: {spans[-1][1]} layers in {layout.stages} stages on {layout.pp_ranks} rank(s) x "
        f"{layout.replicas} replica(s), {kind}, balance "
        f"{balance if isinstance(balance, str) else 'given'}: {parts}"
    )


def materialise(block: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    if not on_meta(block):
        return block.to(device)
    block = block.to_empty(device=device)
    for m in block.modules():
        if callable(getattr(m, "reset_parameters", None)):
            m.reset_parameters()
    return block


class EvalMode:
    """Blocks in eval mode for a while (shape and cost probes must not move BatchNorm statistics)."""

    def __init__(self, modules):
        self.modules = list(modules)

    def __enter__(self):
        self.modes = [m.training for m in self.modules]
        for m in self.modules:
            m.eval()

    def __exit__(self, *exc):
        for m, mode in zip(self.modules, self.modes):
            m.train(mode)
