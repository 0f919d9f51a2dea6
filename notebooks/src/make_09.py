"""Writes notebooks/09_keras_tensorflow_jax.ipynb (kept as code so reviews see plain diffs)."""

from nbwrite import write

HOROVOD_PROGRAM = """```python
import horovod.keras as hvd
hvd.init()

from keras import backend as K
import tensorflow as tf

# pin GPU to be used to process local rank (one GPU per process)
config = tf.ConfigProto()
config.gpu_options.allow_growth = True
config.gpu_options.visible_device_list = str(hvd.local_rank())
K.set_session(tf.Session(config=config))

# adjust learning rate based on number of GPUs
opt = keras.optimizers.Adadelta(1.0 * hvd.size())
# add Horovod Distributed Optimizer
opt = hvd.DistributedOptimizer(opt)

model.compile(loss=keras.losses.categorical_crossentropy, optimizer=opt, metrics=['accuracy'])
callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
model.fit(x_train, y_train, batch_size=batch_size, callbacks=callbacks, epochs=epochs,
          verbose=1 if hvd.rank() == 0 else 0, validation_data=(x_test, y_test))
```"""

cells = [
    (
        "md",
        "# Keras, TensorFlow and JAX on Spark\n\n"
        "The documents this project grew from train Keras models with Horovod, launched by "
        "`HorovodRunner(np=2).run(train)`. Horovod 0.28.1 does not build against TensorFlow >= 2.16 "
        "(Keras 3), and spark-tensorflow-distributor is unmaintained. Here the same program runs on "
        "two Spark barrier tasks three ways, each rank fed its shard of one Spark DataFrame:\n\n"
        "1. **Keras 3 on torch** with Horovod's Keras API: `import sparkml_dist.keras as hvd`;\n"
        '2. **tf.keras** under `MultiWorkerMirroredStrategy` (`backend="tensorflow"`);\n'
        '3. **Keras 3 on JAX** with `keras.distribution.DataParallel` (`backend="jax"`).\n\n'
        "The data: scikit-learn's 8x8 digits as a DataFrame of 64 pixels and a label.",
    ),
    (
        "code",
        "import os, sys\nos.environ.setdefault('PYSPARK_PYTHON', sys.executable)\n"
        "from pyspark.sql import SparkSession\n"
        "spark = (SparkSession.builder.master('local[2]').appName('09_keras_tensorflow_jax')\n"
        "         .config('spark.ui.enabled', 'false').config('spark.sql.shuffle.partitions', '4')\n"
        "         .config('spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures', '1')\n"
        "         .config('spark.scheduler.barrier.maxConcurrentTasksCheck.interval', '1s')\n"
        "         .getOrCreate())\n"
        "import numpy as np\nfrom sklearn.datasets import load_digits\n"
        "from sklearn.model_selection import train_test_split\n"
        "X, y = load_digits(return_X_y=True)\n"
        "X_train, X_test, y_train, y_test = train_test_split((X / 16.0).astype('float32'), y, test_size=0.25, random_state=0)\n"
        "df = spark.createDataFrame([(x.tolist(), int(t)) for x, t in zip(X_train, y_train)],\n"
        "                           'pixels array<float>, label long')\n"
        "print(df.count(), 'training rows;', len(y_test), 'test rows kept on the driver')",
    ),
    (
        "md",
        "## 1. The Horovod program, with its import changed\n\n"
        "As the documents write it for Horovod (Keras 2 on TensorFlow 1):\n\n" + HOROVOD_PROGRAM + "\n\n"
        "With `sparkml_dist.keras` the import changes and the TF1 session lines go (Keras 3 has no "
        "sessions; the runner pins each rank's GPU). The rest is unchanged: `DistributedOptimizer` "
        "averages the gradients over the ranks through the run's torch.distributed group, the "
        "callback broadcasts rank 0's weights, `MetricAverageCallback` averages the metrics. "
        "`HorovodRunner` sees that the function imports `sparkml_dist.keras` and runs it on "
        "torch.distributed: no Horovod needed.",
    ),
    (
        "code",
        "def convnet(keras):\n"
        "    return keras.Sequential([\n"
        "        keras.Input((64,)), keras.layers.Reshape((8, 8, 1)),\n"
        "        keras.layers.Conv2D(16, 3, activation='relu'), keras.layers.Flatten(),\n"
        "        keras.layers.Dense(32, activation='relu'), keras.layers.Dense(10, activation='softmax')])\n\n"
        "def train(epochs, x_test, y_test):\n"
        "    import keras\n"
        "    import sparkml_dist.keras as hvd          # was: import horovod.keras as hvd\n"
        "    from sparkml_dist.runner import shard\n"
        "    hvd.init()\n"
        "    model = convnet(keras)                     # each rank its own random start...\n"
        "    opt = keras.optimizers.Adadelta(1.0 * hvd.size())\n"
        "    opt = hvd.DistributedOptimizer(opt)\n"
        "    model.compile(loss=keras.losses.sparse_categorical_crossentropy, optimizer=opt, metrics=['accuracy'])\n"
        "    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),   # ...rank 0's for all\n"
        "                 hvd.callbacks.MetricAverageCallback()]\n"
        "    x_train = shard().to_keras(batch_size=32, x='pixels', y='label')   # this rank's rows\n"
        "    history = model.fit(x_train, callbacks=callbacks, epochs=epochs,\n"
        "                        verbose=1 if hvd.rank() == 0 else 0, validation_data=(x_test, y_test))\n"
        "    return {'history': history.history, 'weights': model.get_weights()}\n\n"
        "from sparkml_dist.horovod import HorovodRunner\n"
        "keras_torch = HorovodRunner(np=2).run_with_data(df, train, epochs=12, x_test=X_test, y_test=y_test)\n"
        "print('validation accuracy', round(keras_torch['history']['val_accuracy'][-1], 3))",
    ),
    ("md", "### Its learning curve (metrics averaged over the two ranks)"),
    (
        "code",
        "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
        "%matplotlib inline\n"
        "h = keras_torch['history']\n"
        "fig, (loss, acc) = plt.subplots(1, 2, figsize=(9, 3.2))\n"
        "loss.plot(h['loss'], label='training'); loss.plot(h['val_loss'], label='validation')\n"
        "acc.plot(h['accuracy'], label='training'); acc.plot(h['val_accuracy'], label='validation')\n"
        "loss.set_xlabel('epoch'); loss.set_ylabel('loss'); loss.legend()\n"
        "acc.set_xlabel('epoch'); acc.set_ylabel('accuracy'); acc.legend()\n"
        "fig.suptitle('Keras 3 on torch, sparkml_dist.keras, 2 Spark barrier tasks'); plt.tight_layout(); plt.show()",
    ),
    (
        "md",
        '## 2. The same model in tf.keras under `backend="tensorflow"`\n\n'
        "Each rank gets a `TF_CONFIG` naming both workers, so `MultiWorkerMirroredStrategy()` joins "
        "the run. `MirroredStrategyRunner` (spark-tensorflow-distributor's API) opens the strategy's "
        "scope around the function; `shard().to_tf_dataset()` gives this rank's rows as a "
        "`tf.data.Dataset`, auto-sharding off. `tf.keras` is Keras 2 (`tf-keras`, "
        "`TF_USE_LEGACY_KERAS=1`): Keras 3's `fit` fails under this strategy, and is refused.\n\n"
        "TensorFlow 2.21 prints C++ start-up lines (oneDNN, CUDA probing) before its logging is "
        "configured, which `TF_CPP_MIN_LOG_LEVEL` no longer hides: `log_ranks='none'` keeps them "
        "out of this cell (a failing rank's traceback is still shown).",
    ),
    (
        "code",
        "def train_tf(epochs, x_test, y_test):\n"
        "    import tensorflow as tf\n"
        "    from sparkml_dist.runner import shard\n"
        "    model = convnet(tf.keras)                    # inside the strategy's scope\n"
        "    model.compile(loss='sparse_categorical_crossentropy', optimizer=tf.keras.optimizers.Adadelta(2.0),\n"
        "                  metrics=['accuracy'])\n"
        "    data = shard().to_tf_dataset(batch_size=32, x='pixels', y='label')\n"
        "    history = model.fit(data, epochs=epochs, verbose=0, validation_data=(x_test, y_test))\n"
        "    return {'history': history.history}\n\n"
        "from sparkml_dist.tensorflow_distributor import MirroredStrategyRunner\n"
        "tf_keras = MirroredStrategyRunner(num_slots=2, use_gpu=False, log_ranks='none').run_with_data(\n"
        "    df, train_tf, epochs=12, x_test=X_test, y_test=y_test)\n"
        "print('validation accuracy', round(tf_keras['history']['val_accuracy'][-1], 3))",
    ),
    (
        "md",
        '## 3. Keras 3 on JAX under `backend="jax"`\n\n'
        "The runner initializes `jax.distributed` on every rank (rank 0 is the coordinator) and sets "
        "Keras's `KERAS_DISTRIBUTION_*` variables, so `keras.distribution.initialize()` and "
        "`DataParallel` run as written. Each process brings its own rows (`auto_shard_dataset = False`).",
    ),
    (
        "code",
        "def train_jax(epochs, x_test, y_test):\n"
        "    import keras\n"
        "    from sparkml_dist.runner import shard\n"
        "    keras.distribution.initialize()\n"
        "    data_parallel = keras.distribution.DataParallel(devices=keras.distribution.list_devices())\n"
        "    data_parallel.auto_shard_dataset = False\n"
        "    keras.distribution.set_distribution(data_parallel)\n"
        "    model = convnet(keras)\n"
        "    model.compile(loss='sparse_categorical_crossentropy', optimizer=keras.optimizers.Adadelta(2.0),\n"
        "                  metrics=['accuracy'])\n"
        "    data = shard().to_keras(batch_size=32, x='pixels', y='label')\n"
        "    model.fit(data, epochs=epochs, verbose=0)\n"
        "    loss, accuracy = model.evaluate(x_test, y_test, verbose=0)\n"
        "    return {'val_accuracy': accuracy, 'devices': keras.distribution.list_devices()}\n\n"
        "from sparkml_dist.runner import BarrierRunner\n"
        "keras_jax = BarrierRunner(2, backend='jax', log_ranks='none').run_with_data(df, train_jax, epochs=12, x_test=X_test, y_test=y_test)\n"
        "print('devices', keras_jax['devices'], 'validation accuracy', round(keras_jax['val_accuracy'], 3))",
    ),
    ("md", "## The three side by side"),
    (
        "code",
        "results = {'Keras 3 on torch (sparkml_dist.keras)': keras_torch['history']['val_accuracy'][-1],\n"
        "           'tf.keras, MultiWorkerMirroredStrategy': tf_keras['history']['val_accuracy'][-1],\n"
        "           'Keras 3 on JAX, DataParallel': keras_jax['val_accuracy']}\n"
        "for name, accuracy in results.items():\n"
        "    print(f'{name:40s} validation accuracy {accuracy:.3f}')\n"
        "assert all(a > 0.85 for a in results.values()), results",
    ),
    ("code", "spark.stop()\nprint('Spark stopped')"),
]

if __name__ == "__main__":
    write(cells, "09_keras_tensorflow_jax.ipynb")
