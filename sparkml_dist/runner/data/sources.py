"""Where a rank's rows are read from, chunk by chunk: its spill file, Parquet row ranges, a table.  [rank]

A rank holds one or more *streams* (see :mod:`sparkml_dist.runner.data.sample_order`); each stream is a
list of chunks read one at a time, so what a rank holds in memory is bounded by the chunks it is
using, never by its shard:

* :class:`IpcSource`: rows that came through Spark, spilled by the task to an Arrow IPC file on the
  rank's local disk, one record batch per chunk (``chunk_rows`` rows), the streams one after
  another.  The file is read with plain reads (not memory-mapped), so only the chunks being used
  count toward the process's memory.
* :class:`ParquetSource`: a plain Parquet scan, read by the rank itself from the files (no local
  copy), chunk after chunk of a row group with a bounded read buffer.
* :class:`TableSource`: an in-memory Arrow table (one stream; tests and direct use).

The task describes the source in a small JSON *manifest* (:func:`write_manifest`) beside the rank's
work files; :func:`open_manifest` opens it.  Nothing in it is unpickled: JSON, and Arrow's own
schema encoding for Parquet's schema.
"""

from __future__ import annotations

import base64
import json
import os
from typing import Dict, List, Sequence, Tuple

import pyarrow as pa

from ...errors import ConfigurationError
from . import parquet_split
from .sample_order import chunk_sizes


class TableSource:
    """Streams over in-memory tables, ``chunk_rows`` rows a chunk: ``TableSource(table, stream=c)``
    (one stream) or ``TableSource({c: table, ...})`` (several, as a rank holding them would)."""

    def __init__(self, tables, stream: int = 0, chunk_rows: int = 16384) -> None:
        if isinstance(tables, pa.Table):
            tables = {int(stream): tables}
        self._tables = {int(c): t for c, t in tables.items()}
        self.streams = tuple(sorted(self._tables))
        self.schema = self._tables[self.streams[0]].schema
        self._chunks = {c: chunk_sizes(t.num_rows, chunk_rows) for c, t in self._tables.items()}
        self._rows = int(chunk_rows)

    def chunks(self, stream: int) -> List[int]:
        return self._chunks[stream]

    def read(self, stream: int, i: int) -> pa.Table:
        return self._tables[stream].slice(i * self._rows, self._chunks[stream][i])


class IpcSource:
    """The streams spilled by the task, in stream order, ``chunk_rows`` rows a record batch."""

    def __init__(self, path: str, streams: Sequence[int], sizes: Dict[int, int], chunk_rows: int) -> None:
        self._handle = pa.OSFile(path, "rb")
        self._reader = pa.ipc.open_file(self._handle)
        self.schema = self._reader.schema
        self.streams = tuple(int(s) for s in streams)
        self._chunks = {c: chunk_sizes(sizes[c], chunk_rows) for c in self.streams}
        self._first: Dict[int, int] = {}
        at = 0
        for c in self.streams:
            self._first[c] = at
            at += len(self._chunks[c])
        if at != self._reader.num_record_batches:
            raise ConfigurationError(
                f"the rank's spilled rows do not match the plan: {self._reader.num_record_batches} "
                f"chunks in {path}, {at} expected"
            )

    def chunks(self, stream: int) -> List[int]:
        return self._chunks[stream]

    def read(self, stream: int, i: int) -> pa.Table:
        return pa.Table.from_batches([self._reader.get_batch(self._first[stream] + i)])

    def close(self) -> None:
        self._handle.close()


class ParquetSource:
    """Each stream a list of Parquet row-group slices ``(uri, row_group, start, stop)``, read in
    chunks of ``chunk_rows`` rows (aligned on the row group's start) by a sequential reader per
    stream with a bounded read buffer: memory follows the chunks in use, not the files' row-group
    size.  :meth:`groups` tells the sample order which chunks share a slice, so it keeps them in
    sequence (the slices are shuffled, and the rows within each window)."""

    def __init__(
        self, columns: Sequence[str], schema: pa.Schema, parts: Dict[int, list], chunk_rows: int = 4096
    ):
        self.columns, self.schema = list(columns), schema
        self.streams = tuple(sorted(parts))
        self._rows = int(chunk_rows)
        self._parts = {c: [tuple(s) for s in parts[c]] for c in self.streams}
        # per stream: (slice index, batch number within the row group, start, stop) of every chunk
        self._chunks: Dict[int, List[Tuple[int, int, int, int]]] = {}
        for c in self.streams:
            cut = []
            for k, (_, _, start, stop) in enumerate(self._parts[c]):
                start, stop = int(start), int(stop)
                for b in range(start // self._rows, -(-stop // self._rows)):
                    lo, hi = max(start, b * self._rows), min(stop, (b + 1) * self._rows)
                    if lo < hi:
                        cut.append((k, b, lo, hi))
            self._chunks[c] = cut
        self._files: Dict[str, object] = {}
        self._cursor: Dict[int, list] = {}  # stream -> [slice index, next batch number, iterator]
        self.opened = 0  # row-group readers started (a re-read shows here)

    def chunks(self, stream: int) -> List[int]:
        return [hi - lo for _, _, lo, hi in self._chunks[stream]]

    def groups(self, stream: int) -> List[int]:
        """The slice of each chunk: the chunks of one slice are read in sequence."""
        return [k for k, _, _, _ in self._chunks[stream]]

    def _file(self, uri: str):
        import pyarrow.parquet as pq
        from pyarrow import fs as pafs

        pf = self._files.get(uri)
        if pf is None:
            filesystem, path = pafs.FileSystem.from_uri(uri)
            pf = self._files[uri] = pq.ParquetFile(
                filesystem.open_input_file(path), buffer_size=1 << 20, pre_buffer=False
            )
        return pf

    def _batch(self, stream: int, k: int, b: int) -> pa.RecordBatch:
        """Batch ``b`` of slice ``k``'s row group: the next of the stream's reader, or a new reader."""
        cur = self._cursor.get(stream)
        if cur is None or cur[0] != k or cur[1] > b:
            uri, group, _, _ = self._parts[stream][k]
            batches = self._file(uri).iter_batches(
                batch_size=self._rows, row_groups=[int(group)], columns=self.columns, use_threads=False
            )
            cur = self._cursor[stream] = [k, 0, batches]
            self.opened += 1
        while True:
            batch = next(cur[2])
            cur[1] += 1
            if cur[1] - 1 == b:
                return batch

    def read(self, stream: int, i: int) -> pa.Table:
        k, b, lo, hi = self._chunks[stream][i]
        batch = self._batch(stream, k, b).slice(lo - b * self._rows, hi - lo)
        uri, group, _, _ = self._parts[stream][k]
        where = f" of {uri}, row group {group}"
        return parquet_split.deliver(pa.Table.from_batches([batch]), self.columns, self.schema, where)


def write_manifest(path: str, **fields) -> None:
    """The rank's source description (see :func:`open_manifest`), as JSON."""
    if isinstance(fields.get("schema"), pa.Schema):
        fields["schema"] = base64.b64encode(fields["schema"].serialize().to_pybytes()).decode()
    with open(path, "w") as fh:
        json.dump(fields, fh)


def open_manifest(path: str, unlink: bool = True) -> Tuple[object, List[int]]:
    """(the rank's source, every stream's size) from the manifest at ``path``.  A spill file is
    removed from the disk once open (``unlink``): the space goes back when the process ends."""
    with open(path) as fh:
        m = json.load(fh)
    sizes = [int(s) for s in m["sizes"]]
    if m["kind"] == "ipc":
        mine = {int(c): sizes[int(c)] for c in m["streams"]}
        source = IpcSource(m["file"], m["streams"], mine, int(m["chunk_rows"]))
        if unlink:
            os.unlink(m["file"])
    elif m["kind"] == "parquet":
        source = _parquet(m, {int(c): p for c, p in m["parts"].items()})
    else:
        raise ConfigurationError(f"unknown shard source {m['kind']!r} in {path}")
    return source, sizes


def _parquet(m: dict, parts: Dict[int, list]) -> "ParquetSource":
    schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(m["schema"])))
    return ParquetSource(m["columns"], schema, parts)


def reopener(path: str):
    """For a rank of a world that changes in place: ``open(streams)`` gives a source of any of the
    run's streams (the manifest names every stream's Parquet slices), or None when the manifest
    names only this rank's (a fixed world)."""
    with open(path) as fh:
        m = json.load(fh)
    every = m.get("every_part")
    if not every:
        return None
    every = {int(c): p for c, p in every.items()}
    return lambda streams: _parquet(m, {c: every[c] for c in streams})
