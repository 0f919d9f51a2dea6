"""Models as rows of a Spark table, and back, through the safe formats.  [driver]

Hivemall's pattern: the members of an ensemble (or the models of many groups) as a table that SQL
can store, join, filter and vote over.  One row per model::

    group    string               the group number or key, as text
    rows     long                 rows the model was trained on
    format   string               skops | xgboost | json | safetensors (never a pickle unless allowed)
    model    binary               the model's bytes in that format
    metrics  map<string,double>   what its training reported (train_per_group's metrics)
    record   string               JSON: what else rebuilding needs (a member's feature indices, ...)
    sha256   string               SHA-256 of record + model (an HMAC with a signing key)

Reading a table back checks every row's digest and decodes the bytes with
:func:`sparkml_dist.model_formats.decode` (skops' trusted types, the tree and booster checks), so
a forged row is refused as a forged model file is.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any, Iterable, List, Optional, Sequence, Tuple

from .. import model_formats
from ..errors import ConfigurationError
from ..model_checks import UnsafeModelError

SCHEMA = (
    "group string, rows long, format string, model binary, metrics map<string,double>, record string, "
    "sha256 string"
)
COLUMNS = ["group", "rows", "format", "model", "metrics", "record", "sha256"]


def _digest(record: str, data: bytes, key: Optional[bytes]) -> str:
    body = record.encode() + b"\0" + data
    return hmac.new(key, body, hashlib.sha256).hexdigest() if key else hashlib.sha256(body).hexdigest()


def to_table(spark, entries: Iterable[Tuple[Any, int, Any, dict, dict]], key: Any = None):
    """A DataFrame of ``(group, rows, model, metrics, record)`` entries (see the module docstring)."""
    from ..model_store import key_bytes

    signing = key_bytes(key)
    rows = []
    for group, n, model, metrics, record in entries:
        try:
            fmt, data = model_formats.encode(model)
        except Exception as exc:  # noqa: BLE001 - whatever the format's writer raises
            raise ConfigurationError(
                f"the model of group {group!r} ({type(model).__name__}) cannot be stored in a safe format "
                f"(skops, XGBoost's own, JSON): {type(exc).__name__}: {exc}. Return a scikit-learn-API "
                "model, an XGBoost model, or plain values from the training function"
            ) from exc
        text = json.dumps(record, sort_keys=True)
        metrics = {str(k): float(v) for k, v in (metrics or {}).items()}
        rows.append((str(group), int(n), fmt, bytearray(data), metrics, text, _digest(text, data, signing)))
    return spark.createDataFrame(rows, SCHEMA)


def read_table(
    df, key: Any = None, trusted_types: Sequence[str] = (), allow_pickle: bool = False
) -> List[Tuple[str, int, Any, dict, dict]]:
    """``(group, rows, model, metrics, record)`` of every row, checked and decoded, by group."""
    from ..model_store import key_bytes

    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise UnsafeModelError(f"the members table has no {missing} columns; it has {df.columns}")
    signing = key_bytes(key)
    out = []
    for r in df.select(*COLUMNS).collect():
        data, text = bytes(r["model"]), r["record"] or "{}"
        if _digest(text, data, signing) != r["sha256"]:
            raise UnsafeModelError(
                f"the model of group {r['group']!r} does not match its sha256 column"
                f"{' (HMAC with the signing key)' if signing else ''}: changed after it was written"
            )
        model = model_formats.decode(
            r["format"],
            data,
            trusted_types=trusted_types,
            allow_pickle=allow_pickle,
            what=f"group {r['group']!r}",
        )
        record = json.loads(text)
        if not isinstance(record, dict):
            raise UnsafeModelError(f"group {r['group']!r}: its record is not a JSON object")
        out.append((r["group"], int(r["rows"]), model, dict(r["metrics"] or {}), record))
    return sorted(out, key=lambda e: (e[4].get("group", 0), e[0]))


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
        """The members as a Spark DataFrame (see :mod:`sparkml_dist.ensemble.members_table`)."""
        from pyspark.sql import SparkSession

        from .member_records import KeyModel, to_record

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
        from .member_records import from_record

        rows = read_table(df, key, trusted_types, allow_pickle)
        if not rows:
            raise ConfigurationError("the members table has no rows: there is no model to rebuild")
        members = [from_record(record, model) for _, _, model, _, record in rows]
        model = cls._from_members(members, rows[0][4].get("model") or {})
        model._set(**params)
        return model
