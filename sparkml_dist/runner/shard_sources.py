"""Where a rank's rows are read from, chunk by chunk: its spill file, Parquet row ranges, a table.  [rank]

A rank holds one or more *streams* (see :mod:`sparkml_dist.runner.sample_order`); each stream is a
list of chunks read one at a time, so what a rank holds in memory is bounded by the chunks it is
using, never by its shard:

* :class:`IpcSource`: rows that came through Spark, spilled by the task to an Arrow IPC file on the
  rank's local disk, one record batch per chunk (``chunk_rows`` rows), the streams one after
  another.  The file is read with plain reads (not memory-mapped), so only the chunks being used
  count toward the process's memory.
* :class:`ParquetSource`: a plain Parquet scan, read by the rank itself from the files (no local
  copy); a chunk is one row-group slice, so memory follows the files' row-group size.
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

from ..errors import ConfigurationError
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
    """Each stream a list of Parquet row-group slices ``(uri, row_group, start, stop)``."""

    def __init__(self, columns: Sequence[str], schema: pa.Schema, parts: Dict[int, list]) -> None:
        self.columns, self.schema = list(columns), schema
        self.streams = tuple(sorted(parts))
        self._parts = {c: [tuple(s) for s in parts[c]] for c in self.streams}
        self._files: Dict[str, object] = {}

    def chunks(self, stream: int) -> List[int]:
        return [int(stop) - int(start) for _, _, start, stop in self._parts[stream]]

    def _file(self, uri: str):
        import pyarrow.parquet as pq
        from pyarrow import fs as pafs

        pf = self._files.get(uri)
        if pf is None:
            filesystem, path = pafs.FileSystem.from_uri(uri)
            pf = self._files[uri] = pq.ParquetFile(filesystem.open_input_file(path))
        return pf

    def read(self, stream: int, i: int) -> pa.Table:
        uri, group, start, stop = self._parts[stream][i]
        table = self._file(uri).read_row_group(int(group), columns=self.columns, use_threads=False)
        return table.slice(int(start), int(stop) - int(start)).select(self.columns).cast(self.schema)


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
        schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(m["schema"])))
        source = ParquetSource(m["columns"], schema, {int(c): p for c, p in m["parts"].items()})
    else:
        raise ConfigurationError(f"unknown shard source {m['kind']!r} in {path}")
    return source, sizes
