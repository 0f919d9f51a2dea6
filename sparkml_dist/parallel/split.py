"""Where to cut a model into pipeline stages.  [anywhere]

A pipeline stage is a run of consecutive layers ("blocks").  :func:`partition` cuts a list of
per-layer costs into ``stages`` contiguous runs so that the most expensive stage is as cheap as it
can be (the pipeline runs at the pace of its slowest stage).  The costs come from
:mod:`.costs`: measured forward+backward time per layer (``balance="compute"``) or bytes of
parameters, gradients and kept activations per layer (``balance="memory"``).

Example::

    from sparkml_dist.parallel.split import partition
    partition([4, 1, 1, 1, 1, 4], 2)      # -> [3, 3]: layers 0-2 and 3-5, cost 6 each
"""

from __future__ import annotations

from typing import List, Sequence, Tuple, Union

from ..errors import ConfigurationError


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
