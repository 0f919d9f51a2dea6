"""Sparse features kept sparse: a bagging task's peak memory against its CSR size, and the fit
beside MLlib's own sparse LogisticRegression on the same hashed rows.

    python benchmarks/bench_sparse.py                       # 1M rows x 2^18 columns, ~30 stored
    python benchmarks/bench_sparse.py --memory-only --rows 200000   # the task only (no Spark), JSON

The memory figure runs one bagging task's executor code (``_fit_task.fit_groups``) in a fresh
process on rows streamed from an Arrow IPC file, as a Spark task receives them (in key order, as
the fit's sort hands them), fitting scikit-learn's LogisticRegression on the CSR matrix; the
process's peak RSS growth (VmHWM after a reset, Linux) is divided by the CSR size of the rows
(12 bytes per stored value + 8 per row).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise KeyError(field)


def _write_rows(path: str, rows: int, width: int, stored: int, seed: int = 0) -> float:
    """Arrow IPC batches of ``rows`` vectors (``stored`` values each, sorted keys, one group) as
    Spark's mapInArrow sends them; returns the CSR size in MiB."""
    import numpy as np
    import pyarrow as pa

    from sparkml_dist.ensemble.member_records import FEATURES, LABEL
    from sparkml_dist.group_rows import GROUP_COL, KEY_COL

    rng = np.random.default_rng(seed)
    vec = pa.struct(
        [
            ("type", pa.int8()),
            ("size", pa.int32()),
            ("indices", pa.list_(pa.int32())),
            ("values", pa.list_(pa.float64())),
        ]
    )
    schema = pa.schema(
        [(GROUP_COL, pa.int32()), (KEY_COL, pa.int64()), (FEATURES, vec), (LABEL, pa.float64())]
    )
    weights = rng.normal(size=width)
    keys = np.sort(rng.integers(-(2**62), 2**62, size=rows))
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        for lo in range(0, rows, 10_000):
            n = min(10_000, rows - lo)
            idx = np.sort(rng.integers(0, width, size=(n, stored)), axis=1).astype(np.int32)
            val = rng.random((n, stored))
            label = ((val * weights[idx]).sum(axis=1) > 0).astype(np.float64)
            offsets = pa.array(np.arange(n + 1, dtype=np.int32) * stored)
            feats = pa.StructArray.from_arrays(
                [
                    pa.array(np.zeros(n, np.int8)),
                    pa.array(np.full(n, width, np.int32)),
                    pa.ListArray.from_arrays(offsets, pa.array(idx.ravel())),
                    pa.ListArray.from_arrays(offsets, pa.array(val.ravel())),
                ],
                fields=list(vec),
            )
            cols = [pa.array(np.zeros(n, np.int32)), pa.array(keys[lo : lo + n]), feats, pa.array(label)]
            writer.write_batch(pa.RecordBatch.from_arrays(cols, schema=schema))
    return (rows * stored * 12 + (rows + 1) * 8) / 2**20


def task_peak(path: str, width: int) -> dict:
    """In this (fresh) process: one bagging task over the rows in ``path``; peak RSS growth."""
    import pyarrow as pa
    from sklearn.linear_model import LogisticRegression

    from sparkml_dist import collection, serialization
    from sparkml_dist.ensemble.engine import fitting as _fit_groups
    from sparkml_dist.ensemble.engine import task as _fit_task
    from sparkml_dist.ensemble.member_records import FEATURES, LABEL

    recipe = _fit_groups.Clone(
        serialization.dumps(LogisticRegression(max_iter=50)),
        seeds=(1,),
        member=True,
        classes=(0.0, 1.0),
        feature_subsets=(tuple(range(width)),),
    )
    inputs = _fit_groups.Inputs(features=(FEATURES,), label=LABEL, n_features=width, check_values=False)
    spec = _fit_groups.GroupFitSpec(recipe, inputs, (0,))
    base = _status_mb("VmRSS")
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # VmHWM from here on
    t = time.perf_counter()
    reader = pa.ipc.open_stream(pa.OSFile(path, "rb"))
    out = list(_fit_task.fit_groups(iter(reader), spec))
    wall = time.perf_counter() - t
    peak = _status_mb("VmHWM") - base
    member = collection.decode(pa.Table.from_batches(out), [0])[(0, 0)].model  # raises the task's error
    return {"peak_growth_mb": peak, "fit_s": wall, "coef_nnz": int((member.model.coef_ != 0).sum())}


def memory(rows: int, width: int, stored: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rows.arrow")
        csr_mb = _write_rows(path, rows, width, stored)
        code = f"import json, bench_sparse; print(json.dumps(bench_sparse.task_peak({path!r}, {width})))"
        env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.path.dirname(HERE))
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
        if done.returncode:
            raise RuntimeError(f"the task failed: {done.stderr[-3000:]}")
        out = json.loads(done.stdout.strip().splitlines()[-1])
    out.update(rows=rows, width=width, stored=stored, csr_mb=csr_mb, ratio=out["peak_growth_mb"] / csr_mb)
    return out


def spark_fit(rows: int, width: int, stored: int) -> dict:
    """BaggingClassifier(LogisticRegression) over hashed words beside MLlib's LogisticRegression."""
    from harness import interleaved, local_session
    from pyspark.ml.classification import LogisticRegression as MLlibLR
    from pyspark.ml.feature import HashingTF
    from pyspark.sql import functions as F
    from sklearn.linear_model import LogisticRegression

    from sparkml_dist.ensemble import BaggingClassifier

    spark = local_session("bench_sparse", memory="8g")
    word = lambda i: F.concat(F.lit("w"), (F.abs(F.xxhash64("id", i)) % 200_000).cast("string"))  # noqa: E731
    words = spark.range(rows).select("id", F.transform(F.sequence(F.lit(1), F.lit(stored)), word).alias("w"))
    words = words.withColumn("label", F.exists("w", lambda x: x.endswith("7")).cast("double"))
    df = HashingTF(inputCol="w", outputCol="tf", numFeatures=width).transform(words).select("tf", "label")
    df = df.repartition(2).cache()
    df.count()
    contenders = {
        "sparkml_dist bagging": lambda: BaggingClassifier(
            estimator=LogisticRegression(max_iter=50), numModels=2, featuresCol="tf"
        ).fit(df),
        "MLlib LR": lambda: MLlibLR(featuresCol="tf", maxIter=50).fit(df),
    }
    walls, _ = interleaved(contenders, repeats=2)
    best = {k: min(v) for k, v in walls.items()}
    spark.stop()
    return {"walls": best, "ratio_mllib_over_ours": best["MLlib LR"] / best["sparkml_dist bagging"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--width", type=int, default=1 << 18)
    ap.add_argument("--stored", type=int, default=30)
    ap.add_argument("--memory-only", action="store_true")
    args = ap.parse_args()
    mem = memory(args.rows, args.width, args.stored)
    print(json.dumps(mem) if args.memory_only else f"task: {json.dumps(mem)}")
    if not args.memory_only:
        print(f"task peak growth {mem['peak_growth_mb']:.0f} MiB = {mem['ratio']:.2f} x its CSR size")
        print(json.dumps(spark_fit(args.rows, args.width, args.stored)))


if __name__ == "__main__":
    main()
