"""The chief's programs of TensorFlow's parameter-server tutorial, as a user writes them (imported by
rank processes too): the runner gives every rank its ``TF_CONFIG``, nothing else changes.

* :func:`keras_fit`: ``model.fit`` on a ``DatasetCreator`` under ``ParameterServerStrategy``;
* :func:`custom_loop`: a ``ClusterCoordinator`` scheduling a ``tf.function`` step on per-worker
  datasets, and beside it one process's plain loop over the same batches from the same weights;
* ``kill=(role, index)``: the chief kills that role's process (the one listening on its
  ``TF_CONFIG`` address) after the first epoch, as a lost machine would.
"""

import json
import os

import numpy as np

FEATURES, ROWS, BATCH = 4, 256, 16
TRUE_W = np.array([[1.0], [2.0], [-1.0], [0.5]], "float32")


def data(pipeline: int = 0):
    rng = np.random.default_rng(pipeline)
    x = rng.normal(size=(ROWS, FEATURES)).astype("float32")
    return x, x @ TRUE_W


def _kill(role_index):
    """The process serving ``role_index``'s TF_CONFIG address, killed with SIGKILL (its pid)."""
    import signal

    import psutil

    role, index = role_index
    port = int(json.loads(os.environ["TF_CONFIG"])["cluster"][role][index].rsplit(":", 1)[1])
    for conn in psutil.net_connections("tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
            os.kill(conn.pid, signal.SIGKILL)
            return conn.pid
    raise AssertionError(f"nothing listens on {role} {index}'s port {port}")


def keras_fit(epochs: int = 3, steps: int = 20, kill=None):
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(FEATURES,))])
        model.compile(tf.keras.optimizers.SGD(0.05), loss="mse")

    def dataset_fn(input_context):
        x, y = data(input_context.input_pipeline_id)
        return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(ROWS).batch(BATCH).repeat()

    killed = []

    class KillAfterTheFirstEpoch(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if kill is not None and epoch == 0:
                killed.append(_kill(kill))

    history = model.fit(
        tf.keras.utils.experimental.DatasetCreator(dataset_fn), epochs=epochs, steps_per_epoch=steps,
        verbose=0, callbacks=[KillAfterTheFirstEpoch()],
    )  # fmt: skip
    return {
        "loss": history.history["loss"],
        "tf_config": json.loads(os.environ["TF_CONFIG"]),
        "killed": killed,
        "pid": os.getpid(),
    }


def custom_loop(steps: int = 24):
    """The tutorial's custom loop; with one worker its steps run in order, so the weights equal one
    process's plain SGD over the same batches from the same starting weights (also returned)."""
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(FEATURES,))])
        optimizer = tf.keras.optimizers.SGD(0.05)
    start = [w.copy() for w in model.get_weights()]

    def dataset_fn(input_context):
        x, y = data(input_context.input_pipeline_id)
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).repeat()

    @tf.function
    def per_worker_dataset_fn():
        return strategy.distribute_datasets_from_function(dataset_fn)

    iterator = iter(coordinator.create_per_worker_dataset(per_worker_dataset_fn))

    @tf.function
    def step_fn(it):
        def replica_fn(batch):
            x, y = batch
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica_fn, args=(next(it),)), None)

    for _ in range(steps):
        coordinator.schedule(step_fn, args=(iterator,))
    coordinator.join()
    return {
        "weights": [w.tolist() for w in model.get_weights()],
        "one_process": [w.tolist() for w in _one_process(start, steps)],
        "iterations": int(optimizer.iterations.numpy()),
    }


def _one_process(start, steps: int):
    """Plain SGD in this process, no strategy: the batches worker 0's pipeline gives, in order."""
    import tensorflow as tf

    w, b = (tf.Variable(v) for v in start)
    x, y = data(0)
    for s in range(steps):
        i = (s * BATCH) % ROWS
        xb, yb = x[i : i + BATCH], y[i : i + BATCH]
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(xb @ w + b - yb))
        gw, gb = tape.gradient(loss, [w, b])
        w.assign_sub(0.05 * gw)
        b.assign_sub(0.05 * gb)
    return [w.numpy(), b.numpy()]
