"""What the ranks' step clock costs, and how soon it names a slowed rank (sparkml_dist.runner.timing).

Three sections (``--sections``), on ``BarrierRunner(2)`` over local[2] (gloo):

- ``overhead``: bench_comm.py's MLP (``--hidden 4096``: 18.9 M parameters), DDP on 2 local rank
  processes (gloo), the same steps with the step clock on and off (``SPARKML_DIST_STEP_TIMING=0``
  in their environment), interleaved; samples/s of each and their ratio (target: the clock costs
  <= 1% of a step);
- ``detect``: a small DDP model whose rank 1 becomes 1.5x slower (extra compute a step, half its
  undisturbed step time) after ``--slow-after`` steps: how many of rank 1's summaries after the
  slowdown until the console names it (target: <= 3), and ``--quiet-runs`` undisturbed runs of
  the same job, none of which may name a rank;
- ``figure``: the report of a run with rank 1 slowed, drawn (``report.plot()``) to ``--figure``;
- ``link`` (alone): two network-namespace hosts (root, iproute2), one rank each, the MLP with host2's
  link unshaped and then shaped to ``--rate``: where each rank's time went and the report's advice.

    python benchmarks/bench_timing.py [--sections overhead,detect,figure] [--repeats 3] [--steps 40]
        [--quiet-runs 10] [--figure docs/figures/rank_times.png]
    python benchmarks/bench_timing.py --sections link [--rate 1gbit] [--steps 40]
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

from harness import local_session  # noqa: E402

FEATURES, CLASSES, BATCH = 512, 10, 128


def mlp_steps(hidden, steps, warmup=5):
    """bench_comm's MLP under DDP: samples/s over the timed steps (global batch BATCH)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from sparkml_dist.runner import init_process_group

    torch.set_num_threads(1)
    init_process_group()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(), torch.nn.Linear(hidden, CLASSES),
    )  # fmt: skip
    net = DistributedDataParallel(model)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    x = torch.randn(BATCH // dist.get_world_size(), FEATURES)
    y = torch.randint(0, CLASSES, (BATCH // dist.get_world_size(),))
    for i in range(warmup + steps):
        if i == warmup:
            dist.barrier()
            start = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    dist.barrier()
    return steps * BATCH / (time.perf_counter() - start)


def slowed(slow_after, steps, extra_s, marks=None):
    """A small DDP model; rank 1 computes ``extra_s`` more each step after ``slow_after`` steps (the
    wall time of the slowdown is written to ``marks``)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from sparkml_dist.runner import init_process_group

    init_process_group()
    torch.manual_seed(0)
    net = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    )
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    x = torch.randn(32, 64)
    for i in range(steps):
        if i == slow_after and dist.get_rank() == 1 and marks:
            with open(marks, "w") as fh:
                fh.write(str(time.time()))
        opt.zero_grad()
        loss = net(x).sum()
        time.sleep(0.02)  # every rank's own work: 20 ms a step
        if dist.get_rank() == 1 and i >= slow_after:
            time.sleep(extra_s)
        loss.backward()
        opt.step()
    return steps


def overhead_rates(args):
    """Each round's samples/s of both, interleaved: the median ratio."""
    from sparkml_dist.runner import BarrierRunner

    on, off = [], []
    for r in range(args.repeats):
        for name in ("on", "off") if r % 2 == 0 else ("off", "on"):
            # local processes (np=-2): they start with this process's environment, the switch included
            os.environ["SPARKML_DIST_STEP_TIMING"] = "1" if name == "on" else "0"
            rate = BarrierRunner(-2, log_ranks="none").run(mlp_steps, args.hidden, args.steps)
            (on if name == "on" else off).append(rate)
            print(
                f"round {r} timing {name:3s} load {os.getloadavg()[0]:4.2f} samples/s {rate:8.1f}", flush=True
            )
    os.environ.pop("SPARKML_DIST_STEP_TIMING", None)
    ratio = statistics.median(on) / statistics.median(off)
    print(
        f"overhead: timing on {statistics.median(on):.1f} samples/s, off {statistics.median(off):.1f}: "
        f"on/off {ratio:.3f} (the clock costs {100 * (1 - ratio):.1f}% of a step; target <= 1%)"
    )
    return ratio


def detect(args):
    from sparkml_dist.runner import BarrierRunner
    from sparkml_dist.runner.timing import clock

    marks = os.path.join(os.getcwd(), ".bench_timing_slowdown")
    lines = []
    said_at = []

    def sink(text):
        lines.append(text)
        if " is slow: " in text:
            said_at.append(time.time())

    steps = args.slow_after + 400
    BarrierRunner(2, log_ranks="none", log_sink=sink).run(slowed, args.slow_after, steps, 0.01, marks)
    with open(marks) as fh:
        slowed_at = float(fh.read())
    os.unlink(marks)
    named = [ln for ln in lines if " is slow: " in ln]
    if said_at:
        after = (said_at[0] - slowed_at) / clock.SUMMARY_S
        took = said_at[0] - slowed_at
        print(f"detect: rank 1 named {took:.1f} s after its slowdown ({after:.1f} summaries; target <= 3)")
        print(f"detect: the console said: {named[0].strip()}")
    else:
        print("detect: rank 1 was never named")
    quiet = 0
    for _ in range(args.quiet_runs):
        lines.clear()
        BarrierRunner(2, log_ranks="none", log_sink=sink).run(slowed, 10**9, 200, 0.0)
        quiet += any(" is slow: " in ln for ln in lines)
    print(f"detect: {quiet} of {args.quiet_runs} undisturbed runs named a rank (target: 0)")


def figure(args):
    from figures import save

    from sparkml_dist.runner import BarrierRunner, last_run

    BarrierRunner(2, log_ranks="none").run(slowed, 20, 300, 0.01)
    report = last_run()
    data = {"rows": report.rows, "title": "DDP, rank 1 given 10 ms more compute a step"}
    command = f"python benchmarks/bench_timing.py --sections figure --figure {os.path.relpath(args.figure)}"
    save(args.figure, "rank_times", data, command)
    print(report.table() + report.advice)


def link(args):
    """Two network-namespace hosts (tests/support/hosts.py), one rank each: bench_comm's MLP with
    host2's link unshaped, then at ``--rate``; each run's report (where the time went, its advice)."""
    from harness import hosts_session

    from sparkml_dist.runner import BarrierRunner, last_run
    from tests.support.hosts import Hosts, unavailable

    why = unavailable()
    if why:
        raise SystemExit(f"the link section needs network-namespace hosts: {why}")
    with Hosts(cores=1, memory="3g") as cluster:
        spark = hosts_session(cluster, "bench_timing-link")
        try:
            BarrierRunner(2, log_ranks="none").run(mlp_steps, args.hidden, 2)  # warm: workers, pools
            for rate in (None, args.rate):
                cluster.shape("host2", rate) if rate else cluster.unshape("host2")
                measured = cluster.throughput("host1", "host2", seconds=1.0)
                rate_s = BarrierRunner(2, log_ranks="none").run(mlp_steps, args.hidden, args.steps)
                report = last_run()
                print(f"== host2's link {rate or 'unshaped'} ({measured / 1e9:.2f} Gbit/s measured): "
                      f"{rate_s:.1f} samples/s", flush=True)  # fmt: skip
                print(report.table() + report.advice + "\n", flush=True)
        finally:
            spark.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sections", default="overhead,detect,figure")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--slow-after", type=int, default=100)
    ap.add_argument("--quiet-runs", type=int, default=10)
    ap.add_argument(
        "--figure", default=os.path.join(os.path.dirname(HERE), "docs", "figures", "rank_times.png")
    )
    ap.add_argument("--rate", default="1gbit", help="link: host2's shaped rate")
    args = ap.parse_args()
    if args.sections == "link":
        return link(args)
    spark = local_session("bench_timing")
    try:
        sections = args.sections.split(",")
        if "overhead" in sections:
            overhead_rates(args)
        if "detect" in sections:
            detect(args)
        if "figure" in sections:
            figure(args)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
