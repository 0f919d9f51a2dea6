"""Many models against the recipe every Spark user knows: ``groupBy(key).applyInPandas(fit)``.

One scikit-learn LinearRegression per key, 20 rows a key, 2 features, on local[2]:

- **fit**: ``GroupedTrainer(..., membersDir=...)`` (the models written to a store as they are
  fitted) vs ``df.groupBy("k").applyInPandas(fit)`` returning each key's coefficients, written
  as Parquet (both end with the models in storage);
- **score**: ``model.transform`` of 10 rows a key vs the recipe's scoring: the coefficients
  joined to the rows, then ``groupBy("k").applyInPandas(score)``; both written to Spark's
  ``noop`` sink (computed, not stored);
- **driver memory**: the driver Python's resident memory after the fit, less before it; what of
  it stays once Arrow's allocator released what it keeps unused; and what the model itself holds
  (its keys, counts and the blocks' references).

Contenders alternate within each round (``harness.interleaved``); the data is generated in Spark
(``spark.range``), never on the driver.  Ratios < 1 mean ours is faster.

    python benchmarks/bench_many_models.py --keys 10000 100000 [--repeats 2] [--score-rows 10]
    python benchmarks/bench_many_models.py --keys 1000000 --repeats 1 --no-recipe
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time

import pyarrow as pa

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from harness import interleaved, local_session  # noqa: E402

ROWS_PER_KEY = 20


def rss_mib() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def holds_mib(model) -> float:
    """What the model itself holds on the driver: its keys, counts and blocks' references."""
    held = model._models
    own = [b.rows for b in held.blocks if b.rows.base is None]  # a view of held.rows holds nothing
    arrays = held.keys.nbytes + held.rows.nbytes + sum(r.nbytes for r in own)
    return (arrays + sum(len(str(b.meta)) + len(b.data or b"") for b in held.blocks)) / 2**20


def data(spark, keys: int, rows_per_key: int, seed: int):
    from pyspark.sql import functions as F

    df = spark.range(keys * rows_per_key).select(
        (F.col("id") % keys).alias("k"), F.rand(seed).alias("x1"), F.rand(seed + 1).alias("x2")
    )
    return df.withColumn("y", F.col("x1") * 2 + F.col("x2") * (F.col("k") % 7) + F.rand(seed + 2) * 0.1)


def recipe_fit(pdf):
    import pandas as pd
    from sklearn.linear_model import LinearRegression

    m = LinearRegression().fit(pdf[["x1", "x2"]], pdf["y"])
    return pd.DataFrame(
        {"k": [pdf["k"].iloc[0]], "c1": [m.coef_[0]], "c2": [m.coef_[1]], "b": [m.intercept_]}
    )


def recipe_score(pdf):
    import pandas as pd

    p = pdf["x1"] * pdf["c1"] + pdf["x2"] * pdf["c2"] + pdf["b"]
    return pd.DataFrame({"k": pdf["k"], "x1": pdf["x1"], "x2": pdf["x2"], "prediction": p})


COEFS = "k long, c1 double, c2 double, b double"
SCORED = "k long, x1 double, x2 double, prediction double"


def one_size(spark, keys: int, args, root: str) -> tuple:
    """Fit and score at ``keys`` keys, ours and the recipe interleaved: the report's row."""
    from sklearn.linear_model import LinearRegression

    from sparkml_dist.ensemble import GroupedTrainer

    train = data(spark, keys, ROWS_PER_KEY, 0).cache()
    score = data(spark, keys, args.score_rows, 10).cache()
    train.count(), score.count()
    held = {}

    def ours_fit():
        gc.collect()
        before = rss_mib()
        trainer = GroupedTrainer(
            estimator=LinearRegression(), groupCol="k", featuresCols=["x1", "x2"], labelCol="y",
            membersDir=os.path.join(root, "members"),
        )  # fmt: skip
        model = trainer.fit(train)
        peak = rss_mib() - before
        held["model"] = model
        gc.collect()
        pa.default_memory_pool().release_unused()  # what Arrow's allocator keeps but holds nothing
        held["memory"] = (peak, rss_mib() - before, holds_mib(model))
        return len(model.keys)

    def recipe_fit_run():
        out = train.groupBy("k").applyInPandas(recipe_fit, COEFS)
        out.write.mode("overwrite").parquet(os.path.join(root, "coefs"))
        return keys

    def ours_score():
        held["model"].transform(score).write.format("noop").mode("overwrite").save()

    def recipe_score_run():
        joined = score.join(spark.read.parquet(os.path.join(root, "coefs")), "k")
        joined.groupBy("k").applyInPandas(recipe_score, SCORED).write.format("noop").mode("overwrite").save()

    fits = {"ours": ours_fit, "applyInPandas": recipe_fit_run}
    scores = {"ours": ours_score, "applyInPandas": recipe_score_run}
    if args.no_recipe:
        fits, scores = {"ours": ours_fit}, {"ours": ours_score}
    walls, last = interleaved(fits, args.repeats)
    assert last["ours"] == keys, last
    swalls = {k: [float("nan")] for k in scores} if args.fit_only else interleaved(scores, args.repeats)[0]
    row = (keys, walls, swalls, held["memory"], len(held["model"]._models.blocks))
    train.unpersist(), score.unpersist()
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--score-rows", type=int, default=10, help="rows scored per key")
    ap.add_argument("--no-recipe", action="store_true", help="ours only (e.g. 10^6 keys)")
    ap.add_argument("--fit-only", action="store_true", help="no scoring (the driver's memory at 10^6 keys)")
    ap.add_argument("--figure", default=None, help="write fit and score times by keys here (PNG + JSON)")
    args = ap.parse_args()
    spark = local_session("bench_many_models")
    spark.conf.set("spark.sql.shuffle.partitions", "8")
    root = tempfile.mkdtemp(prefix="bench_many_models-")
    report = [one_size(spark, keys, args, root) for keys in args.keys]
    med = statistics.median
    print(
        f"\nlocal[2], LinearRegression per key, {ROWS_PER_KEY} rows a key to fit, {args.score_rows} "
        f"to score; medians of {args.repeats} interleaved rounds"
    )
    print(
        f"{'keys':>9} {'fit ours':>9} {'recipe':>8} {'ratio':>6} {'score ours':>10} {'recipe':>8} "
        f"{'ratio':>6} {'driver MiB: fit / kept / model':>31} {'blocks':>7}"
    )
    for keys, walls, swalls, (peak, kept, holds), blocks in report:
        f_ours, s_ours = med(walls["ours"]), med(swalls["ours"])
        f_rec = med(walls["applyInPandas"]) if "applyInPandas" in walls else float("nan")
        s_rec = med(swalls["applyInPandas"]) if "applyInPandas" in swalls else float("nan")
        print(
            f"{keys:>9,} {f_ours:8.1f}s {f_rec:7.1f}s {f_ours / f_rec:5.2f}x {s_ours:9.1f}s {s_rec:7.1f}s "
            f"{s_ours / s_rec:5.2f}x {peak:12.0f} / {kept:5.0f} / {holds:7.1f} {blocks:>7}"
        )
    print(f"load average at the end: {os.getloadavg()[0]:.2f}; {time.strftime('%Y-%m-%d %H:%M')}")
    spark.stop()
    if args.figure:
        figure(report, args)


def figure(report, args) -> None:
    """Bars of the medians: fit and score seconds per number of keys, ours beside the recipe."""
    import figures

    med = statistics.median
    panels = []
    for what, index in (("fit", 1), ("score", 2)):
        bars = {}
        for row in report:
            for name, walls in row[index].items():
                bars[f"{name} {row[0]:,}"] = round(med(walls), 2)
        title, ylabel = f"{what}: seconds by keys (local[2])", "seconds (lower is better)"
        panels.append({"title": title, "ylabel": ylabel, "bars": bars})
    command = "python benchmarks/bench_many_models.py " + " ".join(sys.argv[1:])
    figures.save(args.figure, "bars", {"panels": panels}, command)


if __name__ == "__main__":
    main()
