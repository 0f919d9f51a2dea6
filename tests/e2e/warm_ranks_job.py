"""A notebook's session in miniature: two runs on local[2] (the first starts the executor's warm
pool and forks its ranks from it, the second finds it ready), then spark.stop().  Prints one JSON
line: the runs' rank parents and wall seconds, and the pools."""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def ranks_parent():
    import psutil
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    dist.all_reduce(torch.ones(1))
    return psutil.Process().ppid()


if __name__ == "__main__":
    from sparkml_dist.runner import BarrierRunner
    from sparkml_dist.session import get_session
    from tests.support.runner_checks import pool_processes

    spark = get_session("local[2]")
    runs = []
    for _ in range(2):
        t = time.perf_counter()
        runs.append(
            (BarrierRunner(2, log_ranks="none").run(ranks_parent, return_all=True), time.perf_counter() - t)
        )
    import psutil

    ours = {c.pid for c in psutil.Process().children(recursive=True)}  # the JVM, its Python daemon
    from tests.support.runner_checks import pool_socket

    anchored = lambda p: int(pool_socket(p).split("-")[0] or 0) in ours  # noqa: E731 - to this session
    pools = [p for p in pool_processes() if anchored(p)]
    spark.stop()
    gone, alive = psutil.wait_procs(pools, timeout=20)
    result = {"runs": runs, "pools": [p.pid for p in pools], "after_stop": [p.pid for p in alive]}
    print("RESULT " + json.dumps(result))
