"""A group larger than a task's memory, trained from a stream of its rows.  [executor]

A streamed group's rows reach its fit one Arrow batch at a time, as Spark reads them (sorted by
group and row key, so in the same order on any partitioning), and nothing of the group is held but
the batches of one chunk:

* an estimator (:class:`~sparkml_dist.ensemble.GroupedTrainer`, ``streamAbove``) is trained with
  ``partial_fit`` on chunks of exactly :data:`CHUNK_ROWS` rows (the last one shorter), cut from
  the batches whatever their boundaries, so the same chunks reach it on any partitioning; a
  classifier's first call gets every class of its key (counted on the driver);
* the user's function (``train_per_group(..., stream=True)``) gets an iterator of Arrow record
  batches of the group's columns, and what it leaves unread is skipped.

Example::

    model = fit_stream(SGDClassifier(), group, key, Counted(batches), to_xyw, classes=(0, 1))
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, List, Optional, Sequence

import numpy as np
import pyarrow as pa

from ..group_rows import GROUP_COL, KEY_COL
from .member_records import KeyModel

CHUNK_ROWS = 10_000


class Counted:
    """The group's batches, counting the rows that pass (what the driver checks the group's rows
    against); :meth:`drain` reads what the consumer left."""

    def __init__(self, batches: Iterable[pa.RecordBatch]) -> None:
        self._batches, self.rows = iter(batches), 0

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        for batch in self._batches:
            self.rows += batch.num_rows
            yield batch

    def drain(self) -> int:
        for _ in self:
            pass
        return self.rows


def chunks(batches: Iterable[pa.RecordBatch], size: int = CHUNK_ROWS) -> Iterator[List[pa.RecordBatch]]:
    """The batches re-cut into runs of exactly ``size`` rows (the last one shorter)."""
    held: List[pa.RecordBatch] = []
    count = 0
    for batch in batches:
        while batch.num_rows:
            take = min(size - count, batch.num_rows)
            held.append(batch.slice(0, take))
            count += take
            batch = batch.slice(take)
            if count == size:
                yield held
                held, count = [], 0
    if held:
        yield held


def fit_stream(
    model: Any, group: int, key: Any, batches: Counted, convert: Callable[[List[pa.RecordBatch]], tuple],
    classes: Optional[Sequence],
) -> KeyModel:  # fmt: skip
    """``model`` (a fresh copy, seeded) trained by ``partial_fit`` on its rows, one chunk at a
    time, each turned into ``(X, y, w)`` by ``convert`` (see the module docstring)."""
    first = True
    for chunk in chunks(batches):
        X, y, w = convert(chunk)
        kw = {"sample_weight": w} if w is not None else {}
        if first and classes is not None:
            kw["classes"] = np.asarray(classes)
        model.partial_fit(X, y, **kw)
        first = False
    if first:
        raise ValueError("the group has no rows to train on")
    return KeyModel(group, key, model, batches.rows)


def user_batches(batches: Counted) -> Iterator[pa.RecordBatch]:
    """What the user's function reads: the group's batches without the engine's columns."""
    for batch in batches:
        yield batch.drop_columns([c for c in (GROUP_COL, KEY_COL) if c in batch.schema.names])
