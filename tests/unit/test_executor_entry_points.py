"""The executor entry points without Spark: each fed a list of Arrow batches, as ``mapInArrow``
hands them to a Python worker, and its output read back through the collection layer."""

import numpy as np
import pyarrow as pa
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import KFold
from sklearn.tree import DecisionTreeClassifier

from sparkml_dist import WorkerError, collection, serialization
from sparkml_dist.ensemble.aggregation import probabilities, vote
from sparkml_dist.ensemble.engine import fitting as _fit_groups
from sparkml_dist.ensemble.engine import task as _fit_task
from sparkml_dist.ensemble.member_records import FEATURES, LABEL, KeyModel, Member
from sparkml_dist.ensemble.scoring import members as _member_scoring
from sparkml_dist.group_rows import GROUP_COL, KEY_COL
from sparkml_dist.search._worker import Job, SearchSpec, search_task
from sparkml_dist.tune.trial import TrialSpec, trial_task


def _rows(X, y, groups, keys=None):
    feats = pa.array([list(map(float, r)) for r in X], pa.list_(pa.float64()))
    cols = {GROUP_COL: pa.array(groups, pa.int32()), FEATURES: feats, LABEL: pa.array(y, pa.float64())}
    if keys is not None:
        cols[KEY_COL] = pa.array(keys, pa.int64())
    return pa.table(cols)


def _batches(table, size):
    return table.to_batches(max_chunksize=size)


def _collected(out):
    return collection.decode(pa.Table.from_batches(list(out), schema=collection.CHUNK_SCHEMA))


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 4))
    y = (X[:, 0] + X[:, 1] > 0).astype(float)
    return X, y


def _member_spec(subsets=((0, 1, 2, 3), (0, 1), (1, 2, 3)), on_error="raise"):
    recipe = _fit_groups.Clone(
        serialization.dumps(DecisionTreeClassifier(max_depth=3)),
        seeds=(1, 2, 3),
        member=True,
        classes=(0.0, 1.0),
        feature_subsets=subsets,
    )
    inputs = _fit_groups.Inputs(features=(FEATURES,), label=LABEL, n_features=4)
    return _fit_groups.GroupFitSpec(recipe, inputs, (0, 1, 2), on_error)


def test_fit_groups_then_predict_arrow(data):
    X, y = data
    groups = np.arange(len(y)) % 3
    table = _rows(X, y, groups, keys=np.arange(len(y)) * 7919 % 1000)
    table = table.take(np.argsort(groups, kind="stable"))  # a task's rows come group by group
    results = _collected(_fit_task.fit_groups(_batches(table, 17), _member_spec()))  # across batches
    assert sorted(results) == [(0, 0), (1, 0), (2, 0)]
    members = {k: r.model for k, r in results.items()}
    assert [m.features.tolist() for m in (members[(g, 0)] for g in range(3))] == [
        [0, 1, 2, 3],
        [0, 1],
        [1, 2, 3],
    ]
    assert all(isinstance(m, Member) and m.n_rows == 40 for m in members.values())
    # the same rows in another batching and order give the same members (rows are ordered by key)
    shuffled = table.take(np.random.default_rng(1).permutation(120))
    shuffled = shuffled.take(np.argsort(shuffled.column(GROUP_COL).to_numpy(), kind="stable"))
    again = _collected(_fit_task.fit_groups(_batches(shuffled, 50), _member_spec()))
    assert all(
        np.array_equal(members[k].model.tree_.value, again[k].model.model.tree_.value) for k in members
    )

    ensemble = [members[(g, 0)] for g in range(3)]
    blob = serialization.dumps(ensemble)
    pspec = _member_scoring.PredictSpec(
        blob, serialization.digest(blob), True, 2, (0.0, 1.0), "soft", 4, "features"
    )
    feats = pa.array([list(r) for r in X], pa.list_(pa.float64()))
    out = _member_scoring.predict_arrow(feats, pspec)
    want = probabilities(vote(ensemble, X, 2, "soft"))
    assert np.allclose(np.array(out.field("probability").to_pylist()), want)
    assert out.field("prediction").to_numpy().tolist() == want.argmax(axis=1).astype(float).tolist()
    with pytest.raises(Exception, match="features"):  # a ragged row is refused, naming the column
        _member_scoring.predict_arrow(pa.array([[1.0, 2.0]], pa.list_(pa.float64())), pspec)
    with pytest.raises(RuntimeError, match="did not arrive together"):  # rows not grouped: refused
        list(_fit_task.fit_groups(_batches(_rows(X, y, groups, keys=np.arange(120)), 17), _member_spec()))


def _key_spec(on_error="raise"):
    recipe = _fit_groups.Clone(serialization.dumps(LogisticRegression()))
    inputs = _fit_groups.Inputs(features=(FEATURES,), label=LABEL)
    return _fit_groups.GroupFitSpec(recipe, inputs, ("a", "b", "c"), on_error, what="key")


def test_fitting_keys_holds_one_group_at_a_time_and_names_a_failed_key(data):
    X, y = data
    groups = np.repeat([0, 1, 2], 40)
    y = y.copy()
    y[80:] = 1.0  # key "c": one class, which LogisticRegression refuses
    table = _rows(X, y, groups, keys=np.arange(120))
    out = list(_fit_task.fit_groups(_batches(table, 30), _key_spec()))  # group 0 spans two batches
    with pytest.raises(WorkerError, match=r"group 2 failed.*fitting key 'c' \(40 rows\): ValueError") as err:
        _collected(out)
    assert "Traceback" in err.value.worker_traceback
    good = _collected(_fit_task.fit_groups(_batches(table.slice(0, 80), 30), _key_spec()))
    assert [(r.model.key, r.rows) for r in good.values()] == [("a", 40), ("b", 40)]
    assert all(isinstance(r.model, KeyModel) for r in good.values())
    skipped = _collected(_fit_task.fit_groups(_batches(table, 30), _key_spec("skip")))
    assert [r.error is None for r in skipped.values()] == [True, True, False]
    assert "ValueError" in skipped[(2, 0)].error and "Traceback" in skipped[(2, 0)].error


def _keys_of(estimator, on_error="skip"):
    recipe = _fit_groups.Clone(serialization.dumps(estimator))
    inputs = _fit_groups.Inputs(features=(FEATURES,), label=LABEL)
    return _fit_groups.GroupFitSpec(recipe, inputs, ("a", "b", "c"), on_error, what="key")


def test_later_keys_skip_only_the_parameter_check_the_first_key_passed(data):
    """A task checks its estimator's parameters at its first fit only (the copies hold the same):
    the models are those of a plain fit; bad parameters fail every key, naming the parameter; a
    NaN in a later key's rows is still refused (the data checks run on every key)."""
    from sklearn.linear_model import LinearRegression

    X, y = data
    table = _rows(X, y, np.repeat([0, 1, 2], 40), keys=np.arange(120))
    fitted = _collected(_fit_task.fit_groups(_batches(table, 30), _keys_of(LinearRegression())))
    for g in range(3):
        plain = LinearRegression().fit(X[40 * g : 40 * (g + 1)], y[40 * g : 40 * (g + 1)])
        assert np.array_equal(fitted[(g, 0)].model.model.coef_, plain.coef_)
    bad = _keys_of(LinearRegression(fit_intercept="yes"))  # refused by its check, on every key
    bad = _collected(_fit_task.fit_groups(_batches(table, 30), bad))
    errors = [r.error or "" for r in bad.values()]
    assert len(errors) == 3 and all("InvalidParameterError" in e and "fit_intercept" in e for e in errors)
    X_nan = X.copy()
    X_nan[100, 2] = np.nan  # key "c": its 21st row
    with_nan = _rows(X_nan, y, np.repeat([0, 1, 2], 40), keys=np.arange(120))
    out = _collected(_fit_task.fit_groups(_batches(with_nan, 30), _keys_of(LinearRegression())))
    assert [r.error is None for r in out.values()] == [True, True, False]
    assert "Input X contains NaN" in out[(2, 0)].error


def test_search_task_runs_its_partitions_units_in_order(data):
    X, y = data
    candidates = [{"max_depth": 1}, {"max_depth": 3}]
    splits = [(tr, te) for tr, te in KFold(3).split(X)]
    kwargs = dict(
        scorer=None,
        verbose=0,
        fit_params={},
        return_train_score=False,
        return_n_test_samples=True,
        return_times=True,
        return_parameters=False,
        error_score=np.nan,
        score_params={},
    )
    from sklearn.metrics import check_scoring

    kwargs["scorer"] = check_scoring(DecisionTreeClassifier())
    from sparkml_dist.search import _FIT_AND_SCORE_ARGS

    kwargs = {k: v for k, v in kwargs.items() if k in _FIT_AND_SCORE_ARGS}
    payload = serialization.dumps(
        Job(DecisionTreeClassifier(random_state=0), X, y, candidates, splits, kwargs)
    )
    spec = SearchSpec(serialization.digest(payload), payload, n_units=6, n_parts=2)
    parts = [pa.record_batch({"id": pa.array([1], pa.int64())})]  # this task holds partition 1
    results = _collected(search_task(parts, spec))
    assert sorted(results) == [(1, 0), (3, 0), (5, 0)]  # units 1, 3, 5: partition 1 of 2
    assert all(0.0 <= r["test_scores"] <= 1.0 and r["n_test_samples"] == 40 for r in results.values())
    assert list(search_task([], spec)) == []  # an empty partition runs nothing


def _trial_fn(params, trial):
    trial.report(1, loss=params["x"] * 2)
    return {"loss": params["x"] * 2}


def test_trial_task_returns_the_result_even_without_a_driver():
    payload = serialization.dumps(_trial_fn)
    spec = TrialSpec(3, {"x": 1.5}, payload, serialization.digest(payload), ("127.0.0.1", 9), b"s" * 32)
    rows = [pa.record_batch({"id": pa.array([0], pa.int64())})]
    out = _collected(trial_task(rows, spec))[(3, 0)]
    assert out["ok"] and out["returned"] == {"loss": 3.0} and out["reports"] == {1: {"loss": 3.0}}
    assert out["unreachable"].startswith("127.0.0.1:9")  # said, and the trial ran anyway
