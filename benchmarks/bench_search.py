"""ParallelSearchCV on local[2] vs scikit-learn's GridSearchCV(n_jobs=2) in this process.

48 candidates x 3 folds of a random forest on scikit-learn's bundled digits. Contenders are
interleaved (the order alternates every round); the load average is recorded; the scores of both
are checked to be identical. Target: ours at most 1.3x scikit-learn's time on one machine.

    python benchmarks/bench_search.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import interleaved  # noqa: E402 - benchmarks/ is the script's folder

GRID = {"n_estimators": [10, 30, 60], "max_depth": [4, 8, 12, None], "max_features": ["sqrt", 0.2, 0.4, 0.6]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    from sklearn.datasets import load_digits
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.model_selection import GridSearchCV

    from sparkml_dist.search import ParallelSearchCV
    from sparkml_dist.session import get_session

    spark = get_session(
        "local[2]",
        conf_file=os.path.join(
            os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf", "spark-local.yaml"
        ),
        app_name="bench_search",
    )
    spark.sparkContext.setLogLevel("ERROR")
    X, y = load_digits(return_X_y=True)
    est = RandomForestClassifier(random_state=0)
    n_fits = int(np.prod([len(v) for v in GRID.values()])) * 3
    contenders = {
        "sparkml_dist": lambda: ParallelSearchCV(est, GRID, cv=3).fit(X, y),
        "sklearn_n_jobs_2": lambda: GridSearchCV(est, GRID, cv=3, n_jobs=2).fit(X, y),
    }
    for fn in contenders.values():  # warm-up: Spark's Python workers, joblib's loky pool
        fn()
    walls, last = interleaved(contenders, args.repeats)
    ours, ref = last["sparkml_dist"].cv_results_, last["sklearn_n_jobs_2"].cv_results_
    same = all(np.array_equal(ours[k], ref[k]) for k in ref if "test_score" in k)
    med = {k: statistics.median(v) for k, v in walls.items()}
    print(f"\n{n_fits} fits (48 candidates x 3 folds), median wall over {args.repeats} rounds")
    for k, v in med.items():
        print(f"  {k:18s} {v:6.2f}s")
    print(f"  ours / scikit-learn = {med['sparkml_dist'] / med['sklearn_n_jobs_2']:.3f}x (target <= 1.3)")
    print(f"  identical test scores (every split, mean, std, rank): {same}")
    spark.stop()


if __name__ == "__main__":
    main()
