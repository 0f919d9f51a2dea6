"""Keras (sparkml_dist.keras), TensorFlow and JAX programs as Spark barrier jobs, fed a DataFrame.

The frameworks' own checks (weights equal to one process's, refusals, restarts) run as local
processes in tests/unit/test_keras.py and test_framework_backends.py; here each backend runs once
on Spark, and once more where the master can change it (separate executor JVMs, Spark Connect).
"""

import numpy as np
import pandas as pd
import pytest

from sparkml_dist.runner import BarrierRunner
from sparkml_dist.tensorflow_distributor import MirroredStrategyRunner
from tests.conftest import masters
from tests.support import framework_helpers as fh

ROWS = 101  # not a multiple of anything: the ranks' shards differ by a row


@pytest.fixture(scope="module")
def table(spark):
    rng = np.random.default_rng(7)
    x = rng.normal(size=(ROWS, fh.FEATURES))
    frame = pd.DataFrame({f"f{i}": x[:, i] for i in range(fh.FEATURES)})
    frame["label"] = x @ np.arange(1, fh.FEATURES + 1) / fh.FEATURES
    return spark.createDataFrame(frame).repartition(3)


@masters("local", "connect")
def test_keras_with_sparkml_dist_keras_trains_on_each_ranks_shard(table):
    out = BarrierRunner(2, timeout=300).run_with_data(table, fh.keras_on_data, return_all=True)
    assert sorted(o["rows"] for o in out) == [50, 51] and out[0]["steps"] == out[1]["steps"] == 7
    assert out[0]["weights"] == out[1]["weights"]
    assert out[0]["loss"][-1] < out[0]["loss"][0]  # it learned


@masters("local", "cluster")
def test_tf_keras_under_the_strategy_trains_on_a_tf_dataset_of_each_shard(table):
    out = BarrierRunner(2, backend="tensorflow", timeout=300).run_with_data(
        table, fh.tf_on_data, return_all=True
    )
    assert sorted(o["rows"] for o in out) == [50, 51]
    assert out[0]["batches"] == out[1]["batches"] == 7  # equal steps: no rank waits alone
    assert out[0]["auto_shard_off"]  # the strategy does not split the shard again
    assert out[0]["weights"] == out[1]["weights"]
    assert out[0]["loss"][-1] < out[0]["loss"][0]


@masters("local")
def test_keras_data_parallel_on_jax_trains_on_each_ranks_shard(table):
    out = BarrierRunner(2, backend="jax", timeout=300).run_with_data(
        table, fh.jax_keras_data_parallel, on_data=True, return_all=True
    )
    assert out[0]["backend"] == "jax" and out[0]["devices"] == 2
    assert out[0]["weights"] == out[1]["weights"]


@masters("local")
def test_mirrored_strategy_runner_runs_its_workers_as_spark_tasks(spark):
    out = MirroredStrategyRunner(num_slots=2, use_gpu=False, timeout=300).run(fh.tf_in_runner_strategy)
    assert out["strategy"] == "CollectiveAllReduceStrategy" and out["replicas"] == 2


@masters("local")
def test_roles_that_need_more_tasks_than_the_slots_are_refused_before_any_job(spark):
    from sparkml_dist.errors import InsufficientResourcesError
    from tests.support import ps_helpers

    with pytest.raises(InsufficientResourcesError) as err:  # local[2]: 2 slots for 4 tasks
        BarrierRunner(2, backend="tensorflow", roles={"ps": 1}, timeout=60).run(ps_helpers.keras_fit)
    said = str(err.value)
    assert "1 chief + 2 workers + 1 parameter server = 4 tasks" in said and "lower np" in said, said
