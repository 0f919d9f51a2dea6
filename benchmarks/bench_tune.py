"""Tuner on local[2]: scheduling overhead, early-stopping savings, and Optuna's own loop side by side.

64 trials (an 8 x 8 grid) of a function with a known learning curve: at step s it reports
``(x - 0.3)**2 + (y - 0.6)**2 + 1 / (s + 1)`` after ``--pause`` seconds of "training" (a sleep: a
GPU- or IO-bound step, which leaves both contenders' threads free), ``--steps`` steps per trial.
Contenders, interleaved each round (order alternating):

* ``tuner``: ``Tuner(sampler="grid", max_concurrent=2)`` - every trial a Spark task;
* ``tuner_median``: the same with ``early_stopping="median"``;
* ``optuna_n_jobs_2``: ``optuna.create_study(...).optimize(objective, n_jobs=2)`` in this process,
  the same grid and function, no pruning.

Targets: tuner wall <= 1.25 x the ideal (64 x trial time / 2 slots); early stopping saves >= 40% of
the summed trial time and finds the same best configuration; tuner wall <= 1.2 x Optuna's.

``--ranks-per-trial k`` (k > 1) measures trials that are gangs instead, on local[2k] (two gangs at
once): 16 trials of k ranks, each ~``--work`` seconds of steps (every step an all-reduce), and
reports the tuning's wall against the ideal (16 x work / 2 gangs; target <= 1.15x), the gap from
one gang's end to the next trial's ranks starting in its slots (target <= 1 s), a trial's start
(from its launch to its function running on every rank) against a warm ``BarrierRunner(k)`` no-op
run's (target <= 1.2x), and, with ``early_stopping="median"``, the gap from a stopped gang's stop
to its successor's start.

    python benchmarks/bench_tune.py [--repeats 2] [--steps 20] [--pause 0.1]
    python benchmarks/bench_tune.py --ranks-per-trial 2 [--work 5] [--trials 16] [--vs-ray]

``--vs-ray`` (with ``--ranks-per-trial``) runs the same study on Ray Tune + Ray Train over Ray on
Spark instead, side by side (:mod:`ray_gangs`; needs the ``ray`` package, an extra of this benchmark).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from harness import interleaved  # noqa: E402 - benchmarks/ is the script's folder

GRID = {"x": [i / 7 for i in range(8)], "y": [i / 7 for i in range(8)]}


def curve(params, trial):
    loss = None
    for step in range(params["steps"]):
        time.sleep(params["pause"])
        loss = (params["x"] - 0.3) ** 2 + (params["y"] - 0.6) ** 2 + 1.0 / (step + 1)
        trial.report(step, loss=loss)
        if trial.should_stop():
            break
    return {"loss": loss}


def optuna_run(steps: int, pause: float) -> dict:
    import optuna

    from sparkml_dist.tune.tuner import _grid_sampler

    def objective(trial):
        x = trial.suggest_categorical("x", GRID["x"])
        y = trial.suggest_categorical("y", GRID["y"])
        loss = None
        for step in range(steps):
            time.sleep(pause)
            loss = (x - 0.3) ** 2 + (y - 0.6) ** 2 + 1.0 / (step + 1)
            trial.report(loss, step)
        return loss

    study = optuna.create_study(sampler=_grid_sampler(optuna)(GRID, seed=0))
    study.optimize(objective, n_trials=64, n_jobs=2)
    return {"best": study.best_params, "trial_seconds": None}


def tuner_run(steps: int, pause: float, early_stopping) -> dict:
    from sparkml_dist import tune

    space = {**GRID, "steps": steps, "pause": pause}
    r = tune.Tuner(
        curve,
        space,
        metric="loss",
        sampler="grid",
        max_trials=64,
        max_concurrent=2,
        early_stopping=early_stopping,
        seed=0,
        progress=False,
    ).run()
    best = {k: r.best_params[k] for k in ("x", "y")}
    return {"best": best, "trial_seconds": float(r.trials["duration"].sum()), "states": r.trials["state"]}


def gang_curve(params, trial):
    """A gang trial: ~``work`` seconds of steps, an all-reduce a step; when each rank ran."""
    import torch
    import torch.distributed as dist

    from sparkml_dist.runner import init_process_group

    started = time.time()
    init_process_group()
    loss, steps = None, max(1, int(params["work"] / 0.25))
    for step in range(steps):
        time.sleep(0.25)
        dist.all_reduce(torch.ones(1))
        loss = (params["x"] - 0.3) ** 2 + 1.0 / (step + 1)
        trial.report(step, loss=loss)
        if trial.should_stop():
            break
    spans = [torch.zeros(2, dtype=torch.float64) for _ in range(dist.get_world_size())]
    dist.all_gather(spans, torch.tensor([started, time.time()], dtype=torch.float64))
    return {"loss": loss, "spans": [s.tolist() for s in spans]}


def noop():
    import torch.distributed as dist

    from sparkml_dist.runner import init_process_group

    init_process_group()
    dist.barrier()


def _gaps(trials) -> list:
    """Each gap between a gang's end and the next trial's ranks starting (the slots taken at once)."""
    spans = sorted(
        ((min(s for s, _ in out["spans"]), max(e for _, e in out["spans"])) for out in trials["returned"]),
        key=lambda t: t[0],
    )
    ends = sorted(e for _, e in spans)
    gaps = []
    for start, _ in spans[2:]:  # the first two started at once: every later one waited for an end
        before = [e for e in ends if e <= start + 0.05]
        if before:
            gaps.append(start - max(before))
    return gaps


def gang_main(args) -> None:
    from sparkml_dist import tune
    from sparkml_dist.runner import BarrierRunner
    from sparkml_dist.session import get_session

    k = args.ranks_per_trial
    spark = get_session(
        f"local[{2 * k}]", conf_file=os.path.join(ROOT, "conf", "spark-local.yaml"), app_name="bench_tune"
    )
    spark.sparkContext.setLogLevel("ERROR")
    space = {"x": [i / (args.trials - 1) for i in range(args.trials)], "work": args.work}
    BarrierRunner(k, log_ranks="none").run(noop)  # warm-up: Spark's workers, the pools
    for policy in (None, "median"):
        t = time.perf_counter()
        r = tune.Tuner(
            gang_curve, space, metric="loss", sampler="grid", max_trials=args.trials,
            ranks_per_trial=k, early_stopping=policy, progress=False,
        ).run()  # fmt: skip
        wall = time.perf_counter() - t
        work = [max(e for _, e in o["spans"]) - min(s for s, _ in o["spans"]) for o in r.trials["returned"]]
        ideal = sum(work) / 2
        gaps = _gaps(r.trials)
        print(
            f"{k} ranks a trial, early_stopping={policy}: {args.trials} trials in {wall:.1f} s; their work "
            f"{sum(work):.1f} s / 2 gangs = {ideal:.1f} s ideal: {wall / ideal:.3f}x (target <= 1.15x); "
            f"states {r.trials['state'].value_counts().to_dict()}"
        )
        print(
            f"  slots to the next gang: median {statistics.median(gaps):.2f} s, max {max(gaps):.2f} s "
            "(target <= 1 s)"
        )
    starts = []
    for _ in range(5):
        t = time.perf_counter()
        BarrierRunner(k, log_ranks="none").run(noop)
        starts.append(time.perf_counter() - t)
    short = {"x": [0.1, 0.2, 0.3, 0.4, 0.5], "work": 0.25}
    t = time.perf_counter()
    r = tune.Tuner(
        gang_curve, short, metric="loss", sampler="grid", max_trials=5, ranks_per_trial=k,
        max_concurrent=1, progress=False,
    ).run()  # fmt: skip
    wall = time.perf_counter() - t
    work = sum(max(e for _, e in o["spans"]) - min(s for s, _ in o["spans"]) for o in r.trials["returned"])
    cost = (wall - work) / 5  # each trial's start and end, one after another: its launch's cost
    noop_s = statistics.median(starts)
    print(
        f"5 trials one after another of ~0.25 s of work each: {wall:.2f} s, {work:.2f} s of it their work: "
        f"{cost:.2f} s a trial to start and end; a warm BarrierRunner({k}) no-op run {noop_s:.2f} s: "
        f"{cost / noop_s:.2f}x (target <= 1.2x)"
    )
    spark.stop()


def ray_main(args) -> None:
    import ray_gangs

    from sparkml_dist.session import get_session

    spark = get_session(
        f"local[{2 * args.ranks_per_trial}]",
        conf_file=os.path.join(ROOT, "conf", "spark-local.yaml"),
        app_name="bench_tune-vs-ray",
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        ray_gangs.main(args, gang_curve)
    finally:
        spark.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--pause", type=float, default=0.1)
    ap.add_argument("--ranks-per-trial", type=int, default=1)
    ap.add_argument("--work", type=float, default=5.0)
    ap.add_argument("--trials", type=int, default=16)
    ap.add_argument("--vs-ray", action="store_true", help="gangs: the same study on Ray Tune + Ray Train")
    args = ap.parse_args()
    if args.ranks_per_trial > 1 and args.vs_ray:
        return ray_main(args)
    if args.ranks_per_trial > 1:
        return gang_main(args)

    import optuna

    from sparkml_dist.session import get_session

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spark = get_session(
        "local[2]", conf_file=os.path.join(ROOT, "conf", "spark-local.yaml"), app_name="bench_tune"
    )
    spark.sparkContext.setLogLevel("ERROR")
    median = {"policy": "median", "startup_trials": 4}
    contenders = {
        "tuner": lambda: tuner_run(args.steps, args.pause, None),
        "tuner_median": lambda: tuner_run(args.steps, args.pause, median),
        "optuna_n_jobs_2": lambda: optuna_run(args.steps, args.pause),
    }
    tuner_run(1, 0.0, None)  # warm-up: Spark's Python workers
    walls, last = interleaved(contenders, args.repeats)
    med = {k: statistics.median(v) for k, v in walls.items()}
    trial_time = args.steps * args.pause
    ideal = 64 * trial_time / 2
    saved = 1 - last["tuner_median"]["trial_seconds"] / last["tuner"]["trial_seconds"]
    states = last["tuner_median"]["states"].value_counts().to_dict()
    print()
    print(f"trial time {trial_time:.2f} s x 64 trials / 2 slots: ideal {ideal:.1f} s")
    print(f"tuner wall (median of {args.repeats}): {med['tuner']:.2f} s = {med['tuner'] / ideal:.3f} x ideal")
    print(
        f"optuna n_jobs=2: {med['optuna_n_jobs_2']:.2f} s; tuner / optuna = "
        f"{med['tuner'] / med['optuna_n_jobs_2']:.3f}"
    )
    print(
        f"early stopping (median): wall {med['tuner_median']:.2f} s, summed trial time saved "
        f"{100 * saved:.1f}% ({states}); same best: "
        f"{last['tuner_median']['best'] == last['tuner']['best'] == last['optuna_n_jobs_2']['best']} "
        f"({last['tuner']['best']})"
    )
    spark.stop()


if __name__ == "__main__":
    main()
