"""The exact deal of run_with_data's Spark path: contiguous balanced ranges moved by one shuffle
(sparkml_dist.runner.data.range_deal), checked on the cases that stress it: buckets straddling streams, more
streams than tasks, streams several tasks read (replicas), few rows, every row the same."""

import pytest
from pyspark.sql import functions as F

from sparkml_dist import partitioning
from sparkml_dist.runner.data import range_deal


def _dealt(df, streams, readers, tasks):
    placed, sizes = range_deal.ranges(df, 7, df.columns, streams, readers, tasks)
    seen = placed.select(
        "v",
        F.col(partitioning.GROUP_COL).alias("stream"),
        F.spark_partition_id().alias("task"),
        F.monotonically_increasing_id().alias("at"),
    )
    return sorted(tuple(r) for r in seen.collect()), sizes


CASES = {
    "a stream per task": (2, [[0], [1]], 2),
    "four streams on two tasks": (4, [[0], [1], [0], [1]], 2),
    "replicas: each stream read by two tasks": (2, [[0, 1], [2, 3]], 4),
    "seven streams, one task each": (7, [[c] for c in range(7)], 7),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("rows", [9, 5000])
def test_each_stream_is_a_balanced_range_on_its_readers_whatever_the_partitioning(spark, name, rows):
    streams, readers, tasks = CASES[name]
    base = spark.range(0, rows, 1, 3).select((F.col("id") % 997 * 1.5).alias("v"))  # duplicates too
    got, sizes = _dealt(base, streams, readers, tasks)
    again, _ = _dealt(base.repartition(5, "v"), streams, readers, tasks)
    key = lambda rows_: sorted((s, t, v) for v, s, t, _ in rows_)  # noqa: E731 - order checked below
    assert key(got) == key(again)  # the same deal however the input is partitioned
    assert sum(sizes) == rows and max(sizes) - min(sizes) <= 1
    for c in range(streams):
        for t in readers[c]:
            mine = sorted(v for v, s, task, _ in got if s == c and task == t)
            assert len(mine) == sizes[c]
        assert {task for _, s, task, _ in got if s == c} == set(readers[c])
    first_copy = [v for v, s, task, _ in got if task == readers[s][0]]
    want = sorted(float(i % 997 * 1.5) for i in range(rows))
    assert sorted(first_copy) == want  # every row once (over one reader of each stream)
    for t in range(tasks):  # a task's rows come stream by stream
        order = [s for _, s, task, at in sorted(got, key=lambda r: r[3]) if task == t]
        assert order == sorted(order)


def test_rows_all_alike_fill_every_stream_from_one_bucket(spark):
    df = spark.range(0, 101, 1, 4).select(F.lit(3.0).alias("v"))
    got, sizes = _dealt(df, 4, [[0], [1], [2], [3]], 4)
    assert sizes == (25, 25, 25, 26)
    assert [sum(1 for _, s, t, _ in got if s == c and t == c) for c in range(4)] == [25, 25, 25, 26]
    assert len(got) == 101
