"""Tuner: a hyperparameter search over any training function, trials as Spark tasks.  [driver]

Optuna draws the parameters (``sampler``: "grid", "random", "tpe" or any ``BaseSampler``) and
decides early stopping (``early_stopping``: :mod:`sparkml_dist.tune.policies`); Spark runs each
trial as a one-task job, launched as soon as a slot frees (never more than ``max_concurrent`` at
once).  A trial's ``trial.report(step, **metrics)`` travels to the driver over an authenticated
socket (:mod:`sparkml_dist.runner.channel`), is handed to the pruner, and the answer comes back
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

A trial's function may start local ranks with ``BarrierRunner(np=-k)`` (k processes on the trial's
executor; give it ``trial_resources={"cpus": k}``); ``BarrierRunner(np > 0)`` needs the driver's
Spark and is refused inside a trial.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any, Callable, Dict, Optional

from .. import _spark_env, collection, launch, progress, serialization, tracking
from ..errors import ConfigurationError
from ..runner.channel import listen, new_secret
from . import policies, resources
from . import space as spaces
from .result import TrialRecord, TuneResult, trial_value
from .trial import TrialSpec, trial_task

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
    ) -> None:
        optuna = _optuna()
        if not callable(fn):
            raise ConfigurationError(f"fn must be a function fn(params, trial), got {fn!r}")
        self.dists, self.constants = spaces.parse(space)
        if not isinstance(metric, str) or not metric:
            raise ConfigurationError(f"metric must name the metric to optimize (a string), got {metric!r}")
        if mode not in ("min", "max"):
            raise ConfigurationError(f"mode must be 'min' or 'max', got {mode!r}")
        if isinstance(max_trials, bool) or not isinstance(max_trials, int) or max_trials < 1:
            raise ConfigurationError(f"max_trials must be an integer >= 1, got {max_trials!r}")
        if max_concurrent is not None and (
            isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int) or max_concurrent < 1
        ):
            raise ConfigurationError(f"max_concurrent must be an integer >= 1 or None: {max_concurrent!r}")
        if timeout is not None and (not isinstance(timeout, (int, float)) or timeout <= 0):
            raise ConfigurationError(f"timeout must be a number of seconds > 0 or None, got {timeout!r}")
        if not isinstance(sampler, optuna.samplers.BaseSampler) and sampler not in SAMPLERS:
            raise ConfigurationError(
                f"sampler must be one of {list(SAMPLERS)} or an optuna.samplers.BaseSampler, got {sampler!r}"
            )
        self.grid = spaces.grid_values(self.dists) if sampler == "grid" else None
        self.pruner = policies.pruner_of(early_stopping)
        self.resources = resources.check(trial_resources)
        try:
            self.payload = serialization.dumps(fn)
        except Exception as exc:
            raise ConfigurationError(
                f"fn cannot be sent to the executors ({type(exc).__name__}: {exc}); define it at "
                "module level or in an importable module"
            ) from None
        self.fn, self.space, self.metric, self.mode = fn, space, metric, mode
        self.sampler, self.max_trials, self.max_concurrent = sampler, max_trials, max_concurrent
        self.early_stopping, self.timeout, self.seed = early_stopping, timeout, seed
        self.progress, self.mlflow, self.stop_grace, self.spark = progress, mlflow, stop_grace, spark

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
        slots = resources.plan_slots(spark, self.resources, len(self.payload), self.max_concurrent)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.create_study(
            direction="minimize" if self.mode == "min" else "maximize",
            sampler=self._make_sampler(),
            pruner=self.pruner,
        )
        log.info("Tuner: %d trials, %d at once (%s)", self.n_trials, slots.concurrency, slots.summary)
        with tracking.job_run("Tuner", self.mlflow, self.tracked_params()) as run:
            result = _Tuning(self, spark, study, slots, run).execute()
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


class _Tuning:
    """One run of a Tuner: the trial threads, the channel and the records."""

    def __init__(self, tuner: Tuner, spark, study, slots, run) -> None:
        self.t, self.spark, self.study, self.slots, self.run = tuner, spark, study, slots, run
        self.lock = threading.Lock()
        self.records: Dict[int, TrialRecord] = {}
        self.launched = 0
        self.stopping: Optional[str] = None
        self.failure: Optional[BaseException] = None
        self.secret = new_secret()
        self.key = serialization.digest(tuner.payload)
        self.run_id = uuid.uuid4().hex[:8]

    # ----------------------------------------------------------------- trials
    def _next(self) -> Optional[TrialRecord]:
        with self.lock:
            if self.stopping or self.launched >= self.t.n_trials:
                return None
            trial = self.study.ask(self.t.dists)
            self.launched += 1
            rec = TrialRecord(trial, {**trial.params, **self.t.constants})
            self.records[trial.number] = rec
        rec.child = self.run.child(f"trial {trial.number}", rec.params)
        return rec

    def _worker(self, server) -> None:
        try:
            while True:
                rec = self._next()
                if rec is None:
                    return
                self._finish(rec, self._launch(rec, server))
        except BaseException as exc:  # noqa: BLE001 - raised again on the driver's main thread
            with self.lock:
                self.failure = self.failure or exc
                self.stopping = self.stopping or "error"

    def _launch(self, rec: TrialRecord, server) -> dict:
        pool = self.slots.gpu_pool
        gpus = pool.take() if pool is not None else None
        number = rec.trial.number
        spec = TrialSpec(
            number, rec.params, self.t.payload, self.key, (server.address, server.port), self.secret, gpus
        )
        rec.tag = launch.JobTag(self.spark, f"tune-{self.run_id}-{number}")
        rec.started = time.time()
        try:
            df = self.spark.range(0, 1, 1, 1)
            out = launch.map_groups(df, trial_task, spec, profile=self.slots.profile)
            with rec.tag.scope():
                table = out.toArrow()
            return collection.decode(table, [number], what="trial")[(number, 0)]
        except Exception as exc:  # the job failed or was cancelled: the tuning goes on
            why = f"cancelled ({rec.stop_reason})" if rec.stop_reason else f"{type(exc).__name__}: {exc}"
            return {"ok": False, "error": why, "cancelled": bool(rec.stop_reason)}
        finally:
            if gpus is not None:
                pool.give(gpus)

    def _finish(self, rec: TrialRecord, result: dict) -> None:
        with self.lock:
            rec.absorb(result)
            value, missing = trial_value(result, rec, self.t.metric)
            optuna = _optuna()
            if missing and not self.stopping:
                self.failure = ConfigurationError(
                    f"metric={self.t.metric!r} was never reported by trial {rec.trial.number}: {missing}. "
                    "Return it (return {'" + self.t.metric + "': value}) or report it "
                    f"(trial.report(step, {self.t.metric}=value)), or fix metric="
                )
                self.stopping = "error"
            if rec.state == "failed" or value is None:
                rec.state = "cancelled" if result.get("cancelled") else "failed"
                self.study.tell(rec.trial, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
            elif rec.stop_reason:
                rec.state, rec.value = "stopped", value
                self.study.tell(rec.trial, state=optuna.trial.TrialState.PRUNED, skip_if_finished=True)
            else:
                rec.state, rec.value = "complete", value
                self.study.tell(rec.trial, value, skip_if_finished=True)
        self.run.end_child(rec.child, rec.state, rec.final_metrics(self.t.metric), rec.last_step)
        self.bar.update(1)
        best = self._best()
        if best is not None:
            self.bar.set_postfix_str(f"best {self.t.metric}={best.value:.4g} (trial {best.trial.number})")

    # ----------------------------------------------------------------- the channel
    def on_message(self, message: dict, send) -> None:
        if message.get("type") != "report":
            return
        rec = self.records.get(message.get("trial"))
        if rec is None:
            return
        step = message.get("step")
        metrics = {k: (float("nan") if v is None else v) for k, v in (message.get("metrics") or {}).items()}
        with self.lock:
            rec.send = send
            rec.history[step] = metrics
            value = metrics.get(self.t.metric)
            if value is not None and not rec.stop_reason and isinstance(step, int):
                rec.trial.report(float(value), step)
                if rec.trial.should_prune():
                    rec.stop_reason = "early stopping"
            stop = bool(rec.stop_reason)
        self.run.child_metrics(rec.child, metrics, step)
        send({"seq": message.get("seq"), "stop": stop})

    def _stop_running(self, reason: str) -> None:
        with self.lock:
            self.stopping = self.stopping or reason
            running = [r for r in self.records.values() if r.state == "running"]
            for rec in running:
                rec.stop_reason = rec.stop_reason or reason
        for rec in running:
            if rec.send is not None:
                rec.send({"stop": True})

    def _cancel_running(self) -> None:
        for rec in list(self.records.values()):
            if rec.state == "running" and rec.tag is not None:
                rec.stop_reason = rec.stop_reason or "cancelled"
                rec.tag.cancel()

    # ----------------------------------------------------------------- the whole run
    def execute(self) -> TuneResult:
        self.bar = progress.bar(self.t.n_trials, "trials", self.t.progress)
        server = listen(self.secret, self.on_message, _spark_env.driver_host(self.spark), replies=True)
        threads = [
            threading.Thread(target=self._worker, args=(server,), name=f"sparkml_dist-trial-{i}", daemon=True)
            for i in range(min(self.slots.concurrency, self.t.n_trials))
        ]
        start = time.monotonic()
        deadline = start + self.t.timeout if self.t.timeout else None
        stop_at = None
        try:
            with launch.own_interrupts():
                for th in threads:
                    th.start()
                while any(th.is_alive() for th in threads):
                    for th in threads:
                        th.join(0.1)
                    now = time.monotonic()
                    if deadline is not None and now > deadline and not self.stopping:
                        self._stop_running(f"timeout={self.t.timeout}s")
                    if self.stopping and stop_at is None:
                        stop_at = now + (0 if self.failure else self.t.stop_grace)
                    if stop_at is not None and now > stop_at:
                        self._cancel_running()
        except KeyboardInterrupt:
            self._stop_running("interrupted")
            self._cancel_running()
            for th in threads:
                th.join(10)
            raise
        finally:
            server.close()
            self.bar.close()
        if self.failure is not None:
            raise self.failure
        return TuneResult.build(self.records, self.t, self.study, time.monotonic() - start)

    def _best(self) -> Optional[TrialRecord]:
        done = [r for r in self.records.values() if r.state == "complete"]
        if not done:
            return None
        pick = min if self.t.mode == "min" else max
        return pick(done, key=lambda r: r.value)
