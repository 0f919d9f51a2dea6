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


def _column_numpy(col: pa.ChunkedArray, name: str) -> np.ndarray:
    arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type) or pa.types.is_fixed_size_list(arr.type):
        n = len(arr)
        if arr.null_count:
            raise ConfigurationError(f"column {name!r}: {arr.null_count} rows are null")
        values = arr.flatten()
        if n and len(values) % n:
            raise ConfigurationError(f"column {name!r}: rows have different lengths")
        width = len(values) // n if n else 0
        return values.to_numpy(zero_copy_only=False).reshape(n, width)
    return arr.to_numpy(zero_copy_only=False)


def _to_tensor(arr: np.ndarray, float_dtype=None):
    """A writable tensor: floating data as ``float_dtype`` (float32), integers as int64.

    The shard is a read-only memory map, so data is copied once here (a float64 column becomes a
    float32 tensor half its size); tensors never alias the file.
    """
    import torch

    if np.issubdtype(arr.dtype, np.floating):
        target = {torch.float64: np.float64, torch.float16: np.float16}.get(float_dtype, np.float32)
    elif np.issubdtype(arr.dtype, np.bool_):
        target = np.bool_
    else:
        target = np.int64
    out = np.array(arr, dtype=target, copy=True, order="C") if (arr.dtype != target or not arr.flags.writeable) \
        else np.ascontiguousarray(arr)
    return torch.from_numpy(out)


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

    def to_numpy(self, columns: Columns = None) -> np.ndarray:
        """One 2-D array: a single list column as (n, d) (zero copy), scalar columns stacked."""
        names = self._names(columns)
        arrays = [_column_numpy(self.table.column(c), c) for c in names]
        if len(arrays) == 1:
            return arrays[0] if arrays[0].ndim == 2 else arrays[0].reshape(-1, 1)
        return np.column_stack([a if a.ndim == 2 else a.reshape(-1, 1) for a in arrays])

    def to_torch(self, columns: Columns = None, dtype=None):
        """A tensor of ``to_numpy(columns)``: floating data as ``dtype`` (default float32)."""
        return _to_tensor(self.to_numpy(columns), dtype)

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
        self._tensors = [_to_tensor(_column_numpy(shard.table.column(c), c)) for c in names]
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.steps = shard.steps_per_epoch(batch_size, drop_last)
        self.rows = shard.num_rows
        self.rank = shard.rank
        self.epoch = 0

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
