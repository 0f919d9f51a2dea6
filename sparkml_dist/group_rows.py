"""The columns the shared split adds to each row, and the order of a group's rows.  [anywhere]

:mod:`sparkml_dist.partitioning` (driver) adds ``KEY_COL`` (a 64-bit hash of the seed and the row)
and ``GROUP_COL`` (the group the row belongs to); executor code reads them and orders a group's rows
with :func:`order_rows`, so a member is fitted on the same rows in the same order on every retry
and cluster shape; :func:`group_runs` hands a task's rows over one group at a time.
"""

from __future__ import annotations

from typing import Iterable, Iterator, List, Tuple

import numpy as np
import pyarrow as pa

GROUP_COL = "__sd_group"
KEY_COL = "__sd_key"


def order_rows(keys: np.ndarray, *tiebreak: np.ndarray) -> np.ndarray:
    """Deterministic order of a group's rows: by key, ties (bootstrap copies, collisions) by content."""
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    if sorted_keys.size < 2 or not np.any(sorted_keys[1:] == sorted_keys[:-1]) or not tiebreak:
        return order
    columns = []
    for arr in tiebreak[::-1]:
        arr = np.asarray(arr)
        columns.extend(arr.T[::-1] if arr.ndim == 2 else [arr])
    return np.lexsort(tuple(columns) + (keys,))


def group_runs(batches: Iterable[pa.RecordBatch]) -> Iterator[Tuple[int, List[pa.RecordBatch]]]:
    """``(group, its batches)`` for rows that arrive sorted by ``GROUP_COL``: one group is held at
    a time, whatever the batches' boundaries.  A group that comes back after another is an error
    (the rows were not grouped: it would be fitted twice on halves)."""
    pending: List[pa.RecordBatch] = []
    current = None
    done = set()
    for batch in batches:
        groups = batch.column(GROUP_COL).to_numpy()
        if not len(groups):
            continue
        cuts = np.flatnonzero(np.diff(groups)) + 1
        for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(groups)]):
            g = int(groups[lo])
            if current is not None and g != current:
                yield current, pending
                done.add(current)
                pending = []
            if g in done:
                raise RuntimeError(f"group {g}'s rows did not arrive together in this task")
            current = g
            pending.append(batch.slice(lo, hi - lo))
    if current is not None:
        yield current, pending
