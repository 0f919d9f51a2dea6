"""What the one per-group engine costs: the per-group fits on this checkout vs another one, interleaved.

Each round starts one process per checkout (its own SparkSession on local[2], that checkout's
``sparkml_dist`` first on the path of the driver and the executors) which fits, on the same Parquet
data (``--rows`` x 50 features, a binary label, a ``key`` column of 20 values): ``BaggingClassifier``
(its default members, 8 of them), ``BaggingClassifier.forest()`` (8 trees of depth 8),
``GroupedTrainer`` (a ``LinearRegression`` per key) and ``train_per_group`` (the user's function per
key).  Each fit runs twice and the second (warm) is timed.  The checkouts alternate their order each
round; the ratio is this checkout's median over the other's.

    git worktree add /tmp/before 49e4cfb      # the commit before the engine (issue 40)
    python benchmarks/bench_engine.py --other /tmp/before [--rows 300000] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
FEATURES, KEYS = 50, 20
FITS = ("bagging", "forest", "grouped", "per_group")


def make_data(rows: int, path: str) -> None:
    import numpy as np
    import pandas as pd
    from sklearn.datasets import make_classification

    X, y = make_classification(n_samples=rows, n_features=FEATURES, n_informative=15, random_state=0)
    pdf = pd.DataFrame(X, columns=[f"f{i}" for i in range(FEATURES)])
    pdf["label"] = y.astype(float)
    pdf["key"] = np.random.default_rng(0).integers(0, KEYS, rows).astype(str)
    pdf.to_parquet(path, index=False)


def fit_key(data, key):
    """train_per_group's function: a linear model of the group's rows."""
    from sklearn.linear_model import LinearRegression

    if isinstance(data, tuple):  # featuresCols given: (X, y)
        return LinearRegression().fit(data[0], data[1])
    cols = [f"f{i}" for i in range(FEATURES)]
    return LinearRegression().fit(data[cols], data["label"])


def child(root: str, data: str) -> None:
    """One checkout's fits; prints {fit: warm seconds} as JSON on the last line."""
    import warnings

    warnings.simplefilter("ignore", DeprecationWarning)
    from sklearn.linear_model import LinearRegression

    from sparkml_dist.ensemble import BaggingClassifier, GroupedTrainer, train_per_group
    from sparkml_dist.session import get_session

    spark = get_session(
        "local[2]",
        conf_file=os.path.join(root, "conf", "spark-local.yaml"),
        conf={"spark.driver.memory": "6g"},
        app_name="bench-engine",
    )
    spark.sparkContext.setLogLevel("ERROR")
    df = spark.read.parquet(data).cache()
    df.count()
    cols = [f"f{i}" for i in range(FEATURES)]
    fits = {
        "bagging": lambda: BaggingClassifier(numModels=8, featuresCols=cols, seed=1).fit(df),
        "forest": lambda: BaggingClassifier.forest(numTrees=8, maxDepth=8, featuresCols=cols, seed=1).fit(df),
        "grouped": lambda: GroupedTrainer(
            estimator=LinearRegression(), groupCol="key", featuresCols=cols, labelCol="label"
        ).fit(df),
        "per_group": lambda: train_per_group(
            df, fit_key, groupCol="key", featuresCols=cols, labelCol="label"
        ),
    }
    out = {}
    for name, fit in fits.items():
        fit()  # cold: the first job of its kind
        t = time.perf_counter()
        fit()
        out[name] = time.perf_counter() - t
    spark.stop()
    print(json.dumps(out))


def run_checkout(root: str, data: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, HERE]), "PYSPARK_PYTHON": sys.executable}
    code = (
        f"import sys; sys.path[:0] = [{root!r}, {HERE!r}]; import bench_engine; "
        f"bench_engine.child({root!r}, {data!r})"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=root)
    if proc.returncode != 0:
        raise SystemExit(f"{root}: the fits failed\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--other", required=True, help="a checkout of another commit (git worktree add ...)")
    ap.add_argument("--rows", type=int, default=300_000)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    here = os.path.dirname(HERE)
    checkouts = {"this": here, "other": os.path.abspath(args.other)}
    times = {k: {f: [] for f in FITS} for k in checkouts}
    with tempfile.TemporaryDirectory(prefix="bench-engine-") as tmp:
        data = os.path.join(tmp, "rows.parquet")
        make_data(args.rows, data)
        for r in range(args.repeats):
            order = list(checkouts) if r % 2 == 0 else list(checkouts)[::-1]
            for name in order:
                load = os.getloadavg()[0]
                got = run_checkout(checkouts[name], data)
                for f in FITS:
                    times[name][f].append(got[f])
                shown = "  ".join(f"{f} {got[f]:6.2f}s" for f in FITS)
                print(f"round {r} {name:5s} load {load:4.2f}  {shown}", flush=True)
    print(f"\nwarm fit, medians of {args.repeats} rounds ({args.rows:,} rows x {FEATURES}, {KEYS} keys):")
    for f in FITS:
        a, b = statistics.median(times["this"][f]), statistics.median(times["other"][f])
        print(f"  {f:10s} this {a:6.2f} s   other {b:6.2f} s   ratio {a / b:.3f}x (target <= 1.05x)")


if __name__ == "__main__":
    main()
