"""Started by test_runner_e2e: a local-cluster Spark whose one executor 'has' two GPUs (a fake
discovery script), so the runner's GPU pinning runs for real on a CPU machine.  (Local mode does
not schedule custom resources; a real executor does.)"""

import json
import os
import sys

from sparkml_dist.runner import BarrierRunner, context
from sparkml_dist.session import get_session


def where_am_i():
    ctx = context()
    return {"rank": ctx.rank, "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "device": ctx.device}


if __name__ == "__main__":
    script, mode = sys.argv[1], sys.argv[2]
    # mode "conf": the cluster gives every task a GPU (spark.task.resource.gpu.amount);
    # mode "profile": it does not, and the runner asks for one per task with a stage-level profile
    task_amount = {"spark.task.resource.gpu.amount": "1"} if mode == "conf" else {}
    spark = get_session(
        "local-cluster[1,2,1024]",
        conf={
            **task_amount,
            "spark.worker.resource.gpu.amount": "2",
            "spark.worker.resource.gpu.discoveryScript": script,
            "spark.executor.resource.gpu.amount": "2",
            "spark.executor.resource.gpu.discoveryScript": script,
            "spark.ui.enabled": "false",
            "spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures": "1",
            "spark.scheduler.barrier.maxConcurrentTasksCheck.interval": "1s",
        },
    )
    out = BarrierRunner(2, use_gpu=True, start_timeout=120, timeout=240).run(where_am_i, return_all=True)
    print("RESULT " + json.dumps(out))
    spark.stop()
