"""Rank functions for the Keras, TensorFlow and JAX backends (imported by executors too).

Each imports its framework inside, as a user's function does, and returns plain lists so the
results compare exactly on the driver.
"""

import json
import os

import numpy as np

FEATURES, ROWS_PER_RANK, BATCH = 6, 32, 8


def rank_data(rank: int, rows: int = ROWS_PER_RANK):
    """Rank ``rank``'s rows: a fixed linear target plus noise, different on every rank."""
    rng = np.random.default_rng(100 + rank)
    x = rng.normal(size=(rows, FEATURES)).astype("float32")
    y = (x @ np.arange(1, FEATURES + 1, dtype="float32") / FEATURES + 0.1 * rng.normal(size=rows)).astype(
        "float32"
    )
    return x, y


def global_batches(world: int, rows: int = ROWS_PER_RANK):
    """The rows one process sees when it trains on the ranks' batches side by side: step s's global
    batch is every rank's batch s, in rank order."""
    parts = [rank_data(r, rows) for r in range(world)]
    xs, ys = [], []
    for s in range(rows // BATCH):
        for x, y in parts:
            xs.append(x[s * BATCH : (s + 1) * BATCH])
            ys.append(y[s * BATCH : (s + 1) * BATCH])
    return np.concatenate(xs), np.concatenate(ys)


def _keras_model(keras, seed: int):
    import random

    random.seed(seed)  # Keras's initializers draw their seeds from Python's generator
    np.random.seed(seed)
    return keras.Sequential(
        [keras.Input((FEATURES,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)]
    )


def weights_of(model):
    return [w.tolist() for w in model.get_weights()]


# ------------------------------------------------------------------ sparkml_dist.keras (torch)
def keras_fit(distributed=True, broadcast=True, seed_by_rank=False, epochs=2, passes=1):
    """Horovod's Keras program on sparkml_dist.keras: each rank fits its own rows."""
    import keras

    import sparkml_dist.keras as hvd

    hvd.init()
    model = _keras_model(keras, hvd.rank() if seed_by_rank else 0)
    opt = keras.optimizers.SGD(0.05, momentum=0.5)
    if distributed:
        opt = hvd.DistributedOptimizer(
            opt, backward_passes_per_step=passes, average_aggregated_gradients=True
        )
    model.compile(optimizer=opt, loss="mse")
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)] if broadcast else []
    callbacks.append(hvd.callbacks.MetricAverageCallback())
    x, y = rank_data(hvd.rank())
    history = model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0, callbacks=callbacks)
    return {
        "weights": weights_of(model),
        "loss": history.history["loss"],
        "backend": keras.backend.backend(),
        "optimizer": [type(model.optimizer).__name__, isinstance(model.optimizer, keras.optimizers.SGD)],
        "iterations": int(keras.ops.convert_to_numpy(model.optimizer.iterations)),
        "size": hvd.size(),
        "sum": float(hvd.allreduce(hvd.rank() + 1.0, op=hvd.Sum)),
        "mean": float(hvd.allreduce(np.float64(hvd.rank() + 1.0))),
        "gathered": hvd.allgather(np.arange(hvd.rank() + 1)).tolist(),
        "broadcast": hvd.broadcast(np.array([hvd.rank() * 10.0, 7.0]), root_rank=1).tolist(),
    }


def keras_reference(world: int, epochs=2):
    """One process (a world of one) training the same model on the ranks' global batches."""
    import keras

    import sparkml_dist.keras as hvd

    hvd.init()
    model = _keras_model(keras, 0)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.5)), loss="mse")
    x, y = global_batches(world)
    model.fit(x, y, batch_size=BATCH * world, epochs=epochs, shuffle=False, verbose=0)
    return weights_of(model)


def keras_warmup(initial_lr=0.2, warmup_epochs=2):
    """The learning rate each batch starts with, under LearningRateWarmupCallback."""
    import keras

    import sparkml_dist.keras as hvd

    hvd.init()
    seen = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen.append(float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))

    model = _keras_model(keras, 0)
    model.compile(
        optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(initial_lr, momentum=0.9)), loss="mse"
    )
    x, y = rank_data(hvd.rank())
    warmup = hvd.callbacks.LearningRateWarmupCallback(initial_lr, warmup_epochs=warmup_epochs)
    model.fit(
        x,
        y,
        batch_size=BATCH,
        epochs=warmup_epochs + 1,
        shuffle=False,
        verbose=0,
        callbacks=[warmup, Record()],
    )
    return {"lrs": seen, "momentum": float(model.optimizer.momentum)}


def keras_on_data(epochs=2):
    """sparkml_dist.keras fed by run_with_data: the rank's shard as a PyDataset."""
    import keras

    import sparkml_dist.keras as hvd
    from sparkml_dist.runner import shard

    hvd.init()
    data = shard().to_keras(batch_size=BATCH, x=[f"f{i}" for i in range(FEATURES)], y="label", seed=3)
    model = _keras_model(keras, hvd.rank())
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse")
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback()]
    history = model.fit(data, epochs=epochs, verbose=0, callbacks=callbacks)
    return {
        "weights": weights_of(model),
        "loss": history.history["loss"],
        "steps": len(data),
        "rows": shard().num_rows,
    }


def keras_mismatched_broadcasts():
    """Each rank passes values that do not match the other's: every call is refused on both ranks
    (Horovod: "Mismatched BROADCAST tensor shapes"); the refusals, by case."""
    import keras

    import sparkml_dist.keras as hvd

    hvd.init()
    rank = hvd.rank()
    cases = {
        "shape": lambda: hvd.broadcast(np.zeros((2, 3) if rank == 0 else (3, 2), "float32"), 0),
        "dtype": lambda: hvd.broadcast(np.array([0.0, 1.0, 2.0], "float32" if rank == 0 else "int32"), 0),
        "count": lambda: hvd.broadcast(np.zeros(3 if rank == 0 else 4, "float32"), 0),
        "allreduce": lambda: hvd.allreduce(np.zeros(3 if rank == 0 else 4, "float32")),
        "variables": lambda: hvd.broadcast_variables(
            keras.Sequential([keras.Input((4,)), keras.layers.Dense(3 if rank == 0 else 4)]).variables, 0
        ),
        "alike": lambda: hvd.broadcast(np.full(3, float(rank), "float32"), 0).tolist(),
    }
    out = {}
    for case, call in cases.items():
        try:
            out[case] = call()
        except Exception as exc:  # noqa: BLE001 - the refusal is what the test reads
            out[case] = f"{type(exc).__name__}: {exc}"
    return out


def keras_imported_first():
    """A program that imports keras before sparkml_dist.keras, under the environment's backend."""
    import keras  # noqa: F401

    import sparkml_dist.keras as hvd

    hvd.init()
    return hvd.rank()


# ------------------------------------------------------------------ backend="tensorflow"
def tf_fit(fail_rank=None, marker=None):
    """tf.keras under MultiWorkerMirroredStrategy; ``fail_rank`` raises (once, with ``marker``)."""
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rank = int(os.environ["RANK"])
    if fail_rank == rank and (marker is None or not os.path.exists(marker)):
        if marker is not None:
            open(marker, "w").close()
        raise ValueError(f"bad batch on rank {rank}")
    x, y = rank_data(rank)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).with_options(options)
    with strategy.scope():
        model = tf.keras.Sequential(
            [
                tf.keras.Input((FEATURES,)),
                tf.keras.layers.Dense(8, activation="tanh"),
                tf.keras.layers.Dense(1),
            ]
        )
        model.compile(optimizer=tf.keras.optimizers.SGD(0.05), loss="mse")
    model.fit(data, epochs=2, verbose=0)
    total = strategy.reduce("SUM", strategy.run(lambda: tf.constant(float(rank + 1))), axis=None)
    return {
        "workers": strategy.cluster_resolver.cluster_spec().num_tasks("worker"),
        "replicas": strategy.num_replicas_in_sync,
        "weights": weights_of(model),
        "sum": float(total),
        "keras": type(model).__module__.split(".")[0],
        "ports": [int(w.rsplit(":", 1)[1]) for w in json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"]],
    }


def tf_in_runner_strategy(epochs=1):
    """For MirroredStrategyRunner without use_custom_strategy: the scope is already open."""
    import tensorflow as tf

    strategy = tf.distribute.get_strategy()
    x, y = rank_data(int(os.environ["RANK"]))
    model = tf.keras.Sequential([tf.keras.Input((FEATURES,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    model.fit(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).with_options(options),
        epochs=epochs,
        verbose=0,
    )
    return {
        "strategy": type(strategy).__name__,
        "replicas": strategy.num_replicas_in_sync,
        "weights": weights_of(model),
    }


def tf_on_data(epochs=2):
    """tf.keras fed by run_with_data: the shard as a tf.data.Dataset, auto-sharding off."""
    import tensorflow as tf

    from sparkml_dist.runner import shard

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    data = shard().to_tf_dataset(batch_size=BATCH, x=[f"f{i}" for i in range(FEATURES)], y="label")
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((FEATURES,)), tf.keras.layers.Dense(1)])
        model.compile(optimizer=tf.keras.optimizers.SGD(0.05), loss="mse")
    history = model.fit(data, epochs=epochs, verbose=0)
    return {
        "weights": weights_of(model),
        "loss": history.history["loss"],
        "rows": shard().num_rows,
        "batches": int(data.cardinality()),
        "auto_shard_off": data.options().experimental_distribute.auto_shard_policy
        == tf.data.experimental.AutoShardPolicy.OFF,
    }


def keras3_on_tensorflow():
    """Keras 3 (not tf.keras) fit under MultiWorkerMirroredStrategy: refused with the fix."""
    import keras
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    x, y = rank_data(int(os.environ["RANK"]))
    model.fit(x, y, epochs=1, verbose=0)


def tf_strategy_under_torch():
    """A MultiWorkerMirroredStrategy program launched on the torch backend (no TF_CONFIG)."""
    import tensorflow as tf

    tf.distribute.MultiWorkerMirroredStrategy()
    return "trained alone"


# ------------------------------------------------------------------ backend="jax"
def jax_collectives():
    import jax
    import jax.numpy as jnp
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()), ("ranks",))
    local = np.array([jax.process_index() + 1.0], dtype="float32")
    spread = jax.make_array_from_process_local_data(NamedSharding(mesh, P("ranks")), local)
    total = jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, P()))(spread)
    again = None
    jax.distributed.initialize()  # a program's own call: harmless once the runner has initialized
    try:
        jax.distributed.initialize(num_processes=jax.process_count(), process_id=jax.process_index() + 5)
    except Exception as exc:  # noqa: BLE001 - the refusal is what the test reads
        again = str(exc)
    return {
        "count": jax.process_count(),
        "index": jax.process_index(),
        "devices": len(jax.devices()),
        "psum": float(total),
        "gathered": multihost_utils.process_allgather(local).ravel().tolist(),
        "again": again,
    }


def jax_keras_data_parallel(epochs=2, on_data=False):
    """Keras 3 on JAX with keras.distribution.DataParallel over the ranks' processes."""
    import keras

    keras.distribution.initialize()  # reads KERAS_DISTRIBUTION_*: the runner's coordinator
    distribution = keras.distribution.DataParallel(devices=keras.distribution.list_devices())
    distribution.auto_shard_dataset = False  # each process brings its own rows
    keras.distribution.set_distribution(distribution)
    model = _keras_model(keras, 0)  # the same start everywhere: JAX checks replicated values agree
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    if on_data:
        from sparkml_dist.runner import shard

        data = shard().to_keras(batch_size=BATCH, x=[f"f{i}" for i in range(FEATURES)], y="label")
        history = model.fit(data, epochs=epochs, verbose=0)
    else:
        x, y = rank_data(int(os.environ["RANK"]))
        history = model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0)
    return {
        "backend": keras.backend.backend(),
        "devices": len(keras.distribution.list_devices()),
        "weights": weights_of(model),
        "loss": history.history["loss"],
    }


def jax_keras_as_the_guide_writes_it(epochs=2):
    """Keras 3's distribution guide for one process with several devices, unchanged: no
    ``keras.distribution.initialize()`` call, no seed set, the initial weights drawn by Keras."""
    import keras

    distribution = keras.distribution.DataParallel(devices=keras.distribution.list_devices())
    distribution.auto_shard_dataset = False  # each process brings its own rows
    keras.distribution.set_distribution(distribution)
    model = keras.Sequential(
        [keras.Input((FEATURES,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)]
    )
    first = weights_of(model)
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    x, y = rank_data(int(os.environ["RANK"]))
    model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0)
    return {"first": first, "weights": weights_of(model)}


def keras_load_model(path):
    """A model saved with its Adam state, loaded by hvd.load_model: the optimizer distributed, its
    state kept; the same file loads as a plain Keras model too."""
    import keras

    import sparkml_dist.keras as hvd
    from sparkml_dist.keras._optimizer import _Averaging

    hvd.init()
    model = _keras_model(keras, 0)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    x, y = rank_data(hvd.rank())
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    model.save(path)
    before = [keras.ops.convert_to_numpy(v) for v in model.optimizer.variables]
    loaded = hvd.load_model(path)
    after = [keras.ops.convert_to_numpy(v) for v in loaded.optimizer.variables]
    loaded.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)  # and it trains on
    return {
        "class": type(loaded.optimizer).__name__,
        "distributed": isinstance(loaded.optimizer, _Averaging),
        "state": len(before) > 2 and all(np.array_equal(a, b) for a, b in zip(before, after)),
        "plain": isinstance(keras.saving.load_model(path).optimizer, _Averaging),
    }
