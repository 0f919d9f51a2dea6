"""backend="tensorflow" and backend="jax": their rank environments (pure), and real TensorFlow and
JAX programs run by the runner's ranks as local processes (np < 0); the Spark modes are in
tests/spark/test_frameworks.py."""

import json
import sys
import time

import pytest

from sparkml_dist import WorkerError
from sparkml_dist.errors import ConfigurationError
from sparkml_dist.host import network
from sparkml_dist.runner import BarrierRunner, backends
from sparkml_dist.runner.backends.base import after_import
from sparkml_dist.tensorflow_distributor import MirroredStrategyRunner
from tests.support import framework_helpers as fh

PEERS = [
    {"host": "10.0.0.1", "port": 4001, "gpus": None},
    {"host": "10.0.0.2", "port": 4002, "gpus": None},
    {"host": "10.0.0.1", "port": 4003, "gpus": None},
]


def test_each_rank_gets_a_tf_config_naming_every_worker_and_itself():
    tf = backends.get("tensorflow")
    assert tf.every_rank_listens  # every worker serves its own address
    for rank in range(3):
        env, extra = tf.rank_env(rank, PEERS, None, 600)
        config = json.loads(env["TF_CONFIG"])
        assert config["cluster"] == {"worker": ["10.0.0.1:4001", "10.0.0.2:4002", "10.0.0.1:4003"]}
        assert config["task"] == {"type": "worker", "index": rank} and extra == {}
        assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == "3"
        assert "MASTER_ADDR" not in env  # torch's store is not there to join
    assert json.loads(tf.rank_env(2, PEERS, None, 600)[0]["TF_CONFIG"])  # LOCAL_RANK by host:
    assert tf.rank_env(2, PEERS, None, 600)[0]["LOCAL_RANK"] == "1"
    v6 = [{"host": "fd00::1", "port": 5, "gpus": None}]
    assert json.loads(tf.rank_env(0, v6, None, 600)[0]["TF_CONFIG"])["cluster"]["worker"] == ["[fd00::1]:5"]
    assert tf.env_defaults["TF_USE_LEGACY_KERAS"] == "1"


def test_jax_ranks_get_rank_zero_as_coordinator_and_keras_distribution_variables():
    jax = backends.get("jax")
    assert not jax.every_rank_listens
    env, _ = jax.rank_env(1, PEERS, None, 600)
    assert env["KERAS_DISTRIBUTION_JOB_ADDRESSES"] == "10.0.0.1:4001"
    assert env["KERAS_DISTRIBUTION_NUM_PROCESSES"] == "3" and env["KERAS_DISTRIBUTION_PROCESS_ID"] == "1"
    assert jax.env_defaults == {"KERAS_BACKEND": "jax"}
    assert backends.get("torch").env_defaults == {"KERAS_BACKEND": "torch"}


def test_after_import_runs_once_the_module_is_imported(tmp_path, monkeypatch):
    (tmp_path / "late_module_x.py").write_text("VALUE = 41\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    after_import("late_module_x", lambda m: seen.append(m.VALUE + 1))
    assert seen == []  # not imported by the hook itself
    import late_module_x  # noqa: F401

    assert seen == [42]
    after_import("late_module_x", lambda m: seen.append("now"))  # already imported: at once
    assert seen == [42, "now"]
    monkeypatch.delitem(sys.modules, "late_module_x")


def test_a_missing_framework_is_named_on_the_driver_with_its_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # Python's own way to make it unimportable
    with pytest.raises(ConfigurationError, match=r"sparkml_dist\[tensorflow\]"):
        BarrierRunner(-2, backend="tensorflow")
    with pytest.raises(ConfigurationError, match=r"tf_fit imports tensorflow.*sparkml_dist\[tensorflow\]"):
        BarrierRunner(-2).run(fh.tf_fit)


def _horovod_keras():
    import horovod.keras as hvd

    hvd.init()


def _horovod_tf_keras():
    from horovod.tensorflow.keras import DistributedOptimizer  # noqa: F401


def _horovod_tf():
    import horovod.tensorflow as hvd

    hvd.init()


@pytest.mark.parametrize(
    "fn,binding,first",
    [
        (_horovod_keras, "horovod.keras", "sparkml_dist.keras as hvd"),
        (_horovod_tf_keras, "horovod.tensorflow.keras", "sparkml_dist.keras as hvd"),
        (_horovod_tf, "horovod.tensorflow", "backend='tensorflow'"),
    ],
)
def test_horovods_tensorflow_bindings_are_refused_on_the_driver_naming_what_runs_instead(fn, binding, first):
    from sparkml_dist.horovod import HorovodRunner

    started = time.monotonic()
    with pytest.raises(ConfigurationError) as err:
        HorovodRunner(np=-2).run(fn)
    text = str(err.value)
    assert f"imports {binding}:" in text and "TensorFlow >= 2.16" in text
    assert first in text.split("Instead: ")[1].split(";")[0]  # the fix for this kind of program first
    assert "sparkml_dist.keras as hvd" in text and "backend='tensorflow'" in text
    assert time.monotonic() - started < 5  # on the driver: no rank was started


def test_a_horovod_built_with_tensorflow_runs_its_bindings_unrefused(tmp_path, monkeypatch):
    from sparkml_dist.runner.backends import needs as frameworks

    (tmp_path / "horovod" / "tensorflow").mkdir(parents=True)
    (tmp_path / "horovod" / "__init__.py").write_text("")
    (tmp_path / "horovod" / "tensorflow" / "mpi_lib.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
    assert not frameworks._horovod_tf_built()  # this Python's Horovod is torch-only
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "horovod", raising=False)
    assert frameworks._horovod_tf_built()
    frameworks._refuse_horovod_tf("train", {"horovod.keras"})  # no error


@pytest.mark.slow
def test_multi_worker_mirrored_strategy_trains_the_same_weights_on_both_workers():
    out = BarrierRunner(-2, backend="tensorflow", timeout=300).run(fh.tf_fit, return_all=True)
    for o in out:
        assert o["workers"] == 2 and o["replicas"] == 2 and o["sum"] == 3.0
        assert o["keras"] == "tf_keras"  # tf.keras is Keras 2 (TF_USE_LEGACY_KERAS=1)
        # each gRPC server bound a port no other process could be handed between the task's
        # close and its bind (a CI run lost one: "Could not start gRPC server")
        assert all(p in network.quiet_ports() for p in o["ports"]), o["ports"]
    assert out[0]["weights"] == out[1]["weights"]


@pytest.mark.slow
def test_a_failing_tensorflow_rank_is_named_and_a_restart_recovers(tmp_path):
    with pytest.raises(WorkerError) as info:
        BarrierRunner(-2, backend="tensorflow", timeout=300).run(fh.tf_fit, fail_rank=1)
    assert info.value.rank == 1 and "bad batch on rank 1" in str(info.value)
    assert "tf_fit" in str(info.value)  # the traceback reaches the user's frame
    marker = str(tmp_path / "failed-once")
    out = BarrierRunner(-2, backend="tensorflow", timeout=300, max_restarts=1).run(
        fh.tf_fit, fail_rank=1, marker=marker
    )
    assert out["workers"] == 2  # the second attempt trained


@pytest.mark.slow
def test_keras3_fit_under_the_strategy_is_refused_with_the_fix():
    with pytest.raises(WorkerError) as info:
        BarrierRunner(-2, backend="tensorflow", timeout=300).run(fh.keras3_on_tensorflow)
    text = str(info.value)
    assert "TF_USE_LEGACY_KERAS=1" in text and "tf.keras" in text and "PerReplica" in text


@pytest.mark.slow
def test_a_multi_worker_strategy_on_the_torch_backend_is_refused_not_run_alone():
    with pytest.raises(WorkerError) as info:
        BarrierRunner(-2, timeout=300).run(fh.tf_strategy_under_torch)
    assert "backend='tensorflow'" in str(info.value) and "cluster of one" in str(info.value)


@pytest.mark.slow
def test_mirrored_strategy_runner_opens_the_strategy_scope_for_the_function():
    runner = MirroredStrategyRunner(num_slots=2, local_mode=True, use_gpu=False, timeout=300)
    out = runner.run(fh.tf_in_runner_strategy, epochs=1)
    assert out["strategy"] == "CollectiveAllReduceStrategy" and out["replicas"] == 2
    with pytest.raises(ConfigurationError, match="num_slots"):
        MirroredStrategyRunner(num_slots=0)
    with pytest.raises(ConfigurationError, match="gpu_resource_name"):
        MirroredStrategyRunner(num_slots=2, gpu_resource_name="tpu")


@pytest.mark.slow
def test_jax_distributed_is_initialized_before_the_function():
    out = BarrierRunner(-2, backend="jax", timeout=300).run(fh.jax_collectives, return_all=True)
    for rank, o in enumerate(out):
        assert o["count"] == 2 and o["index"] == rank and o["devices"] == 2
        assert o["psum"] == 3.0 and o["gathered"] == [1.0, 2.0]
        assert "already initialized this rank as process" in o["again"]


@pytest.mark.slow
def test_keras_data_parallel_on_jax_ends_with_the_same_weights_on_every_process():
    out = BarrierRunner(-2, backend="jax", timeout=300).run(fh.jax_keras_data_parallel, return_all=True)
    assert out[0]["backend"] == "jax" and out[0]["devices"] == 2
    assert out[0]["weights"] == out[1]["weights"]
    assert out[0]["loss"] == out[1]["loss"]


@pytest.mark.slow
def test_keras_guides_program_without_initialize_draws_the_same_weights_on_every_rank():
    """No keras.distribution.initialize() call (Keras's guide for one process with several
    devices): the ranks drew different initial weights and JAX failed with 'passed to device_put is
    not the same on each process'; the runner now agrees Keras's seed as that call would."""
    out = BarrierRunner(-2, backend="jax", timeout=300).run(
        fh.jax_keras_as_the_guide_writes_it, return_all=True
    )
    assert out[0]["first"] == out[1]["first"]
    assert out[0]["weights"] == out[1]["weights"] and out[0]["weights"] != out[0]["first"]
    again = BarrierRunner(-2, backend="jax", timeout=300).run(fh.jax_keras_as_the_guide_writes_it)
    assert again["first"] != out[0]["first"]  # a new run, a new draw: the seed is the run's


@pytest.mark.slow
def test_a_ranks_batch_is_cut_over_its_own_replicas_in_order_each_part_within_a_row():
    """What a rank with several GPUs gives each of its replicas under the strategy (one replica
    per rank here: no GPU), checked on the dataset the distribution is built from."""
    import numpy as np
    import tensorflow as tf

    from sparkml_dist.runner.data.framework_data import _replica_batches

    ids = np.arange(13, dtype="float32")
    batches = tf.data.Dataset.from_tensor_slices((ids, ids * 2)).batch(5)  # 5, 5, 3 rows
    parts = [(a.numpy().tolist(), b.numpy().tolist()) for a, b in _replica_batches(batches, 3)]
    assert [len(a) for a, _ in parts] == [1, 2, 2, 1, 2, 2, 1, 1, 1]  # 3 parts a batch, sizes within 1
    assert [i for a, _ in parts for i in a] == ids.tolist()  # every row once, in order
    assert all(b == [2 * i for i in a] for a, b in parts)  # x and y cut alike
    assert _replica_batches(batches, 1) is batches
