"""The shared split on a real SparkSession: determinism, modes, checks."""

import pytest
from pyspark.sql import functions as F

from sparkml_dist import ConfigurationError
from sparkml_dist._spark_env import task_memory_budget
from sparkml_dist.partitioning import GROUP_COL, KEY_COL, SplitSpec, assign_groups, check_groups, group_stats


@pytest.fixture(scope="module")
def rows(spark):
    return spark.range(0, 4000).select(F.col("id"), (F.col("id") % 7).cast("double").alias("x"))


def _assignment(df, spec):
    out = assign_groups(df, spec, ["id", "x"])
    return sorted(tuple(r) for r in out.select("id", GROUP_COL).collect())


@pytest.mark.parametrize("sampling,ratio", [("disjoint", 1.0), ("bootstrap", 0.7), ("subsample", 0.3)])
def test_same_seed_same_groups_however_the_input_is_partitioned(rows, sampling, ratio):
    spec = SplitSpec(num_groups=5, sampling=sampling, sample_ratio=ratio, seed=11)
    a = _assignment(rows.repartition(1), spec)
    b = _assignment(rows.repartition(7, "x"), spec)
    assert a == b
    assert a != _assignment(rows, SplitSpec(num_groups=5, sampling=sampling, sample_ratio=ratio, seed=12))


def test_group_g_is_alone_in_partition_g(rows):
    out = assign_groups(rows, SplitSpec(num_groups=6, seed=1), ["id"])
    pairs = {tuple(r) for r in out.select(GROUP_COL, F.spark_partition_id()).distinct().collect()}
    assert pairs == {(g, g) for g in range(6)}


def test_mode_statistics(rows):
    n = 4000
    disjoint = assign_groups(rows, SplitSpec(num_groups=4, seed=3), ["id"])
    ids = [r[0] for r in disjoint.select("id").collect()]
    assert sorted(ids) == list(range(n))  # every row in exactly one group
    counts = group_stats(disjoint, 4).counts()
    assert counts.sum() == n and counts.min() > 0.8 * n / 4

    boot = assign_groups(
        rows, SplitSpec(num_groups=4, sampling="bootstrap", sample_ratio=0.5, seed=3), ["id"]
    )
    per = boot.groupBy(GROUP_COL, "id").count()
    copies = [r[0] for r in per.select("count").collect()]
    assert max(copies) >= 2  # Poisson copies
    assert abs(boot.count() / (4 * n) - 0.5) < 0.05

    sub = assign_groups(
        rows, SplitSpec(num_groups=4, sampling="subsample", sample_ratio=0.25, seed=3), ["id"]
    )
    assert sub.groupBy(GROUP_COL, "id").count().where("count > 1").count() == 0  # no replacement
    assert abs(sub.count() / (4 * n) - 0.25) < 0.05


def test_keys_are_stable_row_hashes(rows):
    spec = SplitSpec(num_groups=2, seed=5)
    a = dict(assign_groups(rows, spec, ["id"]).select("id", KEY_COL).collect())
    b = dict(assign_groups(rows.repartition(3), spec, ["id"]).select("id", KEY_COL).collect())
    assert a == b and len(set(a.values())) == len(a)


def test_empty_groups_and_oversized_groups_are_refused(spark):
    tiny = spark.range(0, 3).select(F.col("id").cast("double").alias("x"))
    spec = SplitSpec(num_groups=8, seed=0, names={"num_groups": "numModels"})
    stats = group_stats(assign_groups(tiny, spec, ["x"]), spec.num_groups)
    with pytest.raises(ConfigurationError, match="groups received no rows.*Lower numModels"):
        check_groups(stats, spec, bytes_per_row=8, budget_bytes=1 << 30)
    spec2 = SplitSpec(num_groups=1)
    stats2 = group_stats(assign_groups(tiny, spec2, ["x"]), spec2.num_groups)
    with pytest.raises(ConfigurationError, match="more than one task can hold"):
        check_groups(stats2, spec2, bytes_per_row=1 << 30, budget_bytes=1 << 30)
    assert "rows min/median/max = 3/3/3" in stats2.summary()
    assert task_memory_budget(spark) > 64 << 20
