"""The contract of a pyspark.ml stage, checked once over every public stage of the package.

What a Spark ML user does with any stage: reads and copies its params, saves and loads it unfitted,
puts it in a ``Pipeline`` after a ``VectorAssembler`` and saves the fitted pipeline (same predictions
after loading), tunes it with ``CrossValidator``, and signs what it saves.  Each stage gets one
small case below; a public stage without a case fails the first test, so a new stage cannot skip
the contract.
"""

import inspect

import numpy as np
import pandas as pd
import pytest
from pyspark.ml import Estimator, Pipeline, PipelineModel
from pyspark.ml.evaluation import BinaryClassificationEvaluator, RegressionEvaluator
from pyspark.ml.feature import VectorAssembler
from pyspark.ml.tuning import CrossValidator, ParamGridBuilder
from sklearn.datasets import make_classification
from sklearn.tree import DecisionTreeClassifier, DecisionTreeRegressor

import sparkml_dist
import sparkml_dist.ensemble as ensemble
from sparkml_dist.formats.checks import UnsafeModelError
from tests.conftest import masters

pytestmark = masters("local")  # pyspark.ml's own machinery on the driver; fits are tested elsewhere

COLS = [f"f{i}" for i in range(5)]
KEY = "stage contract key 0123456789"


@pytest.fixture(scope="module")
def rows(spark):
    X, y = make_classification(n_samples=400, n_features=5, n_informative=3, random_state=4)
    pdf = pd.DataFrame(X, columns=COLS).assign(label=y.astype(float), shop=np.where(X[:, 0] > 0, "a", "b"))
    return spark.createDataFrame(pdf)


# stage -> (a small stage reading "features", the param a grid varies, its two values, the evaluator's class)
CASES = {
    "BaggingClassifier": lambda: (
        ensemble.BaggingClassifier(estimator=DecisionTreeClassifier(max_depth=3), numModels=2, seed=1),
        "numModels",
        [1, 3],
        BinaryClassificationEvaluator,
    ),
    "BaggingRegressor": lambda: (
        ensemble.BaggingRegressor(estimator=DecisionTreeRegressor(max_depth=3), numModels=2, seed=1),
        "numModels",
        [1, 3],
        RegressionEvaluator,
    ),
    "GroupedTrainer": lambda: (
        ensemble.GroupedTrainer(estimator=DecisionTreeRegressor(max_depth=2), groupCol="shop", seed=1),
        "estimator",  # objects as grid values
        [DecisionTreeRegressor(max_depth=1), DecisionTreeRegressor(max_depth=4)],
        RegressionEvaluator,
    ),
    "GlobalForestClassifier": lambda: (
        ensemble.GlobalForestClassifier(numTrees=2, maxDepth=3, numWorkers=2, seed=1),
        "maxDepth",
        [2, 4],
        BinaryClassificationEvaluator,
    ),
    "GlobalForestRegressor": lambda: (
        ensemble.GlobalForestRegressor(numTrees=2, maxDepth=3, numWorkers=2, seed=1),
        "maxDepth",
        [2, 4],
        RegressionEvaluator,
    ),
}


def public_stages():
    names = set(getattr(sparkml_dist, "__all__", [])) | set(ensemble.__all__)
    found = {}
    for name in names:
        obj = getattr(ensemble, name, None) or getattr(sparkml_dist, name, None)
        if inspect.isclass(obj) and issubclass(obj, Estimator):
            found[name] = obj
    return found


def test_every_public_stage_has_a_contract_case():
    assert sorted(public_stages()) == sorted(CASES)


def _values(stage) -> dict:
    """name -> a comparable value of every param that is set or has a default."""
    return {param.name: _comparable(value) for param, value in stage.extractParamMap().items()}


def _comparable(value):
    if hasattr(value, "get_params"):  # a scikit-learn estimator: its class and params
        return (type(value).__name__, sorted(value.get_params().items()))
    return value


@pytest.mark.parametrize("name", sorted(CASES))
def test_params_copy_and_unfitted_save_load(name, spark, tmp_path):
    stage, grid_param, grid_values, _ = CASES[name]()
    cls = public_stages()[name]
    assert isinstance(stage, cls)
    undocumented = [p.name for p in stage.params if not p.doc.strip()]
    assert undocumented == [], f"{name}: params without a doc: {undocumented}"
    assert grid_param in stage.explainParams()
    param = stage.getParam(grid_param)
    copied = stage.copy({param: grid_values[1]})
    assert copied is not stage and copied.uid == stage.uid
    assert _values(copied)[grid_param] == _comparable(grid_values[1])
    assert _values(stage)[grid_param] != _values(copied)[grid_param]  # the original is untouched
    path = str(tmp_path / "unfitted")
    stage.write().overwrite().save(path)
    back = cls.load(path)
    assert type(back) is cls and back.uid == stage.uid and _values(back) == _values(stage)


@pytest.mark.parametrize("name", sorted(CASES))
def test_pipeline_saved_and_loaded_predicts_the_same_and_cross_validates(name, rows, tmp_path):
    stage, grid_param, grid_values, evaluator_class = CASES[name]()
    evaluator = evaluator_class()
    pipe = Pipeline(stages=[VectorAssembler(inputCols=COLS, outputCol="features"), stage])
    pipe.write().overwrite().save(str(tmp_path / "unfitted"))
    unfitted = Pipeline.load(str(tmp_path / "unfitted")).getStages()[1]
    assert type(unfitted) is type(stage) and _values(unfitted) == _values(stage)
    fitted = pipe.fit(rows)
    path = str(tmp_path / "pipeline")
    fitted.write().overwrite().save(path)
    loaded = PipelineModel.load(path)
    assert type(loaded.stages[1]) is type(fitted.stages[1])
    assert loaded.stages[1].uid == fitted.stages[1].uid

    def scored(model):
        return model.transform(rows).select("prediction").toPandas()["prediction"].to_numpy()

    before = scored(fitted)
    assert np.array_equal(scored(loaded), before)
    assert evaluator.evaluate(fitted.transform(rows)) == pytest.approx(
        evaluator.evaluate(loaded.transform(rows))
    )

    grid = ParamGridBuilder().addGrid(stage.getParam(grid_param), grid_values).build()
    cv = CrossValidator(estimator=pipe, estimatorParamMaps=grid, evaluator=evaluator, numFolds=2, seed=3)
    metrics = cv.fit(rows).avgMetrics
    assert len(metrics) == 2 and all(np.isfinite(metrics)), metrics

    model = fitted.stages[1]
    signed = str(tmp_path / "signed")
    model.write().signed_with(KEY).save(signed)
    back = type(model).read().signed_with(KEY).load(signed)
    assert np.array_equal(scored(PipelineModel(stages=[fitted.stages[0], back])), before)
    with pytest.raises(UnsafeModelError, match="signature"):
        type(model).read().signed_with("another key 0123456789").load(signed)
