"""Models as rows of a Spark table, and back, through the safe formats.  [anywhere]

Hivemall's pattern: the members of an ensemble (or the models of many groups) as a table that SQL
can store, join, filter and vote over.  One row per model::

    group    string               the group number or key, as text
    rows     long                 rows the model was trained on
    format   string               skops | xgboost | json | safetensors (never a pickle unless allowed)
    model    binary               the model's bytes in that format
    metrics  map<string,double>   what its training reported (train_per_group's metrics)
    record   string               JSON: what else rebuilding needs (a member's feature indices, ...)
                                  and the row's place in its table: {"table": {"id", "row", "rows"}}
    sha256   string               SHA-256 over every other column (an HMAC with a signing key)

The digest covers the whole row (group, rows, format, metrics, record, model), and the record names
the table (a random id written once per table) and the row's place in it, so the digests cover the
table too: a row whose group or metrics were changed, a row dropped, duplicated, or taken from
another table is refused.  Reading a table back checks all of that, then decodes the bytes with
:func:`sparkml_dist.formats.decode` (skops' trusted types, the tree and booster checks), so
a forged row is refused as a forged model file is.  Tables written before the table id existed
(their digests cover record + model only) still load; signed ones with a warning that their rows'
set and other columns are not covered.

A key whose fit failed (``onError="skip"``) keeps its row: format ``failed``, no model bytes,
its reason in the record (``"error"``); reading the table back gives it no model.

A table saved with no models holds one row that says so (format ``none``, no model bytes, its
record ``{"empty": true, "table": ...}``, digested like any row): a table with no rows at all had
its rows deleted, and is refused at load rather than read back as a model of nothing.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any, Iterable, List, Optional, Sequence, Tuple

from ... import formats as model_formats
from ...errors import ConfigurationError
from ...formats import signing
from ...formats.checks import UnsafeModelError

SCHEMA = (
    "group string, rows long, format string, model binary, metrics map<string,double>, record string, "
    "sha256 string"
)
COLUMNS = ["group", "rows", "format", "model", "metrics", "record", "sha256"]
EMPTY = "none"  # the format of the one row of a table saved with no models
FAILED = "failed"  # the format of a key's row whose fit failed (onError="skip"): no model

log = logging.getLogger(__name__)


def _legacy_digest(record: str, data: bytes, key: Optional[bytes]) -> str:
    """The digest of tables written before the table id: record + model only."""
    return signing.mac(record.encode() + b"\0" + data, key)


def row_digest(group: str, rows: int, fmt: str, metrics: dict, record: str, data: bytes, key) -> str:
    """The digest of one row: every column but the digest itself (metrics in key order)."""
    head = json.dumps([group, int(rows), fmt, sorted((str(k), float(v)) for k, v in metrics.items()), record])
    return signing.mac(head.encode() + b"\0" + data, key)


def safe_encode(model: Any, group: Any) -> Tuple[str, bytes]:
    """``(format, bytes)`` of ``model`` in a safe format; what none holds is refused naming the
    group and what to return instead."""
    try:
        return model_formats.encode(model)
    except Exception as exc:  # noqa: BLE001 - whatever the format's writer raises
        raise ConfigurationError(
            f"the model of group {group!r} ({type(model).__name__}) cannot be stored in a safe format "
            f"(skops, XGBoost's own, JSON): {type(exc).__name__}: {exc}. Return a scikit-learn-API "
            "model, an XGBoost model, or plain values from the training function"
        ) from exc


def to_table(spark, entries: Iterable[Tuple[Any, int, Any, dict, dict]], key: Any = None):
    """A DataFrame of ``(group, rows, model, metrics, record)`` entries (see the module docstring)."""
    return spark.createDataFrame(table_rows(entries, key), SCHEMA)


def table_rows(entries: Iterable[Tuple[Any, int, Any, dict, dict]], key: Any = None) -> List[tuple]:
    """The rows of :func:`to_table`, in :data:`COLUMNS` order: each model encoded in a safe format,
    each row placed in one new table and digested whole."""
    from ...formats.signing import key_bytes

    key_b = key_bytes(key)
    entries = list(entries)
    table_id, rows = uuid.uuid4().hex, []
    if not entries:  # saved empty: one signed row says so (see the module docstring)
        text = json.dumps({"empty": True, "table": {"id": table_id, "row": 0, "rows": 1}}, sort_keys=True)
        return [("", 0, EMPTY, bytearray(), {}, text, row_digest("", 0, EMPTY, {}, text, b"", key_b))]
    for i, (group, n, model, metrics, record) in enumerate(entries):
        fmt, data = safe_encode(model, group)
        place = {"id": table_id, "row": i, "rows": len(entries)}
        text = json.dumps({**record, "table": place}, sort_keys=True)
        metrics = {str(k): float(v) for k, v in (metrics or {}).items()}
        digest = row_digest(str(group), int(n), fmt, metrics, text, data, key_b)
        rows.append((str(group), int(n), fmt, bytearray(data), metrics, text, digest))
    return rows


def read_table(
    df, key: Any = None, trusted_types: Sequence[str] = (), allow_pickle: bool = False
) -> List[Tuple[str, int, Any, dict, dict]]:
    """``(group, rows, model, metrics, record)`` of every row, checked and decoded, by group."""
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise UnsafeModelError(f"the members table has no {missing} columns; it has {df.columns}")
    rows = [r.asDict() for r in df.select(*COLUMNS).collect()]
    return decode_rows(rows, key, trusted_types, allow_pickle)


def decode_rows(
    rows: List[dict], key: Any = None, trusted_types: Sequence[str] = (), allow_pickle: bool = False
) -> List[Tuple[str, int, Any, dict, dict]]:
    """:func:`read_table` on rows already collected (dicts of :data:`COLUMNS`): every row's digest
    and the table's rows as a whole checked (see the module docstring), then each model decoded."""
    from ...formats.signing import key_bytes

    key_b = key_bytes(key)
    if not rows:
        raise UnsafeModelError(
            "the members table has no rows: a table saved with no models holds a row that says so, "
            "so its rows were deleted after it was written (or it is not a members table)"
        )
    checked = _checked_rows(rows, key_b)
    if len(checked) == 1 and checked[0][1].get("empty") is True and checked[0][0]["format"] == EMPTY:
        return []  # saved empty, and its signed row says so
    out = []
    for r, record in checked:
        if r["format"] == FAILED:  # a key whose fit failed keeps its row: no model, its reason
            record.pop("table", None)
            out.append((r["group"], int(r["rows"]), None, dict(r["metrics"] or {}), record))
            continue
        model = model_formats.decode(
            r["format"],
            bytes(r["model"]),
            trusted_types=trusted_types,
            allow_pickle=allow_pickle,
            what=f"group {r['group']!r}",
        )
        record.pop("table", None)
        out.append((r["group"], int(r["rows"]), model, dict(r["metrics"] or {}), record))
    return sorted(out, key=lambda e: (e[4].get("group", 0), e[0]))


def _record(r: dict) -> dict:
    try:
        record = json.loads(r["record"] or "{}")
    except ValueError:
        record = None
    if not isinstance(record, dict):
        raise UnsafeModelError(f"group {r['group']!r}: its record is not a JSON object")
    return record


def _checked_rows(rows: List[dict], key_b: Optional[bytes]) -> List[Tuple[dict, dict]]:
    """Each row with its parsed record, once every digest and the table's set of rows passed."""
    parsed = [(r, _record(r)) for r in rows]
    current = [isinstance(rec.get("table"), dict) for _, rec in parsed]
    if any(current) and not all(current):
        raise UnsafeModelError(
            "the members table mixes rows of this release's tables with rows of an older table; "
            "rows were added or replaced after it was written"
        )
    with_key = " (HMAC with the signing key)" if key_b else ""
    for r, rec in parsed:
        if not isinstance(r["rows"], int) or not isinstance(r["model"], (bytes, bytearray)):
            raise UnsafeModelError(f"the row of group {r['group']!r} has no row count or no model bytes")
        data, text = bytes(r["model"]), r["record"] or "{}"
        if rec.get("table") is not None:
            metrics = dict(r["metrics"] or {})
            good = row_digest(str(r["group"]), r["rows"], str(r["format"]), metrics, text, data, key_b)
        else:
            good = _legacy_digest(text, data, key_b)
        if not signing.same(r["sha256"], good):
            raise UnsafeModelError(
                f"the row of group {r['group']!r} does not match its sha256{with_key}: its group, rows, "
                "format, metrics, record or model changed after it was written"
            )
    if parsed and all(current):
        _check_table(parsed)
        _check_keys(parsed)
    elif parsed and key_b:
        log.warning(
            "this members table was written by an earlier release: its signature covers each model and "
            "record, not the group, metrics or the set of rows. Write it again with to_table() / "
            "members_table() to sign the whole table."
        )
    return parsed


def _check_table(parsed: List[Tuple[dict, dict]]) -> None:
    """Every row of one table, each once: no row dropped, duplicated or brought from another."""
    places = [rec["table"] for _, rec in parsed]
    ids = {p.get("id") for p in places}
    if len(ids) != 1:
        raise UnsafeModelError(
            f"the members table holds rows of {len(ids)} different tables; rows were mixed after writing"
        )
    want = places[0].get("rows")
    seen = [p.get("row") for p in places]
    if not isinstance(want, int) or any(p.get("rows") != want for p in places):
        raise UnsafeModelError("the members table's rows disagree on how many rows it has")
    dup = sorted({i for i in seen if seen.count(i) > 1}, key=str)
    if dup:
        groups = [r["group"] for (r, _), i in zip(parsed, seen) if i in dup]
        raise UnsafeModelError(f"the members table holds rows {dup} twice (groups {groups}): duplicated rows")
    lost = sorted(set(range(want)) - set(seen))
    if lost or len(seen) != want:
        raise UnsafeModelError(
            f"the members table was written with {want} rows and holds {len(seen)}: rows {lost} are missing"
        )


def _check_keys(parsed: List[Tuple[dict, dict]]) -> None:
    """Each row bound to its key: the key its record holds (or, a member's, its group) is the key
    its ``group`` column names; a key model's index is its place in the table; no key twice.  (A
    row whose model bytes alone were swapped for another's, its digest recomputed, stays possible
    without a signing ``key``: the digests then guard against mistakes, a signature against a
    forger.)"""
    seen: dict = {}
    for r, rec in parsed:
        kind = rec.get("kind")
        if kind is None or rec.get("empty"):
            continue
        named = rec["key"] if kind == "key_model" and "key" in rec else rec.get("group")
        if kind == "key_model" and "key" not in rec:
            named = r["group"]  # a key JSON cannot hold: its text is the key
        if str(named) != str(r["group"]):
            raise UnsafeModelError(
                f"the row of group {r['group']!r} holds the model recorded for key {named!r}: a row's "
                "key and its model were mixed after the table was written"
            )
        if kind == "key_model" and rec.get("group") != rec["table"].get("row"):
            raise UnsafeModelError(
                f"the row of group {r['group']!r} says it is key number {rec.get('group')!r} but lies "
                f"at place {rec['table'].get('row')!r}: rows were moved after the table was written"
            )
        if (kind, str(named)) in seen:
            raise UnsafeModelError(
                f"the members table holds key {named!r} twice: rows were duplicated or mixed"
            )
        seen[(kind, str(named))] = True


class TableMembers:
    """``members_table()`` and ``from_table()`` for a fitted model holding members (a bagging or
    grouped model): the model-level state (feature count, label values, ...) rides in every row's
    record, so any row rebuilds the model around the members."""

    def _table_state(self) -> dict:  # pragma: no cover - each model says what it needs
        raise NotImplementedError

    @classmethod
    def _from_members(cls, members: list, state: dict):  # pragma: no cover
        raise NotImplementedError

    def members_table(self, spark=None, *, key: Any = None):
        """The members as a Spark DataFrame (see :mod:`.members_table`)."""
        from pyspark.sql import SparkSession

        from ..member_records import KeyModel, to_record

        spark = spark or SparkSession.getActiveSession()
        if spark is None:
            raise ConfigurationError("members_table(spark): no active SparkSession; pass one")
        state, entries = self._table_state(), []
        for m in self._members:
            record, model = to_record(m)
            name, rows = (m.key, m.rows) if isinstance(m, KeyModel) else (m.group, m.n_rows)
            entries.append((name, rows, model, {}, {**record, "model": state}))
        return to_table(spark, entries, key)

    @classmethod
    def from_table(
        cls, df, *, key: Any = None, trusted_types: Sequence[str] = (), allow_pickle: bool = False, **params
    ):
        """The model whose members a :meth:`members_table` holds (rows checked and decoded as the
        model store's files are); ``params`` set its Params (``featuresCols=``, ``groupCol=`` ...)."""
        from ..member_records import from_record

        rows = read_table(df, key, trusted_types, allow_pickle)
        if not rows:
            raise ConfigurationError("the members table has no rows: there is no model to rebuild")
        members = [from_record(record, model) for _, _, model, _, record in rows]
        model = cls._from_members(members, rows[0][4].get("model") or {})
        model._set(**params)
        return model
