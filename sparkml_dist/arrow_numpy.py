"""Arrow columns to numpy arrays and torch dtypes, without extra copies.  [anywhere]

Used by a rank's shard (:mod:`sparkml_dist.runner.data`) and its loader
(:mod:`sparkml_dist.runner.loader`), and by ``predict_batch``'s workers: a list column becomes an
(n, d) array, a scalar column (n,); binary and string columns stay Python values (an object array)
for the user's ``transform``.
"""

from __future__ import annotations

from typing import Iterable, List, Optional

import numpy as np
import pyarrow as pa

from .errors import ConfigurationError

_BLOCK_ROWS = 2048  # rows transposed at once by fill: a block of 50 float64 columns stays in L2


def is_numeric(t: pa.DataType) -> bool:
    """A column that becomes a tensor as it is: numbers, booleans, lists of those."""
    while is_list(t):
        t = t.value_type
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def torch_dtype(t: pa.DataType, float_dtype=None):
    """The numpy dtype a column's values take in a tensor: floats as ``float_dtype`` (default
    float32), booleans as bool, integers as int64; None for a column that is not numeric."""
    if not is_numeric(t):
        return None
    while is_list(t):
        t = t.value_type
    if pa.types.is_floating(t):
        return float_target(float_dtype)
    return np.bool_ if pa.types.is_boolean(t) else np.int64


def values(column, name: str, dtype) -> np.ndarray:
    """One column of a table (any number of chunks) as numpy: numeric as ``dtype``, else objects."""
    chunk = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if dtype is None:
        return chunk.to_numpy(zero_copy_only=False)
    return chunk_numpy(chunk, name).astype(dtype, copy=False)


def is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def chunk_numpy(chunk: pa.Array, name: str) -> np.ndarray:
    """A zero-copy numpy view of one Arrow chunk: (n, d) for a list column, (n,) otherwise."""
    if not is_list(chunk.type):
        return chunk.to_numpy(zero_copy_only=False)
    if chunk.null_count:
        raise ConfigurationError(f"column {name!r}: {chunk.null_count} rows are null")
    n = len(chunk)
    values = chunk.flatten()
    if n and len(values) % n:
        raise ConfigurationError(f"column {name!r}: rows have different lengths")
    return values.to_numpy(zero_copy_only=False).reshape(n, len(values) // n if n else 0)


def float_target(float_dtype) -> type:
    import torch

    return {torch.float64: np.float64, torch.float16: np.float16}.get(float_dtype, np.float32)


def fill(
    batches: Iterable[pa.RecordBatch], names: List[str], n_rows: int, dtypes: List, stack: bool
) -> List[np.ndarray]:
    """One pass over ``batches`` filling freshly allocated arrays for the named columns.

    ``stack``: one (n, total width) array of ``dtypes[0]``; otherwise one array per column,
    (n, d) for a list column and (n,) for a scalar one.  Each batch is viewed without copying and
    dropped after use, so the peak is the outputs plus one batch.
    """
    outs: Optional[List[np.ndarray]] = None
    widths: List[int] = []
    row = 0
    for batch in batches:
        if not len(batch):
            continue
        parts = [chunk_numpy(batch.column(c), c) for c in names]
        if outs is None:
            widths = [p.shape[1] if p.ndim == 2 else 1 for p in parts]
            if stack:
                outs = [np.empty((n_rows, sum(widths)), dtype=dtypes[0])]
            else:
                outs = [
                    np.empty((n_rows, w) if p.ndim == 2 else (n_rows,), dtype=dt)
                    for p, w, dt in zip(parts, widths, dtypes)
                ]
        for name, part, w in zip(names, parts, widths):
            if part.ndim == 2 and part.shape[1] != w:
                raise ConfigurationError(f"column {name!r}: rows have different lengths")
        if stack:  # columns -> rows, a cache-sized block of rows at a time
            for lo in range(0, len(batch), _BLOCK_ROWS):
                hi = min(lo + _BLOCK_ROWS, len(batch))
                block = np.concatenate([p[lo:hi] if p.ndim == 2 else p[lo:hi, None] for p in parts], axis=1)
                outs[0][row + lo : row + hi] = block
        else:
            for j, part in enumerate(parts):
                outs[j][row : row + len(batch)] = part
        row += len(batch)
    if outs is None:  # no rows
        outs = [np.zeros((0, 0), dtype=dtypes[0])] if stack else [np.zeros(0, dtype=d) for d in dtypes]
    return outs
