"""The shared split on a real SparkSession: determinism, modes, checks."""

import collections

import pytest
from pyspark.sql import functions as F

from sparkml_dist import ConfigurationError
from sparkml_dist._spark_env import task_memory_budget
from sparkml_dist.partitioning import (
    GROUP_COL,
    KEY_COL,
    SplitSpec,
    assign_groups,
    balanced_groups,
    check_groups,
    group_stats,
)
from tests.conftest import masters

pytestmark = masters("local", "connect")


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


def _group_rows(grouped, cols):
    return sorted((r[0], tuple(r[1:])) for r in grouped.select(GROUP_COL, *cols).collect())


def test_balanced_groups_deal_duplicates_and_few_rows_evenly(spark):
    # 4001 rows, but only 7 distinct ones: hashing rows by content would fill 7 groups at most
    dup = spark.range(0, 4001).select((F.col("id") % 7).cast("double").alias("x"))
    spec = SplitSpec(num_groups=6, seed=4)
    grouped, n = balanced_groups(dup, spec, ["x"])
    counts = group_stats(grouped, 6).counts()
    assert n == 4001 and sorted(counts) == [666] + [667] * 5
    assert sorted(r[0] for r in grouped.select("x").collect()) == sorted(float(i % 7) for i in range(4001))
    pairs = {tuple(r) for r in grouped.select(GROUP_COL, F.spark_partition_id()).distinct().collect()}
    assert pairs == {(g, g) for g in range(6)}
    # the same rows give the same groups however they are partitioned; another seed, other groups
    ids = spark.range(0, 60).select(F.col("id"), (F.col("id") % 3).alias("y"))
    a = _group_rows(
        balanced_groups(ids.repartition(1), SplitSpec(num_groups=30, seed=2), ["id", "y"])[0], ["id"]
    )
    b = _group_rows(
        balanced_groups(ids.repartition(5, "y"), SplitSpec(num_groups=30, seed=2), ["id", "y"])[0], ["id"]
    )
    c = _group_rows(balanced_groups(ids, SplitSpec(num_groups=30, seed=3), ["id", "y"])[0], ["id"])
    assert a == b and a != c
    assert sorted(collections.Counter(g for g, _ in a).values()) == [2] * 30  # 30 groups of 60 rows


def test_balanced_groups_keep_an_exact_share(spark):
    rows = spark.range(0, 1000).select(F.col("id"))
    grouped, kept = balanced_groups(rows, SplitSpec(num_groups=3, sample_ratio=0.25, seed=1), ["id"])
    ids = [r[0] for r in grouped.select("id").collect()]
    assert kept == 250 and len(ids) == len(set(ids)) == 250
    assert sorted(group_stats(grouped, 3).counts()) == [83, 83, 84]
    assert min(ids) < 100 and max(ids) > 900  # a draw over all rows, not the first ones


@masters("local", "connect", "oldest")
def test_the_pyspark_40_placement_puts_group_g_in_partition_g_as_repartition_by_id_does(spark):
    """pyspark 4.0 has no repartitionById: a hash repartition on a key that hashes to each partition
    (Spark's own Murmur3, computed here) gives the same placement."""
    from pyspark.sql import functions as F

    from sparkml_dist import spark_compat

    values = list(range(-5, 3000, 41)) + [2**40 + 3, -(2**50)]
    hashed = spark.createDataFrame([(v,) for v in values], "v bigint").selectExpr("hash(v)").collect()
    assert [r[0] for r in hashed] == [spark_compat._murmur3_long(v) for v in values]
    df = spark.range(0, 700).withColumn("g", (F.col("id") * 7 % 13).cast("int"))
    placed = spark_compat.repartition_by_hash_key(df, 13, "g").select("g", F.spark_partition_id().alias("p"))
    assert {(r.g, r.p) for r in placed.distinct().collect()} == {(g, g) for g in range(13)}
