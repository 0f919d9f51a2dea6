"""The columns the shared split adds to each row, and the order of a group's rows.  [anywhere]

:mod:`sparkml_dist.partitioning` (driver) adds ``KEY_COL`` (a 64-bit hash of the seed and the row)
and ``GROUP_COL`` (the group the row belongs to); executor code reads them and orders a group's rows
with :func:`order_rows`, so a member is fitted on the same rows in the same order on every retry
and cluster shape.
"""

from __future__ import annotations

import numpy as np

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
