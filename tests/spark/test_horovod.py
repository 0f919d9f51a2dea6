"""backend="horovod" and the drop-in HorovodRunner, with real Horovod (built by `make horovod`).

Runs in every Spark mode of the suite (local[2], Spark Connect, local-cluster); np < 0 and the
pure parts are in tests/unit/test_horovod_parts.py. Horovod is a requirement of the suite:
`make test` installs it.
"""

import time

import pytest
from pyspark.sql import functions as F

from sparkml_dist import WorkerError
from sparkml_dist.horovod import HorovodRunner
from sparkml_dist.runner import BarrierRunner
from tests.conftest import masters
from tests.support import horovod_helpers as hh
from tests.support.runner_checks import assert_no_rank_left


@masters("local", "cluster")
def test_collectives_give_the_right_numbers_on_every_rank(spark):
    out = BarrierRunner(2, backend="horovod", timeout=180).run(hh.collectives, return_all=True)
    assert [o["rank"] for o in out] == [0, 1]
    for o in out:
        assert o["gloo"] and o["size"] == 2
        assert o["sum"] == 3.0 and o["avg"] == 1.5  # 1 + 2, and their mean
        assert o["gathered"] == [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]  # rank 0: 1 row, rank 1: 2 rows
        assert o["broadcast"] == [0.0, 10.0, 20.0] and o["object"] == {"from": 0}
    # both tasks run on this machine: one host, local ranks 0 and 1 (as horovodrun places them)
    assert sorted(o["local_rank"] for o in out) == [0, 1]
    assert {(o["local_size"], o["cross_size"], o["cross_rank"]) for o in out} == {(2, 1, 0)}
    assert_no_rank_left()


@masters("local")
def test_distributed_optimizer_converges_on_digits_and_rank0_weights_come_back(spark):
    res = HorovodRunner(np=2, timeout=300).run(hh.train_digits, epochs=12)
    losses = res["losses"]
    assert losses[-1] < 0.25 * losses[0], losses  # it learned
    assert res["accuracy"] > 0.9
    assert len(set(res["checks"])) == 1  # every rank ended with the same weights
    state = res["state"]
    assert sorted(state) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert tuple(state["0.weight"].shape) == (32, 64)
    # the weights that came back are rank 0's final weights: same checksum
    assert float(sum(v.double().sum() for v in state.values())) == pytest.approx(res["checks"][0])


@masters("local", "cluster")
@pytest.mark.parametrize("how", ["raise", "kill"])
def test_a_failing_rank_is_reported_with_its_traceback_and_nothing_is_left_running(spark, how):
    t = time.time()
    with pytest.raises(WorkerError) as info:
        HorovodRunner(np=2, timeout=120).run(hh.fail_on, rank_to_fail=1, how=how)
    assert time.time() - t < 60
    err = info.value
    assert err.rank == 1, str(err)  # the root cause, not rank 0's lost-peer symptom
    if how == "raise":
        assert err.exit_code == 1
        assert "ValueError: injected horovod failure at step 2" in err.worker_traceback
    else:
        assert err.exit_code == -9 and "killed by signal 9" in str(err)
    assert_no_rank_left()


@masters("local")
def test_a_rank_that_never_calls_hvd_init_times_out_at_the_rendezvous(spark):
    with pytest.raises(WorkerError, match=r"did not reach the rendezvous \(hvd.init\(\)\)"):
        BarrierRunner(2, backend="horovod", start_timeout=8, timeout=120).run(hh.sleep_before_init, 0, 3600)
    assert_no_rank_left()


@masters("local", "cluster")
def test_the_seed_documents_example_runs_unchanged(spark):
    from examples import horovod_seed_example as example

    loss, accuracy = example.hr.run(example.train)
    assert accuracy > 0.9 and loss < 0.5


@masters("local")
def test_driver_log_verbosity(spark):
    lines = []
    assert HorovodRunner(np=2, log_sink=lines.append).run(hh.talk) == 0
    # log_callback_only: what the ranks sent with log_to_driver, nothing they printed
    assert sorted(lines) == ["[rank 0] callback line from rank 0\n", "[rank 1] callback line from rank 1\n"]
    lines.clear()
    HorovodRunner(np=2, driver_log_verbosity="all", log_sink=lines.append).run(hh.talk, n_lines=2)
    for r in (0, 1):
        assert f"[rank {r}] plain print 1 from rank {r}\n" in lines
        assert f"[rank {r}] callback line from rank {r}\n" in lines


def test_run_with_data_gives_each_rank_its_shard(spark):
    df = spark.range(0, 500).select(F.col("id").cast("double").alias("x"))
    gathered = HorovodRunner(np=2).run_with_data(df, hh.shard_rows)
    assert sorted(v for part in gathered for v in part) == [float(i) for i in range(500)]
    assert min(len(p) for p in gathered) > 150


def test_np_zero_uses_every_task_slot(spark):
    with pytest.warns(FutureWarning, match="deprecated"):
        hr = HorovodRunner(np=0)
    assert hr.run(hh.collectives)["size"] == 2
