"""This rank's shard of the DataFrame, as Arrow / numpy / torch.  [rank]

The barrier task writes its partition to an Arrow IPC file on local disk; the rank process
memory-maps it (``shard().table``, zero copy), keeps a handle open and removes the file at once,
so the disk space goes back when the process ends, whatever way it ends.  Tensors are filled by
reading the file batch by batch through that handle: building them costs the tensors plus one
batch of memory.  No rows are pickled.

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
from typing import BinaryIO, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import pyarrow as pa

from .. import arg_checks
from ..errors import ConfigurationError
from .protocol import SHARD_ENV, SHARD_SIZES_ENV

Columns = Optional[Union[str, Sequence[str]]]
_BLOCK_ROWS = 2048  # rows transposed at once by _fill: a block of 50 float64 columns stays in L2


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


def _float_target(float_dtype) -> type:
    import torch

    return {torch.float64: np.float64, torch.float16: np.float16}.get(float_dtype, np.float32)


def _fill(
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
        parts = [_chunk_numpy(batch.column(c), c) for c in names]
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


class Shard:
    """One rank's rows.

    ``table`` is the memory-mapped Arrow table (zero copy; pages count toward this process's
    memory only once touched).  ``to_numpy``/``to_torch``/``dataloader`` instead *read* the shard
    file batch by batch through ``source``, so building a tensor costs the tensor plus one batch,
    not the tensor plus the mapped shard.
    """

    def __init__(
        self, table: pa.Table, shard_sizes: Sequence[int], rank: int, source: Optional[BinaryIO] = None
    ) -> None:
        self.table = table
        self.shard_sizes = list(shard_sizes)
        self.rank = rank
        self._source = source

    def _batches(self) -> Iterator[pa.RecordBatch]:
        if self._source is None:
            yield from self.table.to_batches()
            return
        self._source.seek(0)
        reader = pa.ipc.open_file(pa.PythonFile(self._source, mode="r"))
        for i in range(reader.num_record_batches):
            yield reader.get_batch(i)

    def _dtype(self, name: str, float_dtype=None, for_torch: bool = False):
        t = self.table.schema.field(name).type
        while _is_list(t):
            t = t.value_type
        if pa.types.is_floating(t):
            return _float_target(float_dtype) if for_torch else t.to_pandas_dtype()
        if for_torch:
            return np.bool_ if pa.types.is_boolean(t) else np.int64
        return t.to_pandas_dtype()

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
            raise ConfigurationError(
                f"columns {missing} are not in this shard; it has {self.table.column_names}"
            )
        return names

    def to_numpy(self, columns: Columns = None, dtype=None) -> np.ndarray:
        """One new 2-D array of the columns (a list column spreads over several), as ``dtype``
        (default: the columns' common type)."""
        names = self._names(columns)
        target = dtype or np.result_type(*[self._dtype(c) for c in names])
        return _fill(self._batches(), names, self.num_rows, [target], stack=True)[0]

    def to_torch(self, columns: Columns = None, dtype=None, device=None):
        """A tensor of the columns: floating data as ``dtype`` (default float32), integers as int64.

        Filled straight from the shard file: the peak is the tensor plus one batch.  ``device``
        (e.g. ``context().device``): where the tensor goes, with a non-blocking copy.
        """
        import torch

        names = self._names(columns)
        target = np.result_type(*[self._dtype(c, dtype, for_torch=True) for c in names])
        tensor = torch.from_numpy(_fill(self._batches(), names, self.num_rows, [target], stack=True)[0])
        return tensor if device is None else tensor.to(device, non_blocking=True)

    def steps_per_epoch(self, batch_size: int, drop_last: bool = False) -> int:
        """Batches every rank yields per epoch (the same on all ranks)."""
        biggest = max(self.shard_sizes) if self.shard_sizes else self.num_rows
        return max(1, biggest // batch_size) if drop_last else max(1, math.ceil(biggest / batch_size))

    def dataloader(
        self,
        batch_size: int,
        columns: Columns = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        device=None,
        pin_memory: bool = False,
    ) -> "ShardLoader":
        """Batches of tensors, one per column: a list column gives (b, d), a scalar column (b,).

        ``device`` (e.g. ``context().device``): each batch is copied there without blocking the
        host; ``pin_memory=True`` stages GPU-bound batches in page-locked memory first, so the
        copy overlaps the previous step's compute.
        """
        arg_checks.integer("batch_size", batch_size, 1)
        if self.num_rows == 0:
            raise ConfigurationError(
                f"rank {self.rank} received an empty shard; there are fewer rows "
                "than ranks. Lower np or add data."
            )
        names = self._names(columns)
        import torch

        arrays = _fill(
            self._batches(),
            names,
            self.num_rows,
            [self._dtype(c, for_torch=True) for c in names],
            stack=False,
        )
        loader = ShardLoader(
            self, [torch.from_numpy(a) for a in arrays], batch_size, shuffle, seed, drop_last
        )
        loader.device = None if device is None else torch.device(device)
        loader.pin_memory = bool(pin_memory) and loader.device is not None and loader.device.type == "cuda"
        return loader


class ShardLoader:
    """Iterable over one epoch of batches; each ``iter()`` starts the next epoch (new shuffle).

    Call ``set_epoch(e)`` to choose the epoch explicitly, as with DistributedSampler.
    """

    def __init__(
        self, shard: Shard, tensors: list, batch_size: int, shuffle: bool, seed: int, drop_last: bool
    ) -> None:
        self._tensors = tensors
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.steps = shard.steps_per_epoch(batch_size, drop_last)
        self.rows = shard.num_rows
        self.rank = shard.rank
        self.epoch = 0
        self.device = None  # set by Shard.dataloader
        self.pin_memory = False

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
            sel = idx[s * self.batch_size : (s + 1) * self.batch_size]
            batch = tuple(t[sel] for t in self._tensors)
            if self.device is not None:
                batch = tuple(
                    (b.pin_memory() if self.pin_memory else b).to(self.device, non_blocking=True)
                    for b in batch
                )
            yield batch


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
    source = open(path, "rb")  # kept open: conversions read through it after the unlink
    if unlink:
        os.unlink(path)
    sizes = json.loads(os.environ.get(SHARD_SIZES_ENV, "[]"))
    _SHARD = Shard(table, sizes, int(os.environ.get("RANK", "0")), source)


def shard() -> Shard:
    """This rank's shard of the DataFrame given to ``BarrierRunner.run_with_data``."""
    if _SHARD is None:
        raise ConfigurationError(
            "shard() is only available inside a function started by BarrierRunner.run_with_data(df, main)"
        )
    return _SHARD
