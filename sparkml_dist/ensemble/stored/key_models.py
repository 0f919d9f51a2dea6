"""The models of a fit by key, held as references: the keys, their counts and the blocks.  [anywhere]

What a :class:`~sparkml_dist.ensemble.GroupedModel` and :func:`train_per_group`'s result hold, at
any number of keys: the keys (Arrow, in their Spark type, in index order), the rows each key's
model saw (numpy), the keys whose fit failed, and the blocks of :mod:`.key_blocks` that hold the
models: files of a model store (``membersDir``, a saved model) or, without one, the blocks' bytes
collected from the tasks.  Nothing is decoded until it is used:

* :meth:`KeyModels.model` reads key ``i``'s block once (a store's file verified against the
  SHA-256 its manifest holds) and decodes that key's row (its digest and place checked);
* read blocks stay in a per-process cache of at most :data:`CACHE_BYTES`, the models decoded from
  them with them: scoring a batch of a block's keys reads the block once;
* shipped to executors (:meth:`KeyModels.without_keys`) it is the blocks' references: each Python
  worker reads the blocks that its rows' keys are in.

Models given whole (read back from a members table, or loaded from a model saved before blocks)
are held as one block of decoded models.

Example::

    models = KeyModels.from_fit(keys, fitted, fit_id, store_uri)
    models.model(models.position("north")), models.rows[:3], models.failed
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...formats.checks import UnsafeModelError
from ...group_rows import FOLDS, comparable, hashable
from .key_blocks import BLOCK_ITEM, Block, BlockWriter, decode_row, read_block
from .key_blocks import FORMAT as BLOCK_FORMAT
from .members_table import safe_encode

KEYS_GROUP = -2  # a saved model's index of its keys (its item 0), beside its blocks
CACHE_BYTES = 256 << 20


class _Read:
    """One block as read: its rows (Arrow) and the entries decoded from them so far."""

    def __init__(self, table: Optional[pa.Table], size: int) -> None:
        self.table, self.size = table, size
        self.entries: Dict[int, Tuple[Any, int, dict, Optional[str]]] = {}


class KeyModels:
    """The models of a fit by key (see the module docstring).  ``keys``: an Arrow array (None on
    executors), ``rows``: each key's rows, ``blocks``: :class:`~.key_blocks.Block`\\ s in key order,
    ``fit_id``: the fit its blocks' rows name, ``uri``: the model store holding the blocks' files."""

    def __init__(
        self, keys: Optional[pa.Array], rows: np.ndarray, blocks: Sequence[Block], fit_id: str,
        uri: Optional[str] = None, trusted_types: Sequence[str] = (), failed: Optional[dict] = None,
        fold: Optional[str] = None,
    ) -> None:  # fmt: skip
        self.keys = keys
        self.fold = fold  # the keys' collation when not byte for byte (group_rows.key_fold)
        self.rows = np.asarray(rows, dtype=np.int64)
        self.blocks = sorted(blocks, key=lambda b: b.lo)
        self.fit_id, self.uri, self.trusted_types = fit_id, uri, tuple(trusted_types)
        self.failed: Dict[int, str] = (
            dict(failed)
            if failed is not None
            else {i: why for b in self.blocks for i, why in b.failed.items()}
        )
        self._starts = np.array([b.lo for b in self.blocks], dtype=np.int64)
        self._cache: "OrderedDict[int, _Read]" = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def from_models(cls, keys: pa.Array, entries: Sequence[tuple], fold: Optional[str] = None) -> "KeyModels":
        """Models given whole: ``entries[i] = (model, rows, metrics[, error])`` of key ``i``
        (an error: its fit failed, it has no model); ``fold``: the keys' collation."""
        full = [(e[0], int(e[1]), dict(e[2] or {}), e[3] if len(e) > 3 else None) for e in entries]
        block = Block(0, len(full), np.array([e[1] for e in full], dtype=np.int64))
        block.models = full
        block.failed = {i: e[3] for i, e in enumerate(full) if e[3] is not None}
        if fold is not None and fold not in FOLDS:
            raise UnsafeModelError(f"the members table names an unknown key collation {fold!r}")
        return cls(keys, block.rows, [block], fit_id="", fold=fold)

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k not in ("_cache", "_lock")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._cache, self._lock = OrderedDict(), threading.Lock()

    def without_keys(self) -> "KeyModels":
        """A copy to ship to executors: the blocks' references, not the keys (rows find their
        key's index by a join)."""
        out = object.__new__(KeyModels)
        out.__setstate__({**self.__getstate__(), "keys": None})
        return out

    # ------------------------------------------------------------------ keys
    def __len__(self) -> int:
        return len(self.rows)

    @property
    def ok(self) -> np.ndarray:
        """Which keys have a model (their fit did not fail)."""
        mask = np.ones(len(self.rows), dtype=bool)
        mask[list(self.failed)] = False
        return mask

    def key(self, i: int) -> Any:
        return hashable(self.keys[int(i)].as_py())

    def python_keys(self, indices: Optional[Sequence[int]] = None) -> List[Any]:
        keys = self.keys if indices is None else self.keys.take(pa.array(indices, pa.int64()))
        return [hashable(k) for k in keys.to_pylist()]

    def indices(self, values: pa.Array) -> np.ndarray:
        """The index of each of ``values`` among the keys (-1 where it is not one), keys compared
        as Spark compares them (:func:`~sparkml_dist.group_rows.comparable`: ``-0.0`` is ``0.0``,
        UTF8_LCASE text case-blind)."""
        keys = self.keys if self.keys.type == values.type else self.keys.cast(values.type)
        fold = getattr(self, "fold", None)  # a model pickled before keys had a collation
        found = pc.index_in(comparable(values, fold), value_set=comparable(keys, fold))
        return pc.fill_null(found, -1).to_numpy(zero_copy_only=False).astype(np.int64)

    def position(self, key: Any) -> int:
        """The index of ``key`` (a ``KeyError`` when no model was fitted for it)."""
        try:
            found = self.indices(pa.array([key], type=self.keys.type))[0]
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
            found = next((i for i, k in enumerate(self.python_keys()) if k == key), -1)
        if found < 0:
            raise KeyError(key)
        return int(found)

    # ------------------------------------------------------------------ models
    def block_of(self, i: int) -> int:
        return int(np.searchsorted(self._starts, i, side="right") - 1)

    def entry(self, i: int) -> Tuple[Any, int, dict, Optional[str]]:
        """``(model, rows, metrics, error)`` of key ``i`` (model None when its fit failed)."""
        b = self.block_of(i)
        if self.blocks[b].models is not None:
            return self.blocks[b].models[i - self.blocks[b].lo]
        read = self._read(b)
        found = read.entries.get(i)
        if found is None:
            lo = self.blocks[b].lo
            collected = self.blocks[b].meta is None
            found = decode_row(
                read.table, i - lo, i, self.fit_id, len(self.rows), self.trusted_types, collected=collected
            )
            read.entries[i] = found
        return found

    def model(self, i: int) -> Any:
        return self.entry(i)[0]

    def __iter__(self) -> Iterator[Tuple[int, Any]]:
        """``(index, model)`` of every key with a model, a block at a time."""
        for i in np.flatnonzero(self.ok):
            yield int(i), self.model(int(i))

    def _read(self, b: int) -> _Read:
        with self._lock:
            read = self._cache.get(b)
            if read is not None:
                self._cache.move_to_end(b)
                return read
        block = self.blocks[b]
        data = block.data if block.data is not None else _store(self.uri).read_bytes(block.meta)
        read = _Read(read_block(data, f"the block of keys {block.lo}..{block.hi - 1}"), len(data))
        with self._lock:
            self._cache[b] = read
            held = sum(r.size for r in self._cache.values())
            while held > CACHE_BYTES and len(self._cache) > 1:
                _, old = self._cache.popitem(last=False)
                held -= old.size
        return read

    # ------------------------------------------------------------------ saved
    def save(self, store) -> List[dict]:
        """Into ``store`` (a saved model's): the keys' index (:data:`KEYS_GROUP`) and every block
        as it is (a store's file copied after its checksum is verified; nothing is decoded).  Models
        held in memory are written into blocks in safe formats first.  Their metadata, for the
        store's manifest."""
        source = self if all(b.meta is not None for b in self.blocks) else self._encoded()
        metas = [store.write(KEYS_GROUP, 0, source._index_table())]
        for b in source.blocks:
            data = b.data if b.data is not None else _store(self.uri).read_bytes(b.meta)
            metas.append(store.write_bytes(b.lo, BLOCK_ITEM, data, fmt=BLOCK_FORMAT))
        return metas

    @classmethod
    def load(cls, store, objects: Sequence[dict], trusted_types: Sequence[str] = ()) -> "KeyModels":
        """What :meth:`save` wrote, from the store's (verified) manifest: the keys' index is read,
        the blocks stay in the store."""
        index = next((m for m in objects if m.get("group") == KEYS_GROUP and m.get("item") == 0), None)
        if index is None:
            raise UnsafeModelError(
                f"the model in {store.uri!r} has blocks of models but no index of its keys"
            )
        table = store.decode(index, signed=store.signed)
        meta = table.schema.metadata or {}
        rows = table.column("rows").to_numpy().astype(np.int64)
        failed_col = table.column("failed").to_pylist()
        metas = sorted((m for m in objects if m.get("item") == BLOCK_ITEM), key=lambda m: m["group"])
        starts = [int(m["group"]) for m in metas]
        if len(rows) and (
            not starts or starts[0] != 0 or starts != sorted(set(starts)) or starts[-1] >= len(rows)
        ):
            raise UnsafeModelError(
                f"the blocks of the model in {store.uri!r} do not hold its {len(rows)} keys"
            )
        blocks = [
            Block(lo, hi, rows[lo:hi], meta=m) for m, lo, hi in zip(metas, starts, starts[1:] + [len(rows)])
        ]
        failed = {i: why for i, why in enumerate(failed_col) if why is not None}
        fit_id = meta.get(b"fit_id", b"").decode()
        keys = table.column("key").combine_chunks()
        fold = meta.get(b"key_fold", b"").decode() or None
        if fold is not None and fold not in FOLDS:
            raise UnsafeModelError(f"the model in {store.uri!r} names an unknown key collation {fold!r}")
        return cls(keys, rows, blocks, fit_id, store.uri, trusted_types, failed, fold=fold)

    def _index_table(self) -> pa.Table:
        failed = (
            [self.failed.get(i) for i in range(len(self.rows))] if self.failed else [None] * len(self.rows)
        )
        table = pa.table(
            {"key": self.keys, "rows": pa.array(self.rows), "failed": pa.array(failed, pa.string())}
        )
        fold = {"key_fold": self.fold} if getattr(self, "fold", None) else {}
        return table.replace_schema_metadata({"fit_id": self.fit_id, **fold})

    def _encoded(self) -> "KeyModels":
        """These models written into blocks (models given whole), under a new fit id."""
        import uuid

        fit_id, blocks = uuid.uuid4().hex, []
        writer = BlockWriter(fit_id, len(self.rows))
        for i in range(len(self.rows)):
            model, rows, metrics, error = self.entry(i)
            encoded = safe_encode(model, self.key(i)) if error is None else None
            blocks += [b for b in [writer.add(i, self.key(i), rows, encoded, metrics, error)] if b]
        blocks += [b for b in [writer.close()] if b]
        return KeyModels(self.keys, self.rows, blocks, fit_id, fold=self.fold)


def members_table(models: KeyModels, spark, key: Any = None):
    """The models as one members table (:mod:`.members_table`: a row per key, a key whose fit
    failed included, with its reason): the store's block files read by Spark as they are, or,
    for blocks held in memory or a signing ``key`` (``key=`` or ``SPARKML_DIST_MODEL_KEY``: each
    row's digest becomes an HMAC), built on the driver."""
    import posixpath

    from ...formats.signing import key_bytes
    from .members_table import row_digest

    source = models if all(b.meta is not None for b in models.blocks) else models._encoded()
    key_b = key_bytes(key)
    if key_b is None and source.uri and all(b.meta is not None for b in source.blocks):
        return spark.read.parquet(*[posixpath.join(source.uri, b.meta["file"]) for b in source.blocks])
    tables = []
    for b in source.blocks:
        table = read_block(b.data if b.data is not None else _store(source.uri).read_bytes(b.meta))
        if key_b is not None:
            r = table.to_pydict()
            digests = [
                row_digest(g, n, f, dict(m or []), rec, bytes(d), key_b)
                for g, n, f, m, rec, d in zip(
                    r["group"], r["rows"], r["format"], r["metrics"], r["record"], r["model"]
                )
            ]
            table = table.set_column(table.schema.get_field_index("sha256"), "sha256", pa.array(digests))
        tables.append(table)
    return spark.createDataFrame(pa.concat_tables(tables))


_stores: Dict[str, Any] = {}


def _store(uri: str):
    from ...formats.store import ModelStore

    if uri not in _stores:
        _stores[uri] = ModelStore(uri)
    return _stores[uri]
