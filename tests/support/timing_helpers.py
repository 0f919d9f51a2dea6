"""Training functions whose ranks' step times are known: one rank slowed on purpose (more compute a
step, or a throttled loader), on DDP, Horovod, sparkml_dist.keras and Keras fit."""

import os
import time

FEATURES = ["x0", "x1", "x2", "x3"]


def rows(spark, n=3200, parts=2):
    """``n`` rows of 4 features and a label."""
    from pyspark.sql import functions as F

    df = spark.range(n).repartition(parts)
    for i, name in enumerate(FEATURES):
        df = df.withColumn(name, F.rand(seed=i))
    return df.withColumn("y", F.col("x0") - F.col("x1"))


def _net():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))


def ddp_with_a_slow_rank(slow_rank=1, compute_s=0.0, loader_s=0.0, batch=8):
    """DDP over the runner's loader; rank ``slow_rank`` spends ``compute_s`` more a step computing,
    or its loader ``loader_s`` more making each batch. Returns the steps the loop made."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from sparkml_dist.runner import init_process_group, shard

    init_process_group()
    slow = dist.get_rank() == slow_rank

    def throttled(values):
        if slow and loader_s:
            time.sleep(loader_s)
        import numpy as np

        x = torch.from_numpy(np.stack([values[c] for c in FEATURES], axis=1).astype("float32"))
        return x, torch.as_tensor(values["y"], dtype=torch.float32)

    net = DistributedDataParallel(_net())
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    steps = 0
    batches = shard().dataloader(
        batch_size=batch, columns=FEATURES + ["y"], shuffle=False, transform=throttled
    )
    for x, y in batches:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x).squeeze(1), y)
        if slow and compute_s:
            time.sleep(compute_s)  # more compute on this rank only, before its gradients are ready
        loss.backward()
        opt.step()
        steps += 1
    return steps


def ddp_own_tensors(steps=30):
    """DDP on the function's own tensors (no loader): the steps come from DDP's forwards."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from sparkml_dist.runner import init_process_group

    init_process_group()
    net = DistributedDataParallel(_net())
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    x = torch.randn(16, 4)
    for _ in range(steps):
        opt.zero_grad()
        net(x).sum().backward()
        opt.step()
    return steps


def marked_steps(steps=12, sleep_s=0.01):
    """A loop no framework shows: steps marked with runner.step()."""
    from sparkml_dist.runner import step

    for _ in range(steps):
        with step():
            time.sleep(sleep_s)
    return steps


def no_steps():
    return os.getpid()


def horovod_steps(steps=20):
    """Horovod's DistributedOptimizer (horovodrun's way): each optimizer step one step."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    net = _net()
    sgd = torch.optim.SGD(net.parameters(), lr=0.01)
    opt = hvd.DistributedOptimizer(sgd, named_parameters=net.named_parameters())
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    x = torch.randn(16, 4)
    for _ in range(steps):
        opt.zero_grad()
        net(x).sum().backward()
        opt.step()
    return steps


def keras_torch_steps(epochs=2, batches=10):
    """sparkml_dist.keras (Horovod's Keras API) on Keras 3's torch backend, through fit."""
    import keras
    import numpy as np

    import sparkml_dist.keras as hvd

    hvd.init()
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
    x = np.random.default_rng(hvd.rank()).normal(size=(8 * batches, 4)).astype("float32")
    model.fit(x, x[:, :1], batch_size=8, epochs=epochs, verbose=0)
    return epochs * batches


def keras_tf_fit_steps(epochs=2, batches=10):
    """Keras fit (tf.keras of tf-keras) under MultiWorkerMirroredStrategy."""
    import numpy as np
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
        model.compile(optimizer=tf.keras.optimizers.SGD(0.01), loss="mse")
    x = np.random.default_rng(0).normal(size=(8 * batches, 4)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(8)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    model.fit(data.with_options(options), epochs=epochs, verbose=0)
    return epochs * batches
