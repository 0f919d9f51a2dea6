"""Reading a plain Parquet scan straight from its files (runner.data.parquet_split and the runner)."""

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F

from sparkml_dist import ConfigurationError
from sparkml_dist.runner import BarrierRunner
from sparkml_dist.runner.data import parquet_split
from tests.conftest import masters
from tests.support import runner_helpers as h

FILES, ROWS_PER_FILE, ROW_GROUP = 3, 25, 7


@pytest.fixture(scope="module")
def table_dir(tmp_path_factory):
    """Three files of 25 rows in row groups of 7 (so ranges cut through row groups); x = row index."""
    root = tmp_path_factory.mktemp("pq")
    for f in range(FILES):
        idx = np.arange(f * ROWS_PER_FILE, (f + 1) * ROWS_PER_FILE)
        t = pa.table(
            {
                "x": idx.astype("float64"),
                "i": idx.astype("int32"),
                "v": pa.array([[float(k), -float(k)] for k in idx], pa.list_(pa.float64())),
                "s": [f"row{k}" for k in idx],
            }
        )
        pq.write_table(t, os.path.join(root, f"part-{f}.parquet"), row_group_size=ROW_GROUP)
    return str(root)


@pytest.fixture(scope="module")
def df(spark, table_dir):
    return spark.read.parquet(table_dir)


@pytest.mark.parametrize("parts", [1, 2, 3, 4, 7])
def test_parts_are_contiguous_balanced_ranges_with_sparks_types(df, parts):
    split, why = parquet_split.split_files(df.select("s", "x", "v", "i"), parts)
    assert split is not None, why
    tables = [
        pa.Table.from_batches(list(parquet_split.read(split, p, batch_rows=5)), split.schema)
        for p in range(parts)
    ]
    assert [t.num_rows for t in tables] == list(split.rows)
    assert max(split.rows) - min(split.rows) <= 1
    got = pa.concat_tables(tables)
    assert got.column("x").to_pylist() == [float(k) for k in range(FILES * ROWS_PER_FILE)]  # file order
    expected = df.select("s", "x", "v", "i").toArrow()
    assert got.schema.equals(expected.schema)  # exactly what Spark would deliver
    assert got.sort_by("x").equals(expected.sort_by("x"))


@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda d: d.filter("x > 3"), "Filter"),
        (lambda d: d.withColumn("x", F.col("x") * 2), "computes or renames"),
        (lambda d: d.select(F.col("x").alias("y")), "computes or renames"),
        (lambda d: d.limit(10), "Limit"),
        (lambda d: d.sample(0.5, seed=1), "Sample"),
    ],
)
def test_anything_but_a_plain_scan_goes_through_spark(df, make, reason):
    split, why = parquet_split.split_files(make(df), 2)
    assert split is None and reason in why


def test_a_computed_column_beyond_the_printed_fields_is_seen(spark, tmp_path):
    """Plans print 25 fields by default: a change to the 30th column must not pass unseen."""
    wide = spark.range(40).select(*[(F.col("id") * i).cast("double").alias(f"c{i}") for i in range(30)])
    wide.write.parquet(str(tmp_path / "wide"))
    d = spark.read.parquet(str(tmp_path / "wide"))
    assert parquet_split.split_files(d, 2)[0] is not None
    split, why = parquet_split.split_files(d.withColumn("c29", F.col("c29") + 1), 2)
    assert split is None and "computes or renames" in why


def test_partition_columns_cached_frames_other_formats_and_mixed_types_go_through_spark(spark, tmp_path):
    base = spark.range(30).select(F.col("id").cast("double").alias("x"), (F.col("id") % 3).alias("part"))
    base.write.partitionBy("part").parquet(str(tmp_path / "parted"))
    parted = spark.read.parquet(str(tmp_path / "parted"))
    assert "'part' is not stored" in parquet_split.split_files(parted, 2)[1]
    assert parquet_split.split_files(parted.select("x"), 2)[0] is not None  # without the partition column

    base.write.csv(str(tmp_path / "csv"))
    assert "reads csv files" in parquet_split.split_files(spark.read.csv(str(tmp_path / "csv")), 2)[1]

    mixed = tmp_path / "mixed"
    mixed.mkdir()
    pq.write_table(pa.table({"x": pa.array([1, 2], pa.int64())}), str(mixed / "a.parquet"))
    pq.write_table(pa.table({"x": pa.array([3, 4], pa.int32())}), str(mixed / "b.parquet"))
    split, why = parquet_split.split_files(spark.read.parquet(str(mixed)), 2)
    assert split is None and "'x' is stored as int32" in why


@masters("local", "connect", "cluster")  # what separate executor JVMs can change
def test_runner_reads_the_files_and_matches_the_spark_path(df):
    direct = BarrierRunner(2, timeout=180).run_with_data(df, h.shard_in_order, return_all=True)
    assert [r["values"] for r in direct] == [
        [float(k) for k in range(0, 37)],
        [float(k) for k in range(37, 75)],
    ]
    moved = BarrierRunner(2, timeout=180, read_files=False).run_with_data(
        df, h.shard_in_order, return_all=True
    )
    assert sorted(v for r in moved for v in r["values"]) == [float(k) for k in range(75)]
    assert [r["values"] for r in moved] != [r["values"] for r in direct]  # hashed, not ranges


def test_local_processes_read_the_files_too(df):
    out = BarrierRunner(-2, timeout=120).run_with_data(df.select("x"), h.shard_in_order, return_all=True)
    assert [r["values"] for r in out] == [[float(k) for k in range(0, 37)], [float(k) for k in range(37, 75)]]


def test_fewer_rows_than_ranks_is_refused_before_launching(spark, tmp_path):
    pq.write_table(pa.table({"x": [1.0]}), str(tmp_path / "one.parquet"))
    with pytest.raises(ConfigurationError, match="fewer than np=2 ranks"):
        BarrierRunner(2).run_with_data(spark.read.parquet(str(tmp_path / "one.parquet")), h.shard_in_order)


@pytest.fixture(scope="module")
def saved_features(spark, tmp_path_factory):
    """A feature table saved as Parquet, as a pipeline's users keep one: ``dense`` from a
    VectorAssembler (rows with many zeros stored sparse, the others dense), ``tf`` from a HashingTF
    (sparse), ``maybe`` a vector column with null rows."""
    from pyspark.ml.feature import HashingTF, VectorAssembler

    rows = spark.range(0, 90, 1, 3).selectExpr(
        "id",
        "cast(if(id % 3 = 0, 0, id) as double) as a",
        "0.0 as b",
        "cast(id * 0.5 as double) as c",
        "0.0 as d",
        "array(concat('w', cast(id % 7 as string)), concat('w', cast(id % 4 as string))) as words",
    )
    df = VectorAssembler(inputCols=["a", "b", "c", "d"], outputCol="dense").transform(rows)
    df = HashingTF(numFeatures=32, inputCol="words", outputCol="tf").transform(df)
    df = df.withColumn("maybe", F.when(F.col("id") % 5 == 0, None).otherwise(F.col("dense")))
    path = str(tmp_path_factory.mktemp("features") / "table")
    df.select("id", "dense", "tf", "maybe").write.parquet(path)
    return spark.read.parquet(path)


def test_a_saved_vector_column_is_read_from_the_files_as_vector_to_array_gives_it(saved_features):
    from sparkml_dist.runner.data.sharding import vector_arrays

    cols = ["id", "dense", "tf", "maybe"]
    split, why = parquet_split.split_files(saved_features, 2)
    assert split is not None, why
    assert [str(split.schema.field(c).type) for c in cols[1:]] == ["list<element: double not null>"] * 3
    got = pa.Table.from_batches([b for p in range(2) for b in parquet_split.read(split, p)])
    arrays = saved_features.select("id", *[vector_arrays(c).alias(c) for c in cols[1:]])
    want = sorted(arrays.toArrow().to_pylist(), key=lambda r: r["id"])
    assert sorted(got.to_pylist(), key=lambda r: r["id"]) == want
    assert sum(r["maybe"] is None for r in want) == 18 and want[4]["dense"] == [4.0, 0.0, 2.0, 0.0]
    stored = pq.read_table(saved_features.inputFiles()[0]).column("dense").combine_chunks()
    assert set(stored.field("type").to_pylist()) == {0, 1}  # sparse and dense rows in one column


@masters("local", "connect", "cluster")  # what separate executor JVMs can change
def test_the_ranks_read_a_saved_vector_column_in_place_and_get_sparks_arrays(saved_features, caplog):
    import logging

    caplog.set_level(logging.INFO, logger="sparkml_dist")
    cols = ["id", "dense", "tf", "maybe"]  # a null vector arrives as None both ways
    direct = BarrierRunner(2, timeout=180).run_with_data(saved_features, h.shard_rows, cols, return_all=True)
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "straight from 3 Parquet files" in said and "writing the rows once" not in said  # no copy
    moved = BarrierRunner(2, timeout=180, read_files=False).run_with_data(
        saved_features, h.shard_rows, cols, return_all=True
    )
    by_id = lambda out: sorted((r for rows in out for r in rows), key=lambda r: r["id"])  # noqa: E731
    assert by_id(direct) == by_id(moved) and len(by_id(direct)) == 90
    assert [len(rows) for rows in direct] == [45, 45]


@masters("local")
def test_a_crafted_vector_in_a_saved_table_fails_the_run_naming_column_file_and_row_group(
    saved_features, tmp_path
):
    """A saved feature table whose file was rewritten with pyarrow (Spark's schema metadata kept,
    so Spark still reads the column as vectors): one sparse row of ``dense`` with 1 index for 2
    values. Read in place, the ranks refuse it as Spark would, naming where it is."""
    import shutil

    from sparkml_dist import WorkerError

    copy = tmp_path / "table"
    shutil.copytree(os.path.dirname(saved_features.inputFiles()[0].replace("file:", "")), copy)
    for crc in copy.glob(".*.crc"):  # Hadoop's checksums of the files as Spark wrote them
        crc.unlink()
    target = sorted(copy.glob("part-*.parquet"))[0]
    table = pq.read_table(target)
    rows = table.column("dense").to_pylist()
    rows[1] = {"type": 0, "size": 4, "indices": [2], "values": [7.0, 9.0]}
    crafted = table.set_column(
        table.schema.get_field_index("dense"),
        table.schema.field("dense"),
        pa.array(rows, table.schema.field("dense").type),
    )
    pq.write_table(crafted.replace_schema_metadata(table.schema.metadata), target)
    df = saved_features.sparkSession.read.parquet(str(copy))
    assert df.schema["dense"].dataType.simpleString() == "vector"  # still a vector column to Spark
    with pytest.raises(WorkerError) as err:
        BarrierRunner(2, timeout=180).run_with_data(df, h.shard_rows, ["id", "dense"])
    text = str(err.value)
    assert "column 'dense' of" in text and target.name in text and "row group 0" in text
    assert "1 indices for 2 values" in text
