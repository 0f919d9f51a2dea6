"""Model parallelism on Spark barrier tasks: pipeline stages and FSDP2 through BarrierRunner."""

import pytest

from sparkml_dist import InsufficientResourcesError
from sparkml_dist._spark_env import ClusterMemory
from sparkml_dist.plan import model_bytes
from sparkml_dist.runner import BarrierRunner
from tests.support import parallel_helpers as ph
from tests.support.runner_checks import assert_no_rank_left

STEPS, ROWS = 4, 32


@pytest.fixture(scope="module")
def unsplit():
    return ph.train_unsplit(STEPS, ROWS)


def max_diff(a, b):
    assert list(a) == list(b)
    return max((a[k] - b[k]).abs().max().item() for k in a)


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


def test_fsdp2_shards_a_model_over_barrier_tasks(spark, unsplit):
    state, _ = unsplit
    out = BarrierRunner(2, spark=spark, timeout=240).run(ph.train_fsdp, STEPS, ROWS, return_all=True)
    assert max_diff(state, out[0]["state"]) <= 1e-5  # sharded training = one process on the whole batch
    total = sum(v.numel() for v in state.values())
    assert [o["held"] for o in out] != [total, total] and sum(o["held"] for o in out) == total
    assert_no_rank_left()
