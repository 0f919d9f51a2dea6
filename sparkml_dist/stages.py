"""A model as an ordered list of blocks, and where to cut it into pipeline stages.  [anywhere]

A model can be split into stages when it is a ``torch.nn.Sequential`` or a module whose ``blocks``
attribute (an ``nn.ModuleList`` or ``nn.Sequential``) holds all its parameters and whose forward
applies the blocks in order (:func:`blocks_of`).  A pipeline stage is a run of consecutive blocks:
:func:`partition` cuts a list of per-block costs into ``stages`` contiguous runs so that the most
expensive stage is as cheap as it can be (the pipeline runs at the pace of its slowest stage).
The costs come from :mod:`sparkml_dist.parallel.costs` (measured time or bytes per block) in the
ranks, or from parameter counts in :func:`sparkml_dist.plan.model_bytes` on the driver; both use
this module, so the planner and the pipeline cut a model the same way.  torch is imported only
by :func:`blocks_of`.

Example::

    from sparkml_dist.stages import partition
    partition([4, 1, 1, 1, 1, 4], 2)      # -> [3, 3]: layers 0-2 and 3-5, cost 6 each
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence, Tuple, Union

from .errors import ConfigurationError


@dataclass
class Blocks:
    names: List[str]  # the blocks' names in the model ("0", "1", ...)
    modules: list
    prefix: str  # "" for a Sequential, "blocks." for a module holding a ``blocks`` list

    def __len__(self) -> int:
        return len(self.modules)


def blocks_of(model) -> Blocks:
    """The ordered blocks of ``model``; a ConfigurationError naming ``model`` when it has none."""
    import torch

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


def partition(costs: Sequence[float], stages: int) -> List[int]:
    """Layer counts of ``stages`` contiguous runs of ``costs`` minimising the largest run's sum.

    Every run has at least one layer.  Ties go to the split that puts more layers early, so the
    result depends on the costs only (the same on every rank given the same costs).
    """
    n = len(costs)
    if not 1 <= stages <= n:
        raise ConfigurationError(f"stages must be between 1 and the number of layers ({n}), got {stages}")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + float(c))
    inf = float("inf")
    # best[s][i]: the smallest possible largest run when the first i layers form s runs
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for s in range(1, stages + 1):
        for i in range(s, n - (stages - s) + 1):
            for j in range(s - 1, i):  # the last run is layers j..i-1
                worst = max(best[s - 1][j], prefix[i] - prefix[j])
                if worst < best[s][i] - 1e-12 * max(1.0, abs(worst)):
                    best[s][i], cut[s][i] = worst, j
    counts, i = [], n
    for s in range(stages, 0, -1):
        j = cut[s][i]
        counts.append(i - j)
        i = j
    return counts[::-1]


def check_counts(counts: Sequence[int], stages: int, layers: int) -> List[int]:
    """An explicit ``balance=[...]``: one count >= 1 per stage, adding up to the layers."""
    if (
        not isinstance(counts, (list, tuple))
        or len(counts) != stages
        or any(not isinstance(c, int) or isinstance(c, bool) or c < 1 for c in counts)
        or sum(counts) != layers
    ):
        raise ConfigurationError(
            f"balance as a list gives the layers of each stage: {stages} integers >= 1 adding up to "
            f"the model's {layers} layers; got {counts!r}"
        )
    return list(counts)


def ranges(counts: Sequence[int]) -> List[Tuple[int, int]]:
    """[(first, end)] layer ranges (end exclusive) of stages with these layer counts."""
    out, start = [], 0
    for c in counts:
        out.append((start, start + c))
        start += c
    return out


def stage_sums(costs: Sequence[float], counts: Sequence[int]) -> List[float]:
    return [float(sum(costs[a:b])) for a, b in ranges(counts)]


def largest_stage(costs: Sequence[Union[int, float]], stages: int) -> float:
    """The cost of the most expensive stage when ``costs`` are split as evenly as they can be."""
    return max(stage_sums(costs, partition(costs, stages)))
