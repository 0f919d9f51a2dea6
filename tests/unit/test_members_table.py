"""The members table's digests cover every column and the set of rows (no Spark: rows as dicts)."""

import json
import logging

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from sparkml_dist.ensemble.stored import members_table
from sparkml_dist.formats.checks import UnsafeModelError

KEY = "k" * 32


def _models():
    rng = np.random.default_rng(0)
    out = []
    for g, shift in (("a", 0.0), ("b", 3.0), ("c", -3.0)):
        X = rng.normal(shift, 1.0, size=(60, 2))
        model = LogisticRegression().fit(X, (X[:, 0] > shift).astype(int))
        out.append((g, 60, model, {"acc": 0.5 + shift / 10}, {}))
    return out


def _rows(key=KEY):
    return [dict(zip(members_table.COLUMNS, r)) for r in members_table.table_rows(_models(), key)]


def test_a_table_round_trips_with_its_key():
    back = members_table.decode_rows(_rows(), KEY)
    assert [g for g, *_ in back] == ["a", "b", "c"]
    assert back[1][3] == {"acc": 0.8} and "table" not in back[1][4]


@pytest.mark.parametrize(
    "tamper, message",
    [
        (lambda rows: rows[0].update(group="b") or rows[1].update(group="a"), "does not match its sha256"),
        (lambda rows: rows[2].update(metrics={"acc": 0.99}), "does not match its sha256"),
        (lambda rows: rows[1].update(rows=6000), "does not match its sha256"),
        (lambda rows: rows.pop(1), r"written with 3 rows and holds 2: rows \[1\] are missing"),
        (lambda rows: rows.append(dict(rows[0])), r"holds rows \[0\] twice"),
    ],
    ids=["groups swapped", "metrics rewritten", "rows rewritten", "a row dropped", "a row duplicated"],
)
def test_a_signed_table_refuses_every_change_made_without_the_key(tamper, message):
    rows = _rows()
    tamper(rows)
    with pytest.raises(UnsafeModelError, match=message):
        members_table.decode_rows(rows, KEY)


def test_rows_of_two_signed_tables_do_not_mix():
    first, second = _rows(), _rows()
    with pytest.raises(UnsafeModelError, match="2 different tables"):
        members_table.decode_rows(first[:2] + second[2:], KEY)


def test_an_unsigned_forger_who_recomputes_the_digest_still_meets_the_format_checks():
    rows = _rows(key=None)
    r = rows[0]
    r["format"], r["model"] = "pickle", b"\x80\x04junk"
    r["sha256"] = members_table.row_digest(
        r["group"], r["rows"], "pickle", r["metrics"], r["record"], r["model"], None
    )
    with pytest.raises(Exception, match="pickle"):
        members_table.decode_rows(rows, None)


def test_a_table_of_an_earlier_release_still_loads_and_a_signed_one_warns(caplog):
    rows = _rows()
    for r in rows:  # as sparkml_dist wrote tables before the table id: record + model digested
        record = json.loads(r["record"])
        record.pop("table")
        r["record"] = json.dumps(record, sort_keys=True)
        r["sha256"] = members_table._legacy_digest(r["record"], bytes(r["model"]), KEY.encode())
    with caplog.at_level(logging.WARNING):
        back = members_table.decode_rows(rows, KEY)
    assert [g for g, *_ in back] == ["a", "b", "c"] and "earlier release" in caplog.text
    mixed = rows[:2] + _rows()[2:]
    with pytest.raises(UnsafeModelError, match="mixes rows"):
        members_table.decode_rows(mixed, KEY)


def test_a_table_with_every_row_deleted_is_refused_and_one_saved_empty_loads_empty():
    with pytest.raises(UnsafeModelError, match="has no rows: a table saved with no models holds a row"):
        members_table.decode_rows([], KEY)  # every row of a signed table deleted
    empty = [dict(zip(members_table.COLUMNS, r)) for r in members_table.table_rows([], KEY)]
    assert len(empty) == 1 and empty[0]["format"] == members_table.EMPTY  # the row that says so
    assert members_table.decode_rows(empty, KEY) == []
    forged = dict(empty[0], record=json.dumps({"empty": True, "table": {"id": "x", "row": 0, "rows": 1}}))
    with pytest.raises(UnsafeModelError, match="does not match its sha256"):
        members_table.decode_rows([forged], KEY)  # a stranger cannot write "empty" without the key
    with pytest.raises(UnsafeModelError, match="2 different tables"):
        members_table.decode_rows(empty + _rows()[:1], KEY)  # nor add rows to an empty table


def _key_rows():
    """A grouped model's table: one key model per key 0, 1, 2, unsigned (no key set)."""
    entries = []
    for i, (_, n, model, metrics, _) in enumerate(_models()):
        record = {"kind": "key_model", "group": i, "rows": n, "key": i}
        entries.append((i, n, model, metrics, record))
    return [dict(zip(members_table.COLUMNS, r)) for r in members_table.table_rows(entries, None)]


def _redigest(r):
    r["sha256"] = members_table.row_digest(
        r["group"], r["rows"], r["format"], r["metrics"], r["record"], bytes(r["model"]), None
    )


def test_a_row_that_carries_another_keys_model_is_refused_though_its_digest_was_recomputed():
    """Key 0's row given key 1's model and record (its place kept): before, key 0 was scored by key
    1's model; now the key its record holds must be the key its row names."""
    rows = _key_rows()
    forged = json.loads(rows[1]["record"])
    forged["table"]["row"] = 0
    rows[0].update(model=rows[1]["model"], record=json.dumps(forged, sort_keys=True))
    _redigest(rows[0])
    with pytest.raises(UnsafeModelError, match="row of group '0' holds the model recorded for key 1"):
        members_table.decode_rows(rows, None)
    rows[0]["group"] = "1"  # renamed too: key 1 twice, key 0 gone
    _redigest(rows[0])
    with pytest.raises(
        UnsafeModelError, match="says it is key number 1 but lies at place 0|holds key 1 twice"
    ):
        members_table.decode_rows(rows, None)
    forged["group"] = 0
    rows[0]["record"] = json.dumps(forged, sort_keys=True)
    _redigest(rows[0])
    with pytest.raises(UnsafeModelError, match="holds key 1 twice"):
        members_table.decode_rows(rows, None)
    assert [g for g, *_ in members_table.decode_rows(_key_rows(), None)] == ["0", "1", "2"]
