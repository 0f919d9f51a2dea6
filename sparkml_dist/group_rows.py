"""The columns the shared split adds to each row, and the order of a group's rows.  [anywhere]

:mod:`sparkml_dist.partitioning` (driver) adds ``KEY_COL`` (a 64-bit hash of the seed and the row)
and ``GROUP_COL`` (the group the row belongs to); executor code reads them and orders a group's rows
with :func:`order_rows`, so a member is fitted on the same rows in the same order on every retry
and cluster shape; :func:`group_runs` hands a task's rows over one group at a time, held, and
:func:`group_streams` one batch at a time (a group larger than a task's memory).
"""

from __future__ import annotations

from typing import Iterable, Iterator, List, Optional, Tuple

import numpy as np
import pyarrow as pa

GROUP_COL = "__sd_group"
KEY_COL = "__sd_key"
KEY_VALUE_COL = "__sd_key_value"  # a fit by key: the key itself, read by the task that fits it


# Keys are equal when Spark's grouping and joins hold them equal: a float's -0.0 is its 0.0 (and
# every NaN one NaN, as Arrow's lookups already have it); text under the UTF8_LCASE collation
# compares lower-cased. Other collations (ICU's UNICODE, UNICODE_CI, ...) have rules of their own
# that Python does not share: a key column collated so is refused, naming the fix.
FOLDS = ("UTF8_BINARY", "UTF8_LCASE")


def key_fold(data_type, column: str, param: str) -> Optional[str]:
    """The collation a key column's text is compared under (None: byte for byte), from its Spark
    type; a collation whose equality Python cannot follow is refused by name."""
    collation = getattr(data_type, "collation", None) or "UTF8_BINARY"
    if collation not in FOLDS:
        from .errors import ConfigurationError

        raise ConfigurationError(
            f"{param}={column!r} is text collated {collation}, whose equality (Spark's ICU rules) "
            "sparkml_dist cannot follow when it looks keys up; collate it as UTF8_BINARY or "
            f"UTF8_LCASE first (F.collate(F.col({column!r}), 'UTF8_LCASE'))"
        )
    return None if collation == "UTF8_BINARY" else collation


def comparable(values: pa.Array, fold: Optional[str] = None) -> pa.Array:
    """``values`` as Spark compares keys (see :data:`FOLDS`): -0.0 made 0.0, text lower-cased
    under UTF8_LCASE."""
    import pyarrow.compute as pc

    if pa.types.is_floating(values.type):
        return pc.if_else(pc.equal(values, pa.scalar(0, values.type)), pa.scalar(0, values.type), values)
    if fold == "UTF8_LCASE" and (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
        return pc.utf8_lower(values)
    return values


def hashable(value):
    """A key as Python holds it: lists (array keys) as tuples, dicts (struct keys) as tuples of
    their items, so every key can name a group in a dict."""
    if isinstance(value, list):
        return tuple(hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, hashable(v)) for k, v in value.items())
    return value


def draw_seeds(seed: int, n: int) -> np.ndarray:
    """One seed per group for the member's own randomness (``random_state``), drawn at once."""
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, 2])
    return rng.integers(0, 2**31 - 1, size=int(n))


class SeedDraw:
    """:func:`draw_seeds` ``(seed, n)`` as a sequence, drawn where it is first read (an executor),
    so 10^6 keys' seeds do not travel with every task."""

    def __init__(self, seed: int, n: int) -> None:
        self.seed, self.n, self._values = int(seed), int(n), None

    def __getstate__(self):
        return {"seed": self.seed, "n": self.n}

    def __setstate__(self, state):
        self.__init__(state["seed"], state["n"])

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, g: int) -> int:
        if self._values is None:
            self._values = draw_seeds(self.seed, self.n)
        return int(self._values[g])


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


def _slices(batches: Iterable[pa.RecordBatch]) -> Iterator[Tuple[int, pa.RecordBatch]]:
    """``(group, slice)``: each batch cut where ``GROUP_COL`` changes."""
    for batch in batches:
        groups = batch.column(GROUP_COL).to_numpy()
        if not len(groups):
            continue
        cuts = np.flatnonzero(np.diff(groups)) + 1
        for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(groups)]):
            yield int(groups[lo]), batch.slice(lo, hi - lo)


def group_streams(batches: Iterable[pa.RecordBatch]) -> Iterator[Tuple[int, Iterator[pa.RecordBatch]]]:
    """``(group, its batches as they arrive)`` for rows that arrive sorted by ``GROUP_COL``, whatever
    the batches' boundaries: nothing of a group is held but the batch being read.  Each group's
    batches are read (or what is left of them skipped) before the next group comes.  A group that
    comes back after another is an error (the rows were not grouped: it would be fitted twice on
    halves)."""
    slices = _slices(batches)
    head = [next(slices, None)]
    done = set()

    def rest(g: int) -> Iterator[pa.RecordBatch]:
        while head[0] is not None and head[0][0] == g:
            piece = head[0][1]
            head[0] = next(slices, None)
            yield piece

    while head[0] is not None:
        g = head[0][0]
        if g in done:
            raise RuntimeError(f"group {g}'s rows did not arrive together in this task")
        stream = rest(g)
        yield g, stream
        for _ in stream:  # the consumer stopped early: skip the group's other rows
            pass
        done.add(g)


def group_runs(batches: Iterable[pa.RecordBatch]) -> Iterator[Tuple[int, List[pa.RecordBatch]]]:
    """``(group, its batches)``: :func:`group_streams` with each group's batches held (one group
    at a time)."""
    for g, stream in group_streams(batches):
        yield g, list(stream)
