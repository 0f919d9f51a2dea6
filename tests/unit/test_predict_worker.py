"""predict_batch's executor side fed Arrow batches (no Spark): a worker keeps few predict functions."""

import gc
import weakref

import numpy as np
import pyarrow as pa

from sparkml_dist import _predict_worker as pw
from sparkml_dist import serialization

_alive = weakref.WeakValueDictionary()


class Heavy:
    """A model holding 8 MiB, as a real one holds its weights."""

    def __init__(self, scale):
        self.scale, self.weights = scale, np.ones(1 << 20)

    def __call__(self, x):
        return x * self.scale


def _maker(i):
    def make():
        from tests.unit import test_predict_worker as here  # the registry itself is not pickled

        model = here.Heavy(i)
        here._alive[i] = model
        return model

    return make


def _spec(i):
    field = pa.field("prediction", pa.float64())
    return pw.PredictSpec(
        key=f"model-{i}",
        input_cols=("x",),
        output_col="prediction",
        output_type=pa.schema([field]).serialize().to_pybytes(),
        batch_size=4,
        make_fn=serialization.dumps(_maker(i)),
    )


def test_a_worker_keeps_the_eight_most_recently_used_predict_functions():
    pw._MADE.clear()
    batch = pa.record_batch([pa.array([1.0, 2.0, 3.0])], names=["x"])
    for i in range(20):  # 20 predict_batch calls on one Python worker, each with its own model
        out = list(pw.predict_task(iter([batch]), _spec(i)))
        assert out[0].column("prediction").to_pylist() == [float(i), 2.0 * i, 3.0 * i]
        if i >= 12:
            list(pw.predict_task(iter([batch]), _spec(12)))  # model 12 stays in use
    gc.collect()
    assert len(pw._MADE) == pw.KEEP == 8
    assert sorted(_alive) == [12, 13, 14, 15, 16, 17, 18, 19]  # the others' memory is freed
    pw._MADE.clear()


def test_a_model_fitted_with_feature_names_scores_batches_without_a_warning_per_batch():
    import warnings

    import pandas as pd
    from sklearn.tree import DecisionTreeClassifier

    from sparkml_dist import formats as model_formats

    X = pd.DataFrame({"a": [0.0, 1.0, 2.0, 3.0], "b": [1.0, 0.0, 1.0, 0.0]})
    model = DecisionTreeClassifier().fit(X, [0, 1, 0, 1])
    fmt, data = model_formats.encode(model)
    field = pa.field("prediction", pa.float64())
    spec = pw.PredictSpec(
        key="named", input_cols=("a", "b"), output_col="prediction",
        output_type=pa.schema([field]).serialize().to_pybytes(), batch_size=2,
        model_format=fmt, model_bytes=data,
    )  # fmt: skip
    batch = pa.record_batch([pa.array(X["a"]), pa.array(X["b"])], names=["a", "b"])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = list(pw.predict_task(iter([batch] * 5), spec))
    assert [b.column("prediction").to_pylist() for b in out][0] == [0.0, 1.0]
    assert not [w for w in seen if "feature names" in str(w.message)]
    pw._MADE.clear()
