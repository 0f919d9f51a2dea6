"""Model files that run no code, signatures, paths that stay in their directory (no Spark)."""

import json
import os

import numpy as np
import pytest

from sparkml_dist import CollectionError, collection
from sparkml_dist import formats as model_formats
from sparkml_dist.formats import UnsafeModelError
from tests.support import hostile


@pytest.fixture(scope="module")
def xy():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 5))
    return X, (X[:, 0] + X[:, 1] > 0).astype(int)


def _models(X, y):
    from sklearn.ensemble import (
        GradientBoostingClassifier,
        HistGradientBoostingClassifier,
        RandomForestClassifier,
    )
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.tree import DecisionTreeClassifier
    from xgboost import XGBClassifier

    return [
        DecisionTreeClassifier(max_depth=5).fit(X, y),
        RandomForestClassifier(n_estimators=5, random_state=0).fit(X, y),
        GradientBoostingClassifier(n_estimators=5).fit(X, y),
        HistGradientBoostingClassifier(max_iter=10).fit(X, y),
        make_pipeline(StandardScaler(), LogisticRegression()).fit(X, y),
        XGBClassifier(n_estimators=5, max_depth=3).fit(X, y),
    ]


def test_every_model_type_round_trips_through_a_format_that_runs_no_code(xy):
    X, y = xy
    for model in _models(X, y):
        fmt, data = model_formats.encode(model)
        assert fmt in ("skops", "xgboost"), (type(model), fmt)
        back = model_formats.decode(fmt, data)
        assert type(back) is type(model)
        assert np.array_equal(back.predict_proba(X), model.predict_proba(X)), type(model).__name__


def test_plain_values_and_tensors_keep_their_types():
    import datetime
    import decimal

    import torch

    value = {"a": [1, 2.5, None, True], "d": datetime.date(2024, 1, 2), "p": decimal.Decimal("1.10")}
    assert model_formats.encode(value)[0] == "json"
    assert model_formats.decode(*model_formats.encode(value)) == value
    for not_plain in ((1, 2), np.arange(3), {1: "int key"}):
        fmt, data = model_formats.encode(not_plain)
        assert fmt == "skops" and type(model_formats.decode(fmt, data)) is type(not_plain)
    state = {"w": torch.randn(3, 4), "b": torch.arange(4)}
    fmt, data = model_formats.encode(state)
    back = model_formats.decode(fmt, data)
    assert fmt == "safetensors" and all(torch.equal(back[k], state[k]) for k in state)


def test_hostile_corpus_is_refused_by_the_store_and_runs_nothing(tmp_path):
    marker = str(tmp_path / "pwned")
    for name, (fmt, data) in hostile.corpus(marker).items():
        store_dir = str(tmp_path / f"store-{abs(hash(name))}")
        store = collection.ModelStore(store_dir)
        store.commit([store.write(0, 0, {"placeholder": 1})])
        hostile.plant(store_dir, 0, 0, fmt, data)
        for load in (store.load, store.load_all):
            with pytest.raises(UnsafeModelError) as info:
                load(0) if load == store.load else load()
            text = str(info.value)
            assert ("allow_pickle=True" in text) if fmt in ("pickle", None) else ("trusted_types" in text), (
                name
            )
        assert not os.path.exists(marker), f"{name} ran code"


def test_untrusted_types_name_the_opt_in_and_load_once_trusted(tmp_path, monkeypatch):
    from tests.support.helpers import FailingClassifier

    store = collection.ModelStore(str(tmp_path / "s"))
    store.commit([store.write(0, 0, FailingClassifier())])
    with pytest.raises(UnsafeModelError, match=r"tests\.support\.helpers\.FailingClassifier.*trusted_types"):
        store.load(0)
    assert isinstance(
        store.load(0, trusted_types=["tests.support.helpers.FailingClassifier"]), FailingClassifier
    )
    monkeypatch.setenv("SPARKML_DIST_TRUSTED_TYPES", "tests.support.helpers.FailingClassifier")
    assert isinstance(store.load(0), FailingClassifier)


def test_pickles_are_written_and_read_only_when_asked_for(tmp_path):
    store = collection.ModelStore(str(tmp_path / "s"))
    with pytest.raises(CollectionError, match="cannot be saved in a format whose loading runs no code"):
        store.write(0, 0, lambda x: x)
    meta = store.write(0, 0, lambda x: x + 1, allow_pickle=True)
    store.commit([meta])
    assert meta["format"] == "pickle"
    with pytest.raises(UnsafeModelError, match="allow_pickle=True"):
        store.load(0)
    assert store.load(0, allow_pickle=True)(1) == 2


def _signed_store(tmp_path, key="k1-0123456789abcdef"):
    store = collection.ModelStore(str(tmp_path / "signed"), key=key)
    store.commit([store.write(g, 0, {"g": g}) for g in range(2)])
    return str(tmp_path / "signed")


def test_signed_store_refuses_any_change_and_an_unsigned_one_needs_no_key(tmp_path, monkeypatch):
    path = _signed_store(tmp_path)
    loaded = collection.ModelStore(path, key="k1-0123456789abcdef").load_all()
    assert loaded == {(0, 0): {"g": 0}, (1, 0): {"g": 1}}
    with pytest.raises(UnsafeModelError, match="signature .* does not match"):
        collection.ModelStore(path, key="another key, 16 bytes+").load(0)
    hostile.plant(path, 1, 0, "json", b'{"g": "tampered"}')  # the file and its checksum, consistently
    with pytest.raises(UnsafeModelError, match="signature .* does not match"):
        collection.ModelStore(path, key="k1-0123456789abcdef").load(0)
    monkeypatch.setenv("SPARKML_DIST_MODEL_KEY", "k1-0123456789abcdef")  # the key from the environment
    with pytest.raises(UnsafeModelError, match="signature"):
        collection.ModelStore(path).load(0)
    unsigned = collection.ModelStore(str(tmp_path / "plain"), key=None)
    monkeypatch.delenv("SPARKML_DIST_MODEL_KEY")
    unsigned.commit([unsigned.write(0, 0, [1, 2])])
    assert collection.ModelStore(str(tmp_path / "plain")).load(0) == [1, 2]
    with pytest.raises(UnsafeModelError, match="is not signed, and a signing key is set"):
        collection.ModelStore(str(tmp_path / "plain"), key="k1-0123456789abcdef").load(0)


def test_one_changed_byte_of_a_signed_manifest_is_refused(tmp_path):
    path = _signed_store(tmp_path)
    manifest = os.path.join(path, "manifest.json")
    text = open(manifest).read()
    open(manifest, "w").write(text.replace('"group": 1', '"group": 7', 1))
    with pytest.raises(UnsafeModelError, match="signature"):
        collection.ModelStore(path, key="k1-0123456789abcdef").load_all()


@pytest.mark.parametrize(
    "name", ["../../etc/passwd", "/etc/passwd", "objects/../../x", "objects/a/../../b", ""]
)
def test_manifest_names_cannot_leave_the_directory(tmp_path, name):
    store = collection.ModelStore(str(tmp_path / "s"))
    store.commit([store.write(0, 0, 1)])
    path = tmp_path / "s" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["objects"][0]["file"] = name
    path.write_text(json.dumps(manifest))
    with pytest.raises(UnsafeModelError, match="not a plain file name"):
        store.load(0)


def test_checkpoint_latest_record_cannot_leave_the_directory(tmp_path):
    import torch

    from sparkml_dist.runner import checkpoint

    checkpoint.save({"w": torch.ones(2)}, 1, directory=str(tmp_path))
    assert torch.equal(checkpoint.load(str(tmp_path))["w"], torch.ones(2))
    record = json.loads((tmp_path / "LATEST").read_text())
    (tmp_path.parent / "outside.pt").write_bytes((tmp_path / record["file"]).read_bytes())
    record["file"] = "../outside.pt"
    (tmp_path / "LATEST").write_text(json.dumps(record))
    with pytest.raises(UnsafeModelError, match="not a plain file name"):
        checkpoint.load(str(tmp_path))


KEY = "a team key of 24 bytes!!"


def test_short_keys_are_refused_naming_the_setting(tmp_path, monkeypatch):
    from sparkml_dist import ConfigurationError

    with pytest.raises(ConfigurationError, match=r"key=\) is 5 bytes long; use at least 16"):
        collection.ModelStore(str(tmp_path / "s"), key="short")
    monkeypatch.setenv("SPARKML_DIST_MODEL_KEY", "tiny")
    store = collection.ModelStore(str(tmp_path / "s"))
    with pytest.raises(ConfigurationError, match="SPARKML_DIST_MODEL_KEY"):
        store.commit([store.write(0, 0, 1)])
    monkeypatch.setenv("SPARKML_DIST_MODEL_KEY", "")  # set but empty: not a silent "no signing"
    store = collection.ModelStore(str(tmp_path / "e"))
    with pytest.raises(ConfigurationError, match="SPARKML_DIST_MODEL_KEY is set but empty"):
        store.commit([store.write(0, 0, 1)])


def test_the_signature_lives_in_the_manifest_and_interleaved_commits_leave_a_loadable_store(tmp_path):
    """Two writers commit one store alternately (and a third reads in between): every state a reader
    can see verifies, because the manifest and its MAC are one file swapped in by one rename."""
    import threading

    path = str(tmp_path / "shared")
    writers = [collection.ModelStore(path, key=KEY) for _ in range(2)]
    errors, stop = [], threading.Event()

    def commit(w, tag):
        for i in range(30):
            w.commit([w.write(0, 0, {"by": tag, "i": i})])

    def read():
        while not stop.is_set():
            try:
                value = collection.ModelStore(path, key=KEY).load(0)
                assert value["by"] in ("a", "b")
            except CollectionError as exc:  # "no manifest" only before the first commit
                if "no manifest.json" not in str(exc):
                    errors.append(exc)

    threads = [threading.Thread(target=commit, args=(w, t)) for w, t in zip(writers, "ab")]
    reader = threading.Thread(target=read)
    reader.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    reader.join()
    assert not errors, errors[:3]
    assert not os.path.exists(os.path.join(path, "manifest.sig"))
    assert "signature" in json.loads(open(os.path.join(path, "manifest.json")).read())
    assert collection.ModelStore(path, key=KEY).load(0)["i"] == 29


def test_a_reader_racing_a_recommit_gets_the_old_or_the_new_model(tmp_path):
    path = str(tmp_path / "s")
    writer = collection.ModelStore(path, key=KEY)
    writer.commit([writer.write(0, 0, {"v": "old"})])
    reader = collection.ModelStore(path, key=KEY)
    stale = reader.manifest()  # the reader has the old manifest...
    writer.commit([writer.write(0, 0, {"v": "new"})])  # ...the writer replaces it and its files
    with pytest.raises(CollectionError):
        reader.read_bytes(stale["objects"][0])  # the old file is gone
    assert reader.load(0) == {"v": "new"}  # a load re-reads the manifest instead of failing


@pytest.mark.parametrize("kind", ["fifo", "dev_zero_link", "symlink", "longer"])
def test_objects_that_are_not_plain_files_of_their_size_are_refused_at_once(tmp_path, kind):
    import time

    path = str(tmp_path / "s")
    store = collection.ModelStore(path)
    store.commit([store.write(0, 0, {"x": 1})])
    meta = store.manifest()["objects"][0]
    target = os.path.join(path, meta["file"])
    os.remove(target)
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "dev_zero_link":
        os.symlink("/dev/zero", target)
    elif kind == "symlink":
        (tmp_path / "elsewhere.json").write_text('{"x": 1}')
        os.symlink(str(tmp_path / "elsewhere.json"), target)
    else:
        open(target, "wb").write(b"0" * (50 << 20))
    start = time.monotonic()
    with pytest.raises(UnsafeModelError, match="not a regular file|symbolic link|longer than"):
        collection.ModelStore(path).load(0)
    assert time.monotonic() - start < 5
