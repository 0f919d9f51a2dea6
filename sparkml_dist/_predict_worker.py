"""Scoring batches of a DataFrame in a Python worker: the predict function made once per worker.  [executor]

:func:`predict_task` is the ``mapInArrow`` function of :func:`sparkml_dist.inference.predict_batch`.
The predict function comes from the spec: the user's ``make_predict_fn`` (cloudpickled by this run's
driver), called once per Python worker and kept for the worker's later tasks (Spark reuses workers:
the :data:`KEEP` most recently used functions stay, as pyspark's ``predict_batch_udf`` keeps 8);
or a model, decoded once per worker from a safe format (skops / XGBoost / JSON), whose ``predict``
(or ``predict_proba``...) is called.  Columns reach the function as numpy
arrays: (b,) for a scalar column, (b, d) for a list column, objects for binary and string columns.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

import numpy as np
import pyarrow as pa

from . import feature_arrays

KEEP = 8  # predict functions a worker keeps: the most recently used ones
_MADE: "OrderedDict[Tuple[str, Tuple[str, ...]], Callable]" = OrderedDict()  # (key, GPUs) -> function


@dataclass(frozen=True)
class PredictSpec:
    """What the driver hands each scoring task (plain values)."""

    key: str  # identifies the predict function: the same key reuses the worker's made function
    input_cols: Tuple[str, ...]
    output_col: str
    output_type: bytes  # the output field, as a serialized Arrow schema of one field
    batch_size: int
    use_gpu: bool = False
    make_fn: Optional[bytes] = None  # cloudpickled make_predict_fn
    model_format: Optional[str] = None  # a model's safe format, with its bytes
    model_bytes: Optional[bytes] = None
    method: str = "predict"
    trusted_types: Tuple[str, ...] = ()


def _task_gpus(spec: PredictSpec) -> Tuple[str, ...]:
    if not spec.use_gpu:
        return ()
    from .gpus import task_addresses

    gpus = tuple(task_addresses())
    if gpus:  # the task's own GPUs, as CUDA numbers them for this process
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    return gpus


def _make(spec: PredictSpec) -> Callable:
    if spec.make_fn is not None:
        from .serialization import loads

        return loads(spec.make_fn)()  # this run's driver pickled it
    from .formats import decode

    model = decode(
        spec.model_format, spec.model_bytes, trusted_types=spec.trusted_types, what="the model to score with"
    )
    method = getattr(model, spec.method)

    def predict(*arrays):
        import warnings

        parts = [a if a.ndim == 2 else a[:, None] for a in arrays]
        with warnings.catch_warnings():  # the driver matched the columns to the model's names
            warnings.filterwarnings("ignore", message="X does not have valid feature names")
            return method(np.concatenate(parts, axis=1) if len(parts) > 1 else parts[0])

    return predict


def predict_fn(spec: PredictSpec) -> Callable:
    """This worker's predict function for ``spec`` (made on first use)."""
    slot = (spec.key, _task_gpus(spec))
    fn = _MADE.get(slot)
    if fn is None:
        fn = _MADE[slot] = _make(spec)
        while len(_MADE) > KEEP:  # the least recently used model goes (and its memory with it)
            _MADE.popitem(last=False)
    _MADE.move_to_end(slot)
    return fn


def _output(values: Any, field: pa.Field, n: int) -> pa.Array:
    """The predict function's output for ``n`` rows as an Arrow array of ``field``'s type."""
    t = field.type
    if pa.types.is_struct(t):
        if not isinstance(values, dict):
            raise TypeError(
                f"the predict function must return a dict of arrays for the struct {field.name!r}"
            )
        kids = [_output(values[f.name], f, n) for f in t]
        return pa.StructArray.from_arrays(kids, fields=list(t))
    arr = np.asarray(values)
    if len(arr) != n:
        raise ValueError(f"the predict function returned {len(arr)} rows for a batch of {n}")
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        arr = arr.reshape(n, -1)
        flat = pa.array(arr.reshape(-1).astype(t.value_type.to_pandas_dtype(), copy=False))
        offsets = pa.array(np.arange(0, arr.size + 1, max(1, arr.shape[1]), dtype=np.int32))
        return pa.ListArray.from_arrays(offsets, flat, type=pa.list_(t.value_type))
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.ndim != 1:
        raise ValueError(
            f"the predict function returned shape {arr.shape} for {field.name!r} of type {t}: "
            "use an array return type for several values per row"
        )
    return pa.array(arr, type=t, from_pandas=True) if arr.dtype == object else pa.array(arr).cast(t)


def _column(arr: pa.Array, name: str) -> np.ndarray:
    """A batch's column as the predict function gets it: numbers in their own type ((b,) or
    (b, d), without a copy where Arrow allows), binary and strings as objects."""
    if feature_arrays.is_numeric(arr.type):
        return feature_arrays.chunk_numpy(arr, name)
    return arr.to_numpy(zero_copy_only=False)


def predict_task(batches: Iterator[pa.RecordBatch], spec: PredictSpec) -> Iterator[pa.RecordBatch]:
    """Every input batch with its prediction column, ``batch_size`` rows per call."""
    field = pa.ipc.read_schema(pa.py_buffer(spec.output_type)).field(0)
    fn = None
    for batch in batches:
        for lo in range(0, batch.num_rows, spec.batch_size):
            part = batch.slice(lo, spec.batch_size)
            if fn is None:
                fn = predict_fn(spec)
            arrays = [_column(part.column(c), c) for c in spec.input_cols]
            out = _output(fn(*arrays), field, part.num_rows)
            yield pa.RecordBatch.from_arrays([*part.columns, out], names=[*part.schema.names, field.name])


def model_key(fmt: Optional[str], data: Optional[bytes], extra: Dict[str, Any]) -> str:
    """A key naming a model and how it is called (the same model reuses a worker's decoded copy)."""
    digest = hashlib.sha256(data or b"")
    digest.update(json.dumps([fmt, extra], sort_keys=True, default=str).encode())
    return digest.hexdigest()
