"""Feature columns as Arrow hands them to Python -> the matrix a model fits on.  [anywhere]

Lists of numbers (``array<double>``: numeric columns stacked, array columns) become a dense
``(rows, features)`` float64 array.  Spark ML vectors arrive as their storage struct (``type`` 0
sparse / 1 dense, ``size``, ``indices``, ``values``) and are never expanded on the way: they become
a ``scipy.sparse.csr_matrix`` straight from the stored values, and a dense array only when the
model cannot take sparse input or most entries are stored anyway (one rule, :func:`matrix`)::

    X = matrix(batch.column("features"), sparse_ok=accepts_sparse(estimator))

``accepts_sparse`` reads scikit-learn's ``input_tags.sparse`` (linear models, trees, forests,
XGBoost and LightGBM's scikit-learn classes, pipelines whose first step does): a model fitted
either way predicts the same from either form.

Columns for tensors (a rank's shard, :mod:`sparkml_dist.runner.data.shard`, its loader
:mod:`sparkml_dist.runner.data.loader`, and ``predict_batch``'s workers) go through the same room without
extra copies: a list column becomes an ``(n, d)`` array, a scalar column ``(n,)``, each in the torch
dtype its Arrow type maps to (:func:`torch_dtype`, :func:`fill`); binary and string columns stay
Python values (an object array) for the user's ``transform``.
"""

from __future__ import annotations

from typing import Any, Iterable, List, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .errors import ConfigurationError

# vectors become CSR when fewer than this share of their entries are stored (and the model takes it)
SPARSE_SHARE = 1 / 3


def is_vector(t: pa.DataType) -> bool:
    """Whether an Arrow type is a Spark ML vector's storage struct."""
    return pa.types.is_struct(t) and {f.name for f in t} >= {"type", "size", "indices", "values"}


def accepts_sparse(model: Any) -> bool:
    """Whether ``model.fit``/``predict`` take ``scipy.sparse`` input (scikit-learn's tags)."""
    try:
        from sklearn.utils import get_tags

        return bool(get_tags(model).input_tags.sparse)
    except Exception:  # not a scikit-learn-API object, or tags it cannot compute: dense is safe
        return False


def _combined(arr):
    return arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr


def vector_shape(df, column: str, sample: int = 1000):
    """(width, mean stored entries per row) of a Spark ML vector column, from its first ``sample``
    rows (SQL cannot look inside vectors).  [driver: one small Spark job]"""
    rows = [r[0] for r in df.select(column).limit(sample).collect() if r[0] is not None]
    if not rows:
        return 0, 0.0
    return int(rows[0].size), float(np.mean([len(v.values) for v in rows]))


def lists_to_numpy(arr: pa.Array, n_features: Optional[int] = None, what: str = "features") -> np.ndarray:
    """A list<double> Arrow array -> (n_rows, n_features) float64 array; nulls inside become NaN."""
    arr = _combined(arr)
    n = len(arr)
    if arr.null_count:
        raise ValueError(f"{what}: {arr.null_count} rows have a null feature vector")
    values = arr.flatten()
    if n == 0:
        return np.zeros((0, n_features or 0))
    width = len(values) // n
    lengths = pc.list_value_length(arr)
    lo, hi = pc.min_max(lengths).values()
    if lo.as_py() != hi.as_py() or (n_features is not None and width != n_features):
        raise ValueError(
            f"{what}: rows have {lo.as_py()}..{hi.as_py()} values; expected "
            f"{n_features if n_features is not None else 'the same number'} in every row"
        )
    return values.to_numpy(zero_copy_only=False).astype(np.float64, copy=False).reshape(n, width)


def _vector_parts(arr: pa.Array, n_features: Optional[int], what: str):
    """(stored values, their columns, values per row, width) of a vector struct array."""
    if arr.null_count:
        raise ValueError(f"{what}: {arr.null_count} rows hold no vector (null); drop or fill them")
    kind = arr.field("type").to_numpy(zero_copy_only=False)
    sizes = arr.field("size").fill_null(0).to_numpy(zero_copy_only=False)
    lengths = arr.field("values").value_lengths().fill_null(0).to_numpy(zero_copy_only=False)
    widths = np.where(kind == 0, sizes, lengths)
    width = int(n_features if n_features is not None else (widths.max() if len(arr) else 0))
    if len(arr) and np.any(widths != width):
        bad = np.flatnonzero(widths != width)
        raise ValueError(
            f"{what}: vectors of {sorted(set(widths[bad].tolist()))[:5]} entries where {width} are "
            f"expected ({bad.size} rows); every row needs the same size"
        )
    data = arr.field("values").flatten().to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
    stored_idx = arr.field("indices").flatten().to_numpy(zero_copy_only=False)  # sparse rows only
    if np.all(kind == 0):
        cols = stored_idx
    else:  # a dense row's values sit in columns 0..width-1
        starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
        cols = np.arange(data.size) - starts
        from_sparse = np.repeat(kind == 0, lengths)
        cols[from_sparse] = stored_idx
    if cols.size and (cols.min() < 0 or cols.max() >= max(width, 1)):
        raise ValueError(f"{what}: a vector has an index outside 0..{width - 1}")
    return data, cols.astype(np.int32 if width < 2**31 else np.int64, copy=False), lengths, width


def vectors_to_csr(arr: pa.Array, n_features: Optional[int] = None, what: str = "features"):
    """Spark ML vectors -> ``scipy.sparse.csr_matrix`` of their stored entries (never expanded)."""
    from scipy import sparse

    data, cols, lengths, width = _vector_parts(_combined(arr), n_features, what)
    indptr = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    return sparse.csr_matrix((data, cols, indptr), shape=(len(lengths), width))


def csr_from_batches(parts: List[pa.RecordBatch], column: str, n_features: Optional[int], what: str):
    """One CSR matrix of ``column`` over record batches, emptying ``parts`` as it goes: each
    batch's vectors are copied into the matrix (allocated once, filled in order) and the batch let
    go, so the rows are held about once, not twice, while the matrix is built."""
    from scipy import sparse

    nnz = sum(int(b.column(column).field("values").flatten().__len__()) for b in parts)
    rows = sum(b.num_rows for b in parts)
    data = np.empty(nnz, dtype=np.float64)  # pages are committed as they are written
    cols = np.empty(nnz, dtype=np.int32 if (n_features or 0) < 2**31 else np.int64)
    indptr = np.zeros(rows + 1, dtype=np.int64)
    at = row = 0
    width = n_features
    pool = pa.default_memory_pool()
    while parts:
        batch = parts.pop(0)
        d, c, lengths, width = _vector_parts(_combined(batch.column(column)), width, what)
        data[at : at + d.size], cols[at : at + d.size] = d, c
        indptr[row + 1 : row + 1 + lengths.size] = at + np.cumsum(lengths)
        at, row = at + d.size, row + lengths.size
        del batch, d, c
        pool.release_unused()  # hand the batch's pages back (mimalloc/jemalloc keep them otherwise)
    return sparse.csr_matrix((data, cols, indptr), shape=(rows, width or 0))


def vectors_to_numpy(arr: pa.Array, n_features: Optional[int] = None, what: str = "features") -> np.ndarray:
    """Spark ML vectors -> a dense (rows, size) float64 array."""
    data, cols, lengths, width = _vector_parts(_combined(arr), n_features, what)
    out = np.zeros((len(lengths), width))
    out[np.repeat(np.arange(len(lengths)), lengths), cols] = data
    return out


def matrix(
    arr: pa.Array, n_features: Optional[int] = None, *, sparse_ok: bool = False, what: str = "features"
):
    """The matrix a model gets: CSR for vectors when ``sparse_ok`` and fewer than
    :data:`SPARSE_SHARE` of the entries are stored, a dense float64 array otherwise."""
    arr = _combined(arr)
    if not is_vector(arr.type):
        return lists_to_numpy(arr, n_features, what)
    if sparse_ok:
        X = vectors_to_csr(arr, n_features, what)
        cells = X.shape[0] * X.shape[1]
        return X if cells and X.nnz < SPARSE_SHARE * cells else X.toarray()
    return vectors_to_numpy(arr, n_features, what)


def _part(arr: pa.Array, sparse_ok: bool, what: str):
    """One feature column as a block of the matrix: a number (n, 1), an array (n, d), a vector (n, d)
    sparse where ``sparse_ok``."""
    arr = _combined(arr)
    if is_vector(arr.type):
        return vectors_to_csr(arr, what=what) if sparse_ok else vectors_to_numpy(arr, what=what)
    if (
        pa.types.is_list(arr.type)
        or pa.types.is_large_list(arr.type)
        or pa.types.is_fixed_size_list(arr.type)
    ):
        return lists_to_numpy(arr, what=what)
    if arr.null_count:
        raise ValueError(f"{what}: {arr.null_count} rows are null")
    return arr.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)[:, None]


def stack(
    columns: List[pa.Array],
    names: List[str],
    n_features: Optional[int] = None,
    *,
    sparse_ok: bool = False,
    keep_sparse: bool = False,
):
    """Feature columns side by side, the one way every per-group fit builds its matrix: numbers
    and arrays dense, vectors as they are stored; CSR when a vector part is and ``sparse_ok``, made
    dense when most entries are stored anyway (:data:`SPARSE_SHARE`) unless ``keep_sparse``."""
    what = ", ".join(repr(n) for n in names)
    if len(columns) == 1 and not keep_sparse:
        return matrix(columns[0], n_features, sparse_ok=sparse_ok, what=f"column {what}")
    parts = [_part(arr, sparse_ok, f"column {name!r}") for arr, name in zip(columns, names)]
    if not any(hasattr(p, "tocsr") for p in parts):
        X = np.hstack(parts) if len(parts) > 1 else parts[0]
    else:
        from scipy import sparse

        X = sparse.hstack([p if hasattr(p, "tocsr") else sparse.csr_matrix(p) for p in parts]).tocsr()
        cells = X.shape[0] * X.shape[1]
        if not keep_sparse and not (cells and X.nnz < SPARSE_SHARE * cells):
            X = X.toarray()
    if n_features is not None and X.shape[1] != n_features:
        raise ValueError(f"columns {what}: {X.shape[1]} features where {n_features} are expected")
    return X


def check_finite(X, allow_nan: bool, what: str) -> None:
    """Refuse +/-inf always and NaN unless the model handles missing values (dense or CSR)."""
    values = X.data if hasattr(X, "tocsr") else X
    if np.isinf(values).any():
        raise ValueError(f"{what}: {int(np.isinf(values).sum())} values are +/-inf; clip or drop them")
    if not allow_nan and np.isnan(values).any():
        raise ValueError(
            f"{what}: {int(np.isnan(values).sum())} values are NaN; impute or drop them, or use a model "
            "that handles missing values"
        )


# ---------------------------------------------------------------- columns for tensors, no extra copies
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
