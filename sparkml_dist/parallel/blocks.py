"""The parts of a model (its blocks, :mod:`sparkml_dist.stages`) one pipeline rank keeps.  [rank]

A model can be pipelined when it is a ``torch.nn.Sequential`` or a module whose ``blocks``
attribute (an ``nn.ModuleList`` or ``nn.Sequential``) holds all its parameters and whose forward
applies the blocks in order.  A rank keeps only its stages' blocks, in a container laid out like
the original model, so its ``state_dict`` keys are the original model's keys.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence, Tuple

import torch

from ..errors import ConfigurationError
from ..stages import Blocks, blocks_of  # noqa: F401 - blocks_of: the pipeline's entry point


def container(blocks: Blocks, indices: Sequence[int]):
    """A module holding the blocks ``indices`` under their original names (keys as the model's)."""
    seq = torch.nn.Sequential(OrderedDict((blocks.names[i], blocks.modules[i]) for i in indices))
    return BlocksHolder(seq) if blocks.prefix else seq


class BlocksHolder(torch.nn.Module):
    """Some blocks of a model with a ``blocks`` attribute, under that attribute."""

    def __init__(self, blocks):
        super().__init__()
        self.blocks = blocks

    def forward(self, x):
        return self.blocks(x)


def check_forward(model, blocks: Blocks, example) -> None:
    """A ``blocks`` model must compute exactly its blocks in order: checked once on one micro-batch."""
    if not blocks.prefix or on_meta(model):
        return
    was_training = model.training
    model.eval()  # dropout off: both sides must be deterministic
    try:
        with torch.no_grad():
            whole = model(example)
            h = example
            for block in blocks.modules:
                h = block(h)
    finally:
        model.train(was_training)
    if not isinstance(whole, torch.Tensor) or whole.shape != h.shape or not torch.allclose(whole, h):
        raise ConfigurationError(
            f"model: {type(model).__name__}.forward does not equal its blocks applied in order; a "
            "pipeline runs only the blocks. Put every step of forward into a block"
        )


def on_meta(module) -> bool:
    return any(p.is_meta for p in module.parameters())


def stage_examples(blocks: Blocks, spans: Sequence[Tuple[int, int]], example, wanted: Sequence[int]):
    """({stage: (input, output)} for the ``wanted`` stages, the model's output), on meta tensors.

    Runs one micro-batch through every block (no gradients kept); blocks on the meta device give
    meta tensors, which is all a stage needs (shapes and dtypes).
    """
    out = {}
    h = example
    with torch.no_grad():
        for s, (a, b) in enumerate(spans):
            x = h
            for i in range(a, b):
                h = blocks.modules[i](h)
            if s in wanted:
                out[s] = (x.to("meta"), h.to("meta"))
    return out, h.to("meta")
