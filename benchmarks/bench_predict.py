"""Scoring a DataFrame with a torch network: ``sparkml_dist.inference.predict_batch`` vs pyspark's
``predict_batch_udf``, the same make_predict_fn, the same data, one SparkSession on local[2].

``--rows`` x 50 float features (an array column, Parquet), an MLP 50 -> 64 -> 1, batches of 1,024;
each contender scores every row (``write.format("noop")``: the whole plan runs, nothing is kept).
The outputs of both are compared on every row first.  Contenders interleave, order alternating.

    python benchmarks/bench_predict.py [--rows 1000000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from harness import interleaved, local_session  # noqa: E402


def make_predict_fn():
    """The network (seeded: the same weights in every worker) and its batch function."""
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    net = torch.nn.Sequential(torch.nn.Linear(50, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).eval()

    def predict(features):
        with torch.no_grad():
            return net(torch.from_numpy(features.astype("float32", copy=False)))[:, 0].numpy()

    return predict


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    import numpy as np
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql import functions as F
    from pyspark.sql.types import FloatType

    from sparkml_dist.inference import predict_batch

    spark = local_session("bench_predict")
    path = os.path.join(HERE, "data", f"vectors_{args.rows}x50.parquet")
    if not os.path.exists(path):
        spark.range(args.rows, numPartitions=8).select(
            "id", F.array(*[(F.rand(i) * 2 - 1).cast("float") for i in range(50)]).alias("features")
        ).write.parquet(path)
    df = spark.read.parquet(path)
    udf = predict_batch_udf(
        make_predict_fn, return_type=FloatType(), batch_size=1024, input_tensor_shapes=[[50]]
    )

    def ours():
        return predict_batch(
            df, make_predict_fn, input_cols=["features"], return_type="float", batch_size=1024
        )

    def theirs():
        return df.withColumn("prediction", udf("features"))

    a = ours().select("id", "prediction").toPandas().sort_values("id")["prediction"].to_numpy()
    b = theirs().select("id", "prediction").toPandas().sort_values("id")["prediction"].to_numpy()
    print(f"outputs: {len(a):,} rows, max |ours - predict_batch_udf| = {np.abs(a - b).max():.2e}")
    run = lambda frame: frame.write.format("noop").mode("overwrite").save()  # noqa: E731
    walls, _ = interleaved(
        {"predict_batch": lambda: run(ours()), "predict_batch_udf": lambda: run(theirs())}, args.repeats
    )
    best = {k: min(v) for k, v in walls.items()}
    print(f"\n{args.rows:,} rows x 50 floats, MLP 50-64-1, batch 1024, local[2], best of {args.repeats}")
    for name, wall in best.items():
        print(f"  {name:18s} {wall:6.2f} s  {args.rows / wall:12,.0f} rows/s")
    ratio = best["predict_batch_udf"] / best["predict_batch"]
    print(f"  predict_batch / predict_batch_udf throughput: {ratio:.2f}x")
    spark.stop()


if __name__ == "__main__":
    main()
