"""The task of every per-group fit: its rows in, one result per group (or per block) out.  [executor]

:func:`fit_groups` is the ``mapInArrow`` function of :func:`.groups.fit` and
:func:`~.groups.fit_keys`.  A task's rows arrive one group after another
(``GROUP_COL``); each group is fitted by :func:`~.fitting.fit_one` (in this process, or, with a
per-key timeout, in a child process the task watches: :mod:`.key_watch`), the driver's bar of
groups done is told (batched), and the result goes out: collected per group, or, for a fit of
many keys, added to the task's open block (:mod:`..stored.key_blocks`), written to the store or
collected whole when it closes.  One group's rows are held at a time, or none of them for a group trained
from a stream (:mod:`.stream`; with a per-key timeout its batches go to the watched child as
they arrive).  Nothing here touches a SparkSession.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Iterable, Iterator

import pyarrow as pa

from ... import collection, progress, serialization
from ...group_rows import KEY_VALUE_COL, group_streams, hashable
from ..stored.key_blocks import BLOCK_ITEM, Block, BlockWriter
from ..stored.key_blocks import FORMAT as BLOCK_FORMAT
from . import key_watch as _key_watch
from .fitting import Clone, GroupFitSpec, Template, fit_one
from .stream import Counted


def fit_groups(batches: Iterable[pa.RecordBatch], spec: GroupFitSpec) -> Iterator[pa.RecordBatch]:
    """Executor task: the rows of one or more groups in, one result per group (or one per block
    of keys) out (see the module docstring); one group is held at a time."""
    loaded = serialization.loads(spec.recipe.blob)  # the estimator or the function, once per task
    if isinstance(spec.recipe, Clone):
        loaded = Template(loaded, spec.recipe.member)
    writer = BlockWriter(*spec.blocks) if spec.blocks else None
    watched = _key_watch.Watched(spec) if spec.key_timeout else contextlib.nullcontext()
    with progress.Reporter(spec.progress) as report, watched:
        for group, stream in group_streams(b for b in batches if b.num_rows):
            key, stream = _keyed(spec, group, stream)
            if spec.key_timeout:  # in the watched child, its rows held or streamed to it
                out = watched.fit(group, key, stream, streamed=_streamed(spec, group))
            elif _streamed(spec, group):  # never held: fitted here, as its batches arrive
                out = fit_one(spec, loaded, group, key, Counted(stream))
            else:
                out = fit_one(spec, loaded, group, key, list(stream))
            report()
            if isinstance(out, pa.RecordBatch):  # a collected result, or the error that ends the fit
                yield out
                continue
            block = writer.add(group, key, out.rows, out.encoded, out.metrics, out.error)
            if block is not None:
                yield _ship(spec.store, block)
    block = writer.close() if writer is not None else None
    if block is not None:
        yield _ship(spec.store, block)


def _keyed(spec: GroupFitSpec, group: int, stream: Iterator[pa.RecordBatch]):
    """``(the group's key, its batches)``: the key from the spec, or the one its rows carry (then
    dropped from them)."""
    if spec.keys is not None:
        return spec.keys[group], stream
    first = next(stream)
    key = hashable(first.column(KEY_VALUE_COL)[0].as_py())
    return key, (b.drop_columns([KEY_VALUE_COL]) for b in itertools.chain([first], stream))


def _streamed(spec: GroupFitSpec, group: int) -> bool:
    return spec.stream == "all" or (isinstance(spec.stream, dict) and group in spec.stream)


def _ship(store, block: Block) -> pa.RecordBatch:
    """A closed block back to the driver: written to the store (its metadata goes back), or whole."""
    if store is not None:
        block.meta = store.write_bytes(block.lo, BLOCK_ITEM, block.data, fmt=BLOCK_FORMAT)
        block.data = None
    return collection.encode(block.lo, 0, block)
