"""The framework backends side by side, one SparkSession on local[2], 2 ranks each.

(a) wall time of a no-op job (join the rendezvous + one all-reduce): backend="torch" (gloo),
    backend="tensorflow" (MultiWorkerMirroredStrategy + a cross-worker reduce), backend="jax"
    (jax.distributed + a sum over the processes' devices);
(b) samples/s of one MLP (50-256-256-10, batch 256 per rank, SGD) trained by Keras 3 on the torch
    backend through sparkml_dist.keras (model.fit, DistributedOptimizer) vs a plain DDP loop
    through the runner: the overhead of the Keras path; measured inside rank 0 after a warm-up.

Contenders are interleaved (the order alternates every round); the load average is recorded.

    python benchmarks/bench_frameworks.py [--repeats 3] [--steps 300] [--sections noop,keras]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from harness import interleaved, local_session  # noqa: E402

FEATURES, CLASSES, BATCH = 50, 10, 256


# ---------------------------------------------------------------- functions run on the ranks
def noop_torch():
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


def noop_tensorflow():
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    return float(strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None))


def noop_jax():
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()), ("ranks",))
    ones = jax.make_array_from_process_local_data(NamedSharding(mesh, P("ranks")), np.ones(1, "float32"))
    return float(jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, P()))(ones))


def _data(rank: int, steps: int):
    import numpy as np

    rng = np.random.default_rng(rank)
    x = rng.normal(size=(steps * BATCH, FEATURES)).astype("float32")
    return x, rng.integers(0, CLASSES, size=steps * BATCH)


def keras_mlp(steps: int, hidden: int, averaged: bool = True, warmup: int = 20):
    """Keras 3 (torch backend) through sparkml_dist.keras: global samples/s of model.fit
    (``averaged=False``: the same without DistributedOptimizer, each rank alone: Keras's own cost)."""
    import time

    import keras
    import torch

    import sparkml_dist.keras as hvd

    torch.set_num_threads(1)
    hvd.init()
    x, y = _data(hvd.rank(), steps)
    model = keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(hidden, activation="relu"),
            keras.layers.Dense(hidden, activation="relu"),
            keras.layers.Dense(CLASSES),
        ]
    )
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    opt = keras.optimizers.SGD(0.01)
    model.compile(optimizer=hvd.DistributedOptimizer(opt) if averaged else opt, loss=loss)
    model.fit(x[: warmup * BATCH], y[: warmup * BATCH], batch_size=BATCH, epochs=1, verbose=0, shuffle=False)
    started = time.perf_counter()
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False)
    return steps * BATCH * hvd.size() / (time.perf_counter() - started)


def ddp_mlp(steps: int, hidden: int, averaged: bool = True, warmup: int = 20):
    """The same MLP, data and optimizer in a plain DDP loop: global samples/s (``averaged=False``:
    the torch loop without DDP, each rank alone)."""
    import time

    import torch
    import torch.distributed as dist

    from sparkml_dist.runner import init_process_group

    torch.set_num_threads(1)
    init_process_group()
    x, y = _data(dist.get_rank(), steps)
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    net = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, CLASSES),
    )
    model = torch.nn.parallel.DistributedDataParallel(net) if averaged else net
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(i: int) -> None:
        opt.zero_grad()
        lo = (i % steps) * BATCH
        torch.nn.functional.cross_entropy(model(x[lo : lo + BATCH]), y[lo : lo + BATCH]).backward()
        opt.step()

    for i in range(warmup):
        step(i)
    started = time.perf_counter()
    for i in range(steps):
        step(i)
    return steps * BATCH * dist.get_world_size() / (time.perf_counter() - started)


# ---------------------------------------------------------------- the driver
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--sections", default="noop,keras")
    ap.add_argument("--hidden", type=int, default=256, help="width of the MLP's two hidden layers")
    args = ap.parse_args()
    sections = set(args.sections.split(","))
    local_session("bench_frameworks")
    from sparkml_dist.runner import BarrierRunner

    quiet = dict(log_ranks="none", timeout=600)
    if "noop" in sections:
        contenders = {
            "torch": lambda: BarrierRunner(2, **quiet).run(noop_torch),
            "tensorflow": lambda: BarrierRunner(2, backend="tensorflow", **quiet).run(noop_tensorflow),
            "jax": lambda: BarrierRunner(2, backend="jax", **quiet).run(noop_jax),
        }
        cold = {}
        for name, run in contenders.items():  # a session's first run of each: it starts the pool
            t = time.perf_counter()
            run()
            cold[name] = time.perf_counter() - t
        time.sleep(15)  # the machine settles after three first runs
        walls, _ = interleaved(contenders, args.repeats)
        med = {k: statistics.median(v) for k, v in walls.items()}
        print("\n(a) no-op job (rendezvous + one all-reduce): each backend's first run (pool starts), then")
        print(f"    the median wall seconds of {args.repeats} interleaved later runs (warm ranks)")
        for name, wall in med.items():
            print(
                f"    {name:10s} first {cold[name]:6.2f} s; later {wall:6.2f} s, {wall / med['torch']:.2f}x "
                "torch's (target <= 1.2x)"
            )
    if "keras" in sections:
        n, h = args.steps, args.hidden
        contenders = {
            "keras (sparkml_dist.keras)": lambda: BarrierRunner(2, **quiet).run(keras_mlp, n, h),
            "ddp (plain loop)": lambda: BarrierRunner(2, **quiet).run(ddp_mlp, n, h),
            "keras, not averaged": lambda: BarrierRunner(2, **quiet).run(keras_mlp, n, h, False),
            "torch, not averaged": lambda: BarrierRunner(2, **quiet).run(ddp_mlp, n, h, False),
        }
        rates = {name: [] for name in contenders}
        for r in range(args.repeats):
            for name in contenders if r % 2 == 0 else list(contenders)[::-1]:
                rate = contenders[name]()
                rates[name].append(rate)
                print(
                    f"round {r} {name:28s} load {os.getloadavg()[0]:4.2f} {rate:10.0f} samples/s", flush=True
                )
        med = {k: statistics.median(v) for k, v in rates.items()}
        keras_rate, ddp_rate = med["keras (sparkml_dist.keras)"], med["ddp (plain loop)"]
        keras_alone, torch_alone = med["keras, not averaged"], med["torch, not averaged"]
        print(
            f"\n(b) MLP {FEATURES}-{h}-{h}-{CLASSES}, batch {BATCH} a rank, 2 ranks, median of {args.repeats}"
        )
        print(f"    keras {keras_rate:10.0f} samples/s, ddp {ddp_rate:10.0f} samples/s")
        print(f"    keras / ddp = {keras_rate / ddp_rate:.3f}  (target >= 0.9)")
        print(f"    each rank alone (no all-reduce): keras {keras_alone:.0f}, torch {torch_alone:.0f} a s:")
        print(f"    Keras's own loop is {keras_alone / torch_alone:.3f}x torch's; averaging costs Keras")
        print(
            f"    {1 - keras_rate / keras_alone:.1%} of its rate, "
            f"DDP costs the torch loop {1 - ddp_rate / torch_alone:.1%}"
        )


if __name__ == "__main__":
    main()
