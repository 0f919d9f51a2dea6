"""Writes notebooks/02_barrier_training.ipynb (kept as code so reviews see plain diffs)."""

from nbwrite import write

cells = [
    (
        "md",
        "# Data-parallel PyTorch on Spark with `BarrierRunner`\n\nAn MLP on scikit-learn's digits, "
        "trained with DistributedDataParallel on 2 ranks. Each rank reads its own shard of a Spark "
        "DataFrame; rank 0 returns the weights and the loss curve.",
    ),
    (
        "code",
        "import os, sys\nos.environ.setdefault('PYSPARK_PYTHON', sys.executable)\n"
        "from pyspark.sql import SparkSession\n"
        "spark = (SparkSession.builder.master('local[2]').appName('02_barrier_training')\n"
        "         .config('spark.ui.enabled', 'false').config('spark.sql.shuffle.partitions', '4')\n"
        "         .config('spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures', '1')\n"
        "         .config('spark.scheduler.barrier.maxConcurrentTasksCheck.interval', '1s')\n"
        "         .getOrCreate())\n"
        "print('Spark', spark.version, 'on', spark.sparkContext.master)",
    ),
    (
        "code",
        "import numpy as np\nfrom sklearn.datasets import load_digits\n"
        "from sklearn.model_selection import train_test_split\n"
        "X, y = load_digits(return_X_y=True)\nX = X / 16.0\n"
        "X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.25, random_state=0)\n"
        "train_df = spark.createDataFrame([(x.tolist(), int(t)) for x, t in zip(X_train, y_train)],\n"
        "                                 'features array<double>, label long')\n"
        "print(train_df.count(), 'training rows')",
    ),
    (
        "md",
        "## The training function\nIt runs in its own process on every rank. `init_process_group()` "
        "picks gloo (CPU) or NCCL (GPU); `shard().dataloader(...)` gives every rank the same number "
        "of batches per epoch, so DDP never waits on a rank that ran out of data.",
    ),
    (
        "code",
        "def train(epochs=30, lr=0.05):\n"
        "    import torch, torch.distributed as dist\n"
        "    from sparkml_dist.runner import context, init_process_group, shard\n"
        "    init_process_group()\n"
        "    torch.manual_seed(0)\n"
        "    device = context().device  # 'cpu', or this rank's GPU with use_gpu=True\n"
        "    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)).to(device)\n"
        "    model = torch.nn.parallel.DistributedDataParallel(net)\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)\n"
        "    loader = shard().dataloader(32, ['features', 'label'], shuffle=True, seed=0, device=device, pin_memory=True)\n"
        "    import time\n"
        "    losses, own, seconds = [], [], []\n"
        "    for epoch in range(epochs):\n"
        "        total, started = torch.zeros(2, device=device), time.perf_counter()\n"
        "        for xb, yb in loader:\n"
        "            loss = torch.nn.functional.cross_entropy(model(xb), yb)\n"
        "            opt.zero_grad(); loss.backward(); opt.step()\n"
        "            total += torch.tensor([loss.item() * len(yb), len(yb)], device=device)\n"
        "        own.append((total[0] / total[1]).item()); seconds.append(time.perf_counter() - started)\n"
        "        dist.all_reduce(total)\n"
        "        losses.append((total[0] / total[1]).item())\n"
        "        if context().rank == 0 and epoch % 10 == 0:\n"
        "            print(f'epoch {epoch}: loss {losses[-1]:.4f}')\n"
        "    per_rank = [None] * dist.get_world_size()\n"
        "    dist.all_gather_object(per_rank, {'loss': own, 'seconds': seconds})  # every rank's curve\n"
        "    return {'state': {k: v.cpu().clone() for k, v in net.state_dict().items()}, 'losses': losses,\n"
        "            'per_rank': per_rank}\n\n"
        "print('train() runs in its own process on every rank')",
    ),
    (
        "code",
        "from sparkml_dist.runner import BarrierRunner\n"
        "result = BarrierRunner(np=2, timeout=600).run_with_data(train_df, train, epochs=30)\n"
        "print('final training loss', round(result['losses'][-1], 4))",
    ),
    ("md", "## Loss curve and test accuracy"),
    (
        "code",
        "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
        "%matplotlib inline\n"
        "fig, (loss, secs) = plt.subplots(1, 2, figsize=(9, 3.2))\n"
        "for r, curve in enumerate(result['per_rank']):\n"
        "    loss.plot(curve['loss'], label=f'rank {r} (its own shard)')\n"
        "    secs.plot(curve['seconds'], label=f'rank {r}')\n"
        "loss.plot(result['losses'], 'k--', label='all ranks (all_reduce)')\n"
        "loss.set_xlabel('epoch'); loss.set_ylabel('training loss'); loss.legend()\n"
        "secs.set_xlabel('epoch'); secs.set_ylabel('seconds per epoch'); secs.legend()\n"
        "fig.suptitle('DDP on 2 Spark barrier tasks'); plt.tight_layout(); plt.show()",
    ),
    (
        "code",
        "import torch\n"
        "net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))\n"
        "net.load_state_dict(result['state'])\n"
        "with torch.no_grad():\n"
        "    pred = net(torch.tensor(X_test, dtype=torch.float32)).argmax(1).numpy()\n"
        "accuracy = (pred == y_test).mean()\nprint(f'test accuracy {accuracy:.3f}')\n"
        "assert accuracy > 0.9, accuracy\nassert result['losses'][-1] < result['losses'][0]",
    ),
    (
        "md",
        "## On GPUs\n`use_gpu=True` gives each rank one GPU (`cuda:0` in the rank, "
        "`context().device`) and NCCL; on a single GPU machine with `local[*]` Spark (or `np < 0`) "
        "the ranks take the driver's GPUs in order. The same training on GPUs, where there are some:",
    ),
    (
        "code",
        "from sparkml_dist.gpus import visible\n"
        "gpus = visible()\n"
        "if gpus:\n"
        "    n = min(2, len(gpus))\n"
        "    on_gpu = BarrierRunner(np=-n, use_gpu=True, timeout=600).run_with_data(train_df, train, epochs=5)\n"
        "    print(f'{n} rank(s) on GPUs {gpus[:n]}: final loss', round(on_gpu['losses'][-1], 4))\n"
        "else:\n"
        "    print('no GPU on this machine: use_gpu=True would refuse to start (it names the GPUs it sees)')",
    ),
    ("code", "spark.stop()\nprint('Spark stopped')"),
]

if __name__ == "__main__":
    write(cells, "02_barrier_training.ipynb")
