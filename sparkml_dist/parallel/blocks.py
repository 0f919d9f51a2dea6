"""A model as an ordered list of blocks, and the parts of it one rank keeps.  [rank]

A model can be pipelined when it is a ``torch.nn.Sequential`` or a module whose ``blocks``
attribute (an ``nn.ModuleList`` or ``nn.Sequential``) holds all its parameters and whose forward
applies the blocks in order.  A rank keeps only its stages' blocks, in a container laid out like
the original model, so its ``state_dict`` keys are the original model's keys.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import List, Sequence, Tuple

import torch

from ..errors import ConfigurationError


@dataclass
class Blocks:
    names: List[str]  # the blocks' names in the model ("0", "1", ...)
    modules: list
    prefix: str  # "" for a Sequential, "blocks." for a module holding a ``blocks`` list

    def __len__(self) -> int:
        return len(self.modules)

    def container(self, indices: Sequence[int]):
        """A module holding the blocks ``indices`` under their original names (keys as the model's)."""
        seq = torch.nn.Sequential(OrderedDict((self.names[i], self.modules[i]) for i in indices))
        return BlocksHolder(seq) if self.prefix else seq


class BlocksHolder(torch.nn.Module):
    """Some blocks of a model with a ``blocks`` attribute, under that attribute."""

    def __init__(self, blocks):
        super().__init__()
        self.blocks = blocks

    def forward(self, x):
        return self.blocks(x)


def blocks_of(model) -> Blocks:
    """The ordered blocks of ``model``; a ConfigurationError naming ``model`` when it has none."""
    if isinstance(model, torch.nn.Sequential):
        named = list(model.named_children())
        prefix = ""
    elif isinstance(model, torch.nn.Module) and isinstance(
        getattr(model, "blocks", None), (torch.nn.ModuleList, torch.nn.Sequential)
    ):
        named = list(model.blocks.named_children())
        prefix = "blocks."
        inside = {id(p) for p in model.blocks.parameters()} | {id(b) for b in model.blocks.buffers()}
        outside = [
            n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if id(t) not in inside
        ]
        if outside:
            raise ConfigurationError(
                f"model: {type(model).__name__} holds parameters outside its `blocks` "
                f"({', '.join(outside[:3])}): a pipeline keeps only the blocks. Move them into "
                "blocks (e.g. an embedding as the first block, a head as the last)"
            )
    else:
        raise ConfigurationError(
            f"model must be a torch.nn.Sequential or a module with a `blocks` attribute "
            f"(nn.ModuleList / nn.Sequential applied in order) to be split into stages; got "
            f"{type(model).__name__}. Wrap its layers: torch.nn.Sequential(layer1, layer2, ...)"
        )
    if not named:
        raise ConfigurationError("model has no blocks to split into stages")
    return Blocks([n for n, _ in named], [m for _, m in named], prefix)


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
