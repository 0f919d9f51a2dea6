"""Many keys' models in blocks: the models of consecutive keys in one Parquet file.  [anywhere]

A grouped fit (:class:`~sparkml_dist.ensemble.GroupedTrainer`, :func:`train_per_group`) hands each
task a run of consecutive keys (the keys' index order: Spark's order of the key column) and the
task writes their models as it fits them, in *blocks*: a block closes after :data:`BLOCK_BYTES` of
model bytes or :data:`BLOCK_KEYS` keys, whichever comes first, and is one small members table
(:mod:`.members_table`'s schema and digests), one row per key in index order::

    group    the key as text            rows     the rows its model saw
    format   the model's safe format    model    its bytes
    metrics  what the fit reported      record   JSON: kind, the key's index ("group"), the key
                                                 when JSON holds it, and its place in the fit
    sha256   the row's digest                    ("table": {"id", "row": index, "rows": keys})

Blocks written to a store (``membersDir``) hold each model in a safe format
(:mod:`sparkml_dist.formats`); blocks collected from the tasks hold pickles, as the collection
layer carries any result, and are written in safe formats when the model is saved or made a table.

A key whose fit failed under ``onError="skip"`` keeps its row: format :data:`FAILED`, no model
bytes, and its reason in the record (``"error"``).  Every row names the fit and its own index, so
the blocks of one fit together are one members table (``spark.read.parquet`` over them) whose
digests cover every row's place: a row moved, dropped, or taken from another fit is refused.

Blocks stay small (256 KiB of models: about 600 linear models) so that reading one key's model
reads one block, and large enough that 10^6 keys make a few thousand files, not millions.

Example::

    writer = BlockWriter(fit_id="ab12", n_keys=100_000)
    for index, key, rows, model in fitted:                  # in index order
        block = writer.add(index, key, rows, formats.encode(model))   # a Block when one closed
    block = writer.close()
    table = read_block(block.data)
    model, rows, metrics, error = decode_row(table, index - block.lo, index, "ab12", 100_000)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa

from ... import formats as model_formats
from ...formats.checks import UnsafeModelError
from ..member_records import json_key
from .members_table import FAILED, row_digest

BLOCK_BYTES = 256 << 10
BLOCK_KEYS = 1024
FORMAT = "parquet"  # how a block is stored (sparkml_dist.formats)
BLOCK_ITEM = 2  # a block's item in a model store (its group: its first key's index)
SCHEMA = pa.schema(
    [
        ("group", pa.string()),
        ("rows", pa.int64()),
        ("format", pa.string()),
        ("model", pa.binary()),
        ("metrics", pa.map_(pa.string(), pa.float64())),
        ("record", pa.string()),
        ("sha256", pa.string()),
    ]
)


@dataclass
class Block:
    """One closed block: keys ``lo`` .. ``hi - 1``, the rows each key's model saw, the keys whose
    fit failed ({index: why}), and the block's Parquet bytes (``data``) or, once a store holds
    them, the store's metadata of its file (``meta``); or models given whole (``models``:
    ``(model, rows, metrics, error)`` per key, read back from a table)."""

    lo: int
    hi: int
    rows: np.ndarray
    failed: Dict[int, str] = field(default_factory=dict)
    data: Optional[bytes] = None
    meta: Optional[dict] = None
    models: Optional[List[tuple]] = None


class BlockWriter:
    """Rows of consecutive keys -> :class:`Block`\\ s (see the module docstring)."""

    def __init__(self, fit_id: str, n_keys: int, state: Optional[dict] = None) -> None:
        self.fit_id, self.n_keys, self.state = fit_id, int(n_keys), dict(state or {})
        self._rows: List[tuple] = []
        self._counts: List[int] = []
        self._failed: Dict[int, str] = {}
        self._lo: Optional[int] = None
        self._bytes = 0

    def add(
        self, index: int, key: Any, rows: int, encoded: Optional[Tuple[str, bytes]] = None,
        metrics: Optional[dict] = None, error: Optional[str] = None,
    ) -> Optional[Block]:  # fmt: skip
        """Add key ``index``'s model, already in its safe format (``encoded``: ``(format,
        bytes)`` of :func:`sparkml_dist.formats.encode`), or its ``error``; the block that closed,
        if one did (a run of keys with a gap starts a new block: a block's keys are consecutive)."""
        done = None
        if self._lo is not None and index != self._lo + len(self._rows):
            done = self.close()
        if self._lo is None:
            self._lo = int(index)
        fmt, data = (FAILED, b"") if error is not None else encoded
        record = {"kind": "key_model", "group": int(index), "rows": int(rows)}
        if json_key(key):
            record["key"] = key
        if error is not None:
            record["error"] = str(error)
            self._failed[int(index)] = str(error)
        if self.state:  # what rebuilding the model from a members table needs (see TableMembers)
            record["model"] = self.state
        record["table"] = {"id": self.fit_id, "row": int(index), "rows": self.n_keys}
        text = json.dumps(record, sort_keys=True)
        metrics = {str(k): float(v) for k, v in (metrics or {}).items()}
        digest = row_digest(str(key), int(rows), fmt, metrics, text, data, None)
        self._rows.append((str(key), int(rows), fmt, data, list(metrics.items()), text, digest))
        self._counts.append(int(rows))
        self._bytes += len(data)
        full = self._bytes >= BLOCK_BYTES or len(self._rows) >= BLOCK_KEYS
        return done if not full else (done or self.close())

    def close(self) -> Optional[Block]:
        """The open block, closed (None when it holds no key)."""
        if self._lo is None:
            return None
        import pyarrow.parquet as pq

        columns = list(zip(*self._rows))
        table = pa.Table.from_arrays([pa.array(c, f.type) for c, f in zip(columns, SCHEMA)], schema=SCHEMA)
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        lo = self._lo
        block = Block(lo, lo + len(self._rows), np.asarray(self._counts, np.int64), dict(self._failed))
        block.data = sink.getvalue().to_pybytes()
        self.__init__(self.fit_id, self.n_keys, self.state)
        return block


def read_block(data: bytes, what: str = "a block of models") -> pa.Table:
    """A block's rows from its (already verified) bytes."""
    table = model_formats.decode(FORMAT, data, what=what)
    if table.schema.names != SCHEMA.names:
        raise UnsafeModelError(f"{what} has columns {table.schema.names}, not {SCHEMA.names}")
    return table


def decode_row(
    table: pa.Table, row: int, index: int, fit_id: str, n_keys: int, trusted_types: Sequence[str] = (),
    what: str = "key", collected: bool = False,
) -> Tuple[Any, int, dict, Optional[str]]:  # fmt: skip
    """``(model, rows, metrics, error)`` of the block's row ``row``, which holds key ``index``: its
    digest, its fit and its place checked, then its model decoded through the safe formats (None
    when its fit failed).  ``collected``: the block came back from this application's tasks through
    the collection layer, never from storage: its models are pickles, as any collected result."""
    r = {name: table.column(name)[row].as_py() for name in SCHEMA.names}
    metrics = dict(r["metrics"] or [])
    data = bytes(r["model"] or b"")
    good = row_digest(r["group"], r["rows"], r["format"], metrics, r["record"], data, None)
    if r["sha256"] != good:
        raise UnsafeModelError(f"the row of {what} {r['group']!r} does not match its sha256: it changed")
    try:
        record = json.loads(r["record"])
        place = record["table"]
    except (ValueError, KeyError, TypeError):
        raise UnsafeModelError(f"the row of {what} {r['group']!r} has no valid record") from None
    if place != {"id": fit_id, "row": index, "rows": n_keys} or record.get("group") != index:
        raise UnsafeModelError(f"the row of {what} {r['group']!r} belongs to another fit or place: {place}")
    if r["format"] == FAILED:
        return None, int(r["rows"]), metrics, str(record.get("error", ""))
    pickled = collected and r["format"] == "pickle"
    name = f"{what} {r['group']!r}"
    model = model_formats.decode(
        r["format"], data, trusted_types=trusted_types, what=name, allow_pickle=pickled
    )
    return model, int(r["rows"]), metrics, None
