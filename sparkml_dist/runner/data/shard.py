"""This rank's shard of the DataFrame: streamed batches, or whole as numpy / torch.  [rank]

A rank's rows are one or more *streams* (:mod:`sparkml_dist.runner.data.sample_order`) read chunk by
chunk from where they lie (:mod:`sparkml_dist.runner.data.sources`): rows that came through Spark
from the Arrow IPC file the task spilled them to on local disk (opened, then removed from the
directory at once, so the space goes back when the process ends, whatever way it ends); a plain
Parquet scan from its files, with no local copy.  No rows are pickled.

Inside ``main``::

    from sparkml_dist.runner import shard
    data = shard()
    for X, y in data.dataloader(64, ["features", "label"], seed=0):    # streamed, bounded memory
        ...
    X = data.to_torch(["features"])        # the whole shard as one tensor (refused when too big)

``dataloader`` streams: what it holds is a few windows of rows, whatever the shard's size, and its
order is the same for any number of ranks (see :mod:`sparkml_dist.runner.data.loader`).  Every rank
yields the same number of batches per epoch, so DDP never hangs on uneven shards.
``to_numpy`` / ``to_torch`` / ``table`` build the whole shard in memory: they refuse a shard that
does not fit, naming the streaming API.
"""

from __future__ import annotations

import json
import os
from typing import Callable, Iterator, List, Optional, Sequence, Union

import numpy as np
import pyarrow as pa

from ... import feature_arrays
from ...errors import ConfigurationError
from ..protocol import SHARD_ENV
from .loader import ShardLoader, check_options, redeal_loaders
from .sample_order import rank_streams
from .sources import TableSource, open_manifest, reopener

Columns = Optional[Union[str, Sequence[str]]]
WINDOW_ROWS = 16384  # rows a stream's window holds by default: the shuffle's reach and its memory


def memory_budget() -> int:
    """Bytes this process may still allocate: the least of the memory available on the machine,
    the room left under its address-space / data limits, and its cgroup's."""
    import resource

    room = []
    status = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            if rest.strip().endswith("kB"):
                status[key] = int(rest.split()[0]) * 1024
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                room.append(int(line.split()[1]) * 1024)
    for limit, used in ((resource.RLIMIT_AS, "VmSize"), (resource.RLIMIT_DATA, "VmData")):
        soft = resource.getrlimit(limit)[0]
        if soft != resource.RLIM_INFINITY:
            room.append(soft - status.get(used, 0))
    try:
        with open("/sys/fs/cgroup/memory.max") as fh:
            cap = fh.read().strip()
        if cap != "max":
            with open("/sys/fs/cgroup/memory.current") as fh:
                room.append(int(cap) - int(fh.read()))
    except OSError:
        pass
    return max(0, min(room)) if room else 1 << 62


class Shard:
    """One rank's rows: ``dataloader`` / ``batches`` stream them; ``to_numpy`` / ``to_torch`` /
    ``table`` build them whole.

    ``Shard(table, shard_sizes, rank)`` makes one from an in-memory Arrow table (rank ``rank``'s
    stream of ``len(shard_sizes)``); inside ``run_with_data`` use :func:`shard`.
    """

    def __init__(
        self, table: Optional[pa.Table], shard_sizes: Sequence[int] = (), rank: int = 0, **where
    ) -> None:
        if table is not None:
            sizes = list(shard_sizes) or [table.num_rows]
            where = dict(
                source=TableSource(table, stream=rank), sizes=sizes, data_rank=rank, data_world=len(sizes)
            )
        self._source = where["source"]
        self.sizes: List[int] = [int(n) for n in where["sizes"]]
        self.data_rank, self.data_world = int(where["data_rank"]), int(where["data_world"])
        self.rank = int(where.get("rank", self.data_rank))
        self._reopen = where.get("reopen")  # a world that changes in place: any streams' source
        self._deal()

    def _deal(self) -> None:
        self.shard_sizes = [
            sum(self.sizes[c] for c in rank_streams(r, self.data_world, len(self.sizes)))
            for r in range(self.data_world)
        ]

    def redeal(self, rank: int, world: int) -> None:
        """The world changed in place (``elastic.run`` with ``min_np``): this rank now holds the
        streams of rank ``rank`` of ``world``, and every loader made from the shard reads them
        from its position on (the global batch stays; each rank's share of it changes)."""
        if self._reopen is None or (rank, world) == (self.data_rank, self.data_world):
            return
        old, self._source = self._source, self._reopen(rank_streams(rank, world, len(self.sizes)))
        self.data_rank, self.data_world, self.rank = rank, world, rank
        self._deal()
        redeal_loaders(old, self._source, rank, world)

    @property
    def num_rows(self) -> int:
        return sum(self.sizes[c] for c in self._source.streams)

    @property
    def column_names(self) -> List[str]:
        return list(self._source.schema.names)

    @property
    def streams(self) -> List[int]:
        """The streams this rank holds (see :mod:`sparkml_dist.runner.data.sample_order`)."""
        return list(self._source.streams)

    def _chunks(self) -> Iterator[pa.RecordBatch]:
        """Every row of the shard, stream after stream, chunk by chunk."""
        for c in self._source.streams:
            for i in range(len(self._source.chunks(c))):
                yield from self._source.read(c, i).to_batches()

    def _names(self, columns: Columns) -> List[str]:
        if columns is None:
            return self.column_names
        names = [columns] if isinstance(columns, str) else list(columns)
        missing = [c for c in names if c not in self.column_names]
        if missing:
            raise ConfigurationError(f"columns {missing} are not in this shard; it has {self.column_names}")
        return names

    def _type(self, name: str) -> pa.DataType:
        return self._source.schema.field(name).type

    def _check_fits(self, names: List[str], what: str) -> None:
        """Refuse to build the whole shard when it does not fit in this process's memory."""
        if not self.num_rows:
            return
        c = self._source.streams[0]
        first = self._source.read(c, 0).select(names)
        need = int(first.nbytes / max(1, first.num_rows) * self.num_rows)
        room = memory_budget()
        if need > 0.8 * room:
            raise ConfigurationError(
                f"{what} of rank {self.rank}'s shard needs about {need / 2**20:.0f} MiB "
                f"({self.num_rows} rows of {names}) but this process has about {room / 2**20:.0f} MiB left: "
                "stream it instead with shard().dataloader(batch_size, columns) or "
                "shard().batches(batch_size, columns), "
                "which hold a few windows of rows whatever the shard's size"
            )

    @property
    def table(self) -> pa.Table:
        """The whole shard as one Arrow table (refused when it does not fit in memory)."""
        self._check_fits(self.column_names, "table")
        batches = list(self._chunks())
        return pa.Table.from_batches(batches, schema=self._source.schema)

    def to_numpy(self, columns: Columns = None, dtype=None) -> np.ndarray:
        """One new 2-D array of the columns (a list column spreads over several), as ``dtype``
        (default: the columns' common type).  Refused when it does not fit in memory."""
        names = self._names(columns)
        self._check_fits(names, "to_numpy()")
        types = []
        for c in names:
            t = self._type(c)
            while feature_arrays.is_list(t):
                t = t.value_type
            types.append(t.to_pandas_dtype())
        target = dtype or np.result_type(*types)
        return feature_arrays.fill(self._chunks(), names, self.num_rows, [target], stack=True)[0]

    def to_torch(self, columns: Columns = None, dtype=None, device=None):
        """A tensor of the columns: floating data as ``dtype`` (default float32), integers as int64.

        Filled chunk by chunk: the peak is the tensor plus one chunk; refused, naming the streaming
        API, when the tensor does not fit in memory.  ``device`` (e.g. ``context().device``): where
        the tensor goes, with a non-blocking copy.
        """
        import torch

        names = self._names(columns)
        self._check_fits(names, "to_torch()")
        self._numeric(names)
        target = np.result_type(*[feature_arrays.torch_dtype(self._type(c), dtype) for c in names])
        tensor = torch.from_numpy(
            feature_arrays.fill(self._chunks(), names, self.num_rows, [target], stack=True)[0]
        )
        return tensor if device is None else tensor.to(device, non_blocking=True)

    def _numeric(self, names: List[str]) -> None:
        for c in names:
            if not feature_arrays.is_numeric(self._type(c)):
                raise ConfigurationError(
                    f"column {c!r} holds {self._type(c)} values, not numbers: decode it with "
                    f"shard().dataloader(..., transform=fn), where fn gets the batch's {c!r} values "
                    "(bytes stay bytes) and returns tensors"
                )

    def _check_not_empty(self) -> None:
        if self.num_rows == 0:
            raise ConfigurationError(
                f"rank {self.rank} received an empty shard; there are fewer rows than ranks. "
                "Lower np or add data."
            )

    def steps_per_epoch(self, batch_size: int, drop_last: bool = False) -> int:
        """Batches every rank yields per epoch (the same on all ranks)."""
        from .sample_order import Plan

        return Plan(self.sizes, batch_size * self.data_world, drop_last).steps

    def dataloader(
        self,
        batch_size: Optional[int] = None,
        columns: Columns = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        device=None,
        pin_memory: bool = False,
        *,
        global_batch_size: Optional[int] = None,
        pad_last: bool = False,
        transform: Optional[Callable] = None,
        num_workers: int = 0,
        window_rows: int = WINDOW_ROWS,
        read_ahead: int = 1,
    ) -> ShardLoader:
        """Batches streamed from the shard in the global order (see :mod:`.loader`): without
        ``transform`` a tuple of tensors, one per column ((b, d) for a list column, (b,) for a
        scalar one); with it, what ``transform({column: values})`` returns.

        ``batch_size`` rows per rank, or ``global_batch_size`` rows per step over all ranks (keep
        it fixed to see the same samples per step on any world size).  Each row once an epoch,
        the last batch maybe shorter (see :class:`ShardLoader`: ``padding``); ``pad_last=True``:
        every batch full; ``drop_last=True``: only full batches of rows not yet given.
        ``window_rows``: rows a stream shuffles within and holds at once; ``read_ahead``: windows
        read in advance.
        ``device`` (e.g. ``context().device``): each batch is copied there without blocking the
        host; ``pin_memory=True`` stages GPU-bound batches in page-locked memory first.
        """
        check_options(batch_size, global_batch_size, window_rows, read_ahead, num_workers)
        self._check_not_empty()
        names = self._names(columns)
        if transform is None:
            self._numeric(names)
        device = _torch_device(device)
        return ShardLoader(
            self._source,
            self.sizes,
            self.data_rank,
            self.data_world,
            names,
            [feature_arrays.torch_dtype(self._type(c)) for c in names],
            batch_size=batch_size,
            global_batch_size=global_batch_size,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            pad_last=bool(pad_last),
            device=device,
            pin_memory=bool(pin_memory) and device is not None and device.type == "cuda",
            transform=transform,
            num_workers=num_workers,
            window_rows=window_rows,
            read_ahead=read_ahead,
        )

    def to_keras(self, batch_size: int, x: Columns, y: Columns = None, shuffle=True, seed=0, drop_last=False):
        """A ``keras.utils.PyDataset`` for ``model.fit``: (x, y) batches, the same number on every
        rank (see :mod:`.framework_data`)."""
        from .framework_data import keras_data

        return keras_data(self, batch_size, x, y, shuffle, seed, drop_last)

    def to_tf_dataset(
        self, batch_size: int, x: Columns, y: Columns = None, shuffle=True, seed=0, drop_last=False
    ):
        """A ``tf.data.Dataset`` of (x, y) batches, auto-sharding off: this rank's rows only
        (see :mod:`.framework_data`)."""
        from .framework_data import tf_dataset

        return tf_dataset(self, batch_size, x, y, shuffle, seed, drop_last)

    def batches(self, batch_size: Optional[int] = None, columns: Columns = None, **options) -> ShardLoader:
        """As :meth:`dataloader` without shuffling unless asked: the rows in stream order."""
        options.setdefault("shuffle", False)
        return self.dataloader(batch_size, columns, **options)


def _torch_device(device):
    """``device`` as a torch device (torch imported only then: a transform may give numpy)."""
    if device is None:
        return None
    import torch

    return torch.device(device)


_SHARD: Optional[Shard] = None


def load_from_env(unlink: bool = True) -> None:
    """Called by the rank bootstrap: open the rank's source from the manifest the task wrote."""
    global _SHARD
    path = os.environ.get(SHARD_ENV)
    if not path:
        return
    source, sizes = open_manifest(path, unlink=unlink)
    with open(path) as fh:
        where = json.load(fh)
    _SHARD = Shard(
        None,
        source=source,
        sizes=sizes,
        data_rank=int(where["data_rank"]),
        data_world=int(where["data_world"]),
        rank=int(os.environ.get("RANK", "0")),
        reopen=reopener(path),
    )


def redeal(rank: int, world: int) -> None:
    """The world changed in place: this rank's shard and loaders hold rank ``rank`` of
    ``world``'s streams from now on (nothing when the run has no data)."""
    if _SHARD is not None:
        _SHARD.redeal(rank, world)


def shard() -> Shard:
    """This rank's shard of the DataFrame given to ``BarrierRunner.run_with_data``."""
    if _SHARD is None:
        raise ConfigurationError(
            "shard() is only available inside a function started by BarrierRunner.run_with_data(df, main)"
        )
    return _SHARD
