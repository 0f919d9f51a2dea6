"""The user's own training function, called once per group of rows.  [executor]

The executor side of :func:`sparkml_dist.ensemble.train_per_group`: rows arrive with their group in
``GROUP_COL`` (all of a group's rows in one task, the groups one after another), are put in a fixed
order (by ``KEY_COL``, a hash of the seed and the row), and handed to ``fn(data, key)``:

* without ``features``: ``data`` is a pandas DataFrame of the group's columns;
* with ``features``: ``data`` is ``(X, y)``; ``X`` stacks the feature columns left to right: numeric
  columns and arrays as dense columns, Spark ML vectors as they are stored, so a sparse vector
  column (``HashingTF``, ``CountVectorizer``, one-hot) makes ``X`` a ``scipy.sparse.csr_matrix``
  without ever being densified; ``y`` is the label column (None without one).

What ``fn`` returns (``model`` or ``(model, {"metric": value})``) goes back through the collection
layer; an exception becomes the group's error (with the traceback), or a skipped group.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, List, Optional, Tuple

import numpy as np
import pyarrow as pa

from .. import collection, feature_arrays, serialization
from ..group_rows import GROUP_COL, KEY_COL, group_runs, order_rows


@dataclass(frozen=True)
class PerGroupSpec:
    fn_blob: bytes  # cloudpickled by this run's driver
    keys: Tuple[Any, ...]  # group number -> the key fn is told
    features: Tuple[str, ...] = ()
    label: Optional[str] = None
    on_error: str = "raise"
    members_store: Optional[Any] = None  # a ModelStore: each model is written there (membersDir)


@dataclass
class GroupResult:
    """One group's outcome: its model and metrics, or why it was skipped."""

    group: int
    key: Any
    rows: int
    model: Any = None
    metrics: Optional[dict] = None
    error: Optional[str] = None
    stored: Optional[dict] = None  # with membersDir: the written model's metadata, not the model


def _column(arr, name: str):
    if feature_arrays.is_vector(arr.type):
        return feature_arrays.vectors_to_csr(arr, what=f"column {name!r}")
    arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
    if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
        return feature_arrays.lists_to_numpy(arr, what=f"column {name!r}")
    return arr.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)[:, None]


def group_data(table: pa.Table, spec: PerGroupSpec):
    """What ``fn`` receives for one group's rows (see the module docstring)."""
    order = order_rows(table.column(KEY_COL).to_numpy())
    table = table.take(pa.array(order)).drop_columns(
        [c for c in (GROUP_COL, KEY_COL) if c in table.column_names]
    )
    if not spec.features:
        return table.to_pandas()
    parts = [_column(table.column(c), c) for c in spec.features]
    if any(not isinstance(p, np.ndarray) for p in parts):
        from scipy import sparse

        X = sparse.hstack([sparse.csr_matrix(p) if isinstance(p, np.ndarray) else p for p in parts]).tocsr()
    else:
        X = np.hstack(parts) if len(parts) > 1 else parts[0]
    y = table.column(spec.label).to_numpy(zero_copy_only=False) if spec.label else None
    return X, y


def _call(fn, group: int, parts: List[pa.RecordBatch], spec: PerGroupSpec) -> pa.RecordBatch:
    key = spec.keys[group]
    table = pa.Table.from_batches(parts)
    rows = table.num_rows
    try:
        out = fn(group_data(table, spec), key)
        model, metrics = (
            out if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict) else (out, {})
        )
        if model is None:
            raise ValueError(
                "fn returned no model: end it with `return model` or `return model, {metric: value}`"
            )
        metrics = {str(k): float(v) for k, v in metrics.items()}
        if spec.members_store is None:
            return collection.encode(group, 0, GroupResult(group, key, rows, model=model, metrics=metrics))
        stored = _store(spec.members_store, group, model)
        return collection.encode(group, 0, GroupResult(group, key, rows, metrics=metrics, stored=stored))
    except Exception as exc:  # noqa: BLE001 - the user's function: reported with its traceback
        why = f"group {key!r} ({rows} rows): {type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        if spec.on_error == "raise":
            return collection.encode_error(group, why)
        return collection.encode(group, 0, GroupResult(group, key, rows, error=why))


def _store(store, group: int, model) -> dict:
    """Write ``model`` in a safe format (what the driver would refuse to read back is refused here)."""
    try:
        return store.write(group, 1, model)
    except Exception as exc:  # noqa: BLE001 - the formats' own refusal, reworded for fn's author
        raise ValueError(
            f"fn returned a {type(model).__name__}, which no safe model format can store ({exc}); "
            "return a scikit-learn-API model, an XGBoost/LightGBM model or plain data"
        ) from None


def fit_per_group(batches: Iterable[pa.RecordBatch], spec: PerGroupSpec) -> Iterator[pa.RecordBatch]:
    """``fn`` once per group of the task's rows (one group held at a time)."""
    fn = serialization.loads(spec.fn_blob)
    for group, parts in group_runs(batches):
        yield _call(fn, group, parts, spec)
