"""Started by test_runner_e2e: a local[2] Spark whose driver 'has' two GPUs (a fake discovery
script), so the runner's GPU pinning runs for real on a CPU machine."""

import json
import os
import sys

from sparkml_dist.runner import BarrierRunner, context
from sparkml_dist.session import get_session


def where_am_i():
    ctx = context()
    return {"rank": ctx.rank, "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "device": ctx.device}


if __name__ == "__main__":
    script = sys.argv[1]
    spark = get_session("local[2]", conf={
        "spark.driver.resource.gpu.amount": "2",
        "spark.driver.resource.gpu.discoveryScript": script,
        "spark.task.resource.gpu.amount": "1",
        "spark.ui.enabled": "false",
        "spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures": "1",
        "spark.scheduler.barrier.maxConcurrentTasksCheck.interval": "1s",
    })
    out = BarrierRunner(2, use_gpu=True, timeout=120).run(where_am_i, return_all=True)
    print("RESULT " + json.dumps(out))
    spark.stop()
