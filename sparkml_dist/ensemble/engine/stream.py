"""A group larger than a task's memory, trained from a stream of its rows.  [executor]

A streamed group's rows reach its fit one Arrow batch at a time, as Spark reads them (sorted by
group and row key, so in the same order on any partitioning), and nothing of the group is held but
the batches of one chunk:

* an estimator (:class:`~sparkml_dist.ensemble.GroupedTrainer`, ``streamAbove``) is trained with
  ``partial_fit`` on chunks of exactly :data:`CHUNK_ROWS` rows (the last one shorter), cut from
  the batches whatever their boundaries, so the same chunks reach it on any partitioning; a
  classifier's first call gets every class of its key (counted on the driver);
* an XGBoost estimator (``XGBRegressor``, ``XGBClassifier``: no ``partial_fit``) trains on XGBoost's
  external memory (:func:`fit_xgboost_stream`): the same chunks are written to the task's local
  disk, a ``xgboost.DataIter`` reads them back one at a time as often as XGBoost asks, and
  ``ExtMemQuantileDMatrix`` keeps its quantized pages on disk beside them;
* the user's function (``train_per_group(..., stream=True)``) gets an iterator of Arrow record
  batches of the group's columns, and what it leaves unread is skipped.

Example::

    model = fit_stream(SGDClassifier(), group, key, Counted(batches), to_xyw, classes=(0, 1))
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Callable, Iterable, Iterator, List, Optional, Sequence

import numpy as np
import pyarrow as pa

from ...group_rows import GROUP_COL, KEY_COL
from ..member_records import KeyModel

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
    if is_xgboost(model):
        return fit_xgboost_stream(model, group, key, batches, convert, classes)
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


def is_xgboost(estimator: Any) -> bool:
    """An XGBoost scikit-learn estimator (it streams through external memory, not ``partial_fit``)."""
    return type(estimator).__module__.split(".")[0] == "xgboost" and hasattr(estimator, "get_xgb_params")


def _chunk_iter(paths: List[str], cache: str):
    import xgboost as xgb

    class Chunks(xgb.DataIter):
        """The group's chunk files, one in memory at a time, from the first as often as asked."""

        def __init__(self) -> None:
            self._next = 0
            super().__init__(cache_prefix=cache)

        def next(self, input_data) -> bool:
            if self._next == len(paths):
                return False
            with np.load(paths[self._next], allow_pickle=False) as f:  # this task's own files
                input_data(data=f["X"], label=f["y"], weight=f["w"] if "w" in f.files else None)
            self._next += 1
            return True

        def reset(self) -> None:
            self._next = 0

    return Chunks()


def fit_xgboost_stream(
    model: Any, group: int, key: Any, batches: Counted, convert: Callable[[List[pa.RecordBatch]], tuple],
    classes: Optional[Sequence],
) -> KeyModel:  # fmt: skip
    """``model`` (an XGBoost scikit-learn estimator, seeded) trained on XGBoost's external memory
    from its group's chunks spilled to local disk (module docstring); its settings are the
    estimator's (``get_xgb_params``, ``n_estimators`` rounds), a classifier's classes its key's."""
    import xgboost as xgb

    with tempfile.TemporaryDirectory(prefix="sparkml_dist-xgb-") as tmp:
        paths = []
        for i, chunk in enumerate(chunks(batches)):
            X, y, w = convert(chunk)
            paths.append(os.path.join(tmp, f"chunk{i}.npz"))
            np.savez(paths[-1], X=np.asarray(X, dtype=np.float32), y=y, **({"w": w} if w is not None else {}))
        if not paths:
            raise ValueError("the group has no rows to train on")
        params = {k: v for k, v in model.get_xgb_params().items() if v is not None}
        if classes is not None and int(max(classes)) + 1 > 2:  # XGBoost's classes are 0..n-1
            params.update(objective="multi:softprob", num_class=int(max(classes)) + 1)
        matrix = xgb.ExtMemQuantileDMatrix(
            _chunk_iter(paths, os.path.join(tmp, "cache")), max_bin=params.get("max_bin", 256)
        )
        booster = xgb.train(params, matrix, num_boost_round=int(getattr(model, "n_estimators", None) or 100))
        model.load_model(bytearray(booster.save_raw("ubj")))
    return KeyModel(group, key, model, batches.rows)
