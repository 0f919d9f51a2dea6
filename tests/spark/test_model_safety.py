"""Saved models load without running code, through every load entry point."""

import glob
import json
import os

import numpy as np
import pytest
from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.feature import VectorAssembler
from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor
from sklearn.tree import DecisionTreeClassifier

from sparkml_dist import serialization
from sparkml_dist.ensemble import (
    BaggingClassificationModel,
    BaggingClassifier,
    BaggingRegressionModel,
    BaggingRegressor,
    GroupedModel,
    GroupedTrainer,
)
from sparkml_dist.formats import UnsafeModelError
from sparkml_dist.formats import store as model_store
from tests.conftest import masters
from tests.support import hostile

COLS = ["a", "b", "c"]


@pytest.fixture(scope="module")
def data(spark):
    import pandas as pd

    rng = np.random.default_rng(3)
    X = rng.normal(size=(240, 3))
    pdf = pd.DataFrame(X, columns=COLS).assign(
        label=(X[:, 0] + X[:, 1] > 0).astype(float), y=X @ [1.0, -2.0, 0.5], store=np.repeat(["n", "s"], 120)
    )
    return X, spark.createDataFrame(pdf)


def _save(model, path):
    model.write().overwrite().save(path)
    return path


def test_every_saved_model_type_round_trips_with_identical_predictions(data, tmp_path):
    from xgboost import XGBClassifier

    X, df = data
    classifiers = {
        "xgboost": XGBClassifier(n_estimators=5, max_depth=3),
        "hist_gradient_boosting": HistGradientBoostingClassifier(max_iter=10),
    }
    for name, est in classifiers.items():
        model = BaggingClassifier(estimator=est, numModels=2, featuresCols=COLS, seed=1).fit(df)
        loaded = BaggingClassificationModel.load(_save(model, str(tmp_path / name)))
        assert np.array_equal(loaded.predict_proba(X), model.predict_proba(X)), name
    reg = BaggingRegressor(
        estimator=HistGradientBoostingRegressor(max_iter=10), numModels=2, featuresCols=COLS, labelCol="y"
    ).fit(df)
    loaded = BaggingRegressionModel.load(_save(reg, str(tmp_path / "reg")))
    assert np.array_equal(loaded.predict(X), reg.predict(X))
    grouped = GroupedTrainer(
        estimator=DecisionTreeClassifier(max_depth=3), groupCol="store", featuresCols=COLS, labelCol="label"
    ).fit(df)
    loaded = GroupedModel.load(_save(grouped, str(tmp_path / "grouped")))
    keys = df.select("store").toPandas().store
    assert np.array_equal(loaded.predict(X, keys), grouped.predict(X, keys))
    files = glob.glob(str(tmp_path / "*" / "data" / "objects" / "*"))
    assert files and not [f for f in files if f.endswith(".pkl")]  # no pickle anywhere


@pytest.fixture()
def saved(data, tmp_path):
    """A bagging model, a grouped model and a pipeline holding a bagging model, saved."""
    _, df = data
    bag = BaggingClassifier(estimator=DecisionTreeClassifier(max_depth=3), numModels=2, featuresCols=COLS)
    pipe = Pipeline(
        stages=[
            VectorAssembler(inputCols=COLS, outputCol="features"),
            BaggingClassifier(estimator=DecisionTreeClassifier(max_depth=3), numModels=2),
        ]
    )
    grouped = GroupedTrainer(
        estimator=DecisionTreeClassifier(max_depth=3), groupCol="store", featuresCols=COLS, labelCol="label"
    )
    return {
        "bagging": (_save(bag.fit(df), str(tmp_path / "bag")), BaggingClassificationModel.load),
        "grouped": (_save(grouped.fit(df), str(tmp_path / "grouped")), _every_model),
        "pipeline": (_save(pipe.fit(df), str(tmp_path / "pipe")), PipelineModel.load),
    }


def _every_model(path):
    """A grouped model loads its keys and reads each model when used: load it, then use them all."""
    model = GroupedModel.load(path)
    return [model.models[k] for k in model.keys]


def _store_dir(path):
    """The model store of a saved stage (inside a pipeline: its bagging stage)."""
    stages = sorted(glob.glob(os.path.join(path, "stages", "*")))
    return os.path.join(stages[-1] if stages else path, "data")


def test_hostile_members_are_refused_by_every_load_entry_point(saved, tmp_path):
    marker = str(tmp_path / "pwned")
    payloads = hostile.corpus(marker)
    for entry, (path, load) in saved.items():
        store_dir = _store_dir(path)
        original = open(os.path.join(store_dir, "manifest.json")).read()
        for name, (fmt, data) in payloads.items():
            if entry == "grouped":  # the first key's model, in its block
                hostile.plant_in_block(store_dir, fmt, data)
            else:
                hostile.plant(store_dir, 1, 1, fmt, data)  # member 1's model
            with pytest.raises(Exception) as info:
                load(path)
            assert "UnsafeModelError" in type(info.value).__name__ + str(info.value), (entry, name)
            assert not os.path.exists(marker), f"{entry}: {name} ran code"
            open(os.path.join(store_dir, "manifest.json"), "w").write(original)


@masters("local")
def test_metadata_naming_another_class_is_refused_without_importing_it(saved):
    path, _ = saved["bagging"]
    _edit_metadata(path, lambda m: m.update({"class": "sparkml_dist.runner.tasks.rank.run"}))
    with pytest.raises(UnsafeModelError, match="not a sparkml_dist stage"):
        BaggingClassificationModel.load(path)


def _edit_metadata(path, change):
    """Rewrite a saved stage's metadata with ``change(dict)`` (and drop Spark's .crc files, as an
    attacker editing the directory would)."""
    (meta_file,) = glob.glob(os.path.join(path, "metadata", "part-*"))
    metadata = json.loads(open(meta_file).read())
    change(metadata)
    open(meta_file, "w").write(json.dumps(metadata))
    for crc in glob.glob(os.path.join(path, "metadata", ".*.crc")):
        os.remove(crc)


def _flip_one_byte(store_dir):
    """Change one byte of the last object and fix its checksum, as an attacker without the key would."""
    last = json.loads(open(os.path.join(store_dir, "manifest.json")).read())["objects"][-1]
    data = bytearray(open(os.path.join(store_dir, last["file"]), "rb").read())
    data[len(data) // 2] ^= 1
    hostile.plant(store_dir, last["group"], last["item"], last["format"], bytes(data))


@masters("local")
def test_signed_model_refuses_a_changed_byte_and_unsigned_loads_without_a_key(data, tmp_path, monkeypatch):
    X, df = data
    model = BaggingClassifier(
        estimator=DecisionTreeClassifier(max_depth=3), numModels=2, featuresCols=COLS
    ).fit(df)
    signed, signed2 = str(tmp_path / "signed"), str(tmp_path / "signed2")
    model.write().signed_with("team key 0123456789").save(signed)
    model.write().signed_with("team key 0123456789").save(signed2)
    loaded = BaggingClassificationModel.read().signed_with("team key 0123456789").load(signed)
    assert np.array_equal(loaded.predict_proba(X), model.predict_proba(X))
    monkeypatch.setenv(model_store.KEY_ENV, "team key 0123456789")
    assert np.array_equal(BaggingClassificationModel.load(signed).predict_proba(X), model.predict_proba(X))
    _flip_one_byte(os.path.join(signed, "data"))
    with pytest.raises(UnsafeModelError, match="signature"):
        BaggingClassificationModel.load(signed)
    _edit_metadata(signed2, lambda m: m["defaultParamMap"].update(voting="hard"))  # params are covered too
    with pytest.raises(UnsafeModelError, match="metadata .* does not match"):
        BaggingClassificationModel.load(signed2)
    monkeypatch.delenv(model_store.KEY_ENV)
    unsigned = _save(model, str(tmp_path / "unsigned"))  # no key anywhere: not signed
    assert np.array_equal(BaggingClassificationModel.load(unsigned).predict_proba(X), model.predict_proba(X))
    monkeypatch.setenv(model_store.KEY_ENV, "team key 0123456789")
    with pytest.raises(UnsafeModelError, match="not signed"):
        BaggingClassificationModel.load(unsigned)


@masters("local")
def test_a_model_saved_by_the_previous_release_loads_only_through_allow_pickle(data, tmp_path):
    X, df = data
    model = BaggingClassifier(
        estimator=DecisionTreeClassifier(max_depth=3), numModels=2, featuresCols=COLS
    ).fit(df)
    path = _save(model, str(tmp_path / "old"))
    store_dir = os.path.join(path, "data")
    store = model_store.ModelStore(store_dir)  # rewrite the data as sparkml_dist 0.1 did: pickles
    metas = [store.write_bytes(-1, 0, serialization.dumps(model.getEstimator()))]
    metas += [
        store.write_bytes(m.group, 0, serialization.dumps(m)) for m in model._members
    ]  # internal members, as 0.1 kept them
    for meta in metas:
        meta.pop("format")
    manifest = store.commit(metas)
    manifest["format"] = model_store.ModelStore.FORMAT_V1
    open(os.path.join(store_dir, "manifest.json"), "w").write(json.dumps(manifest))
    with pytest.raises(UnsafeModelError, match=r"older release.*allow_pickle\(\)"):
        BaggingClassificationModel.load(path)
    old = BaggingClassificationModel.read().allow_pickle().load(path)
    assert np.array_equal(old.predict_proba(X), model.predict_proba(X))
    converted = _save(old, str(tmp_path / "converted"))  # saved again: safe formats, loads by default
    assert np.array_equal(BaggingClassificationModel.load(converted).predict_proba(X), model.predict_proba(X))


def _first_manifest(root):
    (manifest,) = glob.glob(os.path.join(root, "**", "data", "manifest.json"), recursive=True)
    return os.path.dirname(manifest)


def test_crafted_members_are_refused_by_every_load_entry_point(data, tmp_path):
    """each crafted case of tests/support/crafted.py planted as member 1's model is
    refused by load, lazy predict, executors' transform and both MLflow loaders, naming the fault."""
    mlflow = pytest.importorskip("mlflow")
    from sparkml_dist import mlflow_flavor
    from tests.support import crafted
    from tests.unit.test_crafted_models import REFUSALS

    X, df = data
    model = BaggingClassifier(estimator=DecisionTreeClassifier(max_depth=3), numModels=2, featuresCols=COLS)
    model = model.fit(df)
    path = _save(model, str(tmp_path / "bag"))
    flavor = str(tmp_path / "mlflow-model")
    mlflow_flavor.save_model(model, flavor)
    stores = [os.path.join(path, "data"), _first_manifest(flavor)]
    originals = {}
    for store_dir in stores:
        for name in glob.glob(os.path.join(store_dir, "**", "*.*"), recursive=True):
            originals[name] = open(name, "rb").read()
    transformed = 0
    for case, (fmt, payload) in crafted.all_cases().items():
        for store_dir in stores:
            hostile.plant(store_dir, 1, 1, fmt, payload)
        loads = {
            "load": lambda: BaggingClassificationModel.load(path),
            "lazy predict": lambda: BaggingClassificationModel.read().lazy().load(path).predict_proba(X),
            "mlflow.pyfunc": lambda: mlflow.pyfunc.load_model(flavor),
            "mlflow_flavor.load_model": lambda: mlflow_flavor.load_model(flavor),
        }
        if transformed < 2:  # executors decode lazily loaded members themselves: a Spark job each
            lazy = BaggingClassificationModel.read().lazy().load(path)
            loads["executors' transform"] = lambda lazy=lazy: lazy.transform(df).collect()
            transformed += 1
        for entry, load in loads.items():
            with pytest.raises(Exception) as info:
                load()
            assert REFUSALS[case] in str(info.value) and "refused" in str(info.value), (case, entry)
        for name, original in originals.items():
            open(name, "wb").write(original)
    assert np.array_equal(BaggingClassificationModel.load(path).predict_proba(X), model.predict_proba(X))


@masters("local")
def test_mlflow_model_directories_are_checked_like_stores(data, tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    import yaml

    from sparkml_dist import mlflow_flavor

    X, df = data
    model = BaggingClassifier(estimator=DecisionTreeClassifier(max_depth=3), numModels=2, featuresCols=COLS)
    model = model.fit(df)
    monkeypatch.setenv(model_store.KEY_ENV, "team key 0123456789")
    signed = str(tmp_path / "signed")
    mlflow_flavor.save_model(model, signed)
    assert os.path.exists(os.path.join(signed, "MLmodel.sig"))
    pdf = df.toPandas()[COLS]
    assert np.array_equal(mlflow.pyfunc.load_model(signed).predict(pdf), model.predict(X))
    mlmodel = os.path.join(signed, "MLmodel")
    conf = yaml.safe_load(open(mlmodel))
    conf["flavors"]["sparkml_dist"]["version"] = "9.9"  # any change to MLmodel breaks its signature
    open(mlmodel, "w").write(yaml.safe_dump(conf))
    for load in (mlflow.pyfunc.load_model, mlflow_flavor.load_model):
        with pytest.raises(UnsafeModelError, match="does not match its signature"):
            load(signed)
    monkeypatch.delenv(model_store.KEY_ENV)
    for stage in ("../../etc", "/etc", "stage/../../x", "sparkml/stages/../../../x"):
        conf["flavors"]["sparkml_dist"]["stage"] = stage
        open(mlmodel, "w").write(yaml.safe_dump(conf))
        with pytest.raises(UnsafeModelError, match="not a plain file name"):
            mlflow_flavor.load_model(signed)
