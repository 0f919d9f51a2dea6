"""Models saved by an earlier release (tests/fixtures/saved, written by make_saved_models.py before
the per-group engine) load and predict exactly as they did."""

import os

import numpy as np
import pandas as pd
import pytest

from sparkml_dist.ensemble.stored.persistence import load_stage
from tests.conftest import ROOT, masters

SAVED = os.path.join(ROOT, "tests", "fixtures", "saved")


@masters("local", "connect", "oldest")  # the driver reads the files; transform runs as for any model
@pytest.mark.parametrize("name", ["bagging_classifier", "bagging_regressor", "grouped", "grouped_regressor"])
def test_a_model_saved_by_an_earlier_release_predicts_as_it_did(spark, name):
    test = spark.createDataFrame(pd.read_csv(os.path.join(SAVED, "test_rows.csv")))
    model = load_stage(os.path.join(SAVED, name))
    got = model.transform(test).select("prediction").toPandas()["prediction"].to_numpy()
    # the same models on the same rows (a linear model's dot product may differ in its last bit
    # with how rows are batched)
    np.testing.assert_allclose(got, np.load(os.path.join(SAVED, f"{name}.prediction.npy")), rtol=1e-12)
