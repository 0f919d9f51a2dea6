"""Feeding a DataFrame to every rank, batch by batch: BarrierRunner's streamed shards vs
TorchDistributor's DataFrame loader, one SparkSession on local[2], two ranks.

Each contender goes from a DataFrame of ``--rows`` x 50 float columns + a label to one epoch of
batches of ``--batch`` rows (tensors) on every rank, end to end (launch, moving the rows, the epoch):

- ``ours_parquet``: a plain Parquet scan, each rank reading its own row ranges from the files;
- ``ours_spark``: the same rows dealt through Spark (``read_files=False``: the exact deal);
- ``ours_computed`` / ``td_computed``: a computed DataFrame as a feature pipeline makes it (a join
  with a dimension table, then ``VectorAssembler`` into one ``features`` vector column): ours writes
  its rows once as Parquet and the ranks read them like a scan; TorchDistributor's loader as above;
- ``ours_table`` / ``td_table``: that pipeline's output saved as a Parquet feature table (the vector
  column stored as Spark stores vectors), as teams keep one: ours reads the files in place, each
  vector becoming an array as it is read; TorchDistributor's loader as above;
- ``torch_distributor``: pyspark's ``TorchDistributor._train_on_dataframe`` with its
  ``_get_spark_partition_data_loader`` (what a TorchDistributor user writes);
- ``*_launch``: the same launches with no data, subtracted to give the feeding time alone.

Inside our ranks the steady state is measured too (samples/s per rank after the first batch) and the
peak RSS growth of the rank while it streams.  Contenders interleave, the order alternating.

    python benchmarks/bench_feed.py [--rows 1000000] [--batch 1000] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from harness import interleaved, local_session  # noqa: E402

COLS = [f"c{i}" for i in range(50)]


def _mb(key: str) -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def ours_epoch(batch, read_ahead=1, columns=None):
    """One epoch of our streamed loader on this rank: rows, steady samples/s, peak RSS growth."""
    import torch  # noqa: F401 - imported before the baseline, as a training function would

    from sparkml_dist.runner import shard

    base = _mb("VmRSS")
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # VmHWM from here on
    rows, first = 0, None
    for *_xs, y in shard().dataloader(batch, columns or COLS + ["label"], seed=0, read_ahead=read_ahead):
        if first is None:
            first = time.perf_counter()
        else:
            rows += len(y)
    steady = rows / (time.perf_counter() - first)
    mine = {"rows": rows + batch, "steady_per_s": steady, "peak_growth_mb": _mb("VmHWM") - base}
    # every rank's figures reach the driver through rank 0's result, as TorchDistributor returns
    # rank 0's only: return_all=True would add a second barrier round (Spark's allGather polls
    # once a second) that the peer does not pay
    import torch.distributed as dist

    from sparkml_dist.runner import init_process_group

    init_process_group()  # gloo on the run's rendezvous
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return every


def td_epoch(cols, rows_per_rank, batch):
    """One epoch of TorchDistributor's DataFrame loader on this rank, batches made into tensors."""
    import numpy as np
    import torch
    from pyspark.ml.torch.distributor import _get_spark_partition_data_loader

    rows = 0
    for b in _get_spark_partition_data_loader(rows_per_rank, batch, num_workers=0):
        xs = [torch.as_tensor(np.asarray(c, dtype=np.float32)) for c in b[:-1]]
        X = xs[0] if len(xs) == 1 else torch.stack(xs, dim=1)
        rows += len(X)
    return {"rows": rows}


def computed(df, spark):
    """A feature pipeline's output: a join with a dimension table, then VectorAssembler."""
    from pyspark.ml.feature import VectorAssembler
    from pyspark.sql import functions as F

    dim = spark.range(100).select(F.col("id").cast("int").alias("bucket"), (F.col("id") / 100).alias("prior"))
    joined = df.withColumn("bucket", F.floor((F.col("c0") + 1) * 50).cast("int")).join(
        F.broadcast(dim), "bucket"
    )
    assembler = VectorAssembler(inputCols=COLS + ["prior"], outputCol="features")
    return assembler.transform(joined).select("features", "label")


def launch_only():
    import torch

    return torch.__version__


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()

    from pyspark.ml.torch.distributor import TorchDistributor
    from pyspark.sql import functions as F

    from sparkml_dist.runner import BarrierRunner

    spark = local_session("bench_feed")
    path = os.path.join(HERE, "data", f"labelled_{args.rows}x50.parquet")
    if not os.path.exists(path):
        spark.range(args.rows, numPartitions=8).select(
            *[(F.rand(i) * 2 - 1).alias(c) for i, c in enumerate(COLS)],
            (F.rand(99) > 0.5).cast("int").alias("label"),
        ).write.parquet(path)
    df = spark.read.parquet(path)
    pipeline = computed(df, spark)
    table_path = os.path.join(HERE, "data", f"features_{args.rows}.parquet")
    if not os.path.exists(table_path):
        pipeline.write.parquet(table_path)
    table = spark.read.parquet(table_path)
    quiet = dict(log_ranks="none", timeout=1800)
    td = lambda: TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)  # noqa: E731
    per_rank = args.rows // 2
    contenders = {
        "ours_parquet": lambda: BarrierRunner(2, **quiet).run_with_data(df, ours_epoch, args.batch),
        "ours_spark": lambda: BarrierRunner(2, read_files=False, **quiet).run_with_data(
            df, ours_epoch, args.batch
        ),
        "torch_distributor": lambda: td()._train_on_dataframe(
            td_epoch, df.repartition(2), COLS + ["label"], per_rank, args.batch
        ),
        "ours_computed": lambda: BarrierRunner(2, **quiet).run_with_data(
            pipeline, ours_epoch, args.batch, columns=["features", "label"]
        ),
        "ours_computed_exact": lambda: BarrierRunner(2, read_files=False, **quiet).run_with_data(
            pipeline, ours_epoch, args.batch, columns=["features", "label"]
        ),
        "td_computed": lambda: td()._train_on_dataframe(
            td_epoch, pipeline.repartition(2), ["features", "label"], per_rank, args.batch
        ),
        "ours_table": lambda: BarrierRunner(2, **quiet).run_with_data(
            table, ours_epoch, args.batch, columns=["features", "label"]
        ),
        "td_table": lambda: td()._train_on_dataframe(
            td_epoch, table.repartition(2), ["features", "label"], per_rank, args.batch
        ),
        "ours_launch": lambda: BarrierRunner(2, **quiet).run(launch_only),
        "torch_distributor_launch": lambda: td().run(launch_only),
    }
    for fn in (contenders["ours_launch"], contenders["torch_distributor_launch"]):
        fn()  # warm-up: Python workers, page cache
    walls, last = interleaved(contenders, args.repeats)
    best = {k: min(v) for k, v in walls.items()}
    launch = {"td": best["torch_distributor_launch"], "ours": best["ours_launch"]}
    feed = {k: v - launch["td" if k.startswith(("td", "torch")) else "ours"] for k, v in best.items()}
    print(f"\n{args.rows:,} x 50 floats + label, batch {args.batch}, 2 ranks, best of {args.repeats}")
    shown = ("ours_parquet", "ours_spark", "torch_distributor", "ours_computed", "ours_computed_exact")
    for name in (*shown, "td_computed", "ours_table", "td_table"):
        print(f"  {name:19s} end to end {best[name]:7.2f} s   feeding alone {feed[name]:7.2f} s")
    print(
        f"  the exact deal (read_files=False) on the computed DataFrame: "
        f"{best['ours_computed_exact'] / best['ours_computed']:.2f}x the staged path's time end to end"
    )
    peers = {
        "ours_parquet": "torch_distributor",
        "ours_spark": "torch_distributor",
        "ours_computed": "td_computed",
        "ours_table": "td_table",
    }
    for name, peer in peers.items():
        print(
            f"  {name}/{peer}: end to end {best[peer] / best[name]:.1f}x faster, "
            f"feeding alone {feed[peer] / max(feed[name], 1e-9):.1f}x faster"
        )
        ranks = last[name]
        steady = statistics.mean(r["steady_per_s"] for r in ranks)
        growth = max(r["peak_growth_mb"] for r in ranks)
        bound = 2 * args.batch * 51 * 4 * 2 / 2**20 + 200
        print(
            f"  {name}: steady state {steady:,.0f} samples/s per rank; peak RSS growth {growth:.0f} MiB "
            f"(target <= 2 x batch x read-ahead + 200 = {bound:.0f} MiB); rows {[r['rows'] for r in ranks]}"
        )
    spark.stop()


if __name__ == "__main__":
    main()
