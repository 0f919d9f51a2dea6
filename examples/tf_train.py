"""A MultiWorkerMirroredStrategy training script, unchanged from a TF_CONFIG cluster's:
``sparkml-dist run --backend tensorflow --np 2 examples/tf_train.py -- --epochs 3``."""

import argparse
import os

import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()

strategy = tf.distribute.MultiWorkerMirroredStrategy()  # the cluster comes from TF_CONFIG
task = strategy.cluster_resolver.task_id
rng = np.random.default_rng(task)  # each worker its own rows
x = rng.normal(size=(256, 8)).astype("float32")
y = (x @ np.linspace(-1.0, 1.0, 8)).astype("float32")
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(32).with_options(options)

with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss="mse")
history = model.fit(data, epochs=args.epochs, verbose=0)
losses = history.history["loss"]
if task == 0:
    workers = strategy.cluster_resolver.cluster_spec().num_tasks("worker")
    print(
        f"final loss {losses[-1]:.4f} (first {losses[0]:.4f}) on {workers} workers, RANK {os.environ['RANK']}"
    )
