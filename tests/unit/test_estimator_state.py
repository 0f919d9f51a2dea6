"""The format of many small models (sparkml_dist.formats.estimator_state): a scikit-learn estimator
whose state is plain values and numeric arrays, in a few hundred bytes, read back exactly; anything
else goes to skops; crafted bytes are refused, naming what is wrong."""

import json
import struct

import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import Lasso, LinearRegression, LogisticRegression, Ridge
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.tree import DecisionTreeRegressor

from sparkml_dist import formats as model_formats
from sparkml_dist.formats import UnsafeModelError, estimator_state


@pytest.fixture(scope="module")
def xy():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 3))
    return X, X @ [1.0, -2.0, 0.5] + 0.3


def test_flat_estimators_round_trip_exactly_and_small(xy):
    X, y = xy
    for model in (
        LinearRegression().fit(X, y),
        Ridge(alpha=0.5).fit(X, y),
        Lasso(alpha=0.01).fit(X, y),
        LogisticRegression().fit(X, y > 0),
        LogisticRegression().fit(X, np.where(y > 0, "up", "down")),  # classes_: fixed-width text
        LogisticRegression().fit(X, np.where(y > 0, "up", "down").astype(object)),  # text objects
        LinearRegression().fit(pd.DataFrame(X, columns=["a", "b", "c"]), y),  # feature_names_in_
        StandardScaler().fit(X),
    ):
        fmt, data = model_formats.encode(model)
        back = model_formats.decode(fmt, data)
        assert fmt == "estimator_state" and type(back) is type(model)
        assert set(vars(back)) == set(vars(model))
        for name, value in vars(model).items():
            assert type(vars(back)[name]) is type(value), name  # numpy scalars stay numpy scalars
            assert np.array_equal(np.asarray(vars(back)[name]), np.asarray(value)), name
        out = back.transform(X) if hasattr(model, "transform") else back.predict(X)
        assert np.array_equal(out, model.transform(X) if hasattr(model, "transform") else model.predict(X))
        import skops.io as sio

        assert len(data) * 5 < len(sio.dumps(model)), (type(model).__name__, len(data))


def test_what_is_not_flat_goes_to_skops(xy):
    X, y = xy

    class MyRegression(LinearRegression):  # a subclass: not scikit-learn's own class
        pass

    mixed = LinearRegression().fit(X, y)
    mixed.feature_names_in_ = np.array(["a", 1, "c"], dtype=object)  # an object array, not all text
    for model in (
        mixed,
        DecisionTreeRegressor(max_depth=2).fit(X, y),  # a Tree object
        make_pipeline(StandardScaler(), Ridge()).fit(X, y),
        MyRegression().fit(X, y),
    ):
        assert not estimator_state.qualifies(model)
        assert model_formats.encode(model)[0] == "skops"
    with pytest.raises(TypeError, match="plain values and numeric arrays"):
        estimator_state.dumps(DecisionTreeRegressor().fit(X, y))


def _crafted(header: dict, body: bytes = b"") -> bytes:
    text = json.dumps(header).encode()
    return estimator_state.MAGIC + struct.pack("<I", len(text)) + text + body


def test_crafted_bytes_are_refused_naming_what_is_wrong(xy):
    X, y = xy
    good = estimator_state.dumps(LinearRegression().fit(X, y))
    header = json.loads(good[12 : 12 + struct.unpack("<I", good[8:12])[0]])
    body = good[12 + struct.unpack("<I", good[8:12])[0] :]
    cases = {
        "not an estimator state": b"PK\x03\x04" + good,
        "which is not a scikit-learn estimator": _crafted({**header, "class": "os.system"}, body),
        "header is not valid": estimator_state.MAGIC + struct.pack("<I", 3) + b"{[}",
        "does not fit its bytes": _crafted(
            {**header, "arrays": {**header["arrays"], "coef_": ["<f8", [10**6], 0, 8 * 10**6]}}, body
        ),
        "is not numbers": _crafted({**header, "arrays": {"coef_": ["|O", [1], 0, 8]}}, body),
        "is described wrongly": _crafted({**header, "arrays": {"coef_": ["<f8"]}}, body),
        "is not a 0-d array": _crafted({**header, "scalars": ["coef_"]}, body),
        "holds something other than text": _crafted({**header, "texts": {"classes_": ["a", 1]}}, body),
    }
    for expected, data in cases.items():
        with pytest.raises(UnsafeModelError, match=expected):
            model_formats.decode("estimator_state", data)
    assert isinstance(model_formats.decode("estimator_state", good), LinearRegression)
