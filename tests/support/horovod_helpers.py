"""Horovod training functions used by the Horovod tests (module-level so they pickle by reference)."""

import os
import signal
import time


def collectives():
    """allreduce / allgather / broadcast across the ranks, and Horovod's view of the placement."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    summed = hvd.allreduce(torch.tensor([float(rank + 1)]), op=hvd.Sum, name="sum")
    averaged = hvd.allreduce(torch.tensor([float(rank + 1)]), name="avg")
    # ranks contribute different row counts: allgather concatenates them in rank order
    gathered = hvd.allgather(torch.full((rank + 1, 2), float(rank)), name="gather")
    sent = torch.arange(3, dtype=torch.float32) * 10 if rank == 0 else torch.zeros(3)
    received = hvd.broadcast(sent, root_rank=0, name="bcast")
    obj = hvd.broadcast_object({"from": rank}, root_rank=0)
    print(f"rank {rank} of {size} ready", flush=True)
    return {
        "rank": rank,
        "size": size,
        "local_rank": hvd.local_rank(),
        "local_size": hvd.local_size(),
        "cross_rank": hvd.cross_rank(),
        "cross_size": hvd.cross_size(),
        "sum": summed.item(),
        "avg": averaged.item(),
        "gathered": gathered.tolist(),
        "broadcast": received.tolist(),
        "object": obj,
        "gloo": hvd.gloo_enabled(),
    }


def train_digits(epochs=12, lr=0.05, seed=0):
    """A DistributedOptimizer MLP on scikit-learn's digits, each rank on its half of the rows.

    Returns rank's final weights, the training-loss history and the test accuracy of the weights.
    """
    import horovod.torch as hvd
    import numpy as np
    import torch
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    hvd.init()
    torch.manual_seed(seed + hvd.rank())  # different starts: broadcast_parameters must align them
    X, y = load_digits(return_X_y=True)
    X = (X / 16.0).astype(np.float32)
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.25, random_state=0)
    X_train, y_train = X_train[hvd.rank() :: hvd.size()], y_train[hvd.rank() :: hvd.size()]
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    opt = torch.optim.SGD(model.parameters(), lr=lr * hvd.size(), momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    Xt, yt = torch.from_numpy(X_train), torch.from_numpy(y_train)
    losses = []
    for _ in range(epochs):
        total = 0.0
        for i in range(0, len(Xt), 32):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(Xt[i : i + 32]), yt[i : i + 32])
            loss.backward()
            opt.step()
            total += loss.item()
        losses.append(hvd.allreduce(torch.tensor(total / (len(Xt) / 32)), name="epoch_loss").item())
    with torch.no_grad():
        accuracy = (model(torch.from_numpy(X_test)).argmax(1).numpy() == y_test).mean()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    # every rank must hold the same weights: gather a checksum of each rank's
    checks = hvd.allgather_object(float(sum(v.double().sum() for v in weights.values())))
    return {"state": weights, "losses": losses, "accuracy": float(accuracy), "checks": checks}


def fail_on(rank_to_fail, how, step=2):
    """All-reduce steps; rank ``rank_to_fail`` fails at ``step`` in the way ``how``."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    for i in range(6):
        if hvd.rank() == rank_to_fail and i == step:
            print(f"rank {hvd.rank()} about to fail with {how}", flush=True)
            if how == "raise":
                raise ValueError(f"injected horovod failure at step {i}")
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if how == "hang":
                time.sleep(3600)
        hvd.allreduce(torch.ones(1), name=f"step{i}")
    return hvd.rank()


def rank_pids():
    import horovod.torch as hvd

    hvd.init()
    return os.getpid()


def talk(n_lines=3):
    """Prints on stdout and sends lines with log_to_driver, for the log verbosity tests."""
    import horovod.torch as hvd

    from sparkml_dist.horovod import log_to_driver

    hvd.init()
    for i in range(n_lines):
        print(f"plain print {i} from rank {hvd.rank()}", flush=True)
    log_to_driver(f"callback line from rank {hvd.rank()}")
    return hvd.rank()


def shard_rows():
    import horovod.torch as hvd

    from sparkml_dist.runner import shard

    hvd.init()
    values = shard().to_numpy(["x"]).reshape(-1).tolist()
    return hvd.allgather_object(sorted(values))


def sleep_before_init(rank_to_sleep, seconds):
    import horovod.torch as hvd

    if int(os.environ["RANK"]) == rank_to_sleep:
        time.sleep(seconds)
    hvd.init()
    return hvd.rank()
