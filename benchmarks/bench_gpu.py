"""BarrierRunner vs torchrun on the same GPUs, no Spark JVM needed (ranks as local processes).

Run as ``python benchmarks/bench_runner.py --gpu`` (or this file directly) on a GPU machine:

(a) wall time of a no-op job (NCCL init + one all-reduce on the GPU);
(b) DDP samples/s of an MLP 1024-4096-4096-10, batch 512 per rank (rank 0's loop, after warm-up);
(c) a 1,000,000 x 50 float shard into a GPU tensor: ``shard().to_torch(device=...)`` from the rank's
    Arrow shard file vs the usual ``torch.from_numpy(array).to(device)``.

Targets (issue 13): (b) >= 0.97x torchrun, (a) <= torchrun.  Contenders interleave every round.

    python benchmarks/bench_runner.py --gpu [--repeats 3] [--steps 300] [--ranks N]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def _device():
    import torch

    # torchrun's rule, which the runner follows too: every GPU visible, LOCAL_RANK picks the rank's
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))


def gpu_noop():
    import torch
    import torch.distributed as dist

    dev = _device()
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl")
    t = torch.ones(1, device=dev)
    dist.all_reduce(t)
    torch.cuda.synchronize()
    return t.item()


def gpu_mlp(steps=300, batch=512, warmup=30):
    import torch
    import torch.distributed as dist

    dev = _device()
    torch.cuda.set_device(dev)
    if not dist.is_initialized():
        dist.init_process_group("nccl")
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096),
        torch.nn.ReLU(),
        torch.nn.Linear(4096, 4096),
        torch.nn.ReLU(),
        torch.nn.Linear(4096, 10),
    ).to(dev)
    model = torch.nn.parallel.DistributedDataParallel(net, device_ids=[dev.index])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    X = torch.randn(batch, 1024, device=dev)
    y = torch.randint(0, 10, (batch,), device=dev)
    for i in range(warmup + steps):
        if i == warmup:
            torch.cuda.synchronize()
            dist.barrier()
            t0 = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(X), y).backward()
        opt.step()
    torch.cuda.synchronize()
    return steps * batch * dist.get_world_size() / (time.perf_counter() - t0)


def shard_to_gpu(rows=1_000_000, device=None):
    """Seconds to move a rows x 50 float shard to this rank's GPU (or ``device``): ours vs
    ``from_numpy().to()``."""
    import numpy as np
    import pyarrow as pa
    import torch

    from sparkml_dist.runner.data.shard import Shard

    dev = torch.device(device) if device else _device()
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    table = pa.table({f"c{i}": np.random.default_rng(i).random(rows, dtype=np.float32) for i in range(50)})
    path = os.path.join(tempfile.mkdtemp(), "shard.arrow")
    with pa.ipc.new_file(path, table.schema) as w:
        w.write_table(table, max_chunksize=65536)
    shard = Shard(pa.ipc.open_file(pa.memory_map(path)).read_all(), [rows], 0)
    os.remove(path)  # the mapping stays readable; nothing is left behind
    os.rmdir(os.path.dirname(path))
    torch.ones(1, device=dev)  # CUDA context outside the timings
    t = time.perf_counter()
    ours = shard.to_torch(device=dev)
    sync()
    t_ours = time.perf_counter() - t
    t = time.perf_counter()
    array = np.stack([table.column(i).to_numpy() for i in range(50)], axis=1)
    plain = torch.from_numpy(array).to(dev)
    sync()
    t_plain = time.perf_counter() - t
    assert torch.equal(ours, plain)
    return {"ours_s": t_ours, "numpy_to_s": t_plain}


TORCHRUN = textwrap.dedent("""
    import sys
    sys.path.insert(0, {here!r})
    import torch.distributed as dist
    from bench_gpu import gpu_noop, gpu_mlp
    r = {call}
    if dist.get_rank() == 0:
        print("RESULT", r, flush=True)
    dist.destroy_process_group()
""")


def torchrun(call: str, ranks: int):
    script = os.path.join(tempfile.mkdtemp(), "job.py")
    with open(script, "w") as fh:
        fh.write(TORCHRUN.format(here=HERE, call=call))
    t = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", script],
        capture_output=True,
        text=True,
        check=True,
    )
    return time.perf_counter() - t, float(out.stdout.split("RESULT", 1)[1].split()[0])


def main(argv=None) -> None:
    import argparse

    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--ranks", type=int, default=0, help="default: every visible GPU")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench_gpu: no CUDA device here")
    from sparkml_dist.runner import BarrierRunner

    n = args.ranks or torch.cuda.device_count()
    os.environ["PYTHONPATH"] = HERE + os.pathsep + os.environ.get("PYTHONPATH", "")

    def ours(fn, *a):
        t = time.perf_counter()
        v = BarrierRunner(-n, use_gpu=True, log_ranks="none", timeout=1800).run(fn, *a)
        return time.perf_counter() - t, v

    contenders = {
        "noop": {"sparkml_dist": lambda: ours(gpu_noop), "torchrun": lambda: torchrun("gpu_noop()", n)},
        "mlp": {
            "sparkml_dist": lambda: ours(gpu_mlp, args.steps),
            "torchrun": lambda: torchrun(f"gpu_mlp({args.steps})", n),
        },
    }
    results = {s: {k: [] for k in c} for s, c in contenders.items()}
    for r in range(args.repeats):
        for section, cs in contenders.items():
            names = list(cs)[r % 2 :] + list(cs)[: r % 2]
            for name in names:
                wall, value = cs[name]()
                results[section][name].append((wall, value))
                print(f"round {r} {section:5s} {name:13s} wall {wall:7.2f}s  {value}", flush=True)
    med = statistics.median
    w = {k: med([x for x, _ in v]) for k, v in results["noop"].items()}
    sps = {k: med([v for _, v in vals]) for k, vals in results["mlp"].items()}
    feed = BarrierRunner(-1, use_gpu=True, log_ranks="none").run(shard_to_gpu)
    print(f"\n{n} x {torch.cuda.get_device_name(0)}, medians of {args.repeats} rounds")
    print(
        f"(a) no-op wall: ours {w['sparkml_dist']:.2f}s, torchrun {w['torchrun']:.2f}s = "
        f"{w['sparkml_dist'] / w['torchrun']:.3f}x (target <= 1)"
    )
    print(
        f"(b) DDP samples/s: ours {sps['sparkml_dist']:,.0f}, torchrun {sps['torchrun']:,.0f} = "
        f"{sps['sparkml_dist'] / sps['torchrun']:.3f}x (target >= 0.97)"
    )
    print(
        f"(c) 1,000,000 x 50 shard to the GPU: ours {feed['ours_s']:.3f}s, numpy + .to() "
        f"{feed['numpy_to_s']:.3f}s"
    )


if __name__ == "__main__":
    main()
