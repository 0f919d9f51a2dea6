"""HorovodRunner's documented example (MNIST-style, Keras in the original) in PyTorch.

On Databricks this ran with ``from sparkdl import HorovodRunner``; here only that import differs.
The five steps are the seed's: initialise Horovod, pin the GPU of the local rank, the usual model
and data, the optimizer (learning rate scaled by ``hvd.size()``) wrapped in
``hvd.DistributedOptimizer``, then training with the initial weights broadcast from rank 0 (what
Keras' ``BroadcastGlobalVariablesCallback(0)`` did) and progress printed by rank 0 only.

    python examples/horovod_seed_example.py            # local[2], two ranks
"""

from sparkml_dist.horovod import HorovodRunner  # was: from sparkdl import HorovodRunner

hr = HorovodRunner(np=2)


def train():
    # Perform your training here..
    import horovod.torch as hvd
    import numpy as np
    import torch
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    # 1. initialise Horovod
    hvd.init()

    # 2. pin the GPU used by this process to its local rank (one GPU per process)
    if torch.cuda.is_available():
        torch.cuda.set_device(hvd.local_rank())

    # 3. standard model and data
    batch_size = 10
    epochs = 5
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    X, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        (X / 16.0).astype(np.float32), y, test_size=0.25, random_state=0
    )
    x_train, y_train = torch.from_numpy(x_train), torch.from_numpy(y_train)
    x_test, y_test = torch.from_numpy(x_test), torch.from_numpy(y_test)

    # 4. adjust the learning rate to the number of workers, add Horovod's distributed optimizer
    opt = torch.optim.Adadelta(model.parameters(), lr=1.0 * hvd.size())
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())

    # 5. start every rank from rank 0's weights, train, evaluate
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    loss_fn = torch.nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(hvd.rank())  # each rank its own batches
    for epoch in range(epochs):
        model.train()
        order = torch.randperm(len(x_train), generator=generator)
        for i in range(0, len(order), batch_size):
            batch = order[i : i + batch_size]
            opt.zero_grad()
            loss = loss_fn(model(x_train[batch]), y_train[batch])
            loss.backward()
            opt.step()
        if hvd.rank() == 0:  # verbose=1 if hvd.rank() == 0 else 0
            print(f"epoch {epoch + 1}/{epochs}: loss {loss.item():.4f}", flush=True)
    model.eval()
    with torch.no_grad():
        out = model(x_test)
        score = [loss_fn(out, y_test).item(), (out.argmax(1) == y_test).float().mean().item()]
    print("Test loss:", score[0])
    print("Test accuracy:", score[1])
    return score


if __name__ == "__main__":
    import os
    import sys

    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = SparkSession.builder.master(os.environ.get("SPARK_MASTER", "local[2]")).getOrCreate()
    print("test loss and accuracy of rank 0:", hr.run(train))
