"""This rank's shard of the DataFrame, as Arrow / numpy / torch.  [executor: inside a rank process]

The barrier task writes its partition to an Arrow IPC file on local disk; the rank process
memory-maps it (zero copy) and removes the file at once, so the disk space goes back when the
process ends, whatever way it ends.  No rows are pickled.

Inside ``main``::

    from sparkml_dist.runner import shard
    data = shard()                                   # an Arrow table, plus helpers
    X = data.to_torch(["features"])                  # list<double> column -> (n, d) float32 tensor
    for X, y in data.dataloader(64, ["features", "label"], shuffle=True, seed=0):
        ...

Every rank's ``dataloader`` yields the same number of batches per epoch (the largest shard decides;
smaller shards cycle through their rows again), so DDP never hangs on uneven shards.
"""

from __future__ import annotations

import json
import math
import os
from typing import Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import pyarrow as pa

from ..errors import ConfigurationError

SHARD_ENV = "SPARKML_DIST_SHARD"
SHARD_SIZES_ENV = "SPARKML_DIST_SHARD_SIZES"

Columns = Optional[Union[str, Sequence[str]]]


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _chunk_numpy(chunk: pa.Array, name: str) -> np.ndarray:
    """A zero-copy numpy view of one Arrow chunk: (n, d) for a list column, (n,) otherwise."""
    if not _is_list(chunk.type):
        return chunk.to_numpy(zero_copy_only=False)
    if chunk.null_count:
        raise ConfigurationError(f"column {name!r}: {chunk.null_count} rows are null")
    n = len(chunk)
    values = chunk.flatten()
    if n and len(values) % n:
        raise ConfigurationError(f"column {name!r}: rows have different lengths")
    return values.to_numpy(zero_copy_only=False).reshape(n, len(values) // n if n else 0)


def _column_numpy(col: pa.ChunkedArray, name: str) -> np.ndarray:
    """One column as numpy: a view when it is one chunk, else one concatenated copy."""
    parts = [_chunk_numpy(c, name) for c in col.chunks if len(c)]
    if not parts:
        return np.zeros((0, 0) if _is_list(col.type) else 0)
    if len(parts) == 1:
        return parts[0]
    if parts[0].ndim == 2 and len({p.shape[1] for p in parts}) > 1:
        raise ConfigurationError(f"column {name!r}: rows have different lengths")
    return np.concatenate(parts)


def _float_target(float_dtype) -> type:
    import torch

    return {torch.float64: np.float64, torch.float16: np.float16}.get(float_dtype, np.float32)


def _columns_array(table: pa.Table, names: List[str], dtype=None) -> np.ndarray:
    """The named columns as one 2-D array with at most one copy of the data.

    A single one-chunk list column without ``dtype`` is a zero-copy (read-only) view of the shard;
    otherwise one array of ``dtype`` is allocated and filled chunk by chunk from zero-copy views,
    so the peak is the mapped shard plus the output.
    """
    cols = [table.column(c) for c in names]
    if len(cols) == 1 and cols[0].num_chunks == 1:
        only = _chunk_numpy(cols[0].chunk(0), names[0])
        if only.ndim == 2 and (dtype is None or only.dtype == dtype):
            return only
    widths, dtypes = [], []
    for name, col in zip(names, cols):
        first = next((c for c in col.chunks if len(c)), None)
        sample = _chunk_numpy(first, name) if first is not None else np.zeros(0)
        widths.append(sample.shape[1] if sample.ndim == 2 else 1)
        dtypes.append(sample.dtype)
    out = np.empty((table.num_rows, sum(widths)), dtype=dtype or np.result_type(*dtypes))
    at = 0
    for name, col, w in zip(names, cols, widths):
        row = 0
        for chunk in col.chunks:
            part = _chunk_numpy(chunk, name)
            if part.ndim == 2 and part.shape[1] != w:
                raise ConfigurationError(f"column {name!r}: rows have different lengths")
            out[row:row + len(chunk), at:at + w] = part if part.ndim == 2 else part[:, None]
            row += len(chunk)
        at += w
    return out


def _tensor_dtype(arr: np.ndarray, float_dtype=None):
    if np.issubdtype(arr.dtype, np.floating):
        return _float_target(float_dtype)
    return np.bool_ if np.issubdtype(arr.dtype, np.bool_) else np.int64


def _to_tensor(arr: np.ndarray, float_dtype=None):
    """A writable tensor (floats as float32 unless ``float_dtype``; integers as int64).

    The shard is a read-only memory map: this copies at most once, and tensors never alias it.
    """
    import torch

    target = _tensor_dtype(arr, float_dtype)
    if arr.dtype != target or not arr.flags.writeable or not arr.flags.c_contiguous:
        arr = np.array(arr, dtype=target, copy=True, order="C")
    return torch.from_numpy(arr)


class Shard:
    """One rank's rows.  ``table`` is the memory-mapped Arrow table."""

    def __init__(self, table: pa.Table, shard_sizes: Sequence[int], rank: int) -> None:
        self.table = table
        self.shard_sizes = list(shard_sizes)
        self.rank = rank

    @property
    def num_rows(self) -> int:
        return self.table.num_rows

    @property
    def column_names(self) -> List[str]:
        return self.table.column_names

    def _names(self, columns: Columns) -> List[str]:
        if columns is None:
            return list(self.table.column_names)
        names = [columns] if isinstance(columns, str) else list(columns)
        missing = [c for c in names if c not in self.table.column_names]
        if missing:
            raise ConfigurationError(f"columns {missing} are not in this shard; it has {self.table.column_names}")
        return names

    def to_numpy(self, columns: Columns = None, dtype=None) -> np.ndarray:
        """One 2-D array of the columns (list columns spread over several).

        A single list column is returned without copying (a read-only view of the shard) unless
        ``dtype`` asks for another type; scalar columns are filled into one new array.
        """
        return _columns_array(self.table, self._names(columns), dtype)

    def to_torch(self, columns: Columns = None, dtype=None):
        """A writable tensor of the columns: floating data as ``dtype`` (default float32),
        integers as int64; one copy of the data."""
        names = self._names(columns)
        sample = _column_numpy(self.table.column(names[0]), names[0])
        return _to_tensor(_columns_array(self.table, names, _tensor_dtype(sample, dtype)), dtype)

    def steps_per_epoch(self, batch_size: int, drop_last: bool = False) -> int:
        """Batches every rank yields per epoch (the same on all ranks)."""
        biggest = max(self.shard_sizes) if self.shard_sizes else self.num_rows
        return max(1, biggest // batch_size) if drop_last else max(1, math.ceil(biggest / batch_size))

    def dataloader(self, batch_size: int, columns: Columns = None, shuffle: bool = True, seed: int = 0,
                   drop_last: bool = False) -> "ShardLoader":
        """Batches of tensors, one per column: a list column gives (b, d), a scalar column (b,)."""
        if batch_size < 1:
            raise ConfigurationError(f"batch_size must be >= 1, got {batch_size}")
        if self.num_rows == 0:
            raise ConfigurationError(f"rank {self.rank} received an empty shard; there are fewer rows "
                                     "than ranks. Lower np or add data.")
        return ShardLoader(self, self._names(columns), batch_size, shuffle, seed, drop_last)


class ShardLoader:
    """Iterable over one epoch of batches; each ``iter()`` starts the next epoch (new shuffle).

    Call ``set_epoch(e)`` to choose the epoch explicitly, as with DistributedSampler.
    """

    def __init__(self, shard: Shard, names: List[str], batch_size: int, shuffle: bool, seed: int,
                 drop_last: bool) -> None:
        self._tensors = [self._tensor(shard.table, c) for c in names]
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.steps = shard.steps_per_epoch(batch_size, drop_last)
        self.rows = shard.num_rows
        self.rank = shard.rank
        self.epoch = 0

    @staticmethod
    def _tensor(table: pa.Table, name: str):
        """One column as a tensor with one copy: (n, d) for a list column, (n,) otherwise."""
        col = table.column(name)
        first = next((c for c in col.chunks if len(c)), None)
        target = _tensor_dtype(_chunk_numpy(first, name) if first is not None else np.zeros(0))
        arr = _columns_array(table, [name], target)
        return _to_tensor(arr if _is_list(col.type) else arr[:, 0])

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.steps

    def _indices(self, epoch: int) -> np.ndarray:
        if self.shuffle:
            rng = np.random.default_rng([self.seed, epoch, self.rank])
            order = rng.permutation(self.rows)
        else:
            order = np.arange(self.rows)
        need = self.steps * self.batch_size
        return np.resize(order, need) if need > self.rows else order[:need]

    def __iter__(self) -> Iterator[Tuple]:
        import torch

        idx = torch.from_numpy(self._indices(self.epoch))
        self.epoch += 1
        for s in range(self.steps):
            sel = idx[s * self.batch_size:(s + 1) * self.batch_size]
            yield tuple(t[sel] for t in self._tensors)


_SHARD: Optional[Shard] = None


def _open_shard_file(path: str) -> pa.Table:
    source = pa.memory_map(path, "r")
    table = pa.ipc.open_file(source).read_all()
    return table


def load_from_env(unlink: bool = True) -> None:
    """Called by the rank bootstrap: map the shard file and remove it from disk."""
    global _SHARD
    path = os.environ.get(SHARD_ENV)
    if not path:
        return
    table = _open_shard_file(path)
    if unlink:
        os.unlink(path)
    sizes = json.loads(os.environ.get(SHARD_SIZES_ENV, "[]"))
    _SHARD = Shard(table, sizes, int(os.environ.get("RANK", "0")))


def shard() -> Shard:
    """This rank's shard of the DataFrame given to ``BarrierRunner.run_with_data``."""
    if _SHARD is None:
        raise ConfigurationError("shard() is only available inside a function started by "
                                 "BarrierRunner.run_with_data(df, main)")
    return _SHARD
