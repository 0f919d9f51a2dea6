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

    python benchmarks/bench_tune.py [--repeats 2] [--steps 20] [--pause 0.1]
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--pause", type=float, default=0.1)
    args = ap.parse_args()

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
