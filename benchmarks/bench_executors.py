"""What checking the executors' Python costs a run (sparkml_dist.executors.check), on local[2].

The check runs before a session's first run (and again only for new executors or packages): one
small Spark job that reads each executor's interpreter and package versions. Measured, in rounds
interleaved with a no-op run of 2 ranks (init + one all-reduce):

- ``check, first``: the check with nothing cached (what a session's first run pays);
- ``check, again``: the check once it has run (what every later run pays);
- ``no-op run``: a whole run, for scale (its own check cached).

    python benchmarks/bench_executors.py [--repeats 5]
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


def noop():
    import torch
    import torch.distributed as dist

    from sparkml_dist.runner import init_process_group

    init_process_group()
    dist.all_reduce(torch.ones(1))
    return 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    from sparkml_dist import executors
    from sparkml_dist.runner import BarrierRunner

    spark = local_session("bench_executors")
    runner = BarrierRunner(2, log_ranks="none")
    runner.run(noop)  # warm: the JVM, the Python workers, the first job
    first, again, runs = [], [], []
    for _ in range(args.repeats):
        executors._checked.clear()
        t = time.perf_counter()
        executors.check(spark, noop, 2, "noop")
        first.append(time.perf_counter() - t)
        t = time.perf_counter()
        executors.check(spark, noop, 2, "noop")
        again.append(time.perf_counter() - t)
        t = time.perf_counter()
        runner.run(noop)
        runs.append(time.perf_counter() - t)
    med = statistics.median
    print(f"\nlocal[2], 2 ranks, medians of {args.repeats} interleaved rounds")
    print(f"  check, first      {med(first):8.3f} s   ({med(first) / med(runs):.2f}x a no-op run)")
    print(f"  check, again      {med(again) * 1e3:8.3f} ms")
    print(f"  no-op run         {med(runs):8.3f} s")
    spark.stop()


if __name__ == "__main__":
    main()
