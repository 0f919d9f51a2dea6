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
        "which this format never writes": _crafted({**header, "class": "os.system"}, body),
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


def test_a_class_this_format_never_writes_is_refused_svc_included(xy):
    """A 6 KB blob naming SVC (a class the writer never produces) with support_ longer than the
    support vectors loaded, and segfaulted in predict; any class outside the reviewed list is refused."""
    import warnings

    from sklearn.svm import SVC

    X, y = xy
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        svc = SVC().fit(X, y > 0)
    assert not estimator_state.qualifies(svc) and model_formats.encode(svc)[0] == "skops"
    state = {k: v for k, v in vars(svc).items() if k != "shape_fit_"}
    state["support_"] = np.concatenate([svc.support_] * 4).astype(np.int32)  # past the vectors
    values = {k: v for k, v in state.items() if not isinstance(v, (np.ndarray, np.generic))}
    arrays, chunks, offset = {}, [], 0
    for name, value in state.items():
        if isinstance(value, (np.ndarray, np.generic)):
            raw = np.ascontiguousarray(value).tobytes()
            arrays[name] = [np.asarray(value).dtype.str, list(np.shape(value)), offset, len(raw)]
            chunks.append(raw)
            offset += len(raw)
    name = f"{SVC.__module__}.{SVC.__qualname__}"
    blob = _crafted({"class": name, "sklearn": "1", "values": values, "arrays": arrays}, b"".join(chunks))
    with pytest.raises(UnsafeModelError, match=r"names class 'sklearn.svm._classes.SVC'.*never writes"):
        model_formats.decode("estimator_state", blob)


def test_an_element_count_that_wraps_int64_is_refused(xy):
    X, y = xy
    good = estimator_state.dumps(LinearRegression().fit(X, y))
    size = struct.unpack("<I", good[8:12])[0]
    header, body = json.loads(good[12 : 12 + size]), good[12 + size :]
    for shape in ([2**62, 4, 0], [2**32, 2**32], [2**41]):
        forged = {**header, "arrays": {**header["arrays"], "coef_": ["<f8", shape, 0, 0]}}
        with pytest.raises(UnsafeModelError, match="claims .* elements"):
            model_formats.decode("estimator_state", _crafted(forged, body))


def test_every_reviewed_class_is_written_in_this_format_and_read_back_exactly(xy):
    """The list holds only classes the writer takes (a genuine fitted one qualifies) and numpy alone
    predicts with; each comes back predicting or transforming the same."""
    import warnings

    from sklearn.utils import all_estimators

    X, y = xy
    X = np.abs(X) + 0.1  # non-negative: the naive Bayes counts models take it too
    reviewed = estimator_state.estimator_classes()
    assert len(reviewed) == len(estimator_state.CLASSES)
    assert set(reviewed) < {f"{c.__module__}.{c.__qualname__}" for _, c in all_estimators()}
    written = 0
    for cls in reviewed.values():
        model = None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for target in (y > y.mean(), y, None):
                try:
                    model = cls().fit(X) if target is None else cls().fit(X, target)
                    break
                except Exception:  # noqa: BLE001 - a classifier given a continuous target, ...
                    model = None
        assert model is not None, cls
        assert estimator_state.qualifies(model), cls
        back = model_formats.decode(*model_formats.encode(model))
        method = "predict" if hasattr(model, "predict") else "transform"
        assert np.array_equal(getattr(back, method)(X), getattr(model, method)(X)), cls
        written += 1
    assert written == len(reviewed)
