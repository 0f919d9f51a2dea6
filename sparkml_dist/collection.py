"""The shared way back from executors to the driver.  [runs on both]

Executors turn any object into *chunk rows* (:data:`CHUNK_SCHEMA`) tagged
``(group, item, attempt, chunk, n_chunks)``; the driver reassembles them with :func:`decode`:

* exactly one copy per ``(group, item)`` is kept when a retried or speculative task delivered
  twice (chunks of different attempts are never mixed);
* a failure on an executor travels as an ``error`` row and is raised as :class:`WorkerError`
  naming the group, with the executor's traceback;
* groups that never reported raise :class:`CollectionError` naming them.

For objects too large to collect, :class:`ModelStore` writes them to a directory (a local path or a
file-system URI such as ``file:///``, ``hdfs://``, ``s3://``): executors write each object under a
temporary name and rename it, only small metadata rows come back through Spark, and the driver then
writes ``manifest.json`` (sizes and SHA-256 checksums) last.  Readers see only what the manifest
lists, so a half-written file is never visible.

Example (driver side)::

    table = df.mapInArrow(task, collection.CHUNK_DDL).toArrow()
    objects = collection.decode(table, expected_groups=range(8))   # {(group, item): object}
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import traceback
import uuid
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Tuple

import pyarrow as pa

from . import serialization
from .errors import CollectionError, WorkerError

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
    detail = {"message": message, "traceback": tb if tb is not None else traceback.format_exc()}
    return encode_bytes(group, -1, json.dumps(detail).encode(), kind=KIND_ERROR)


# --------------------------------------------------------------------------- driver side
@dataclass(frozen=True)
class _Piece:
    chunk: int
    n_chunks: int
    payload: bytes


def _assemble(table: pa.Table) -> Tuple[Dict[Tuple[int, int], bytes], List[Tuple[int, dict]]]:
    """Group chunk rows by (group, item, attempt); keep one complete attempt per (group, item)."""
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
            cols["chunk"][i], cols["n_chunks"][i], payload[i].as_py()
        )
    objects: Dict[Tuple[int, int], bytes] = {}
    errors: List[Tuple[int, dict]] = []
    for key in sorted(attempts):
        group, item, _ = key
        pieces = attempts[key]
        n = next(iter(pieces.values())).n_chunks
        if len(pieces) != n or set(pieces) != set(range(n)):
            continue  # an incomplete attempt (a task killed mid-output): another copy may be whole
        data = b"".join(pieces[c].payload for c in range(n))
        if kinds[key] == KIND_ERROR:
            errors.append((group, json.loads(data.decode())))
        elif (group, item) not in objects:
            objects[(group, item)] = data
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
        group, detail = min(errors, key=lambda e: e[0])
        raise WorkerError(
            f"{what} {group} failed on an executor: {detail['message']}",
            group=group if what == "group" else None,
            rank=group if what == "rank" else None,
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
    return {key: serialization.loads(data) for key, data in sorted(blobs.items())}


# --------------------------------------------------------------------------- model store
def _filesystem(uri: str):
    """(pyarrow FileSystem, path) for a local path or a URI pyarrow understands."""
    from pyarrow import fs as pafs

    if "://" not in uri:
        return pafs.LocalFileSystem(), os.path.abspath(uri)
    if uri.startswith("s3a://") or uri.startswith("s3n://"):
        uri = "s3://" + uri.split("://", 1)[1]
    try:
        return pafs.FileSystem.from_uri(uri)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as exc:
        raise CollectionError(f"cannot open model store {uri!r}: {exc}") from exc


class ModelStore:
    """A directory of objects with a manifest, for results too large to collect.

    Executors call :meth:`write`; the driver calls :meth:`commit` with what came back, then anyone
    can :meth:`load`.  Layout::

        <root>/manifest.json                     written last (atomically)
        <root>/objects/g00003-i0-<attempt>.pkl   one committed file per (group, item)
        <root>/_tmp/...                          in-flight writes, removed by commit

    Example::

        store = ModelStore("file:///mnt/models/run1")
        meta = store.write(group=3, item=0, obj=model)      # on an executor
        store.commit([meta, ...])                           # on the driver
        model = ModelStore("file:///mnt/models/run1").load(3)
    """

    MANIFEST = "manifest.json"

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self._fs, self._root = _filesystem(uri)

    def __getstate__(self):  # pyarrow file systems are re-opened where the store is used
        return {"uri": self.uri}

    def __setstate__(self, state):
        self.__init__(state["uri"])

    def _path(self, *parts: str) -> str:
        return posixpath.join(self._root, *parts)

    # executor side
    def write(self, group: int, item: int, obj: Any) -> dict:
        """Write one object; returns its metadata for :meth:`commit` (send it back via collection)."""
        data = serialization.dumps(obj)
        return self.write_bytes(group, item, data)

    def write_bytes(self, group: int, item: int, data: bytes) -> dict:
        attempt = uuid.uuid4().hex[:12]
        name = f"g{group:05d}-i{item}-{attempt}.pkl"
        tmp = self._path("_tmp", name)
        final = self._path("objects", name)
        self._fs.create_dir(self._path("_tmp"), recursive=True)
        self._fs.create_dir(self._path("objects"), recursive=True)
        with self._fs.open_output_stream(tmp) as out:
            out.write(data)
        self._fs.move(tmp, final)
        return {
            "group": group,
            "item": item,
            "file": f"objects/{name}",
            "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        }

    # driver side
    def commit(self, metas: Iterable[dict], extra: Optional[dict] = None) -> dict:
        """Write the manifest listing one file per (group, item); delete strays of other attempts."""
        chosen: Dict[Tuple[int, int], dict] = {}
        for meta in sorted(metas, key=lambda m: (m["group"], m["item"], m["file"])):
            chosen.setdefault((meta["group"], meta["item"]), meta)
        manifest = {
            "format": "sparkml_dist.model_store/1",
            "objects": [chosen[k] for k in sorted(chosen)],
            **(extra or {}),
        }
        self._fs.create_dir(self._root, recursive=True)
        tmp = self._path("_tmp", f"manifest-{uuid.uuid4().hex}.json")
        self._fs.create_dir(self._path("_tmp"), recursive=True)
        with self._fs.open_output_stream(tmp) as out:
            out.write(json.dumps(manifest, indent=1, sort_keys=True).encode())
        self._fs.move(tmp, self._path(self.MANIFEST))
        keep = {m["file"] for m in manifest["objects"]}
        self._remove_strays(keep)
        return manifest

    def _remove_strays(self, keep: set) -> None:
        from pyarrow import fs as pafs

        for sub in ("objects", "_tmp"):
            infos = self._fs.get_file_info(pafs.FileSelector(self._path(sub), allow_not_found=True))
            for info in infos:
                rel = posixpath.relpath(info.path, self._root)
                if info.type == pafs.FileType.File and rel not in keep:
                    self._fs.delete_file(info.path)

    def manifest(self) -> dict:
        try:
            with self._fs.open_input_stream(self._path(self.MANIFEST)) as src:
                return json.loads(src.read().decode())
        except FileNotFoundError as exc:
            raise CollectionError(
                f"no {self.MANIFEST} in model store {self.uri!r}: the write was never committed "
                "(or this is not a model store)"
            ) from exc

    def read_bytes(self, meta: dict) -> bytes:
        with self._fs.open_input_stream(self._path(meta["file"])) as src:
            data = src.read()
        if len(data) != meta["size"] or hashlib.sha256(data).hexdigest() != meta["sha256"]:
            raise CollectionError(
                f"model file {meta['file']!r} in {self.uri!r} does not match its checksum in the "
                "manifest: it is corrupt or was modified after it was written"
            )
        return data

    def load(self, group: int, item: int = 0, *, trusted_modules: Iterable[str] = ()) -> Any:
        for meta in self.manifest()["objects"]:
            if meta["group"] == group and meta["item"] == item:
                return serialization.safe_loads(self.read_bytes(meta), trusted_modules)
        raise CollectionError(f"model store {self.uri!r} has no object for group {group}, item {item}")

    def load_all(self, *, trusted_modules: Iterable[str] = ()) -> Dict[Tuple[int, int], Any]:
        return {
            (m["group"], m["item"]): serialization.safe_loads(self.read_bytes(m), trusted_modules)
            for m in self.manifest()["objects"]
        }
