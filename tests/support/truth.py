"""The truth matrix's pieces: the data, the model, each backend's training function, and the one
process every backend is checked against (tests/spark/test_truth.py).

What is real: everything that trains. Each function below is a user's program for one backend
(DDP and its communication settings, DiLoCo, FSDP2, pipeline stages, Horovod, ``sparkml_dist.keras``,
tf.keras under ``MultiWorkerMirroredStrategy``, ``MirroredStrategyRunner``, Keras 3 on JAX, plain
JAX), run by the runner's ranks on their shards of a real DataFrame. Each *records, inside its train
step*, the ids of the rows that step trained on: a layer at the front of the model (torch, Keras,
TensorFlow through ``tf.py_function``, Keras on JAX through ``jax.debug.callback``), or the batch
handed to the step itself where the step is one call (a pipeline's ``step``, a jitted JAX step).

The reference is not a framework: the same model (``FEATURES -> HIDDEN`` tanh ``-> 1``, mean
squared error, plain SGD) trained by numpy in float64 on the *global* batches the ranks recorded
(step ``s``'s global batch: every rank's step ``s`` rows together), from the same initial weights.
A backend whose ranks average gradients right ends within float32's rounding of it; one that sums,
drops a rank or trains half an epoch does not.

Every function returns ``{"steps": [[ids of train step s] ...], "weights": {...}}`` (``"global":
True`` when the recording saw the whole global batch, as Keras on JAX's does on process 0), the
weights as numpy lists in the (in, out) layout: ``W1`` (F, H), ``b1`` (H,), ``W2`` (H, 1), ``b2`` (1,).
"""

import json
import os

import numpy as np

FEATURES, HIDDEN, LR = 4, 8, 0.1
COLUMNS = ["id"] + [f"f{i}" for i in range(FEATURES)]  # what the model takes: the id, then features
NAMES = ("W1", "b1", "W2", "b2")


def frame(rows: int, seed: int = 0):
    """``rows`` samples: id, f0..f3, y (a smooth target of the features plus noise)."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, FEATURES)).astype("float32")
    y = (np.tanh(x @ np.linspace(-1, 1, FEATURES)) + 0.1 * rng.normal(size=rows)).astype("float32")
    pdf = pd.DataFrame(x, columns=COLUMNS[1:])
    pdf.insert(0, "id", np.arange(rows, dtype="int64"))
    pdf["y"] = y
    return pdf


def init_weights():
    """The start every backend and the reference share (float32)."""
    rng = np.random.default_rng(7)
    return {
        "W1": (rng.normal(size=(FEATURES, HIDDEN)) * 0.5).astype("float32"),
        "b1": (rng.normal(size=HIDDEN) * 0.1).astype("float32"),
        "W2": (rng.normal(size=(HIDDEN, 1)) * 0.5).astype("float32"),
        "b2": np.zeros(1, dtype="float32"),
    }


def reference(pdf, steps, lr=LR, accumulate=1):
    """One process, float64: SGD on each global batch of ``steps`` (lists of ids), ``accumulate``
    consecutive batches per update (their gradients averaged: one step on k times the batch)."""
    table = pdf.set_index("id")
    w = {k: v.astype("float64") for k, v in init_weights().items()}
    grads = []
    for ids in steps:
        x = table.loc[ids, COLUMNS[1:]].to_numpy("float64")
        y = table.loc[ids, "y"].to_numpy("float64")[:, None]
        h = np.tanh(x @ w["W1"] + w["b1"])
        d = 2 * (h @ w["W2"] + w["b2"] - y) / len(ids)  # d(mean squared error)/d(output)
        dh = d @ w["W2"].T * (1 - h**2)
        grads.append({"W1": x.T @ dh, "b1": dh.sum(0), "W2": h.T @ d, "b2": d.sum(0)})
        if len(grads) == accumulate:
            for k in w:
                w[k] -= lr * sum(g[k] for g in grads) / accumulate
            grads = []
    return w


def global_steps(results):
    """The global batch of every step: each rank's step ``s`` rows together (or, where a
    recording saw the global batch, that)."""
    recorded = [r for r in results if r["steps"]]
    if any(r.get("global") for r in recorded):
        return recorded[0]["steps"]
    counts = {len(r["steps"]) for r in recorded}
    if len(counts) != 1:
        raise AssertionError(f"the ranks took different numbers of steps: {sorted(counts)}")
    return [sum((r["steps"][s] for r in recorded), []) for s in range(counts.pop())]


def difference(weights, expected) -> float:
    """The largest absolute difference between a backend's weights and the reference's."""
    return max(float(np.abs(np.asarray(weights[k], "float64") - expected[k]).max()) for k in NAMES)


# ------------------------------------------------------------------ shared by the rank functions
def _epoch_batches(batch, epochs, options):
    """This rank's (x, y) numpy batches, epoch after epoch: x is [id, features], y (b, 1)."""
    from sparkml_dist.runner import shard

    loader = shard().dataloader(batch, COLUMNS + ["y"], seed=3, transform=_xy, **options.get("loader", {}))
    for _ in range(epochs):
        yield from loader


def _xy(values):
    x = np.stack([values[c].astype("float32") for c in COLUMNS], axis=1)
    return x, values["y"].astype("float32").reshape(-1, 1)


def _torch_model(recorder=True):
    import torch

    class Recorder(torch.nn.Module):
        """The model's first layer: notes the ids each forward of a train step sees."""

        def __init__(self):
            super().__init__()
            self.seen = []

        def forward(self, x):
            if self.training:
                self.seen.append([int(i) for i in x[:, 0].round().tolist()])
            return x[:, 1:]

    w = init_weights()
    first, last = torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Linear(HIDDEN, 1)
    with torch.no_grad():
        first.weight.copy_(torch.from_numpy(w["W1"].T.copy()))
        first.bias.copy_(torch.from_numpy(w["b1"]))
        last.weight.copy_(torch.from_numpy(w["W2"].T.copy()))
        last.bias.copy_(torch.from_numpy(w["b2"]))
    body = [torch.nn.Sequential(first, torch.nn.Tanh()), last]
    return torch.nn.Sequential(Recorder(), *body) if recorder else torch.nn.Sequential(*body)


def _torch_weights(tensors):
    """W1, b1, W2, b2 from the two Linear layers' weight, bias, weight, bias (in that order)."""
    W1, b1, W2, b2 = [t.detach().cpu().double().numpy() for t in tensors]
    return {"W1": W1.T.tolist(), "b1": b1.tolist(), "W2": W2.T.tolist(), "b2": b2.tolist()}


def _keras_weights(model):
    W1, b1, W2, b2 = model.get_weights()[-4:]
    return {"W1": W1.tolist(), "b1": b1.tolist(), "W2": W2.tolist(), "b2": b2.tolist()}


def _keras_init():
    w = init_weights()
    return [w["W1"], w["b1"], w["W2"], w["b2"]]


def several(programs, epochs):
    """Run each of ``programs`` ((label, function name, batch, options)) in turn on this rank,
    every one from the same start over its own pass of the shard: one launch for several rows
    of the matrix. With ``options["out"]`` each rank also writes what it returns there."""
    out = {label: globals()[fn](batch, epochs, options) for label, fn, batch, options in programs}
    where = next((o["out"] for _, _, _, o in programs if "out" in o), None)
    if where:
        with open(os.path.join(where, f"rank{os.environ['RANK']}.json"), "w") as fh:
            json.dump(out, fh)
    return out


# ------------------------------------------------------------------ torch.distributed
def _group():
    import torch.distributed as dist

    from sparkml_dist.runner import init_process_group

    if not dist.is_initialized():
        init_process_group()


def torch_ddp(batch, epochs, options):
    """DDP through ``comm.ddp`` with ``options["comm"]`` (fp16, PowerSGD, accumulate=k), or
    DiLoCo with ``options["diloco"]``, or a deliberately wrong average (``options["mutate"]``:
    "sum" all-reduces without dividing, "drop" leaves rank 1's gradient out): the checker's own test."""
    import torch

    from sparkml_dist.parallel import comm
    from sparkml_dist.parallel.diloco import DiLoCo

    _group()
    model = _torch_model()
    outer = DiLoCo(model, **options["diloco"]) if "diloco" in options else None
    if outer is not None:
        net = model
    elif "mutate" in options:
        net = torch.nn.parallel.DistributedDataParallel(model)
        net.register_comm_hook(None, _wrong_average(options["mutate"]))
    else:
        net = comm.ddp(model, **options.get("comm", {}))
    k = getattr(net, "accumulate", 1)
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    for x, y in _epoch_batches(batch, epochs, options):
        step = net.micro_step() if k > 1 else _Last()
        with step as last:
            (torch.nn.functional.mse_loss(net(torch.from_numpy(x)), torch.from_numpy(y)) / k).backward()
        if last:
            opt.step()
            opt.zero_grad()
            if outer is not None:
                outer.step()
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    return {
        "steps": model[0].seen,
        "weights": _torch_weights([p for m in linears for p in (m.weight, m.bias)]),
    }


class _Last:
    def __enter__(self):
        return True

    def __exit__(self, *exc):
        return False


def _wrong_average(how):
    """A DDP hook that averages wrongly: "sum" leaves the sum undivided, "drop" leaves rank 1's
    gradient out (rank 0's alone is called the average)."""
    import torch.distributed as dist

    def hook(state, bucket):
        buffer = bucket.buffer()
        if how == "drop" and dist.get_rank() == 1:
            buffer.zero_()  # 2 ranks: the sum is then rank 0's gradient alone
        return dist.all_reduce(buffer, async_op=True).get_future().then(lambda f: f.value()[0])

    return hook


def torch_fsdp2(batch, epochs, options):
    """FSDP2: ``fully_shard`` over a 1-D mesh, each rank its own batches."""
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    _group()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = _torch_model()
    for block in model[1:]:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for x, y in _epoch_batches(batch, epochs, options):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(torch.from_numpy(x)), torch.from_numpy(y)).backward()
        opt.step()
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {"steps": model[0].seen, "weights": _torch_weights(list(full.values())) if full else None}


def torch_pipeline(batch, epochs, options):
    """Pipeline stages (``sparkml_dist.parallel.pipeline``): two stages over the ranks of a
    replica, ``world / 2`` replicas (one rank: both stages on it); every rank of a replica reads
    the replica's shard (``run_with_data(replicas=...)``); the ids handed to ``step`` recorded on
    each replica's first pipeline rank."""
    import torch
    import torch.distributed as dist

    from sparkml_dist.parallel import pipeline

    _group()
    world = dist.get_world_size()
    batches = list(_epoch_batches(batch, epochs, options))
    pipe = pipeline(
        _torch_model(recorder=False),
        stages=2,
        microbatches=2,
        loss_fn=torch.nn.functional.mse_loss,
        example_input=torch.from_numpy(batches[0][0][:, 1:]),
        data_parallel=max(1, world // 2),
    )
    opt = torch.optim.SGD(pipe.parameters(), lr=LR)
    seen = []
    for x, y in batches:
        opt.zero_grad()
        pipe.step(torch.from_numpy(x[:, 1:]), torch.from_numpy(y))
        opt.step()
        seen.append([int(i) for i in x[:, 0]])
    state = pipe.full_state_dict()
    first = world == 1 or dist.get_rank() % 2 == 0
    return {
        "steps": seen if first else [],
        "weights": _torch_weights(list(state.values())) if state else None,
    }


def horovod_torch(batch, epochs, options):
    """Horovod's ``DistributedOptimizer`` (Gloo), each rank its own batches."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    model = _torch_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR), model.named_parameters())
    for x, y in _epoch_batches(batch, epochs, options):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(torch.from_numpy(x)), torch.from_numpy(y)).backward()
        opt.step()
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    return {
        "steps": model[0].seen,
        "weights": _torch_weights([p for m in linears for p in (m.weight, m.bias)]),
    }


# ------------------------------------------------------------------ Keras 3 and TensorFlow
def _keras_recorder(keras, note):
    class Recorder(keras.layers.Layer):
        """The model's first layer: what each train step's batch holds."""

        def call(self, x, training=None):
            if training:
                note(x)
            return x[:, 1:]

        def compute_output_shape(self, shape):
            return (shape[0], shape[1] - 1)

    return Recorder()


def keras_torch(batch, epochs, options):
    """Horovod's Keras program on ``sparkml_dist.keras`` (Keras 3, torch backend), fed ``to_keras``."""
    import keras

    import sparkml_dist.keras as hvd
    from sparkml_dist.runner import shard

    hvd.init()
    seen = []

    def note(x):
        if not isinstance(x, keras.KerasTensor):
            seen.append([int(i) for i in keras.ops.convert_to_numpy(x[:, 0]).round()])

    model = keras.Sequential(
        [
            keras.Input((len(COLUMNS),)),
            _keras_recorder(keras, note),
            keras.layers.Dense(HIDDEN, activation="tanh"),
            keras.layers.Dense(1),
        ]
    )
    model.set_weights(_keras_init())
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(LR)), loss="mse")
    data = shard().to_keras(batch, x=COLUMNS, y="y", seed=3)
    model.fit(data, epochs=epochs, verbose=0)
    return {"steps": seen, "weights": _keras_weights(model)}


def _tf_model(tf):
    seen = []

    def note(ids):
        seen.append([int(i) for i in ids.numpy().round()])
        return ids

    class Recorder(tf.keras.layers.Layer):
        def call(self, x, training=None):
            if training:
                ids = tf.py_function(note, [x[:, 0]], tf.float32)
                return x[:, 1:] + 0 * tf.reduce_sum(ids)  # keeps the recording in the step's graph
            return x[:, 1:]

    model = tf.keras.Sequential(
        [
            tf.keras.Input((len(COLUMNS),)),
            Recorder(),
            tf.keras.layers.Dense(HIDDEN, activation="tanh"),
            tf.keras.layers.Dense(1),
        ]
    )
    model.set_weights(_keras_init())
    model.compile(optimizer=tf.keras.optimizers.SGD(LR), loss="mse")
    return model, seen


def tf_keras(batch, epochs, options):
    """tf.keras under ``MultiWorkerMirroredStrategy`` (``backend="tensorflow"``), fed ``to_tf_dataset``
    (``.prefetch`` of it: a dataset derived from the shard's is per rank too)."""
    import tensorflow as tf

    from sparkml_dist.runner import shard

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    data = shard().to_tf_dataset(batch, x=COLUMNS, y="y", seed=3).prefetch(2)
    with strategy.scope():
        model, seen = _tf_model(tf)
    model.fit(data, epochs=epochs, verbose=0)
    return {"steps": seen, "weights": _keras_weights(model)}


def tf_in_strategy_runner(batch, epochs, options):
    """The same program under ``MirroredStrategyRunner``: its strategy's scope is already open."""
    import tensorflow as tf

    from sparkml_dist.runner import shard

    model, seen = _tf_model(tf)
    model.fit(shard().to_tf_dataset(batch, x=COLUMNS, y="y", seed=3), epochs=epochs, verbose=0)
    return {"steps": seen, "weights": _keras_weights(model)}


def keras_jax(batch, epochs, options):
    """Keras 3 on JAX with ``keras.distribution.DataParallel`` over the ranks' processes; the
    recording (a ``jax.debug.callback``) sees each step's global batch on process 0."""
    import jax
    import keras

    keras.distribution.initialize()
    distribution = keras.distribution.DataParallel(devices=keras.distribution.list_devices())
    distribution.auto_shard_dataset = False  # each process brings its own rows
    keras.distribution.set_distribution(distribution)
    from sparkml_dist.runner import shard

    seen = []

    def note(x):
        jax.debug.callback(lambda ids: seen.append([int(i) for i in np.asarray(ids).round()]), x[:, 0])

    model = keras.Sequential(
        [
            keras.Input((len(COLUMNS),)),
            _keras_recorder(keras, note),
            keras.layers.Dense(HIDDEN, activation="tanh"),
            keras.layers.Dense(1),
        ]
    )
    model.set_weights(_keras_init())
    model.compile(optimizer=keras.optimizers.SGD(LR), loss="mse")
    model.fit(shard().to_keras(batch, x=COLUMNS, y="y", seed=3), epochs=epochs, verbose=0)
    return {"steps": seen, "weights": _keras_weights(model), "global": True}


def plain_jax(batch, epochs, options):
    """Plain JAX over ``jax.distributed``: each process's batch is its part of one global array
    (``make_array_from_process_local_data``), one jitted SGD step on it (XLA inserts the reduction)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()), ("rows",))
    rows, whole = NamedSharding(mesh, P("rows")), NamedSharding(mesh, P())
    params = jax.device_put({k: jnp.asarray(v) for k, v in init_weights().items()}, whole)

    def loss(p, x, y):
        out = jnp.tanh(x @ p["W1"] + p["b1"]) @ p["W2"] + p["b2"]
        return jnp.mean((out - y) ** 2)

    @jax.jit
    def step(p, x, y):
        g = jax.grad(loss)(p, x, y)
        return jax.tree_util.tree_map(lambda a, b: a - LR * b, p, g)

    seen = []
    for x, y in _epoch_batches(batch, epochs, options):
        seen.append([int(i) for i in x[:, 0]])
        gx = jax.make_array_from_process_local_data(rows, x[:, 1:])
        gy = jax.make_array_from_process_local_data(rows, y)
        params = step(params, gx, gy)
    local = {k: np.asarray(v.addressable_data(0)) for k, v in params.items()}
    return {"steps": seen, "weights": {k: v.tolist() for k, v in local.items()}}
