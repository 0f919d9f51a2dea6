"""Writes notebooks/05_model_parallel.ipynb (kept as code so reviews see plain diffs)."""

from nbwrite import write

cells = [
    (
        "md",
        "# Models larger than one device: pipeline stages\n\n"
        "**Data parallelism** copies the whole model to every rank and splits the data; **model "
        "parallelism** splits the model itself. `sparkml_dist.parallel.pipeline` cuts a "
        "`torch.nn.Sequential` into **stages** of consecutive layers, one (or more) per rank, on "
        "PyTorch's `torch.distributed.pipelining`. Each mini-batch is cut into **micro-batches** that "
        "flow through the stages under a **schedule**:\n\n"
        "* `simple`: all forwards, then all backwards (GPipe);\n"
        "* `interleaved`: forwards and backwards interleaved (1F1B; with several stages per rank, "
        "interleaved 1F1B), which keeps the devices busier and holds fewer activations.\n\n"
        "The split is **balanced** by `compute` (measured time per layer) or `memory` (parameters, "
        "gradients and activations per layer). Stages combine with data-parallel replicas.",
    ),
    (
        "code",
        "import os, sys\nos.environ.setdefault('PYSPARK_PYTHON', sys.executable)\n"
        "from pyspark.sql import SparkSession\n"
        "spark = (SparkSession.builder.master('local[2]').appName('05_model_parallel')\n"
        "         .config('spark.ui.enabled', 'false')\n"
        "         .config('spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures', '1')\n"
        "         .config('spark.scheduler.barrier.maxConcurrentTasksCheck.interval', '1s').getOrCreate())\n"
        "print('Spark', spark.version, 'on', spark.sparkContext.master)",
    ),
    (
        "md",
        "## A 16-block residual MLP in two stages on two barrier tasks\nEvery rank builds the model "
        "and draws the same mini-batches; `pipeline()` keeps each rank's stages only. "
        "`pipe.step` returns the mini-batch's mean loss on every rank.",
    ),
    (
        "code",
        "import torch\n\n"
        "def build(width=64, layers=16):\n"
        "    torch.manual_seed(0)\n"
        "    block = lambda: torch.nn.Sequential(torch.nn.LayerNorm(width), torch.nn.Linear(width, width), torch.nn.GELU())\n"
        "    return torch.nn.Sequential(*[block() for _ in range(layers - 1)], torch.nn.Linear(width, 1))\n\n"
        "def batch(step, rows=64, width=64):\n"
        "    g = torch.Generator().manual_seed(step)\n"
        "    X = torch.randn(rows, width, generator=g)\n"
        "    return X, X[:, :4].sum(1, keepdim=True) / 2\n\n"
        "def train(steps=40, schedule='interleaved', balance='compute', data_parallel=1):\n"
        "    from sparkml_dist.parallel import pipeline\n"
        "    rows = 64 // data_parallel\n"
        "    pipe = pipeline(build(), stages=2, microbatches=4, loss_fn=torch.nn.functional.mse_loss,\n"
        "                    example_input=torch.zeros(rows, 64), schedule=schedule, balance=balance,\n"
        "                    data_parallel=data_parallel)\n"
        "    import time, torch.distributed as dist\n"
        "    torch.set_num_threads(1)  # one core per rank: CPU time / wall time = the rank's busy share\n"
        "    opt = torch.optim.SGD(pipe.parameters(), lr=0.01)\n"
        "    losses = []\n"
        "    wall, cpu = time.perf_counter(), time.process_time()\n"
        "    for step in range(steps):\n"
        "        X, y = batch(step)\n"
        "        mine = slice(pipe.replica * rows, (pipe.replica + 1) * rows)\n"
        "        opt.zero_grad(); losses.append(pipe.step(X[mine], y[mine])); opt.step()\n"
        "    timing = [None] * dist.get_world_size()\n"
        "    dist.all_gather_object(timing, (time.perf_counter() - wall, time.process_time() - cpu))\n"
        "    return {'split': pipe.split, 'losses': losses, 'state': pipe.full_state_dict(), 'timing': timing}\n\n"
        "from sparkml_dist.runner import BarrierRunner\n"
        "inter = BarrierRunner(np=2, spark=spark).run(train)\n"
        "print('split', inter['split'], ' loss', round(inter['losses'][0], 4), '->', round(inter['losses'][-1], 4))",
        "vary",
    ),
    (
        "md",
        "## Both schedules compute the same gradients\nThe `simple` schedule with a `memory` "
        "split trains to the same weights, and so does one process with the unsplit model.",
    ),
    (
        "code",
        "simple = BarrierRunner(np=2, spark=spark).run(train, schedule='simple', balance='memory')\n"
        "model = build(); opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        "for step in range(40):\n"
        "    X, y = batch(step)\n"
        "    opt.zero_grad(); torch.nn.functional.mse_loss(model(X), y).backward(); opt.step()\n"
        "one = model.state_dict()\n"
        "diff = lambda a, b: max((a[k] - b[k]).abs().max().item() for k in a)\n"
        "print('interleaved vs one process', diff(inter['state'], one))\n"
        "print('simple vs one process     ', diff(simple['state'], one))\n"
        "assert diff(inter['state'], one) < 1e-5 and diff(simple['state'], one) < 1e-5",
    ),
    (
        "md",
        "Where each rank's time goes: its CPU time over the wall time of the 40 steps (one thread per "
        "rank), i.e. computing vs waiting for the other stage (the pipeline's bubble and the "
        "transfers); and what one rank must hold, by the planner's formula, whole vs split in two.",
    ),
    (
        "code",
        "import numpy as np, matplotlib.pyplot as plt\nfrom sparkml_dist.plan import model_bytes\n"
        "fig, (busy, mem) = plt.subplots(1, 2, figsize=(9, 3.2))\n"
        "for k, (name, res) in enumerate([('interleaved', inter), ('simple', simple)]):\n"
        "    share = [c / w for w, c in res['timing']]\n"
        "    ranks = np.arange(len(share)) + k * 0.35\n"
        "    busy.bar(ranks, share, width=0.35, label=f'{name}: computing')\n"
        "    busy.bar(ranks, [1 - x for x in share], width=0.35, bottom=share, color='#ddd')\n"
        "    print(name, 'busy share per rank', [round(x, 2) for x in share])\n"
        "busy.set_xticks([0.17, 1.17], ['rank 0 (stage 0)', 'rank 1 (stage 1)']); busy.set_ylabel('share of wall time')\n"
        "busy.set_title('computing (colour) vs waiting (grey)'); busy.legend(loc='lower right')\n"
        "whole, stage = model_bytes(build(), backprop=True), model_bytes(build(), backprop=True, stages=2)\n"
        "mem.bar(['unsplit (one rank)', 'largest of 2 stages'], [whole / 2**20, stage / 2**20], color=['#9ab', '#5a7'])\n"
        "mem.set_ylabel('MiB per rank (weights, grads, SGD state, activations)'); mem.set_title('memory per rank')\n"
        "plt.tight_layout(); plt.show()",
        "vary",
    ),
    (
        "md",
        "## Data x pipeline: 2 stages x 2 replicas\nFour ranks: two pipelines, each on half of every "
        "mini-batch, with each stage's gradients averaged over its replicas (a 2-D `DeviceMesh`). "
        "This machine has two Spark slots, so the ranks run as local processes (`np=-4`).",
    ),
    (
        "code",
        "both = BarrierRunner(np=-4).run(train, data_parallel=2)\n"
        "print('2 x 2 vs one process', diff(both['state'], one))",
        "vary",
    ),
    (
        "md",
        "## How much one rank holds\nThe planner's formula for the whole model and for one of two "
        "stages: `BarrierRunner(model_bytes=...)` refuses a run whose share does not fit an executor. "
        "For models whose parameters and optimizer state must be sharded over data-parallel ranks, "
        "FSDP2's `fully_shard` works inside the function unchanged (`examples/fsdp_train.py`).",
    ),
    (
        "code",
        "from sparkml_dist.plan import model_bytes\n"
        "net = build(width=1024)\n"
        "print(f'whole: {model_bytes(net, backprop=True) / 2**20:.1f} MiB, '\n"
        "      f'largest of 2 stages: {model_bytes(net, backprop=True, stages=2) / 2**20:.1f} MiB')",
    ),
    ("code", "spark.stop()\nprint('Spark stopped')"),
]

if __name__ == "__main__":
    write(cells, "05_model_parallel.ipynb")
