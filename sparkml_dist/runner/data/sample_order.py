"""The order in which an epoch's samples reach the ranks: the same for any number of ranks.  [anywhere]

``run_with_data`` cuts the rows into ``S`` *streams* (``streams=``, default the number of data
ranks), fixed for the data and the seed whatever the world size; rank ``r`` of ``D`` data ranks
holds streams ``r, r + D, r + 2D, ...`` (``S`` must be a multiple of ``D``).  A stream is a list of
*chunks* (its storage units: a record batch of the rank's spill file, a few thousand rows of a
Parquet row group).

In epoch ``e`` a stream's rows come in this order, computed from ``(seed, e, stream)`` alone: the
chunks in a random order (Parquet: the row-group slices in a random order, each slice's chunks in
sequence, so the files are read forward), taken a *window* (``window_rows`` rows, whole chunks) at a
time, the rows of a window in a random order. Global step ``s`` with a global batch of ``G`` rows
takes the next ``G / S`` positions of every stream; a rank's batch is its streams' share,
interleaved position-major. So the set of samples of every global step is fixed by the data, the
seed, ``S`` and ``G``; a run on 4 ranks and one on 2 (``batch_size`` = ``G / D``) train on the same
samples step by step, and a restart on another world size resumes at the same position.

An epoch gives every row once: it is ``ceil(max_size / (G / S))`` steps, the last one shorter
when the rows run out (every stream gives the same number of rows at every step, so every rank's
batches have the same sizes, as SPMD frameworks need). Streams of unequal size (they differ by at
most one row) fill their last position from their start: position ``p`` of stream ``c`` is its row
``p mod size_c``, so a rank repeats at most one row per short stream it holds, in the last step,
and :meth:`Plan.repeats` counts it (the loader puts such rows at the end of the batch and says how
many: ``loader.padding``). ``pad_last=True`` (the full-batch option) fills the last step to
``G / S`` rows a stream the same way; ``drop_last=True`` stops at the last step every stream can
fill with rows not yet given (``floor(min_size / (G / S))`` steps): no repeats, no short batch.

Example::

    plan = Plan(sizes=[5, 5, 4, 4], global_batch=8, drop_last=False)   # S=4: 2 rows a stream a step
    plan.steps                                                          # 3
    plan.positions(2)                                                   # (4, 5): the last row each
    plan.repeats(2, streams=(2,))                                       # 1: stream 2 has 4 rows
    order = StreamOrder([2, 2, 1], seed=0, epoch=3, stream=1, shuffle=True, window_rows=4)
    order.locate(np.arange(5))              # (window, offset) of each position
"""

from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

import numpy as np

from ...errors import ConfigurationError


def chunk_sizes(rows: int, chunk_rows: int) -> List[int]:
    """``rows`` cut into chunks of ``chunk_rows`` (the last one shorter)."""
    full, rest = divmod(int(rows), int(chunk_rows))
    return [int(chunk_rows)] * full + ([rest] if rest else [])


def rank_streams(data_rank: int, data_world: int, streams: int) -> Tuple[int, ...]:
    """The streams data rank ``data_rank`` of ``data_world`` holds."""
    return tuple(range(data_rank, streams, data_world))


def check_streams(streams: int, data_world: int) -> None:
    if streams < data_world or streams % data_world:
        raise ConfigurationError(
            f"streams={streams} must be a multiple of the {data_world} data ranks (each rank holds "
            f"streams/{data_world} of them): pick a count every world size you run on divides, "
            "e.g. 12 for 1, 2, 3, 4 or 6 ranks"
        )


class Plan:
    """Steps of an epoch and each stream's positions per step, for a global batch of ``G`` rows."""

    def __init__(
        self, sizes: Sequence[int], global_batch: int, drop_last: bool, pad_last: bool = False
    ) -> None:
        self.sizes = [int(s) for s in sizes]
        self.streams = len(self.sizes)
        self.global_batch = int(global_batch)
        if self.global_batch % self.streams:
            raise ConfigurationError(
                f"the global batch of {self.global_batch} rows (batch_size x data ranks) must be a "
                f"multiple of the {self.streams} streams, so every rank gets the same rows per step: "
                f"change batch_size (or global_batch_size) or run_with_data(..., streams=)"
            )
        self.per_stream = self.global_batch // self.streams
        self.longest = max(self.sizes) if self.sizes else 0
        self.full = bool(pad_last) or bool(drop_last)  # every step takes per_stream positions
        if drop_last:
            shortest = min(self.sizes) if self.sizes else 0
            self.steps = shortest // self.per_stream
        else:
            self.steps = math.ceil(self.longest / self.per_stream)
        if self.steps < 1:
            raise ConfigurationError(
                f"drop_last=True leaves no step: a stream has {min(self.sizes or [0])} rows, fewer "
                f"than the {self.per_stream} it gives a step; lower the batch size or set drop_last=False"
            )

    def positions(self, step: int) -> Tuple[int, int]:
        """Every stream's positions ``[lo, hi)`` of global step ``step`` (before the cycling)."""
        lo, hi = step * self.per_stream, (step + 1) * self.per_stream
        return lo, hi if self.full else min(hi, self.longest)

    def repeats(self, step: int, streams: Sequence[int]) -> int:
        """Rows ``streams`` give at step ``step`` that they already gave this epoch (positions past
        a stream's size, filled from its start)."""
        lo, hi = self.positions(step)
        return sum(max(0, hi - max(lo, self.sizes[c])) for c in streams)


def _chunk_order(n: int, groups: Optional[Sequence[int]], rng) -> np.ndarray:
    """The chunks' order: shuffled (``rng``), or, for chunks in ``groups`` (a source that reads a
    group's chunks in sequence, such as the row groups of a Parquet file), the groups shuffled and
    each group's chunks in their order."""
    if rng is None:
        return np.arange(n)
    if groups is None:
        return rng.permutation(n)
    labels = np.asarray(groups)
    firsts = np.flatnonzero(np.r_[True, labels[1:] != labels[:-1]])
    bounds = np.r_[firsts, n]
    picked = rng.permutation(len(firsts))
    return np.concatenate([np.arange(bounds[g], bounds[g + 1]) for g in picked]) if n else np.arange(0)


class StreamOrder:
    """Stream ``stream``'s rows in epoch ``epoch``'s order, window by window (see the module)."""

    def __init__(
        self,
        chunks: Sequence[int],
        *,
        groups: Optional[Sequence[int]] = None,
        seed: int,
        epoch: int,
        stream: int,
        shuffle: bool,
        window_rows: int,
    ) -> None:
        self._key = [int(seed), int(epoch), int(stream)]
        self.shuffle = shuffle
        sizes = np.asarray(chunks, dtype=np.int64)
        order = _chunk_order(len(sizes), groups, np.random.default_rng(self._key) if shuffle else None)
        self.windows: List[np.ndarray] = []
        start, rows = 0, 0
        for i in range(len(order)):
            rows += int(sizes[order[i]])
            if rows >= window_rows or i == len(order) - 1:
                self.windows.append(order[start : i + 1])
                start, rows = i + 1, 0
        self.window_sizes = np.array([int(sizes[w].sum()) for w in self.windows], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.window_sizes)])
        self.rows = int(self.starts[-1])

    def locate(self, positions: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """(window, offset within the window) of positions ``0 <= p < rows``."""
        w = np.searchsorted(self.starts, positions, side="right") - 1
        return w, positions - self.starts[w]

    def permutation(self, window: int) -> np.ndarray:
        """The order of window ``window``'s rows (indices into its chunks, concatenated)."""
        n = int(self.window_sizes[window])
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng([*self._key, window + 1]).permutation(n)
