"""Any DataFrame fed at the speed of a Parquet scan: a computed DataFrame (a join, a feature
pipeline's vectors) written once as Parquet under the staging directory and read by the ranks
like a scan (sparkml_dist.runner.data.staging), and when the exact deal is taken instead."""

import os

import pytest
from pyspark.sql import functions as F

from sparkml_dist import ConfigurationError
from sparkml_dist.runner import BarrierRunner
from tests.conftest import masters
from tests.support import runner_helpers as h
from tests.support import stream_helpers as sh

ROWS = 301


@pytest.fixture(scope="module")
def pipeline(spark):
    """A feature pipeline's output: a broadcast join with a dimension table, VectorAssembler's
    dense vectors and HashingTF's sparse ones (no shuffle: its order repeats)."""
    from pyspark.ml.feature import HashingTF, VectorAssembler

    facts = spark.range(0, ROWS, 1, 3).selectExpr("id", "id % 5 AS k", "cast(id AS double) AS a")
    dim = spark.range(5).selectExpr("id AS k", "cast(id * 10 AS double) AS b")
    joined = facts.join(F.broadcast(dim), "k").withColumn(
        "words", F.array(F.lit("w"), F.col("k").cast("string"))
    )
    assembled = VectorAssembler(inputCols=["a", "b"], outputCol="features").transform(joined)
    return (
        HashingTF(numFeatures=32, inputCol="words", outputCol="tf")
        .transform(assembled)
        .select("id", "features", "tf")
    )


@masters("local", "connect", "cluster")
@pytest.mark.parametrize("np_", [1, 2, -3])
def test_a_computed_dataframe_is_staged_and_every_row_reaches_one_rank_once(pipeline, tmp_path, np_):
    stage = str(tmp_path / "stage")
    out = BarrierRunner(np_, timeout=240, staging_dir=stage).run_with_data(
        pipeline, h.staged_shard, stage, return_all=True
    )
    ids = sorted(i for o in out for i in o["ids"])
    assert ids == list(range(ROWS))  # each row once: none lost, none twice
    sizes = [len(o["ids"]) for o in out]
    assert max(sizes) - min(sizes) <= 1 and len({o["steps"] for o in out}) == 1  # equal batches
    for o in out:  # each row's vectors stayed with it: features = (id, 10 * (id % 5))
        assert o["features"] == [[float(i), 10.0 * (i % 5)] for i in o["ids"]]
        assert o["tf_width"] == 32 and set(o["tf_sums"]) == {2.0}  # the sparse vectors, dense
        assert len(o["staged"]) == 1 and o["staged"][0].startswith("run-")  # read from the staged copy
    assert os.listdir(stage) == []  # removed with the run


@masters("local", "cluster")
def test_a_staged_run_killed_mid_epoch_resumes_at_the_next_unseen_batch(spark, tmp_path):
    """The restart reads the same staged files (written once per run), so the saved position
    means the same rows."""
    logs, stage = tmp_path / "ids", tmp_path / "stage"
    logs.mkdir()
    ids = spark.range(0, 200, 1, 3).selectExpr("id", "cast(id * 0.5 AS double) AS x").where("x >= 0")
    runner = BarrierRunner(
        2, timeout=300, max_restarts=1, checkpoint_dir=str(tmp_path / "ckpt"), staging_dir=str(stage)
    )
    out = runner.run_with_data(ids, sh.ids_with_a_crash, str(logs), 9, return_all=True)
    assert [o["resumed_at"] for o in out] == [10, 10] and all(o["restored"] for o in out)
    seen = sorted(int(i) for p in logs.glob("*.ids") for i in p.read_text().split())
    assert seen == list(range(200))  # every sample of the epoch exactly once, over both attempts
    assert os.listdir(stage) == []


def test_rows_out_of_a_shuffle_take_the_exact_deal_when_a_run_may_resume_another(spark, tmp_path, caplog):
    """A shuffle's output order may differ between runs: with checkpoint_dir (a position saved by
    another run) or streams=, such rows are dealt by content, never staged."""
    stage = str(tmp_path / "stage")
    shuffled = spark.range(0, 100).selectExpr("id", "cast(id AS double) AS x").repartition(3)
    with caplog.at_level("INFO", logger="sparkml_dist"):
        out = BarrierRunner(
            2, timeout=240, checkpoint_dir=str(tmp_path / "ckpt"), staging_dir=stage
        ).run_with_data(shuffled, h.shard_summary, return_all=True)
    assert sorted(v for o in out for v in o["values"]) == [float(i) for i in range(100)]
    assert "come out of a shuffle" in caplog.text
    assert not os.path.exists(stage)  # nothing was written
    # the exact deal: the same shards however the input is partitioned
    again = BarrierRunner(2, timeout=240, read_files=False).run_with_data(
        shuffled.repartition(5), h.shard_summary, return_all=True
    )
    assert [o["values"] for o in again] == [o["values"] for o in out]


def test_a_staging_dir_that_cannot_be_written_is_named_with_the_fix(spark, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    df = spark.range(0, 10).selectExpr("id", "id * 2 AS y")
    with pytest.raises(ConfigurationError, match=r"staging_dir=.*a-file.*read_files=False"):
        BarrierRunner(2, timeout=120, staging_dir=str(blocker / "sub")).run_with_data(df, h.shard_columns)
    with pytest.raises(ConfigurationError, match="staging_dir must be a directory path"):
        BarrierRunner(2, staging_dir="")
