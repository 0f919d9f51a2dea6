"""The shared way back from executors to the driver.  [anywhere]

Executors turn any object into *chunk rows* (:data:`CHUNK_SCHEMA`) tagged
``(group, item, attempt, chunk, n_chunks)``; the driver reassembles them with :func:`decode`:

* exactly one copy per ``(group, item)`` is kept when a retried or speculative task delivered
  twice (chunks of different attempts are never mixed);
* a failure on an executor travels as an ``error`` row and is raised as :class:`WorkerError`
  naming the group, with the executor's traceback;
* groups that never reported raise :class:`CollectionError` naming them.

For objects too large to collect, :class:`~sparkml_dist.formats.store.ModelStore` writes them to a
directory (a local path or a file-system URI such as ``file:///``, ``hdfs://``, ``s3://``) in
formats whose loading runs no code, with a manifest written last (and optionally signed).

Example (driver side)::

    table = df.mapInArrow(task, collection.CHUNK_DDL).toArrow()
    objects = collection.decode(table, expected_groups=range(8))   # {(group, item): object}
"""

from __future__ import annotations

import io
import json
import sys
import traceback
import uuid
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Tuple

import pyarrow as pa

from . import serialization
from .errors import CollectionError, WorkerError, missing_module_hint

DEFAULT_CHUNK_BYTES = 4 << 20  # 4 MiB: well under Arrow's and Spark's per-value limits

CHUNK_SCHEMA = pa.schema(
    [
        ("group", pa.int32()),
        ("item", pa.int32()),
        ("attempt", pa.string()),
        ("chunk", pa.int32()),
        ("n_chunks", pa.int32()),
        ("kind", pa.string()),  # "object" | "error"
        ("payload", pa.binary()),
    ]
)
CHUNK_DDL = "`group` int, item int, attempt string, chunk int, n_chunks int, kind string, payload binary"

KIND_OBJECT = "object"
KIND_ERROR = "error"


# --------------------------------------------------------------------------- executor side
def encode(group: int, item: int, obj: Any, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> pa.RecordBatch:
    """Serialize ``obj`` into chunk rows for ``(group, item)``."""
    return encode_bytes(group, item, serialization.dumps(obj), chunk_bytes=chunk_bytes)


def encode_bytes(
    group: int, item: int, data: bytes, *, kind: str = KIND_OBJECT, chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> pa.RecordBatch:
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    view = memoryview(data)
    pieces = [view[i : i + chunk_bytes] for i in range(0, len(data), chunk_bytes)] or [view[:0]]
    n = len(pieces)
    attempt = uuid.uuid4().hex
    return pa.RecordBatch.from_arrays(
        [
            pa.array([group] * n, pa.int32()),
            pa.array([item] * n, pa.int32()),
            pa.array([attempt] * n, pa.string()),
            pa.array(range(n), pa.int32()),
            pa.array([n] * n, pa.int32()),
            pa.array([kind] * n, pa.string()),
            pa.array([bytes(p) for p in pieces], pa.binary()),
        ],
        schema=CHUNK_SCHEMA,
    )


def encode_error(group: int, message: str, tb: Optional[str] = None) -> pa.RecordBatch:
    """An error row for ``group``; ``tb`` defaults to the exception being handled."""
    detail = {
        "message": message,
        "traceback": tb if tb is not None else traceback.format_exc(),
        "python": sys.executable,  # named when the error is a module the executors cannot import
    }
    return encode_bytes(group, -1, json.dumps(detail).encode(), kind=KIND_ERROR)


# --------------------------------------------------------------------------- driver side
@dataclass(frozen=True)
class _Piece:
    chunk: int
    n_chunks: int
    payload: memoryview  # a view of the collected Arrow buffer: never copied before unpickling


class _Chunks(io.RawIOBase):
    """The pieces of one object as one read-only stream, so that unpickling reads straight from
    the collected Arrow buffers: decoding costs the object itself, not a joined copy of its bytes."""

    def __init__(self, pieces: List[memoryview]) -> None:
        super().__init__()
        self._pieces, self._i, self._pos = pieces, 0, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        out = memoryview(buf).cast("B")
        done = 0
        while done < len(out) and self._i < len(self._pieces):
            piece = self._pieces[self._i]
            n = min(len(out) - done, len(piece) - self._pos)
            out[done : done + n] = piece[self._pos : self._pos + n]
            done, self._pos = done + n, self._pos + n
            if self._pos == len(piece):
                self._i, self._pos = self._i + 1, 0
        return done


def _assemble(table: pa.Table) -> Tuple[Dict[Tuple[int, int], List[memoryview]], List[Tuple[int, dict]]]:
    """Group chunk rows by (group, item, attempt); keep one complete attempt per (group, item)
    (as its pieces, in order)."""
    if table.num_rows == 0:
        return {}, []
    cols = {
        name: table.column(name).to_pylist()
        for name in ("group", "item", "attempt", "chunk", "n_chunks", "kind")
    }
    payload = table.column("payload")
    attempts: Dict[Tuple[int, int, str], Dict[int, _Piece]] = {}
    kinds: Dict[Tuple[int, int, str], str] = {}
    for i in range(table.num_rows):
        key = (cols["group"][i], cols["item"][i], cols["attempt"][i])
        kinds[key] = cols["kind"][i]
        attempts.setdefault(key, {})[cols["chunk"][i]] = _Piece(
            cols["chunk"][i], cols["n_chunks"][i], memoryview(payload[i].as_buffer()).cast("B")
        )
    objects: Dict[Tuple[int, int], List[memoryview]] = {}
    errors: List[Tuple[int, dict]] = []
    for key in sorted(attempts):
        group, item, _ = key
        pieces = attempts[key]
        n = next(iter(pieces.values())).n_chunks
        if len(pieces) != n or set(pieces) != set(range(n)):
            continue  # an incomplete attempt (a task killed mid-output): another copy may be whole
        ordered = [pieces[c].payload for c in range(n)]
        if kinds[key] == KIND_ERROR:
            errors.append((group, json.loads(b"".join(ordered).decode())))
        elif (group, item) not in objects:
            objects[(group, item)] = ordered
    return objects, errors


def decode(
    table: pa.Table, expected_groups: Optional[Iterable[int]] = None, *, what: str = "group"
) -> Dict[Tuple[int, int], Any]:
    """Reassemble chunk rows into ``{(group, item): object}``.

    Raises :class:`WorkerError` for the first group that reported an error (in group order) and
    :class:`CollectionError` naming every expected group that delivered nothing.
    """
    blobs, errors = _assemble(table)
    if errors:
        group, detail = min(errors, key=lambda e: (e[0] < 0, e[0]))  # a group's own error first
        where = f"{what} {group}" if group >= 0 else f"a task, outside any one {what},"
        hint = missing_module_hint(detail.get("traceback", ""), detail.get("python"))
        raise WorkerError(
            f"{where} failed on an executor: {detail['message']}{hint}",
            group=group if what == "group" and group >= 0 else None,
            rank=group if what == "rank" and group >= 0 else None,
            worker_traceback=detail.get("traceback", ""),
        )
    if expected_groups is not None:
        present = {g for g, _ in blobs}
        missing = sorted(set(expected_groups) - present)
        if missing:
            shown = ", ".join(map(str, missing[:20])) + (" ..." if len(missing) > 20 else "")
            raise CollectionError(
                f"{len(missing)} {what}(s) returned no result: {shown}. Their tasks produced no "
                "output; check the executor logs, or increase spark.task.maxFailures if tasks were lost."
            )
    return {
        key: serialization.load_stream(io.BufferedReader(_Chunks(pieces)))
        for key, pieces in sorted(blobs.items())
    }


# --------------------------------------------------------------------------- model store
from .formats.store import ModelStore  # noqa: E402,F401 - the directory variant of this layer
