"""TensorFlow's parameter-server program launched by the runner against the same program launched by
hand, and asynchronous updates against one process.

The program is the tutorial's shape: ``ParameterServerStrategy`` + Keras ``fit`` on a
``DatasetCreator`` (a linear model on noisy rows, each worker its own rows), ``--epochs`` epochs of
``--steps`` steps. Contenders, interleaved (order alternating), ``--repeats`` rounds each:

* ``runner``: ``BarrierRunner(2, backend="tensorflow", roles={"ps": 1})`` on local[4], 4 barrier
  tasks (the chief, 2 workers, 1 parameter server);
* ``by_hand``: the same four roles as plain processes, each given its ``TF_CONFIG`` by hand (free
  ports on this machine), the chief running the same function.

Round r of both draws the initial weights and shuffles the rows from seed r, so what differs
between the two launches of a round is the launch and the asynchronous updates' timing.

It prints each epoch's loss for both (the mean, and the by-hand runs' spread: the target is the
runner's mean inside the by-hand runs' own run-to-run spread), the wall times, and the final loss of
one process training the same model with plain synchronous SGD on the same number of batches from
both workers' rows, alternating (how far asynchronous updates land from it).

    python benchmarks/bench_ps.py [--repeats 5] [--epochs 5] [--steps 40]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from harness import interleaved  # noqa: E402 - benchmarks/ is the script's folder

FEATURES, ROWS, BATCH, LR = 8, 2048, 32, 0.02


def rows(pipeline: int):
    import numpy as np

    rng = np.random.default_rng(pipeline)
    x = rng.normal(size=(ROWS, FEATURES)).astype("float32")
    w = np.linspace(-1.0, 1.0, FEATURES, dtype="float32")[:, None]
    return x, (x @ w + 0.3 * rng.normal(size=(ROWS, 1))).astype("float32")


def chief(epochs: int, steps: int, seed: int):
    """The tutorial's program on the chief: its loss each epoch (the weights drawn and the rows
    shuffled from ``seed``: both launches of a round start alike)."""
    import tensorflow as tf

    tf.keras.utils.set_random_seed(seed)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(FEATURES,))])
        model.compile(tf.keras.optimizers.SGD(LR), loss="mse")

    def dataset_fn(input_context):
        x, y = rows(input_context.input_pipeline_id)
        data = tf.data.Dataset.from_tensor_slices((x, y))
        return data.shuffle(ROWS, seed=seed + input_context.input_pipeline_id).batch(BATCH).repeat()

    creator = tf.keras.utils.experimental.DatasetCreator(dataset_fn)
    return model.fit(creator, epochs=epochs, steps_per_epoch=steps, verbose=0).history["loss"]


def one_process(epochs: int, steps: int, seed: int) -> float:
    """Synchronous SGD in one process on the same number of batches, both workers' rows alternating:
    the last epoch's mean batch loss (what ``fit`` reports as an epoch's loss)."""
    import numpy as np
    import tensorflow as tf

    tf.keras.utils.set_random_seed(seed)
    model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(FEATURES,))])
    model.compile(tf.keras.optimizers.SGD(LR), loss="mse")
    parts = [rows(0), rows(1)]
    order, last = np.random.default_rng(seed), []
    for step in range(epochs * steps):
        x, y = parts[step % 2]
        pick = order.integers(0, ROWS, BATCH)
        loss = float(model.train_on_batch(x[pick], y[pick]))
        if step >= (epochs - 1) * steps:
            last.append(loss)
    return float(np.mean(last))


def _free_ports(n: int):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


SERVER = """
import json, os, sys, time
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import tensorflow as tf
task = json.loads(os.environ["TF_CONFIG"])["task"]
resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
server = tf.distribute.Server(resolver.cluster_spec(), job_name=task["type"], task_index=task["index"],
                              protocol="grpc", start=True)
sys.stdin.read()  # until the launcher closes it
"""

CHIEF = """
import json, os, sys
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
sys.path.insert(0, {here!r})
import bench_ps
print("LOSS " + json.dumps(bench_ps.chief({epochs}, {steps}, {seed})), flush=True)
"""


def by_hand(epochs: int, steps: int, seed: int):
    """The four roles as plain processes, each its TF_CONFIG written by hand."""
    ports = _free_ports(4)
    cluster = {
        "chief": [f"127.0.0.1:{ports[0]}"],
        "worker": [f"127.0.0.1:{p}" for p in ports[1:3]],
        "ps": [f"127.0.0.1:{ports[3]}"],
    }

    def env(role, index):
        config = {"cluster": cluster, "task": {"type": role, "index": index}}
        return dict(os.environ, TF_CONFIG=json.dumps(config), TF_CPP_MIN_LOG_LEVEL="2")

    with tempfile.TemporaryFile("w+") as log:
        servers = [
            subprocess.Popen([sys.executable, "-c", SERVER], env=env(role, i), stdin=subprocess.PIPE,
                             stdout=log, stderr=log, text=True)
            for role, i in (("worker", 0), ("worker", 1), ("ps", 0))
        ]  # fmt: skip
        try:
            here = os.path.dirname(os.path.abspath(__file__))
            code = CHIEF.format(here=here, epochs=epochs, steps=steps, seed=seed)
            done = subprocess.run(
                [sys.executable, "-c", code], env=env("chief", 0), capture_output=True, text=True, timeout=600
            )
        finally:
            for s in servers:
                s.stdin.close()
                s.wait(timeout=60)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("LOSS ")), None)
    assert line is not None, done.stderr[-3000:]
    return json.loads(line[5:])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    from sparkml_dist.runner import BarrierRunner
    from sparkml_dist.session import get_session

    conf = os.path.join(ROOT, "conf", "spark-local.yaml")
    spark = get_session("local[4]", conf_file=conf, app_name="bench_ps")
    spark.sparkContext.setLogLevel("ERROR")
    runner = BarrierRunner(2, backend="tensorflow", roles={"ps": 1}, log_ranks="none", timeout=600)
    curves = {"runner": [], "by_hand": []}

    def through_runner():  # round r: seed r, as the by-hand launch of the round
        curves["runner"].append(runner.run(chief, args.epochs, args.steps, len(curves["runner"])))

    def launched_by_hand():
        curves["by_hand"].append(by_hand(args.epochs, args.steps, len(curves["by_hand"])))

    through_runner()  # warm-up: Spark's workers, the TensorFlow pools
    curves["runner"].clear()
    walls, _ = interleaved({"runner": through_runner, "by_hand": launched_by_hand}, args.repeats)
    spark.stop()
    print("\nepoch | by hand: mean (min - max) | runner: mean (min - max) | runner's mean inside the spread")
    inside = 0
    for e in range(args.epochs):
        hand = [c[e] for c in curves["by_hand"]]
        ours = [c[e] for c in curves["runner"]]
        ok = min(hand) <= statistics.mean(ours) <= max(hand)
        inside += ok
        print(
            f"{e} | {statistics.mean(hand):.4f} ({min(hand):.4f} - {max(hand):.4f}) | "
            f"{statistics.mean(ours):.4f} ({min(ours):.4f} - {max(ours):.4f}) | {ok}"
        )
    print(f"runner's mean loss inside the by-hand spread at {inside} of {args.epochs} epochs")
    print(
        f"wall (median of {args.repeats}): runner {statistics.median(walls['runner']):.1f} s, by hand "
        f"{statistics.median(walls['by_hand']):.1f} s"
    )
    sync = [one_process(args.epochs, args.steps, seed) for seed in range(args.repeats)]
    final = [c[-1] for c in curves["runner"] + curves["by_hand"]]
    print(
        f"final loss: asynchronous parameter servers (2 workers) {statistics.mean(final):.4f} "
        f"({min(final):.4f} - {max(final):.4f}); one process, synchronous SGD on as many batches "
        f"{statistics.mean(sync):.4f} ({min(sync):.4f} - {max(sync):.4f}); the noise floor is 0.09"
    )


if __name__ == "__main__":
    main()
