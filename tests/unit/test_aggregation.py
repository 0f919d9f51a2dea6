import numpy as np
from sklearn.linear_model import LogisticRegression

from sparkml_dist.ensemble.aggregation import Member, probabilities, vote


def test_members_that_saw_only_some_classes_vote_in_the_global_class_order():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 2))
    y = (X[:, 0] > 0).astype(int) + (X[:, 1] > 1).astype(int)  # classes 0, 1, 2 globally
    # member A saw global classes {0, 2}, member B saw {1, 2}; both fitted on local labels 0..1
    mask_a, mask_b = y != 1, y != 0
    a = LogisticRegression().fit(X[mask_a], (y[mask_a] == 2).astype(int))
    b = LogisticRegression().fit(X[mask_b], (y[mask_b] == 2).astype(int))
    ma = Member(0, a, np.arange(2), np.array([0, 2]), int(mask_a.sum()))
    mb = Member(1, b, np.arange(2), np.array([1, 2]), int(mask_b.sum()))
    raw = vote([ma, mb], X, 3, "soft")
    pa, pb = a.predict_proba(X), b.predict_proba(X)
    assert np.allclose(raw[:, 0], pa[:, 0])
    assert np.allclose(raw[:, 1], pb[:, 0])
    assert np.allclose(raw[:, 2], pa[:, 1] + pb[:, 1])
    assert np.allclose(probabilities(raw).sum(axis=1), 1.0)
    hard = vote([ma, mb], X, 3, "hard")
    assert np.all(hard.sum(axis=1) == 2)
    assert np.array_equal(hard[:, 2] > 0, (a.predict(X) == 1) | (b.predict(X) == 1))


def test_constant_member_votes_for_its_only_class():
    m = Member(0, None, np.arange(2), np.array([1]), 5, constant=True)
    X = np.zeros((4, 2))
    assert np.array_equal(vote([m], X, 3, "soft"), np.tile([0.0, 1.0, 0.0], (4, 1)))
    assert np.array_equal(vote([m], X, 3, "hard"), np.tile([0.0, 1.0, 0.0], (4, 1)))
