"""Tuner: a hyperparameter search over any training function, trials as Spark tasks.  [driver]

Optuna draws the parameters (``sampler``: "grid", "random", "tpe" or any ``BaseSampler``) and
decides early stopping (``early_stopping``: :mod:`sparkml_dist.tune.policies`); Spark runs each
trial as a one-task job, launched as soon as a slot frees (never more than ``max_concurrent`` at
once).  A trial's ``trial.report(step, **metrics)`` travels to the driver over an authenticated
socket (:mod:`sparkml_dist.channel`), is handed to the pruner, and the answer comes back
before ``report`` returns: ``trial.should_stop()`` then says whether to end.  A trial that raises
is recorded with its traceback and the tuning goes on.

Example::

    from sparkml_dist import tune

    def train(params, trial):
        model = make_model(params["layers"])
        for epoch in range(20):
            loss = fit_one_epoch(model, lr=params["lr"])
            trial.report(epoch, loss=loss)
            if trial.should_stop():
                break
        return {"loss": loss}

    result = tune.Tuner(train, {"lr": tune.loguniform(1e-4, 1e-1), "layers": [1, 2, 3]},
                        metric="loss", mode="min", sampler="tpe", max_trials=32,
                        early_stopping="median", seed=0).run()
    print(result.best_params, result.best_value)
    result.trials            # one row per trial: params, state, value, duration, steps

A trial that is itself distributed is a *gang*: ``Tuner(..., ranks_per_trial=k)`` runs each trial
as a barrier run of ``k`` ranks started from the driver (:mod:`.gang`), the same parameters on
every rank, whole gangs admitted as slots free, the data staged once for all trials (``data=df``).
Inside a one-task trial, ``BarrierRunner(np=-k)`` starts local ranks on the trial's executor;
``BarrierRunner(np > 0)`` needs the driver's Spark and is refused there.  ``storage=`` keeps the
study where a tuning started again resumes it (:mod:`.storage`).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, Optional

from .. import _spark_env, arg_checks, serialization, tracking
from ..errors import ConfigurationError
from . import policies, resources
from . import space as spaces
from . import storage as studies
from .result import TuneResult
from .scheduler import Tuning

log = logging.getLogger(__name__)

SAMPLERS = ("grid", "random", "tpe")


def _optuna():
    try:
        import optuna
    except ImportError:
        raise ImportError("sparkml_dist.tune needs optuna: pip install 'sparkml_dist[tune]'") from None
    return optuna


class Tuner:
    """Search ``space`` for the parameters of ``fn`` that optimize ``metric``.

    Args:
        fn: ``fn(params, trial)``, run in a Spark task; returns a number, a dict holding ``metric``,
            or None (the last value reported for ``metric`` counts).
        space: parameter name -> values / distribution / constant (:mod:`sparkml_dist.tune.space`).
        metric: the name of the metric to optimize; ``mode``: "min" or "max".
        sampler: "grid" (every combination, in a seeded order), "random", "tpe" (Bayesian), or an
            ``optuna.samplers.BaseSampler``.
        max_trials: trials to run (a grid runs at most its size).
        max_concurrent: trials at once; None: as many as slots, ``trial_resources`` and memory allow.
        early_stopping: None, "bandit", "median", "truncation", a dict or policy object, or an
            ``optuna.pruners.BasePruner`` (:mod:`sparkml_dist.tune.policies`).
        trial_resources: ``{"cpus": c, "gpus": g}`` per trial (stage-level scheduling).
        timeout: seconds; then no new trial starts, running ones are told to stop and, after
            ``stop_grace`` seconds, cancelled.
        seed: seeds the sampler: the same seed draws the same trials (for "tpe" with
            ``max_concurrent=1``; concurrent TPE depends on which trials finished first).
        progress: a progress bar (tqdm) of trials.
        mlflow: True: log the tuning as an MLflow run with a child run per trial; None: only when
            an MLflow run is active; False: never.
        ranks_per_trial: ranks of each trial (default 1: a trial is one Spark task). With ``k > 1``
            every trial is a barrier run of ``k`` ranks (:mod:`.gang`): ``fn(params, trial)`` on each
            rank, the same parameters everywhere (drawn once, here), rank 0's reports and value
            counting, ``trial.should_stop()`` true on every rank after the same step; as many
            gangs at once as the slots hold whole (``max_concurrent`` caps it).
        backend, use_gpu, gpus_per_rank, env, comm: each trial's ranks, as ``BarrierRunner`` takes
            them (any of them, or ``data``, makes trials gangs, of ``ranks_per_trial`` ranks).
        data: a DataFrame every trial trains on (``run_with_data``: ``shard()`` in the function),
            written once as Parquet for all trials when it is not a plain Parquet scan.
        storage: where the study lives so that a tuning started again resumes it
            (:mod:`.storage`: a database URL, a journal file's path, or an Optuna storage);
            ``study_name`` names it there.
    """

    def __init__(
        self,
        fn: Callable,
        space: Dict[str, Any],
        *,
        metric: str,
        mode: str = "min",
        sampler: Any = "random",
        max_trials: int,
        max_concurrent: Optional[int] = None,
        early_stopping: Any = None,
        trial_resources: Optional[Dict[str, int]] = None,
        timeout: Optional[float] = None,
        seed: Optional[int] = None,
        progress: bool = True,
        mlflow: Optional[bool] = None,
        stop_grace: float = 30.0,
        spark=None,
        ranks_per_trial: int = 1,
        backend: Optional[str] = None,
        use_gpu: Optional[bool] = None,
        gpus_per_rank: Optional[int] = None,
        env: Optional[Dict[str, str]] = None,
        comm: Optional[Dict[str, Any]] = None,
        data=None,
        storage: Any = None,
        study_name: str = "sparkml_dist",
    ) -> None:
        optuna = _optuna()
        if not callable(fn):
            raise ConfigurationError(f"fn must be a function fn(params, trial), got {fn!r}")
        self.dists, self.constants = spaces.parse(space)
        if not isinstance(metric, str) or not metric:
            raise ConfigurationError(f"metric must name the metric to optimize (a string), got {metric!r}")
        arg_checks.one_of("mode", mode, ("min", "max"))
        arg_checks.integer("max_trials", max_trials, 1)
        arg_checks.integer("max_concurrent", max_concurrent, 1, none_ok=True)
        arg_checks.seconds("timeout", timeout)
        if not isinstance(sampler, optuna.samplers.BaseSampler) and sampler not in SAMPLERS:
            raise ConfigurationError(
                f"sampler must be one of {list(SAMPLERS)} or an optuna.samplers.BaseSampler, got {sampler!r}"
            )
        self.grid = spaces.grid_values(self.dists) if sampler == "grid" else None
        self.pruner = policies.pruner_of(early_stopping)
        self.resources = resources.check(trial_resources)
        self._gang_setup(ranks_per_trial, trial_resources, data, backend, use_gpu, gpus_per_rank, env, comm)
        if not isinstance(study_name, str) or not study_name:
            raise ConfigurationError(
                f"study_name must name the study in storage (a string), got {study_name!r}"
            )
        self.storage, self.study_name = storage, study_name
        self.payload = serialization.travelling(fn, "fn", fn)
        self.fn, self.space, self.metric, self.mode = fn, space, metric, mode
        self.sampler, self.max_trials, self.max_concurrent = sampler, max_trials, max_concurrent
        self.early_stopping, self.timeout, self.seed = early_stopping, timeout, seed
        self.progress, self.mlflow, self.stop_grace, self.spark = progress, mlflow, stop_grace, spark

    def _gang_setup(self, k, trial_resources, data, backend, use_gpu, gpus_per_rank, env, comm) -> None:
        """Trials as gangs of ``k`` ranks (:mod:`.gang`) when ``ranks_per_trial > 1``, ``data`` or
        a runner setting is given; the settings checked now, as ``BarrierRunner`` checks them."""
        arg_checks.integer("ranks_per_trial", k, 1, fix="the ranks (barrier tasks) of each trial")
        options = {
            n: v
            for n, v in dict(
                backend=backend, use_gpu=use_gpu, gpus_per_rank=gpus_per_rank, env=env, comm=comm
            ).items()
            if v is not None
        }
        self.ranks_per_trial, self.data, self.gang_options = k, data, options
        self.gang = k > 1 or data is not None or bool(options)
        if not self.gang:
            return
        if trial_resources:
            raise ConfigurationError(
                "trial_resources is for one-task trials; a trial of ranks_per_trial ranks takes one "
                "task slot a rank: give it GPUs with use_gpu=True (and gpus_per_rank=)"
            )
        if data is not None and not hasattr(data, "sparkSession"):
            raise ConfigurationError(
                f"data must be a Spark DataFrame (each trial's run_with_data), got {type(data).__name__}"
            )
        from ..runner import BarrierRunner

        BarrierRunner(k, **options)  # refuses a backend, GPU, env or comm setting by name, now

    @property
    def n_trials(self) -> int:
        return min(self.max_trials, spaces.grid_size(self.grid)) if self.grid else self.max_trials

    def _make_sampler(self):
        optuna = _optuna()
        if isinstance(self.sampler, optuna.samplers.BaseSampler):
            return self.sampler
        if self.sampler == "grid":
            return _grid_sampler(optuna)(self.grid, seed=self.seed)
        if self.sampler == "tpe":
            return optuna.samplers.TPESampler(seed=self.seed)
        return optuna.samplers.RandomSampler(seed=self.seed)

    def tracked_params(self) -> Dict[str, Any]:
        return {
            "metric": self.metric,
            "mode": self.mode,
            "sampler": self.sampler if isinstance(self.sampler, str) else type(self.sampler).__name__,
            "max_trials": self.max_trials,
            "max_concurrent": self.max_concurrent,
            "seed": self.seed,
            "space": {k: repr(v) for k, v in self.space.items()},
            **{f"early_stopping.{k}": v for k, v in policies.describe(self.early_stopping).items()},
        }

    def run(self) -> TuneResult:
        """Run the trials; returns the best parameters and every trial's record."""
        optuna = _optuna()
        spark = self.spark or _spark_env.active_session("Tuner (its trials run on Spark)")
        if self.gang:
            o = self.gang_options
            slots = resources.plan_gangs(
                spark,
                self.ranks_per_trial,
                bool(o.get("use_gpu")),
                o.get("gpus_per_rank", 1),
                self.max_concurrent,
            )
        else:
            slots = resources.plan_slots(spark, self.resources, len(self.payload), self.max_concurrent)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        direction = "minimize" if self.mode == "min" else "maximize"
        study, kept = studies.open_study(optuna, self, direction, self._make_sampler(), self.pruner)
        log.info("Tuner: %d trials, %d at once (%s)", self.n_trials, slots.concurrency, slots.summary)
        with tracking.job_run("Tuner", self.mlflow, self.tracked_params()) as run:
            result = Tuning(self, spark, study, slots, run, kept).execute()
            run.log_metrics({"best_value": result.best_value} if result.best_value is not None else {})
            run.log_params({f"best.{k}": v for k, v in (result.best_params or {}).items()})
        return result


def _grid_sampler(optuna):
    class AskTellGrid(optuna.samplers.GridSampler):
        """GridSampler for ask-and-tell: the tuner runs exactly the grid's size of trials, so the
        sampler need not stop the study (``study.stop()`` is only valid inside ``optimize``)."""

        def after_trial(self, study, trial, state, values) -> None:
            pass

    return AskTellGrid
