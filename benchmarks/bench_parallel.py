"""Pipeline parallelism on CPU: a deep MLP split in 2 and 4 stages vs the unsplit model on one rank.

For each contender, every rank reports (measured inside the rank, after warm-up steps):
* samples/s of training (mini-batches through pipe.step / a plain step, Adam);
* idle share ("bubble"): 1 - CPU time / wall time of the timed steps, with one torch thread per
  rank (a rank waiting on a gloo receive sleeps, so its CPU time is its compute);
* peak memory growth: peak RSS minus RSS before the model was built.  Split models are built on
  the meta device, as a model that does not fit one rank must be, so a rank only ever holds its
  stages' parameters, gradients and Adam state.

Contenders run as local rank processes (BarrierRunner(np < 0)), interleaved (the order rotates
every round); medians over the rounds.  On a machine with fewer cores than ranks, throughput
compares badly with more ranks: read the idle share and the memory there.

    python benchmarks/bench_parallel.py [--repeats 3] [--layers 16] [--width 2048] [--batch 256]
                                        [--micro 4] [--steps 12]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _build(layers, width, meta):
    import torch

    def make():
        blocks = [torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU()) for _ in range(layers)]
        return torch.nn.Sequential(*blocks, torch.nn.Linear(width, 10))

    torch.manual_seed(0)
    if meta:
        with torch.device("meta"):
            return make()
    return make()


def rank_bench(cfg):
    """Train cfg['steps'] timed steps after 2 warm-up steps; this rank's figures."""
    import torch

    torch.set_num_threads(cfg["threads"])
    if cfg["stages"] > 1:  # imports and the process group before the baseline: model memory only
        import sparkml_dist.parallel.pipe  # noqa: F401
        from sparkml_dist.runner import init_process_group

        init_process_group()
    base = _rss()
    batch, width = cfg["batch"], cfg["width"]
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(batch, width, generator=g), torch.randint(0, 10, (batch,), generator=g)
    loss_fn = torch.nn.functional.cross_entropy
    if cfg["stages"] == 1:
        model = _build(cfg["layers"], width, meta=False)
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)

        def step():
            opt.zero_grad()
            loss_fn(model(X), y).backward()
            opt.step()
    else:
        from sparkml_dist.parallel import pipeline

        pipe = pipeline(
            _build(cfg["layers"], width, meta=True),
            stages=cfg["stages"],
            microbatches=cfg["micro"],
            loss_fn=loss_fn,
            example_input=X,
            schedule=cfg["schedule"],
            balance="memory",
        )
        opt = torch.optim.Adam(pipe.parameters(), lr=1e-4)

        def step():
            opt.zero_grad()
            pipe.step(X, y)
            opt.step()

    for _ in range(2):
        step()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(cfg["steps"]):
        step()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "samples_s": cfg["steps"] * batch / wall,
        "idle": max(0.0, 1 - cpu / (wall * cfg["threads"])),
        "mem": peak - base,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--layers", type=int, default=16, help="hidden blocks (width x width); a small head follows"
    )
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--micro", type=int, default=4, help="micro-batches per mini-batch")
    args = ap.parse_args()
    from sparkml_dist.runner import BarrierRunner

    # glibc raises its mmap threshold to the size of a freed block (up to 32 MiB), after which the
    # 16 MiB weights and temporaries come from the heap and fragment it: RSS then measures the
    # allocator, not the model.  A fixed threshold (inherited by the ranks) measures the model.
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(1 << 20))
    cores = os.cpu_count() or 1
    common = dict(layers=args.layers, width=args.width, batch=args.batch, steps=args.steps, micro=args.micro)
    contenders = {
        "unsplit, 1 rank": dict(common, ranks=1, stages=1, schedule=None),
        "2 stages simple (GPipe), 2 ranks": dict(common, ranks=2, stages=2, schedule="simple"),
        "2 stages interleaved (1F1B), 2 ranks": dict(common, ranks=2, stages=2, schedule="interleaved"),
        "4 stages simple (looped), 2 ranks": dict(common, ranks=2, stages=4, schedule="simple"),
        "4 stages interleaved (i-1F1B), 2 ranks": dict(common, ranks=2, stages=4, schedule="interleaved"),
        "4 stages simple (GPipe), 4 ranks": dict(common, ranks=4, stages=4, schedule="simple"),
        "4 stages interleaved (1F1B), 4 ranks": dict(common, ranks=4, stages=4, schedule="interleaved"),
    }
    results = {name: [] for name in contenders}
    names = list(contenders)
    for r in range(args.repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            cfg = dict(contenders[name], threads=max(1, cores // contenders[name]["ranks"]))
            out = BarrierRunner(-cfg["ranks"], timeout=1800, log_ranks="none").run(
                rank_bench, cfg, return_all=True
            )
            results[name].append(out)
    print(
        f"\nMLP of {args.layers} hidden blocks + a head, width {args.width}, batch {args.batch}, "
        f"{args.micro} micro-batches; "
        f"{cores} cores, load {os.getloadavg()[0]:.1f}; medians of {args.repeats} rounds"
    )
    base = None
    print(
        f"{'contender':42s} {'samples/s':>10s} {'x unsplit':>9s} {'idle/rank':>10s} {'peak MiB/rank':>14s} "
        f"{'x unsplit':>9s}"
    )
    for name in names:
        rounds = results[name]
        sps = statistics.median(o[0]["samples_s"] for o in rounds)  # rank 0 sees every step end
        idle = statistics.median(statistics.mean(x["idle"] for x in o) for o in rounds)
        mem = statistics.median(max(x["mem"] for x in o) for o in rounds)
        base = base or (sps, mem)
        print(
            f"{name:42s} {sps:10.0f} {sps / base[0]:9.2f} {idle:10.0%} "
            f"{mem / 2**20:14.0f} {mem / base[1]:9.2f}"
        )


if __name__ == "__main__":
    main()
