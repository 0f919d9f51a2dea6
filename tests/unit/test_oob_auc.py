"""The out-of-bag AUC's histogram count equals scikit-learn's ROC AUC on scores of the bins' grid."""

import numpy as np
from sklearn.metrics import roc_auc_score

from sparkml_dist.ensemble.scoring.oob import auc_from_histogram


def test_the_histogram_auc_is_the_exact_auc_on_grid_scores():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 5000)
    bins = np.clip((rng.normal(size=5000) + y * 0.8) * 1000 + 5000, 0, 9999).astype(int)  # ties too
    rows = [
        (b, float(((bins == b) & (y == 1)).sum()), float(((bins == b) & (y == 0)).sum()))
        for b in np.unique(bins)
    ]
    assert abs(auc_from_histogram(rows) - roc_auc_score(y, bins)) < 1e-12
    assert auc_from_histogram([(0, 3.0, 0.0)]) is None  # one class only: no AUC
