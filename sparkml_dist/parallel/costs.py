"""What each layer costs, to balance pipeline stages.  [rank]

* ``compute``: the median of 3 timed forward+backward passes of the layer on one micro-batch
  (after one warm-up), in seconds, on the device the stage will run on; gradients go to
  ``torch.autograd.grad``, so the model's own ``.grad`` fields are left untouched.  A layer that is
  elsewhere (the CPU, the meta device) is timed on a copy there, one layer at a time.
* ``memory``: bytes the layer holds while training: its parameters and their gradients, its
  buffers, and its output kept for backward for every micro-batch of the mini-batch.
"""

from __future__ import annotations

import copy
import statistics
import time
from typing import List

import torch

from .blocks import Blocks


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def memory_costs(blocks: Blocks, example: torch.Tensor, microbatches: int) -> List[float]:
    costs = []
    meta = any(p.is_meta for b in blocks.modules for p in b.parameters())
    h = example.to("meta") if meta else example  # shapes are all it needs
    with torch.no_grad():
        for block in blocks.modules:
            h = block(h)
            params = sum(_nbytes(p) * (2 if p.requires_grad else 1) for p in block.parameters())
            buffers = sum(_nbytes(b) for b in block.buffers())
            costs.append(float(params + buffers + _nbytes(h) * microbatches))
    return costs


def _on(block: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """The block itself where it lives on ``device``, else a copy there (one block at a time)."""
    tensors = list(block.parameters()) + list(block.buffers())
    if not tensors:
        return block
    if tensors[0].is_meta:
        return copy.deepcopy(block).to_empty(device=device)
    return block if tensors[0].device == device else copy.deepcopy(block).to(device)


def compute_costs(
    blocks: Blocks, example: torch.Tensor, device: torch.device, repeats: int = 3
) -> List[float]:
    costs = []
    h = torch.zeros(example.shape, dtype=example.dtype) if example.is_meta else example
    h = h.to(device)
    for block in blocks.modules:
        block = _on(block, device)
        times = []
        for r in range(repeats + 1):
            x = h.detach().requires_grad_(h.is_floating_point())
            start = time.perf_counter()
            out = block(x)
            wrt = [t for t in [x, *block.parameters()] if t.requires_grad]
            if wrt and out.requires_grad:
                torch.autograd.grad(out, wrt, torch.ones_like(out))
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if r:
                times.append(time.perf_counter() - start)
        costs.append(statistics.median(times))
        h = out.detach()
    return costs
