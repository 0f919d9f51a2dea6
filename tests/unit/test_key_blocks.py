"""Many keys' models in blocks (sparkml_dist.ensemble.stored.key_blocks) and the references a grouped
model holds (key_models.KeyModels): blocks of consecutive keys closing at their size, every row's
digest, fit and place checked, one block read per key looked up, the keys' index and the blocks
saved to a real model store and read back lazily."""

import json
import pickle
import uuid

import numpy as np
import pyarrow as pa
import pytest
from sklearn.linear_model import LinearRegression

from sparkml_dist import formats as model_formats
from sparkml_dist.ensemble.stored import key_blocks
from sparkml_dist.ensemble.stored.key_blocks import BlockWriter, decode_row, read_block
from sparkml_dist.ensemble.stored.key_models import KeyModels
from sparkml_dist.formats import UnsafeModelError
from sparkml_dist.formats.store import ModelStore


def _models(n, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(5, 2))
    return [LinearRegression().fit(X, X @ [i, 1.0] + i) for i in range(n)]


def _blocks(models, fit_id, failed=()):
    writer, blocks = BlockWriter(fit_id, len(models), {"label_is_string": False}), []
    for i, m in enumerate(models):
        error = "ValueError: boom" if i in failed else None
        encoded = None if error else model_formats.encode(m)
        blocks += [b for b in [writer.add(i, f"k{i}", 5, encoded, {"r2": 1.0}, error)] if b]
    return blocks + [b for b in [writer.close()] if b]


def test_blocks_hold_consecutive_keys_and_close_at_their_size(monkeypatch):
    monkeypatch.setattr(key_blocks, "BLOCK_KEYS", 4)
    blocks = _blocks(_models(10), "f1")
    assert [(b.lo, b.hi) for b in blocks] == [(0, 4), (4, 8), (8, 10)]
    monkeypatch.setattr(key_blocks, "BLOCK_KEYS", 1000)
    monkeypatch.setattr(key_blocks, "BLOCK_BYTES", 1000)  # ~400 bytes a linear model
    assert [(b.lo, b.hi) for b in _blocks(_models(10), "f1")] == [(0, 3), (3, 6), (6, 9), (9, 10)]
    writer = BlockWriter("f1", 10)
    fmt_data = model_formats.encode(_models(1)[0])
    assert writer.add(0, "a", 5, fmt_data) is None and writer.add(1, "b", 5, fmt_data) is None
    gap = writer.add(5, "f", 5, fmt_data)  # a key that does not follow starts a new block
    assert (gap.lo, gap.hi) == (0, 2) and (writer.close().lo, 6) == (5, 6)


def test_every_row_is_checked_before_its_model_is_decoded():
    models = _models(3)
    [block] = _blocks(models, "f1", failed={1})
    table = read_block(block.data)
    model, rows, metrics, error = decode_row(table, 0, 0, "f1", 3)
    assert np.array_equal(model.coef_, models[0].coef_) and (rows, metrics, error) == (5, {"r2": 1.0}, None)
    assert decode_row(table, 1, 1, "f1", 3)[0] is None and "boom" in decode_row(table, 1, 1, "f1", 3)[3]
    assert block.failed == {1: "ValueError: boom"}
    for args, expected in (
        ((0, 0, "another fit", 3), "belongs to another fit or place"),
        ((0, 2, "f1", 3), "belongs to another fit or place"),  # row 0 read as key 2: moved
        ((0, 0, "f1", 4), "belongs to another fit or place"),
    ):
        with pytest.raises(UnsafeModelError, match=expected):
            decode_row(table, *args)
    tampered = table.set_column(3, "model", pa.array([b"x" + table.column("model")[0].as_py()] * 3))
    with pytest.raises(UnsafeModelError, match="does not match its sha256"):
        decode_row(tampered, 0, 0, "f1", 3)
    record = json.loads(table.column("record")[0].as_py())
    assert record["key"] == "k0" and record["model"] == {"label_is_string": False}


def test_a_key_lookup_reads_its_block_once_and_ships_without_models(monkeypatch):
    monkeypatch.setattr(key_blocks, "BLOCK_KEYS", 4)
    models = _models(10)
    fit_id = uuid.uuid4().hex
    blocks = _blocks(models, fit_id)
    held = KeyModels(pa.array([f"k{i}" for i in range(10)]), np.full(10, 5), blocks, fit_id)
    reads = []
    real = key_blocks.read_block
    monkeypatch.setattr(
        "sparkml_dist.ensemble.stored.key_models.read_block", lambda d, w="": reads.append(w) or real(d)
    )
    assert np.array_equal(held.model(held.position("k5")).coef_, models[5].coef_)
    assert np.array_equal(held.model(6).coef_, models[6].coef_) and len(reads) == 1  # same block
    assert held.model(0) is not None and len(reads) == 2
    with pytest.raises(KeyError):
        held.position("nope")
    assert held.indices(pa.array(["k9", "zz", "k0"])).tolist() == [9, -1, 0]
    shipped = pickle.loads(pickle.dumps(held.without_keys()))
    assert shipped.keys is None and np.array_equal(shipped.model(9).coef_, models[9].coef_)


def test_saved_blocks_load_lazily_reading_the_index_then_one_block(tmp_path, monkeypatch):
    """10,000 keys saved to a real model store: loading reads the keys' index, a key's model
    reads one block (256 KiB of models, about 700), not the store."""
    n = 10_000
    models = _models(1) * n  # the same small model under every key: the encoding is what is measured
    fit_id = uuid.uuid4().hex
    held = KeyModels(
        pa.array([f"k{i:05d}" for i in range(n)]), np.full(n, 5), _blocks(models, fit_id), fit_id
    )
    store = ModelStore(str(tmp_path / "saved"))
    store.commit(held.save(store))
    total = sum(f.stat().st_size for f in (tmp_path / "saved" / "objects").iterdir())
    read = []
    real = ModelStore.read_bytes
    monkeypatch.setattr(
        ModelStore, "read_bytes", lambda self, meta: read.append(meta["size"]) or real(self, meta)
    )
    opened = ModelStore(str(tmp_path / "saved"))
    back = KeyModels.load(opened, opened.manifest()["objects"])
    index = sum(read)
    assert len(read) == 1 and index < total / 5  # the keys' index only
    assert np.array_equal(back.model(back.position("k04321")).coef_, models[0].coef_)
    blocks = len(back.blocks)
    assert blocks >= 10 and len(read) == 2 and read[1] < 1.5 * total / blocks  # one block of them
    assert back.python_keys([0, n - 1]) == ["k00000", f"k{n - 1:05d}"]
