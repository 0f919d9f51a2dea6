"""Crafted model files that load inert but would corrupt memory at predict time are refused before
use: each listed case, through the store, and a fuzzer in child processes."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from sparkml_dist import formats as model_formats
from sparkml_dist.formats.checks import UnsafeModelError
from sparkml_dist.formats.store import ModelStore
from tests.support import crafted, hostile

pytestmark = pytest.mark.slow  # starts rank processes or waits on timeouts: not in make test-fast

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

REFUSALS = {  # what each refusal must say
    "tree child out of range": "children out of range",
    "tree cycle back to the root": "children out of range (or before their parent: a cycle)",
    "tree deeper than max_depth": "deep but says max_depth=1",
    "tree estimator without n_features_in_": "no valid n_features_in_",
    "empty tree": "has no nodes",
    "tree feature past n_features_in_": "features outside [0, 5)",
    "gradient boosting estimators_ wider than n_trees_per_iteration_": "estimators_ of shape (3, 2)",
    "hist gradient boosting negative feature_idx": "features outside [0, 5)",
    "hist gradient boosting empty predictor": "has no nodes",
    "hist gradient boosting categorical split on a numeric feature": "does not call categorical",
    "svc support_ longer than its support vectors": "(115, 5) support vectors for 345 support_ indices",
    "svc _dual_coef_ too small": "_dual_coef_ of shape (1, 2), not (1, 115)",
    "svc _n_support past its support vectors": "does not split 115 support vectors among 2 classes",
    "xgboost split index out of range": "splits on features outside [0, 5)",
    "xgboost child out of range": "children out of range",
    "xgboost cycle": "children out of range",
    "xgboost tree_info past the outputs": "tree_info does not give each tree an output group below 1",
}


@pytest.fixture(scope="module")
def cases():
    out = crafted.all_cases()
    assert set(out) == set(REFUSALS)
    return out


def test_each_crafted_case_is_refused_through_the_store_naming_the_member_and_the_fault(cases, tmp_path):
    for case, (fmt, data) in cases.items():
        path = str(tmp_path / f"s{abs(hash(case))}")
        store = ModelStore(path)
        store.commit([store.write(3, 1, {"placeholder": 1})])
        hostile.plant(path, 3, 1, fmt, data)
        for load in (ModelStore(path).load, ModelStore(path).load_all):
            with pytest.raises(UnsafeModelError) as info:
                load(3, 1) if load.__name__ == "load" else load()
            text = str(info.value)
            assert REFUSALS[case] in text and "g00003-i1" in text, (case, text)


def test_genuine_models_still_load_and_predict_identically():
    from sklearn.ensemble import (
        ExtraTreesRegressor,
        GradientBoostingClassifier,
        GradientBoostingRegressor,
        HistGradientBoostingClassifier,
        IsolationForest,
        RandomForestClassifier,
    )
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import PolynomialFeatures
    from sklearn.tree import DecisionTreeClassifier, DecisionTreeRegressor

    X, y = crafted.data(400, 5)
    y3 = (X[:, 0] > 0).astype(int) + (X[:, 1] > 0.5)
    models = [
        DecisionTreeClassifier(max_leaf_nodes=9).fit(X, y),
        DecisionTreeRegressor(max_depth=6).fit(X, X[:, 0]),
        RandomForestClassifier(5, max_features=2, random_state=0).fit(X, y3),
        ExtraTreesRegressor(4, random_state=0).fit(X, X[:, :2]),
        GradientBoostingClassifier(n_estimators=4).fit(X, y3),
        GradientBoostingRegressor(n_estimators=4, init="zero").fit(X, X[:, 1]),
        HistGradientBoostingClassifier(max_iter=5).fit(X, y3),
        IsolationForest(n_estimators=5, max_features=3, random_state=0).fit(X),
        make_pipeline(PolynomialFeatures(2), DecisionTreeClassifier(max_depth=4)).fit(X, y),
        crafted.xgboost_model(),
    ]
    for model in models:
        back = model_formats.decode(*model_formats.encode(model))
        method = "predict_proba" if hasattr(model, "predict_proba") else "predict"
        assert np.array_equal(getattr(back, method)(X), getattr(model, method)(X)), type(model).__name__


def test_xgboost_structures_that_cannot_be_validated_need_a_signed_store(tmp_path):
    import pandas as pd
    from xgboost import XGBClassifier

    rng = np.random.default_rng(0)
    df = pd.DataFrame({"a": rng.random(200), "c": pd.Categorical(rng.choice(["x", "y", "z"], 200))})
    model = XGBClassifier(n_estimators=2, enable_categorical=True).fit(df, (df.a > 0.5).astype(int))
    key = "0123456789abcdef-key"
    for signed in (False, True):
        path = str(tmp_path / f"s{signed}")
        store = ModelStore(path, key=key if signed else None)
        store.commit([store.write(0, 0, model)])
        if not signed:
            with pytest.raises(UnsafeModelError, match="categorical re-coder.*signed store"):
                ModelStore(path).load(0)
        else:
            back = ModelStore(path, key=key).load(0)
            assert np.array_equal(back.predict_proba(df), model.predict_proba(df))
    with pytest.raises(UnsafeModelError, match="refused before XGBoost read it"):
        model_formats.decode("xgboost", b'{"class": "XGBClassifier"}\n\x00\x01garbage')


@pytest.mark.parametrize("kind", ["tree", "gb", "hgb", "svc", "state", "xgboost"])
def test_fuzzed_models_are_refused_or_predict_without_crashing(kind):
    """2,000 mutations of a genuine model's arrays (random and boundary values), in a child process:
    a crash (SIGSEGV, heap-corruption abort) or a hang fails the test, naming the mutation.  Every
    class either route reads with a compiled predictor or from its own format is covered: trees,
    gradient boosting, support vector machines (skops), XGBoost, and every class of the
    estimator_state format (its header and bytes mutated)."""
    n = 1000 if kind in ("svc", "state") else 2000  # the SVC's first crash came at mutation 23
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.crafted", kind, str(n), "7"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0, f"mutation {lines[-1] if lines else '?'} crashed: {proc.stderr[-2000:]}"
    counts = json.loads(lines[-1])
    assert sum(counts.values()) == n
    assert counts["refused"] > n // 10 and counts["predicted"] > 0, counts
