"""Started by test_runner_e2e: a local-cluster Spark whose executors 'have' two GPUs each (a fake
discovery script), so the runner's GPU pinning runs for real on a CPU machine.  (Local mode does
not schedule custom resources; a real executor does.)

Modes: "conf" (every task gets one GPU), "profile" (the runner asks one per task; then tuner trials
ask one GPU each), "multi" (two
executors, tasks holding two GPUs each: four ranks on two tasks, with a DataFrame shard each)."""

import json
import os
import sys

from sparkml_dist.runner import BarrierRunner, context
from sparkml_dist.session import get_session


def where_am_i():
    ctx = context()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
    return {
        "rank": ctx.rank,
        "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "device": ctx.device,
        "local": [ctx.local_rank, ctx.local_world_size],
        # what torch.cuda.set_device(int(os.environ["LOCAL_RANK"])) picks
        "picked": visible[ctx.local_rank] if ctx.local_rank < len(visible) else None,
    }


def where_and_what():
    from sparkml_dist.runner import shard

    return {**where_am_i(), "values": sorted(shard().to_numpy(["x"]).reshape(-1).tolist())}


def where_gpus(params, trial):  # a tuner trial (defined here: shipped by value from __main__)
    import time

    time.sleep(1.0)
    return {"loss": params["x"], "gpus": ",".join(trial.gpus), "device": trial.device}


if __name__ == "__main__":
    script, mode = sys.argv[1], sys.argv[2]
    # mode "conf": the cluster gives every task a GPU (spark.task.resource.gpu.amount);
    # mode "profile": it does not, and the runner asks for one per task with a stage-level profile
    task_amount = (
        {"spark.task.resource.gpu.amount": {"conf": "1", "multi": "2"}[mode]} if mode != "profile" else {}
    )
    spark = get_session(
        "local-cluster[2,2,1024]" if mode == "multi" else "local-cluster[1,2,1024]",
        conf={
            **task_amount,
            "spark.worker.resource.gpu.amount": "2",
            "spark.worker.resource.gpu.discoveryScript": script,
            "spark.executor.resource.gpu.amount": "2",
            "spark.executor.resource.gpu.discoveryScript": script,
            "spark.ui.enabled": "false",
            "spark.sparkml_dist.gpu.memory": "16g",  # the fake GPUs' memory, for the members' GPU plan
            "spark.executorEnv.PYTHONPATH": os.environ.get("PYTHONPATH", ""),
            "spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures": "1",
            "spark.scheduler.barrier.maxConcurrentTasksCheck.interval": "1s",
        },
    )
    if mode == "multi":  # np counts ranks (= GPUs): 4 ranks on 2 tasks of 2 GPUs
        df = spark.range(0, 40, numPartitions=3).selectExpr("cast(id as double) as x")
        runner = BarrierRunner(4, use_gpu=True, start_timeout=120, timeout=240)
        out = runner.run_with_data(df, where_and_what, return_all=True)
        try:
            BarrierRunner(3, use_gpu=True).run(where_am_i)
        except ValueError as e:  # ConfigurationError
            out.append({"np=3": str(e)})
    else:
        out = BarrierRunner(2, use_gpu=True, start_timeout=120, timeout=240).run(where_am_i, return_all=True)
    print("RESULT " + json.dumps(out))
    if mode == "profile":  # tuner trials asking one GPU each through a stage-level profile
        from sparkml_dist import tune

        r = tune.Tuner(where_gpus, {"x": [1, 2, 3, 4]}, metric="loss", sampler="grid", max_trials=4,
                       trial_resources={"gpus": 1}, progress=False).run()  # fmt: skip
        print(
            "TUNE "
            + json.dumps([dict(out, state=s) for out, s in zip(r.trials["returned"], r.trials["state"])])
        )
        # bagging members on GPUs: each fitting task asks one through the same kind of profile
        from sparkml_dist.ensemble import BaggingClassifier
        from tests.support.helpers import DeviceRecorder

        df = spark.range(0, 80).selectExpr("cast(id as double) as x", "cast(id % 2 as double) as label")
        bag = BaggingClassifier(
            estimator=DeviceRecorder(), numModels=4, featuresCols=["x"], useGpu=True, gpuMemoryPerMember="6g"
        ).fit(df)
        print("BAG " + json.dumps([m.model.fitted_on_ for m in bag.models]))
        from sparkml_dist.plan import plan_gpu_members

        print("PLAN " + plan_gpu_members(spark, 6 << 30).summary())
        too_big = dict(estimator=DeviceRecorder(), featuresCols=["x"], useGpu=True, gpuMemoryPerMember="20g")
        try:  # a member no GPU of the executors (16g, the conf above) holds: refused before any job
            BaggingClassifier(**too_big).fit(df)
        except Exception as exc:
            print("TOO_BIG " + json.dumps(f"{type(exc).__name__}: {exc}"))
    spark.stop()
