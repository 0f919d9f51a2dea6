"""DDP's communication settings and DiLoCo on this machine's loopback (unshaped): what each costs
or saves against plain DDP, 2 ranks as local processes (gloo), one process per rank.

Every contender trains the same MLP (``--hidden`` wide: its gradients are large against the
compute) on the same synthetic classification task for the same number of samples (fixed global
batch), and reports samples/s after a warm-up, the loss over its last steps, and the bytes it
all-reduced per sample:

- ``ddp``: ``comm.ddp(model)`` (DDP's defaults: 25 MiB buckets, float32 all-reduce);
- ``bucket1`` / ``bucket100``: ``bucket_cap_mb=1`` / ``100``;
- ``accumulate4``: ``accumulate=4``, micro-batches of a quarter (one all-reduce per 4);
- ``fp16`` / ``powersgd4``: the compression hooks (PowerSGD rank 4, after 2 plain steps);
- ``diloco8``: no DDP; ``DiLoCo(sync_every=8)`` after each inner SGD step.

Contenders interleave, the order alternating each round. Shaped links (1 and 10 Gbit/s between
network-namespace hosts) are not run here yet.

    python benchmarks/bench_comm.py [--hidden 2048] [--steps 40] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from harness import interleaved  # noqa: E402

FEATURES, CLASSES, BATCH = 512, 10, 128  # global batch: 64 rows per rank


def train(setting, hidden, steps, warmup=5):
    """One rank's run of ``setting``: samples/s (global), last loss, bytes all-reduced per sample."""
    import torch
    import torch.distributed as dist

    from sparkml_dist.parallel import comm
    from sparkml_dist.parallel.diloco import DiLoCo
    from sparkml_dist.runner import context, init_process_group

    init_process_group()
    torch.set_num_threads(1)
    rank, world = context().rank, context().world_size
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(), torch.nn.Linear(hidden, CLASSES),
    )  # fmt: skip
    params = sum(p.numel() for p in model.parameters())
    g = torch.Generator().manual_seed(1 + rank)
    teacher = torch.Generator().manual_seed(99)
    W = torch.randn(FEATURES, CLASSES, generator=teacher)
    accumulate = 4 if setting == "accumulate4" else 1
    options = {
        "ddp": {},
        "bucket1": {"bucket_cap_mb": 1},
        "bucket100": {"bucket_cap_mb": 100},
        "accumulate4": {"accumulate": 4},
        "fp16": {"compression": "fp16"},
        "powersgd4": {"compression": "powersgd", "powersgd_rank": 4},
    }
    outer = None
    if setting == "diloco8":
        net = model
        outer = DiLoCo(model, sync_every=8)
    else:
        net = comm.ddp(model, **options[setting])
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9 if outer is None else 0.0)
    per_rank = BATCH // world
    losses, started = [], None
    for step in range(warmup + steps):
        if step == warmup:
            dist.barrier()
            started = time.perf_counter()
        x = torch.randn(per_rank, FEATURES, generator=g)
        y = (x @ W).argmax(1)
        micro = per_rank // accumulate
        for m in range(accumulate):
            xb, yb = x[m * micro : (m + 1) * micro], y[m * micro : (m + 1) * micro]
            ctx = net.micro_step() if accumulate > 1 else _null()
            with ctx:
                loss = torch.nn.functional.cross_entropy(net(xb), yb) / accumulate
                loss.backward()
        opt.step()
        opt.zero_grad()
        if outer is not None:
            outer.step()
        losses.append(loss.item() * accumulate)
    dist.barrier()
    wall = time.perf_counter() - started
    samples = steps * BATCH
    if outer is not None:
        moved = outer.bytes_reduced * (steps / (warmup + steps))
    elif setting == "powersgd4":
        s = net._powersgd
        moved = (
            params * 4 * steps * s.total_numel_after_compression / max(s.total_numel_before_compression, 1)
        )
    else:
        moved = params * (2 if setting == "fp16" else 4) * steps
    return {
        "samples_per_s": samples / wall,
        "loss": sum(losses[-5:]) / 5,
        "bytes_per_sample": moved / samples,
        "params": params,
    }


class _null:
    def __enter__(self):
        return True

    def __exit__(self, *exc):
        return False


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    os.environ["PYTHONPATH"] = HERE + os.pathsep + os.environ.get("PYTHONPATH", "")
    from sparkml_dist.runner import BarrierRunner

    settings = ("ddp", "bucket1", "bucket100", "accumulate4", "fp16", "powersgd4", "diloco8")
    contenders = {
        s: (
            lambda s=s: BarrierRunner(-2, log_ranks="none", timeout=600, collective_timeout=60).run(
                train, s, args.hidden, args.steps
            )
        )
        for s in settings
    }
    _, last = interleaved(contenders, args.repeats)
    base = last["ddp"]
    print(
        f"\nloopback, 2 ranks (gloo), MLP {FEATURES}-{args.hidden}-{args.hidden}-{CLASSES} "
        f"({base['params'] / 1e6:.1f} M parameters), global batch {BATCH}, {args.steps} timed steps, "
        f"last of {args.repeats} interleaved rounds"
    )
    head = ("setting", "samples/s", "vs ddp", "loss", "bytes/sample", "vs ddp")
    print("  {:12s} {:>10s} {:>7s} {:>7s} {:>13s} {:>7s}".format(*head))
    for s in settings:
        r = last[s]
        speed = r["samples_per_s"] / base["samples_per_s"]
        moved = r["bytes_per_sample"] / base["bytes_per_sample"]
        print(
            f"  {s:12s} {r['samples_per_s']:10.0f} {speed:6.2f}x {r['loss']:7.3f} "
            f"{r['bytes_per_sample']:13,.0f} {moved:6.3f}x"
        )


if __name__ == "__main__":
    main()
