"""The forest preset: MLlib's names in, a bagging estimator of feature-sampling trees out, bad
values refused by name before any Spark job (no SparkSession here)."""

import pytest

from sparkml_dist.ensemble import BaggingClassifier, BaggingRegressor
from sparkml_dist.ensemble.forest import max_features
from sparkml_dist.errors import ConfigurationError


def test_the_preset_is_a_bagging_estimator_of_trees_that_sample_features_per_split():
    f = BaggingClassifier.forest(numTrees=8, maxDepth=7, seed=3, featuresCols=["a", "b"], labelCol="y")
    tree = f.getEstimator()
    assert type(f) is BaggingClassifier and type(tree).__name__ == "DecisionTreeClassifier"
    assert (tree.max_depth, tree.max_features, tree.min_samples_leaf) == (7, 0.3, 1)
    assert (f.getNumModels(), f.getSampling(), f.getSeed(), f.getLabelCol()) == (8, "disjoint", 3, "y")
    r = BaggingRegressor.forest(maxDepth=None, featureSubsetStrategy="auto", minInstancesPerNode=5)
    assert type(r.getEstimator()).__name__ == "DecisionTreeRegressor"
    assert (r.getEstimator().max_depth, r.getEstimator().min_samples_leaf) == (None, 5)
    assert r.getEstimator().max_features == pytest.approx(1 / 3) and r.getNumModels() == 16


@pytest.mark.parametrize(
    "strategy, want", [("all", 1.0), ("sqrt", "sqrt"), ("LOG2", "log2"), ("onethird", 1 / 3), ("0.25", 0.25)]
)
def test_mllib_feature_subset_strategies_map_to_scikit_learn(strategy, want):
    assert max_features(strategy, True) == want


@pytest.mark.parametrize(
    "kwargs, named",
    [
        ({"featureSubsetStrategy": "0"}, "featureSubsetStrategy='0'"),
        ({"featureSubsetStrategy": "half"}, "featureSubsetStrategy='half'"),
        ({"featureSubsetStrategy": 0.3}, "featureSubsetStrategy must be a string"),
        ({"numTrees": 0}, "numTrees"),
        ({"maxDepth": 2.5}, "maxDepth"),
        ({"minInstancesPerNode": 0}, "minInstancesPerNode"),
        ({"sampling": "bootstrap"}, "forest\\(\\) sets sampling itself"),
        ({"estimator": None, "numModels": 3}, "forest\\(\\) sets estimator, numModels itself"),
    ],
)
def test_bad_preset_values_are_refused_by_name(kwargs, named):
    with pytest.raises(ConfigurationError, match=named):
        BaggingClassifier.forest(**kwargs)


def test_the_global_strategy_builds_the_global_forest_with_the_same_names():
    g = BaggingClassifier.forest(strategy="global", numTrees=5, maxDepth=4, numWorkers=3, maxBins=64)
    assert type(g).__name__ == "GlobalForestClassifier"
    assert [g.getOrDefault(p) for p in (g.numTrees, g.maxDepth, g.numWorkers, g.maxBins)] == [5, 4, 3, 64]
    assert type(BaggingRegressor.forest(strategy="global")).__name__ == "GlobalForestRegressor"
    with pytest.raises(ConfigurationError, match="strategy must be one of"):
        BaggingClassifier.forest(strategy="everywhere")
    with pytest.raises(ConfigurationError, match="minInstancesPerNode is a local-strategy parameter"):
        BaggingClassifier.forest(strategy="global", minInstancesPerNode=3)
