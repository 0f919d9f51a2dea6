"""Out-of-bag scores: each row scored by the members that did not see it, in Spark, no data collected."""

import numpy as np
import pandas as pd
import pytest
from sklearn.neighbors import KNeighborsClassifier
from sklearn.tree import DecisionTreeClassifier, DecisionTreeRegressor

from sparkml_dist import ConfigurationError
from sparkml_dist.ensemble import BaggingClassifier, BaggingRegressor
from tests.conftest import masters


def _frame(spark, n, seed, regression=False):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 4))
    signal = X[:, 0] - 0.7 * X[:, 1] + 0.4 * X[:, 2] * X[:, 3]
    y = (
        signal + 0.3 * rng.normal(size=n)
        if regression
        else (signal + 0.4 * rng.normal(size=n) > 0).astype(float)
    )
    pdf = pd.DataFrame({f"f{j}": X[:, j] for j in range(4)} | {"label": y})
    return spark.createDataFrame(pdf), pdf


@masters("local", "connect", "oldest")
def test_one_member_scores_exactly_the_rows_it_left_out(spark):
    df, pdf = _frame(spark, 600, seed=0)
    model = BaggingClassifier(
        estimator=KNeighborsClassifier(n_neighbors=3),
        numModels=1,
        sampling="subsample",
        sampleRatio=0.6,
        featuresCols=["f0", "f1", "f2", "f3"],
        oobScore=True,
        seed=5,
    ).fit(df)
    member = model.models[0].model
    X = pdf[["f0", "f1", "f2", "f3"]].to_numpy()
    seen = {tuple(r) for r in member._fit_X}
    left_out = np.array([tuple(r) not in seen for r in X])
    assert 0.3 < left_out.mean() < 0.5  # about 1 - sampleRatio of the rows
    expected = (member.predict(X[left_out]) == pdf["label"].to_numpy()[left_out]).mean()
    assert model.oobScore_ == pytest.approx(expected, abs=1e-12)


@masters("local")
def test_the_oob_score_estimates_the_held_out_score(spark):
    from sklearn.metrics import roc_auc_score

    train, _ = _frame(spark, 100_000, seed=1)
    test, test_pdf = _frame(spark, 20_000, seed=2)
    cols = ["f0", "f1", "f2", "f3"]
    clf = BaggingClassifier(
        estimator=DecisionTreeClassifier(max_depth=6),
        numModels=16,
        sampling="bootstrap",
        sampleRatio=0.3,
        featuresCols=cols,
        oobScore=True,
    ).fit(train)
    held_out = (clf.transform(test).toPandas()["prediction"] == test_pdf["label"]).mean()
    assert clf.oobScore_ == clf.oobMetrics_["accuracy"] and abs(clf.oobScore_ - held_out) < 0.01
    auc = roc_auc_score(test_pdf["label"], clf.predict_proba(test_pdf[cols].to_numpy())[:, 1])
    assert abs(clf.oobMetrics_["auc"] - auc) < 0.01, (clf.oobMetrics_, auc)
    rtrain, _ = _frame(spark, 4000, seed=3, regression=True)
    rtest, rpdf = _frame(spark, 2000, seed=4, regression=True)
    reg = BaggingRegressor(
        estimator=DecisionTreeRegressor(max_depth=6), numModels=12, sampling="subsample", sampleRatio=0.5,
        featuresCols=cols, oobScore=True,
    ).fit(rtrain)  # fmt: skip
    pred = reg.transform(rtest).toPandas()["prediction"].to_numpy()
    y = rpdf["label"].to_numpy()
    r2 = 1 - ((pred - y) ** 2).sum() / ((y - y.mean()) ** 2).sum()
    assert 0.5 < reg.oobScore_ < 1 and abs(reg.oobScore_ - r2) < 0.05, (reg.oobScore_, r2)
    assert reg.oobMetrics_["r2"] == reg.oobScore_ and reg.oobMetrics_["rmse"] > 0


@masters("local", "connect")
def test_oob_without_left_out_rows_is_refused_before_any_job(spark):
    df, _ = _frame(spark, 50, seed=0)
    with pytest.raises(ConfigurationError, match="oobScore=True needs sampling='bootstrap' or 'subsample'"):
        BaggingClassifier(featuresCols=["f0", "f1"], oobScore=True).fit(df)
    plain = BaggingClassifier(featuresCols=["f0", "f1"], numModels=2).fit(df)
    assert plain.oobScore_ is None
