"""ParallelSearchCV against scikit-learn's GridSearchCV / RandomizedSearchCV: identical results."""

import warnings

import numpy as np
import pandas as pd
import pytest
from scipy.stats import randint
from sklearn.datasets import load_iris
from sklearn.exceptions import FitFailedWarning
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV, KFold, RandomizedSearchCV
from sklearn.tree import DecisionTreeClassifier

from sparkml_dist import ConfigurationError, WorkerError
from sparkml_dist.search import ParallelSearchCV
from tests.conftest import masters


@pytest.fixture(scope="module")
def iris():
    return load_iris(return_X_y=True)


def assert_same_results(ours, ref):
    assert set(ours.cv_results_) == set(ref.cv_results_)
    for key, expected in ref.cv_results_.items():
        if "time" in key:
            continue  # wall-clock, not results
        got = ours.cv_results_[key]
        if key == "params":
            assert got == expected
        elif isinstance(expected, np.ma.MaskedArray):
            assert list(got) == list(expected) and np.array_equal(got.mask, expected.mask), key
        else:
            np.testing.assert_array_equal(got, expected, err_msg=key)
    assert ours.best_index_ == ref.best_index_
    assert ours.best_params_ == ref.best_params_
    assert ours.best_score_ == ref.best_score_


@masters("local", "connect", "cluster")  # what separate executor JVMs can change
def test_grid_search_matches_scikit_learn(spark, iris):
    X, y = iris
    grid = {"max_depth": [1, 2, 3, None], "min_samples_leaf": [1, 5, 20]}
    ref = GridSearchCV(DecisionTreeClassifier(random_state=0), grid, cv=3).fit(X, y)
    ours = ParallelSearchCV(DecisionTreeClassifier(random_state=0), grid, cv=3).fit(X, y)
    assert_same_results(ours, ref)
    np.testing.assert_array_equal(ours.predict(X), ref.predict(X))  # refitted best estimator
    assert ours.n_splits_ == 3 and ours.score(X, y) == ref.score(X, y)


@masters("local")
def test_randomized_search_multimetric_and_train_scores_match(spark, iris):
    X, y = iris
    dists = {
        "max_depth": randint(1, 8),
        "min_samples_split": randint(2, 20),
        "criterion": ["gini", "entropy"],
    }
    cv = KFold(4, shuffle=True, random_state=3)
    kw = dict(
        n_iter=9,
        random_state=7,
        cv=cv,
        scoring=["accuracy", "f1_macro"],
        refit="f1_macro",
        return_train_score=True,
    )
    ref = RandomizedSearchCV(DecisionTreeClassifier(random_state=1), dists, **kw).fit(X, y)
    ours = ParallelSearchCV(DecisionTreeClassifier(random_state=1), param_distributions=dists, **kw).fit(X, y)
    assert_same_results(ours, ref)
    assert "split3_train_accuracy" in ours.cv_results_


def test_a_failing_candidate_is_reported_and_the_search_goes_on(spark, iris):
    X, y = iris
    grid = {"max_depth": [2, -1], "min_samples_leaf": [1, 5]}  # max_depth=-1 raises in fit
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        ref = GridSearchCV(DecisionTreeClassifier(random_state=0), grid, cv=3).fit(X, y)
    with pytest.warns(FitFailedWarning, match="6 fits failed out of a total of 12"):
        ours = ParallelSearchCV(DecisionTreeClassifier(random_state=0), grid, cv=3).fit(X, y)
    assert_same_results(ours, ref)
    assert np.isnan(ours.cv_results_["mean_test_score"]).sum() == 2
    with pytest.raises(WorkerError, match="max_depth"):
        ParallelSearchCV(DecisionTreeClassifier(), grid, cv=3, error_score="raise").fit(X, y)


def test_dataframe_input_equals_numpy_input(spark, iris):
    X, y = iris
    cols = [f"f{i}" for i in range(4)]
    pdf = pd.DataFrame(X, columns=cols).assign(label=y)
    df = spark.createDataFrame(pdf)
    grid = {"C": [0.1, 1.0, 10.0]}
    from_df = ParallelSearchCV(LogisticRegression(max_iter=500), grid, cv=3, max_concurrent=1)
    from_df.fit(df, featuresCols=cols, labelCol="label")
    ref = GridSearchCV(LogisticRegression(max_iter=500), grid, cv=3).fit(pdf[cols], y)
    assert_same_results(from_df, ref)
    assert list(from_df.feature_names_in_) == cols


def test_bad_input_is_named(spark, iris):
    X, y = iris
    with pytest.raises(ConfigurationError, match=r"no parameter\(s\) \['depth'\]"):
        ParallelSearchCV(DecisionTreeClassifier(), {"depth": [1, 2]}).fit(X, y)
    with pytest.raises(
        ConfigurationError,
        match="param_grid: Parameter grid for parameter 'max_depth' need to be a non-empty",
    ):
        ParallelSearchCV(DecisionTreeClassifier(), {"max_depth": []}).fit(X, y)
    with pytest.raises(ConfigurationError, match="exactly one of param_grid"):
        ParallelSearchCV(DecisionTreeClassifier()).fit(X, y)
    df = spark.createDataFrame(pd.DataFrame({"a": [1.0, 2.0], "s": ["x", "y"], "label": [0, 1]}))
    with pytest.raises(ConfigurationError, match=r"columns \['b'\] are not in the DataFrame"):
        ParallelSearchCV(DecisionTreeClassifier(), {"max_depth": [1]}).fit(
            df, featuresCols=["a", "b"], labelCol="label"
        )
    with pytest.raises(ConfigurationError, match=r"feature columns \['s'\] are not numeric"):
        ParallelSearchCV(DecisionTreeClassifier(), {"max_depth": [1]}).fit(
            df, featuresCols=["a", "s"], labelCol="label"
        )


def test_a_progress_bar_counts_the_fits(spark, iris, capsys):
    X, y = iris
    ParallelSearchCV(DecisionTreeClassifier(random_state=0), {"max_depth": [1, 2]}, cv=3).fit(X, y)
    err = capsys.readouterr().err
    assert "fits: 100%" in err and "6/6" in err  # 2 candidates x 3 folds, ticked by the executors
    ParallelSearchCV(DecisionTreeClassifier(random_state=0), {"max_depth": [1]}, cv=3, progress=False).fit(
        X, y
    )
    assert "fits" not in capsys.readouterr().err


def test_a_grid_that_swaps_a_pipelines_final_step_matches_grid_search_cv(spark, iris):
    """Estimators as values and the chosen step's own parameters (a list of dicts), as
    GridSearchCV 1.9 takes them: the same candidates, results, keys and best parameters."""
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = iris
    pipe = Pipeline([("scale", StandardScaler()), ("clf", LogisticRegression(max_iter=500))])
    grid = [
        {"clf": [DecisionTreeClassifier(random_state=0)], "clf__max_depth": [2, 4]},
        {"clf": [LogisticRegression(max_iter=500)], "clf__C": [0.1, 1.0]},
    ]
    ours = ParallelSearchCV(pipe, grid, cv=3).fit(X, y)
    ref = GridSearchCV(pipe, grid, cv=3).fit(X, y)
    assert set(ours.cv_results_) == set(ref.cv_results_) and "param_clf__max_depth" in ours.cv_results_
    assert [type(p["clf"]).__name__ for p in ours.cv_results_["params"]] == [
        type(p["clf"]).__name__ for p in ref.cv_results_["params"]
    ]
    np.testing.assert_allclose(ours.cv_results_["mean_test_score"], ref.cv_results_["mean_test_score"])
    assert ours.best_index_ == ref.best_index_ and repr(ours.best_params_) == repr(ref.best_params_)
    with pytest.raises(
        ConfigurationError, match=r"candidate \{'clf__no_such': 1\} cannot be set: Pipeline has no parameter"
    ):
        ParallelSearchCV(pipe, {"clf__no_such": [1]}, cv=3).fit(X, y)
