"""Model parallelism on Spark barrier tasks: pipeline stages and FSDP2 through BarrierRunner."""

import pytest

from sparkml_dist import ConfigurationError, InsufficientResourcesError, WorkerError
from sparkml_dist._spark_env import ClusterMemory
from sparkml_dist.plan import model_bytes
from sparkml_dist.runner import BarrierRunner
from tests.conftest import masters
from tests.support import parallel_helpers as ph
from tests.support.runner_checks import assert_no_rank_left

STEPS, ROWS = 4, 32


@pytest.fixture(scope="module")
def unsplit():
    return ph.train_unsplit(STEPS, ROWS)


def max_diff(a, b):
    assert list(a) == list(b)
    return max((a[k] - b[k]).abs().max().item() for k in a)


@masters("local")
@pytest.mark.parametrize("schedule, balance", [("simple", "memory"), ("interleaved", "compute")])
def test_two_stages_on_two_barrier_tasks_train_like_one_process(spark, unsplit, schedule, balance):
    state, losses = unsplit
    out = BarrierRunner(2, spark=spark, timeout=240).run(
        ph.train_pipeline, STEPS, ROWS, 2, schedule, balance=balance, return_all=True
    )
    assert max_diff(state, out[0]["state"]) <= 1e-5
    assert out[0]["split"] == out[1]["split"] and out[1]["state"] is None
    assert out[1]["losses"] == pytest.approx(losses, abs=1e-5)
    assert_no_rank_left()


def test_the_planner_refuses_a_model_whole_and_admits_it_split(spark):
    cap = ClusterMemory.from_spark(spark).python_bytes_per_executor
    params = int(cap * 0.75 / 4)  # fp32 with gradients: 1.5x the cap whole, 0.75x split in two
    whole = model_bytes(params, backprop=True)
    split = model_bytes(params, backprop=True, stages=2)
    assert whole > cap > split
    with pytest.raises(InsufficientResourcesError, match="one model needs about"):
        BarrierRunner(2, spark=spark, model_bytes=whole).run(ph.train_pipeline, 1, ROWS, 2, "simple")
    out = BarrierRunner(2, spark=spark, model_bytes=split, timeout=240).run(
        ph.train_pipeline, 1, ROWS, 2, "simple"
    )
    assert len(out["split"]) == 2


@masters("local", "cluster")
def test_fsdp2_shards_a_model_over_barrier_tasks(spark, unsplit):
    state, _ = unsplit
    out = BarrierRunner(2, spark=spark, timeout=240).run(ph.train_fsdp, STEPS, ROWS, return_all=True)
    assert max_diff(state, out[0]["state"]) <= 1e-5  # sharded training = one process on the whole batch
    total = sum(v.numel() for v in state.values())
    assert [o["held"] for o in out] != [total, total] and sum(o["held"] for o in out) == total
    assert_no_rank_left()


@masters("local")
def test_a_pipeline_fed_from_a_dataframe_trains_like_one_process_on_the_same_rows(spark):
    """replicas=1: both stages' ranks read the same rows in the same order; the weights equal one
    process trained on those rows. Without replicas= each rank gets its own rows: refused."""
    pdf = ph.frame(96)
    df = spark.createDataFrame(pdf)
    out = BarrierRunner(2, spark=spark, timeout=240).run_with_data(
        df, ph.pipeline_from_shard, 4, 16, return_all=True, replicas=1
    )
    assert (
        out[0]["ids"] == out[1]["ids"] and out[0]["digest"] == out[1]["digest"] and len(out[0]["ids"]) == 96
    )
    reference = ph.train_unsplit_on(pdf, out[0]["ids"], 4, 16)
    assert max_diff(reference, out[0]["state"]) <= 1e-5
    with pytest.raises(WorkerError, match="the ranks of a pipeline replica must be given the same batch"):
        BarrierRunner(2, spark=spark, timeout=240).run_with_data(df, ph.pipeline_from_shard, 4, 16)
    assert_no_rank_left()


@masters("local")
def test_two_stages_by_two_replicas_from_a_dataframe_read_disjoint_halves_per_replica(spark):
    pdf = ph.frame(64, seed=1)
    out = BarrierRunner(-4, timeout=300).run_with_data(
        spark.createDataFrame(pdf), ph.pipeline_from_shard, 2, 8, 2, return_all=True, replicas=2
    )
    assert [o["replica"] for o in out] == [0, 0, 1, 1]  # the pipeline's layout: replica = rank // 2
    assert out[0]["ids"] == out[1]["ids"] and out[2]["ids"] == out[3]["ids"]  # same rows, same order
    assert not set(out[0]["ids"]) & set(out[2]["ids"])  # the replicas' halves are disjoint
    assert sorted(out[0]["ids"] + out[2]["ids"]) == list(range(64))
    with pytest.raises(ConfigurationError, match="replicas must be a positive integer dividing np=4"):
        BarrierRunner(-4).run_with_data(spark.createDataFrame(pdf), ph.pipeline_from_shard, 1, 8, replicas=3)


@masters("local")
def test_fsdp2_fed_from_a_dataframe_trains_like_one_process_on_the_ranks_batches_together(spark):
    """FSDP2 wants each rank its own rows (run_with_data's default): two ranks of 8 rows a step
    equal one process stepping on those 16 rows."""
    pdf = ph.frame(64, seed=2)
    out = BarrierRunner(2, spark=spark, timeout=240).run_with_data(
        spark.createDataFrame(pdf), ph.fsdp_from_shard, 3, 8, return_all=True
    )
    assert not set(out[0]["ids"]) & set(out[1]["ids"])  # disjoint shards
    together = [i for step in range(3) for r in (0, 1) for i in out[r]["ids"][step * 8 : (step + 1) * 8]]
    reference = ph.train_unsplit_on(pdf, together, 3, 16)
    assert max_diff(reference, out[0]["state"]) <= 1e-5
