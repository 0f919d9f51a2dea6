"""Spark ML vectors as Parquet stores them, checked as Spark checks them, as arrays.  [anywhere]

A vector column is stored as a struct (``type`` 0 sparse / 1 dense, ``size``, ``indices``,
``values``); Spark's ``VectorUDT`` refuses a struct it could not have written. A file read in
place by the ranks (:mod:`sparkml_dist.runner.data.parquet_split`) may have been written by anyone, so
:func:`vector_lists` checks every struct of a batch the same way, and against the width the driver
read, *before* anything is allocated for the rows: a type code other than 0/1, a sparse vector
without a size or indices, indices and values of different lengths, an index out of range, out of
order or repeated, a row of another width, or one wider than :data:`MAX_DENSE_VECTOR` entries, is
refused naming where it is. Then it becomes the ``array<double>`` ``vector_to_array`` makes of it.

Example::

    lists = vector_lists(batch.column("features"), "column 'features' of part-0.parquet", width=3)
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .errors import ConfigurationError

MAX_DENSE_VECTOR = 1 << 16  # entries of a vector column the ranks get as a dense array, per row


def _vector_fault(kind, sizes, stored, indices, width: Optional[int]) -> Optional[str]:
    """What Spark would refuse in these vectors (or what does not fit the column), else None:
    checked on the struct's arrays before anything is allocated for the rows."""
    if kind.size and not np.isin(kind, (0, 1)).all():
        return f"a type code of {int(kind[~np.isin(kind, (0, 1))][0])} (Spark stores 0 sparse, 1 dense)"
    sparse = kind == 0
    if np.any(sparse & (sizes < 0)):
        return f"a sparse vector of size {int(sizes[sparse & (sizes < 0)][0])}"
    widths = np.where(sparse, sizes, stored)
    if width is not None and np.any(widths != width):
        bad = np.flatnonzero(widths != width)
        return (
            f"{len(bad)} vector(s) of {int(widths[bad[0]])} entries in a column the driver read as "
            f"{width} wide (row {int(bad[0])} of the batch)"
        )
    if widths.size and widths.max() > MAX_DENSE_VECTOR:
        return f"a vector of {int(widths.max())} entries, more than the {MAX_DENSE_VECTOR} a rank takes dense"
    if indices is None:
        return None
    counts, idx = indices
    if np.any(counts[sparse] != stored[sparse]):
        row = int(np.flatnonzero(sparse & (counts != stored))[0])
        return f"a sparse vector with {int(counts[row])} indices for {int(stored[row])} values"
    rows = np.repeat(np.arange(len(kind)), counts)[np.repeat(sparse, counts)]
    idx = idx[np.repeat(sparse, counts)]
    if idx.size and (idx.min() < 0 or np.any(idx >= np.repeat(sizes[sparse], counts[sparse]))):
        return "a sparse vector with an index outside its size"
    if idx.size > 1 and np.any((np.diff(idx) <= 0) & (np.diff(rows) == 0)):
        return "a sparse vector whose indices are not strictly increasing"
    return None


def vector_lists(arr, what: str = "a vector column", width: Optional[int] = None) -> pa.Array:
    """Spark ML vectors (their storage struct) -> ``list<double>``, as ``vector_to_array`` makes
    them: every entry of each vector, a sparse one's zeros included; a null vector stays null.

    Every struct is checked first, as Spark's ``VectorUDT`` checks it, and against the column's
    ``width`` where the driver knows it: a type code other than 0/1, a sparse vector with no size,
    indices and values of different lengths, an index out of range, out of order or repeated, a
    row of another width (or wider than :data:`MAX_DENSE_VECTOR`) are refused, naming ``what``,
    before anything is allocated for the rows."""
    arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
    valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    rows = arr.filter(pa.array(valid)) if arr.null_count else arr
    fields = {"type", "size", "indices", "values"}
    if not fields <= {rows.type.field(i).name for i in range(rows.type.num_fields)}:
        raise ConfigurationError(f"{what}: a vector struct without the fields {sorted(fields)}")
    kind_arr, size_arr = pc.struct_field(rows, "type"), pc.struct_field(rows, "size")
    values, indices = pc.struct_field(rows, "values"), pc.struct_field(rows, "indices")
    kind = kind_arr.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    sparse = kind == 0
    missing = (
        "a vector with no type code" if kind_arr.null_count else
        "a vector with no values" if values.null_count else
        "a sparse vector with no size" if np.any(sparse & ~_valid(size_arr)) else
        "a sparse vector with no indices" if np.any(sparse & ~_valid(indices)) else None
    )  # fmt: skip
    sizes = size_arr.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    stored = values.value_lengths().fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    counts = indices.value_lengths().fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    flat_idx = _flat(indices).to_numpy(zero_copy_only=False).astype(np.int64) if sparse.any() else None
    fault = missing or _vector_fault(
        kind, sizes, stored, None if flat_idx is None else (counts, flat_idx), width
    )
    if fault:
        raise ConfigurationError(
            f"{what}: {fault}; Spark's VectorUDT refuses it: the file is damaged or crafted"
        )
    widths = np.where(sparse, sizes, stored)
    data = _flat(values).to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
    at = np.repeat(np.cumsum(widths) - widths, stored)  # where each stored value's row starts
    cols = np.arange(data.size) - np.repeat(np.cumsum(stored) - stored, stored)  # dense rows
    sparse_values = np.repeat(sparse, stored)
    if sparse_values.any():
        cols[sparse_values] = flat_idx[np.repeat(sparse, counts)]
    out = np.zeros(int(widths.sum()))
    out[at + cols] = data
    full = np.zeros(len(arr), dtype=np.int64)
    full[valid] = widths
    offsets = pa.array(np.concatenate([[0], np.cumsum(full)]).astype(np.int32))
    mask = pa.array(~valid) if arr.null_count else None
    return pa.ListArray.from_arrays(offsets, pa.array(out), mask=mask)


def _valid(arr) -> np.ndarray:
    return np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)


def _flat(lists) -> pa.Array:
    """The values of a list array, each row's in order (only what the offsets cover)."""
    return lists.flatten()
