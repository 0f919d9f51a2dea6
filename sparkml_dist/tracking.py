"""MLflow tracking of sparkml_dist jobs: one run per job, one child run per candidate or trial.  [anywhere]

The runs are opened on the driver; :func:`metric_values` checks metrics where they are reported
too (``context().log_metrics`` in rank 0, ``trial.report`` in a trial's task).

Every job (a bagging or grouped fit, ``ParallelSearchCV``, a ``Tuner``, a ``BarrierRunner`` run)
opens :func:`job_run`.  Whether it logs follows the job's ``mlflow`` setting: True logs (and
needs ``mlflow``), False never, None (the default) only when an MLflow run is active.  The job's
run is a child of the active run (nested, so two jobs never collide on a parameter), or the active
run itself when ``mlflow.pyspark.ml.autolog()`` opened it for this very fit.  Child runs are made
with ``MlflowClient`` (thread-safe: trials finish on many threads) and tagged with their parent.

The package imports without mlflow; the ``mlflow`` extra installs it.

Example::

    import mlflow
    with mlflow.start_run():                          # every job below logs a nested run
        BaggingClassifier(numModels=8, mlflow=True).fit(df)
        BarrierRunner(2, mlflow=True).run(train)     # rank 0's context().log_metrics land here
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
import time
from typing import Any, Dict, Iterator, Optional

log = logging.getLogger(__name__)

MAX_PARAM = 500  # characters of a parameter value kept (MLflow stores at most 6000)
_STATUS = {"complete": "FINISHED", "stopped": "FINISHED", "failed": "FAILED", "cancelled": "KILLED"}


def _mlflow(required: bool):
    try:
        import mlflow
    except ImportError:
        if required:
            raise ImportError("mlflow=True needs MLflow: pip install 'sparkml_dist[mlflow]'") from None
        return None
    return mlflow


def wanted(flag: Optional[bool]) -> bool:
    """Whether a job with ``mlflow=flag`` logs.  For None, a run can only be active if mlflow was
    imported already: a job never pays mlflow's import time just to find out."""
    if flag is False:
        return False
    if flag is None:
        mlflow = sys.modules.get("mlflow")
        return mlflow is not None and mlflow.active_run() is not None
    return _mlflow(required=True) is not None


def _plain(params: Dict[str, Any], prefix: str = "") -> Dict[str, str]:
    out = {}
    for key, value in params.items():
        if isinstance(value, dict):
            out.update(_plain(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = str(value)[:MAX_PARAM]
    return out


def _finite(metrics: Dict[str, Any]) -> Dict[str, float]:
    out = {}
    for key, value in (metrics or {}).items():
        with contextlib.suppress(TypeError, ValueError):
            value = float(value)
            if math.isfinite(value):
                out[key] = value
    return out


def metric_values(where: str, step: Optional[int], metrics: Dict[str, Any], *, step_required: bool) -> dict:
    """``metrics`` as floats (numpy scalars and 0-d tensors included), the step checked; a clear
    error naming ``where`` and the metric otherwise.  [anywhere: ranks and trials call it]"""
    if (
        step is None
        and step_required
        or step is not None
        and (isinstance(step, bool) or not isinstance(step, int) or step < 0)
    ):
        raise ValueError(f"{where}: step must be an integer >= 0, got {step!r}")
    values = {}
    for name, value in metrics.items():
        try:
            values[name] = float(value)
        except (TypeError, ValueError):
            raise TypeError(f"{where}: metric {name!r} must be a number, got {value!r}") from None
    return values


class NullRun:
    """What a job gets when it does not log: every call does nothing."""

    run_id = None

    def log_params(self, params: Dict[str, Any]) -> None:
        pass

    def log_metrics(self, metrics: Dict[str, Any], step: Optional[int] = None) -> None:
        pass

    def set_tags(self, tags: Dict[str, Any]) -> None:
        pass

    def child(self, name: str, params: Dict[str, Any]) -> Optional[str]:
        return None

    def child_metrics(self, run_id: Optional[str], metrics: Dict[str, Any], step=None) -> None:
        pass

    def end_child(self, run_id: Optional[str], state: str, metrics=None, step=None) -> None:
        pass

    def log_model(self, model: Any, artifact_path: str = "model", **kwargs) -> None:
        pass


class JobRun(NullRun):
    """The MLflow run of one job (``run_id``) and its children."""

    def __init__(self, mlflow, run_id: str, experiment_id: str, job: str) -> None:
        from mlflow.tracking import MlflowClient

        self._mlflow, self.run_id, self.experiment_id, self.job = mlflow, run_id, experiment_id, job
        self.client = MlflowClient()

    def _batch(self, run_id: str, params=None, metrics=None, step=None, tags=None) -> None:
        from mlflow.entities import Metric, Param, RunTag

        now = int(time.time() * 1000)
        try:
            self.client.log_batch(
                run_id,
                metrics=[Metric(k, v, now, step or 0) for k, v in _finite(metrics or {}).items()],
                params=[Param(k, v) for k, v in _plain(params or {}).items()],
                tags=[RunTag(k, str(v)) for k, v in (tags or {}).items()],
            )
        except Exception as exc:  # noqa: BLE001 - tracking never fails the job
            log.warning("MLflow: could not log to run %s: %s", run_id, exc)

    def log_params(self, params):
        self._batch(self.run_id, params=params)

    def log_metrics(self, metrics, step=None):
        self._batch(self.run_id, metrics=metrics, step=step)

    def set_tags(self, tags):
        self._batch(self.run_id, tags=tags)

    def child(self, name, params):
        try:
            run = self.client.create_run(
                self.experiment_id,
                run_name=name,
                tags={"mlflow.parentRunId": self.run_id, "sparkml_dist.job": self.job},
            )
        except Exception as exc:  # noqa: BLE001
            log.warning("MLflow: could not create a child run of %s: %s", self.run_id, exc)
            return None
        self._batch(run.info.run_id, params=params)
        return run.info.run_id

    def child_metrics(self, run_id, metrics, step=None):
        if run_id is not None:
            self._batch(run_id, metrics=metrics, step=step)

    def end_child(self, run_id, state, metrics=None, step=None):
        if run_id is None:
            return
        self._batch(run_id, metrics=metrics, step=step, tags={"sparkml_dist.state": state})
        with contextlib.suppress(Exception):
            self.client.set_terminated(run_id, _STATUS.get(state, "FINISHED"))

    def log_model(self, model, artifact_path="model", **kwargs):
        from .formats import mlflow as mlflow_flavor

        try:
            mlflow_flavor.log_model(model, self.run_id, artifact_path, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the fit succeeded; say why the model is missing
            log.warning("MLflow: could not log the model to run %s: %s", self.run_id, exc)


# what the ranks need to log into the job's MLflow run themselves: where the server is and how to
# reach it (Databricks' and MLflow's own variables, when set on the driver)
_RANK_MLFLOW_VARS = (
    "MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_TRACKING_INSECURE_TLS", "MLFLOW_EXPERIMENT_ID", "DATABRICKS_HOST", "DATABRICKS_TOKEN",
)  # fmt: skip


def rank_env(run: Any) -> tuple:
    """``((name, value), ...)`` for the ranks of a job logging to MLflow run ``run``: its tracking
    URI, the credentials' variables the driver has, and ``MLFLOW_RUN_ID`` (``mlflow.log_*`` in a
    rank then lands in the job's run); nothing when the job does not log."""
    run_id = getattr(run, "run_id", None)
    if run_id is None:
        return ()
    import os

    mlflow = _mlflow(required=False)
    out = {k: os.environ[k] for k in _RANK_MLFLOW_VARS if os.environ.get(k)}
    if mlflow is not None:
        out["MLFLOW_TRACKING_URI"] = mlflow.get_tracking_uri()
    out["MLFLOW_RUN_ID"] = run_id
    return tuple(out.items())


def stage_params(stage) -> Dict[str, Any]:
    """A pyspark.ml stage's parameters (the estimator as its repr)."""
    return {p.name: (repr(v) if p.name == "estimator" else v) for p, v in stage.extractParamMap().items()}


def tracked_fit(stage, fit, dataset):
    """``fit(dataset)`` of an ensemble estimator inside its job run: params, the fit's figures
    (seconds, models, rows per model) and the fitted model (:mod:`sparkml_dist.formats.mlflow`)."""
    with job_run(type(stage).__name__, stage.getMlflow(), stage_params(stage)) as run:
        started = time.perf_counter()
        model = fit(dataset)
        sizes = model.groupSizes
        sizes = list(sizes.values()) if isinstance(sizes, dict) else list(sizes)
        figures = {"fit_seconds": time.perf_counter() - started, "models": len(sizes)}
        if sizes:
            figures.update(
                group_rows_min=min(sizes), group_rows_mean=sum(sizes) / len(sizes), group_rows_max=max(sizes)
            )
        if hasattr(model, "skippedGroups"):
            figures["skipped_groups"] = len(model.skippedGroups)
        if getattr(model, "oobScore_", None) is not None:
            figures["oob_score"] = model.oobScore_
        figures.update({f"oob_{k}": v for k, v in (getattr(model, "oobMetrics_", None) or {}).items()})
        run.log_metrics(figures)
        run.log_model(model)
    return model


def log_search(run: NullRun, search) -> None:
    """A fitted ParallelSearchCV into its run: a child run per candidate (parameters, mean/std/rank
    of each score, fit time), the best score and parameters and the refit time on the parent."""
    if run.run_id is None:
        return
    results = search.cv_results_
    for i, params in enumerate(results["params"]):
        child = run.child(f"candidate {i}", params)
        figures = {
            k: results[k][i]
            for k in results
            if k.startswith(("mean_test_", "std_test_", "rank_test_", "mean_train_", "mean_fit_time"))
        }
        run.end_child(child, "complete", figures)
    figures = {"candidates": len(results["params"]), "splits": search.n_splits_}
    if hasattr(search, "best_score_"):
        figures["best_score"] = search.best_score_
    if hasattr(search, "refit_time_"):
        figures["refit_seconds"] = search.refit_time_
    run.log_metrics(figures)
    if hasattr(search, "best_params_"):
        run.log_params({f"best.{k}": v for k, v in search.best_params_.items()})


@contextlib.contextmanager
def job_run(job: str, flag: Optional[bool], params: Dict[str, Any]) -> Iterator[NullRun]:
    """The run one job logs to (:class:`JobRun`), or a :class:`NullRun` when it does not log."""
    if not wanted(flag):
        yield NullRun()
        return
    mlflow = _mlflow(required=True)
    active = mlflow.active_run()
    autologged = active is not None and active.data.tags.get("mlflow.autologging") == "pyspark.ml"
    own = not autologged
    run = mlflow.start_run(run_name=job, nested=True, tags={"sparkml_dist.job": job}) if own else active
    jr = JobRun(mlflow, run.info.run_id, run.info.experiment_id, job)
    jr.log_params(params)
    status = "FINISHED"
    try:
        yield jr
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    except BaseException:
        status = "FAILED"
        raise
    finally:
        if own:
            mlflow.end_run(status)
