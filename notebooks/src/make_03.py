"""Writes notebooks/03_horovod.ipynb (kept as code so reviews see plain diffs)."""

from nbwrite import write

cells = [
    (
        "md",
        "# Horovod on Spark with `HorovodRunner`\n\n"
        "Code written for Databricks' `sparkdl.HorovodRunner` runs here after changing one import. "
        "Each rank is a process of a Spark barrier task; Horovod's Gloo rendezvous is served by the "
        "launch itself (no mpirun, no ssh). Horovod must be installed first: `make horovod`.\n\n"
        "We train an MLP on scikit-learn's digits with `hvd.DistributedOptimizer` on 2 ranks.",
    ),
    (
        "code",
        "import os, sys\nos.environ.setdefault('PYSPARK_PYTHON', sys.executable)\n"
        "from pyspark.sql import SparkSession\n"
        "spark = (SparkSession.builder.master('local[2]').appName('03_horovod')\n"
        "         .config('spark.ui.enabled', 'false').config('spark.sql.shuffle.partitions', '4')\n"
        "         .config('spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures', '1')\n"
        "         .config('spark.scheduler.barrier.maxConcurrentTasksCheck.interval', '1s')\n"
        "         .getOrCreate())\n"
        "print('Spark', spark.version, 'on', spark.sparkContext.master)",
    ),
    (
        "code",
        "# from sparkdl import HorovodRunner      <- on Databricks\n"
        "from sparkml_dist.horovod import HorovodRunner, log_to_driver\n"
        "print('HorovodRunner from', HorovodRunner.__module__)",
    ),
    (
        "md",
        "## The training function\n"
        "The usual Horovod steps: `hvd.init()`, pin the GPU of the local rank (when there is one), "
        "scale the learning rate by `hvd.size()`, wrap the optimizer in `hvd.DistributedOptimizer`, "
        "broadcast rank 0's initial state. Each rank trains on its slice of the rows "
        "(`hvd.rank()::hvd.size()`). `log_to_driver` sends progress to this cell; with the default "
        "`driver_log_verbosity='log_callback_only'` plain prints stay in the executors' logs.",
    ),
    (
        "code",
        "def train(epochs=20, lr=0.05):\n"
        "    import numpy as np, torch\n"
        "    import horovod.torch as hvd\n"
        "    from sklearn.datasets import load_digits\n"
        "    from sklearn.model_selection import train_test_split\n"
        "    hvd.init()\n"
        "    if torch.cuda.is_available():\n"
        "        torch.cuda.set_device(hvd.local_rank())\n"
        "    X, y = load_digits(return_X_y=True)\n"
        "    X_train, _, y_train, _ = train_test_split((X / 16.0).astype(np.float32), y, test_size=0.25, random_state=0)\n"
        "    X_train = torch.from_numpy(X_train[hvd.rank()::hvd.size()])\n"
        "    y_train = torch.from_numpy(y_train[hvd.rank()::hvd.size()])\n"
        "    torch.manual_seed(0)\n"
        "    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))\n"
        "    opt = torch.optim.SGD(net.parameters(), lr=lr * hvd.size(), momentum=0.9)\n"
        "    opt = hvd.DistributedOptimizer(opt, named_parameters=net.named_parameters())\n"
        "    hvd.broadcast_parameters(net.state_dict(), root_rank=0)\n"
        "    hvd.broadcast_optimizer_state(opt, root_rank=0)\n"
        "    import time\n"
        "    losses, own, seconds = [], [], []\n"
        "    for epoch in range(epochs):\n"
        "        total, started = 0.0, time.perf_counter()\n"
        "        for i in range(0, len(X_train), 32):\n"
        "            opt.zero_grad()\n"
        "            loss = torch.nn.functional.cross_entropy(net(X_train[i:i + 32]), y_train[i:i + 32])\n"
        "            loss.backward(); opt.step()\n"
        "            total += loss.item() * len(y_train[i:i + 32])\n"
        "        # the mean training loss over all ranks' rows\n"
        "        own.append(total / len(y_train)); seconds.append(time.perf_counter() - started)\n"
        "        losses.append(hvd.allreduce(torch.tensor(own[-1]), name='loss').item())\n"
        "        if hvd.rank() == 0 and epoch % 5 == 0:\n"
        "            log_to_driver(f'epoch {epoch}: loss {losses[-1]:.4f}')\n"
        "    per_rank = hvd.allgather_object({'loss': own, 'seconds': seconds})  # every rank's curve\n"
        "    return {'state': {k: v.clone() for k, v in net.state_dict().items()}, 'losses': losses, 'per_rank': per_rank}\n\n"
        "print('train() runs in its own process on every rank')",
    ),
    (
        "md",
        "## Debug first on the driver (`np < 0`), then on the cluster\n"
        "`np=-2` runs two local processes and shows all their output, as on Databricks.",
    ),
    ("code", "HorovodRunner(np=-2).run(train, epochs=1)['losses']"),
    (
        "code",
        "hr = HorovodRunner(np=2)\nresult = hr.run(train, epochs=20)\n"
        "print('final training loss', round(result['losses'][-1], 4))",
    ),
    ("md", "## Loss curve and test accuracy of rank 0's weights"),
    (
        "code",
        "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
        "%matplotlib inline\n"
        "fig, (loss, secs) = plt.subplots(1, 2, figsize=(9, 3.2))\n"
        "for r, curve in enumerate(result['per_rank']):\n"
        "    loss.plot(curve['loss'], label=f'rank {r} (its own rows)')\n"
        "    secs.plot(curve['seconds'], label=f'rank {r}')\n"
        "loss.plot(result['losses'], 'k--', label='all ranks (allreduce)')\n"
        "loss.set_xlabel('epoch'); loss.set_ylabel('training loss'); loss.legend()\n"
        "secs.set_xlabel('epoch'); secs.set_ylabel('seconds per epoch'); secs.legend()\n"
        "fig.suptitle('Horovod on 2 Spark barrier tasks'); plt.tight_layout(); plt.show()",
    ),
    (
        "code",
        "import numpy as np, torch\nfrom sklearn.datasets import load_digits\n"
        "from sklearn.model_selection import train_test_split\n"
        "X, y = load_digits(return_X_y=True)\n"
        "_, X_test, _, y_test = train_test_split((X / 16.0).astype(np.float32), y, test_size=0.25, random_state=0)\n"
        "net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))\n"
        "net.load_state_dict(result['state'])\n"
        "with torch.no_grad():\n"
        "    accuracy = (net(torch.from_numpy(X_test)).argmax(1).numpy() == y_test).mean()\n"
        "print(f'test accuracy {accuracy:.3f}')\n"
        "assert accuracy > 0.9, accuracy\nassert result['losses'][-1] < result['losses'][0]",
    ),
    (
        "md",
        "## Beyond HorovodRunner: feed each rank its shard of a DataFrame\n"
        "`run_with_data` splits a Spark DataFrame into one disjoint shard per rank; "
        "`sparkml_dist.runner.shard()` reads it inside the function.",
    ),
    (
        "code",
        "df = spark.createDataFrame([(x.tolist(), int(t)) for x, t in zip(X / 16.0, y)],\n"
        "                           'features array<double>, label long')\n\n"
        "def rows_per_rank():\n"
        "    import horovod.torch as hvd\n"
        "    from sparkml_dist.runner import shard\n"
        "    hvd.init()\n"
        "    return hvd.allgather_object(shard().num_rows)\n\n"
        "counts = hr.run_with_data(df, rows_per_rank)\nprint(counts, sum(counts))\n"
        "assert sum(counts) == len(y)",
    ),
    ("code", "spark.stop()\nprint('Spark stopped')"),
]

if __name__ == "__main__":
    write(cells, "03_horovod.ipynb")
