"""``bench_tune.py --ranks-per-trial k --vs-ray``: the gang study side by side with Ray Tune + Ray Train.

The same Spark session (``local[2k]``) runs both, one after the other, each warmed up first:

* ours: ``tune.Tuner(..., ranks_per_trial=k)``, every trial a barrier gang of ``k`` ranks;
* Ray's: Ray on Spark (``ray.util.spark.setup_ray_cluster``: Ray worker nodes as Spark tasks, one CPU
  each, ``2k`` of them), then ``ray.tune.Tuner(TorchTrainer(...))`` with ``ScalingConfig(num_workers=k)``
  and ``max_concurrent_trials=2``: a Ray Train run of ``k`` workers per trial (a Tune function
  trial running a ``TorchTrainer``, as Ray Train's V2 API has it).  While Ray's cluster
  is up its worker nodes hold the Spark slots, so the two never overlap.

The trial is :func:`bench_tune.gang_curve`'s (~``--work`` s of 0.25 s steps, an all-reduce each); both
sides run the 16-point grid, no early stopping.  Printed: each side's wall time, ours over Ray's (target
<= 0.8x), and the time from a trial's launch to its first step, trials one after another (each side's
``wall - work`` over the trials).  Ray is an extra of this benchmark only (``pip install
"ray[default,tune,train]"`` beside the project: nothing in the package imports it).
"""

from __future__ import annotations

import tempfile
import time


def ray_loop(config):
    """The trial on each Ray Train worker (torch.distributed set up by TorchTrainer, gloo)."""
    import torch
    import torch.distributed as dist
    from ray import train

    started = time.time()
    for step in range(max(1, int(config["work"] / 0.25))):
        time.sleep(0.25)
        dist.all_reduce(torch.ones(1))
        loss = (config["x"] - 0.3) ** 2 + 1.0 / (step + 1)
        train.report({"loss": loss, "started": started, "now": time.time(), "first": step == 0})


def ray_study(xs, work: float, k: int, concurrent: int) -> dict:
    """Ray Tune over Ray Train (its V2 API, the default since Ray 2.5x): each trial a function that
    runs a TorchTrainer of ``k`` workers, its reports passed to Tune; wall, and the trials' work."""
    from ray import tune
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    with tempfile.TemporaryDirectory(prefix="bench-ray-") as storage:

        def trial(config):
            name = tune.get_context().get_trial_id()
            workers = ScalingConfig(num_workers=k, resources_per_worker={"CPU": 0.9})
            run = RunConfig(storage_path=storage, name=name, callbacks=[TuneReportCallback()])
            TorchTrainer(ray_loop, train_loop_config=config, scaling_config=workers, run_config=run).fit()

        tuner = tune.Tuner(
            tune.with_resources(trial, {"CPU": 0.1}),  # a trial's driver and its k workers: k CPUs
            param_space={"x": tune.grid_search(list(xs)), "work": work},
            tune_config=tune.TuneConfig(metric="loss", mode="min", max_concurrent_trials=concurrent),
            run_config=tune.RunConfig(storage_path=storage, name="bench", verbose=0),
        )
        t = time.perf_counter()
        grid = tuner.fit()
        wall = time.perf_counter() - t
    frames = [r.metrics_dataframe for r in grid if r.metrics_dataframe is not None]
    spent = [float(f["now"].max() - f["started"].min()) for f in frames if len(f)]
    return {"wall": wall, "work": sum(spent), "trials": len(frames), "errors": len(grid.errors)}


def ours(gang_curve, xs, work: float, k: int, concurrent) -> dict:
    from sparkml_dist import tune

    t = time.perf_counter()
    r = tune.Tuner(
        gang_curve, {"x": list(xs), "work": work}, metric="loss", sampler="grid", max_trials=len(xs),
        ranks_per_trial=k, max_concurrent=concurrent, progress=False,
    ).run()  # fmt: skip
    wall = time.perf_counter() - t
    spent = [max(e for _, e in o["spans"]) - min(s for s, _ in o["spans"]) for o in r.trials["returned"]]
    failed = int((r.trials.state == "failed").sum())
    return {"wall": wall, "work": sum(spent), "trials": len(r.trials), "errors": failed}


def main(args, gang_curve) -> None:
    """``gang_curve``: bench_tune's trial (passed in: defined in the script, it travels by value)."""
    import ray
    from ray.util.spark import setup_ray_cluster, shutdown_ray_cluster

    k = args.ranks_per_trial
    xs = [i / (args.trials - 1) for i in range(args.trials)]
    short = [0.1, 0.2, 0.3, 0.4, 0.5]
    ours(gang_curve, short[:2], 0.25, k, 1)  # warm: Spark's workers, the pools
    mine, mine_seq = ours(gang_curve, xs, args.work, k, None), ours(gang_curve, short, 0.25, k, 1)
    setup_ray_cluster(
        max_worker_nodes=2 * k, num_cpus_head_node=0
    )  # local mode: a CPU each (spark.task.cpus)
    ray.init(ignore_reinit_error=True, log_to_driver=False)
    try:
        ray_study(short[:2], 0.25, k, 1)  # warm: Ray's workers
        theirs, theirs_seq = ray_study(xs, args.work, k, 2), ray_study(short, 0.25, k, 1)
    finally:
        ray.shutdown()
        shutdown_ray_cluster()
    for name, r in (("sparkml_dist", mine), ("Ray Tune + Ray Train", theirs)):
        print(
            f"{name}: {r['trials']} trials of {k} ranks ({r['errors']} failed) in {r['wall']:.1f} s; their "
            f"work {r['work']:.1f} s / 2 gangs: {r['wall'] / (r['work'] / 2):.2f}x the ideal"
        )
    print(f"ours / Ray's wall: {mine['wall'] / theirs['wall']:.2f}x (target <= 0.8x)")
    starts = {n: (r["wall"] - r["work"]) / len(short) for n, r in (("ours", mine_seq), ("Ray", theirs_seq))}
    print(
        f"a trial's cost beyond its work, 5 trials one after another: ours {starts['ours']:.2f} s, "
        f"Ray's {starts['Ray']:.2f} s ({starts['ours'] / starts['Ray']:.2f}x)"
    )
