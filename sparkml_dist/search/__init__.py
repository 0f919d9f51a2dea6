"""ParallelSearchCV: scikit-learn's grid / randomized search, every (candidate, fold) fit on Spark.  [driver]

It is scikit-learn's ``BaseSearchCV`` (so ``cv_results_``, ``best_params_``, ``best_score_``,
``best_estimator_``, ``predict``, ``score``, multi-metric ``scoring`` and ``refit`` behave as in
``GridSearchCV`` / ``RandomizedSearchCV``) with the fits moved to Spark:

* the driver draws the candidates (``ParameterGrid`` / ``ParameterSampler(random_state)``) and the
  folds (``check_cv(cv).split``) exactly as scikit-learn does, so the same data, folds and seeds
  give identical scores;
* the data, folds, candidates and scorers are pickled once into the job and reach each executor
  once (Spark ships a stage's task binary per executor); each Python worker unpickles them once
  and keeps them for all the (candidate, fold) units it runs;
* every unit is scikit-learn's own ``_fit_and_score``; a candidate that raises is recorded with
  ``error_score`` and the search goes on (``error_score="raise"`` stops it);
* results come back through the shared collection layer; the best candidate is refitted on the
  driver;
* ``max_concurrent`` caps how many fits run at once; ``None`` asks the memory planner
  (:mod:`sparkml_dist.plan`), which also refuses a search whose data and model cannot fit in one
  Python worker.

Example::

    from sparkml_dist.search import ParallelSearchCV
    from sklearn.ensemble import RandomForestClassifier

    search = ParallelSearchCV(RandomForestClassifier(random_state=0),
                              {"n_estimators": [50, 100], "max_depth": [4, 8, None]}, cv=3)
    search.fit(X, y)                                     # numpy / pandas, on the active Spark session
    search.fit(df, featuresCols=["a", "b"], labelCol="y")  # or a small Spark DataFrame
    print(search.best_params_, search.best_score_)
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import time
from collections import defaultdict
from typing import List

import numpy as np

from .. import _spark_env, launch, plan, progress, serialization, tracking
from .. import gpus as gpus_mod
from ..errors import ConfigurationError
from . import data as search_data
from ._worker import Job, SearchSpec, search_task

log = logging.getLogger(__name__)

try:  # scikit-learn's own search machinery: identical results by construction
    from sklearn.base import clone, is_classifier
    from sklearn.metrics._scorer import _MultimetricScorer
    from sklearn.model_selection import ParameterGrid, ParameterSampler, check_cv
    from sklearn.model_selection._search import BaseSearchCV
    from sklearn.model_selection._validation import (
        _fit_and_score,
        _insert_error_scores,
        _warn_or_raise_about_fit_failures,
    )
    from sklearn.utils import indexable
    from sklearn.utils.validation import _check_method_params
except ImportError as exc:  # pragma: no cover - depends on the installed scikit-learn
    raise ImportError(f"sparkml_dist.search needs scikit-learn >= 1.5 ({exc})") from exc

_FIT_AND_SCORE_ARGS = set(inspect.signature(_fit_and_score).parameters)
_UNITS_PER_SLOT = 4  # partitions per slot when memory does not cap concurrency: Spark balances them


# --------------------------------------------------------------------------- driver
def _is_spark_df(obj) -> bool:
    return hasattr(obj, "sparkSession") and hasattr(obj, "columns") and hasattr(obj, "schema")


class ParallelSearchCV(BaseSearchCV):
    """Grid or randomized search over ``estimator``'s parameters, each (candidate, fold) on Spark.

    Args:
        estimator: a scikit-learn-API estimator (cloned for every fit).
        param_grid: a dict (or list of dicts) of parameter lists: an exhaustive grid, as
            ``GridSearchCV``. Give this or ``param_distributions``.
        param_distributions: a dict (or list of dicts) of lists or scipy distributions sampled
            ``n_iter`` times with ``random_state``, as ``RandomizedSearchCV``.
        n_iter: candidates drawn from ``param_distributions``.
        scoring, refit, cv, error_score, return_train_score, verbose: as in ``GridSearchCV``.
        random_state: seeds ``ParameterSampler`` (the folds' randomness is ``cv``'s own).
        max_concurrent: at most this many fits at once (Azure ML's ``max_concurrent_runs``);
            None: as many as the cluster's slots and Python memory allow (:mod:`sparkml_dist.plan`).
        progress: a progress bar of the fits as they finish (tqdm; False: none).
        mlflow: True: log the search as an MLflow run (its settings, best score, refit time) with a
            child run per candidate (its parameters and scores); None: only when an MLflow run is
            active; False: never (:mod:`sparkml_dist.tracking`).
        use_gpu: fit each candidate on a GPU of its task, through the estimator's ``device``
            parameter (XGBoost's); see :func:`sparkml_dist.gpus.plan_models`.
    """

    def __init__(
        self,
        estimator,
        param_grid=None,
        *,
        param_distributions=None,
        n_iter=10,
        scoring=None,
        refit=True,
        cv=None,
        random_state=None,
        max_concurrent=None,
        error_score=np.nan,
        return_train_score=False,
        verbose=0,
        progress=True,
        mlflow=None,
        use_gpu=False,
    ):
        super().__init__(
            estimator=estimator,
            scoring=scoring,
            n_jobs=None,
            refit=refit,
            cv=cv,
            verbose=verbose,
            error_score=error_score,
            return_train_score=return_train_score,
        )
        self.param_grid = param_grid
        self.param_distributions = param_distributions
        self.n_iter = n_iter
        self.random_state = random_state
        self.max_concurrent = max_concurrent
        self.progress = progress
        self.mlflow = mlflow
        self.use_gpu = use_gpu

    # ------------------------------------------------------------------ candidates
    def _candidates(self) -> List[dict]:
        if (self.param_grid is None) == (self.param_distributions is None):
            raise ConfigurationError(
                "give exactly one of param_grid (exhaustive, as GridSearchCV) "
                "or param_distributions (sampled n_iter times, as RandomizedSearchCV)"
            )
        try:
            if self.param_grid is not None:
                candidates = list(ParameterGrid(self.param_grid))
            else:
                candidates = list(
                    ParameterSampler(self.param_distributions, self.n_iter, random_state=self.random_state)
                )
        except (TypeError, ValueError) as exc:
            which = "param_grid" if self.param_grid is not None else "param_distributions"
            raise ConfigurationError(f"{which}: {exc}") from None
        if not candidates:
            raise ConfigurationError("the parameter grid is empty: no candidate to evaluate")
        from sklearn.base import clone

        for cand in candidates:  # as fit will set them: a step swapped in, then its own parameters
            try:
                clone(self.estimator).set_params(**clone(cand, safe=False))
            except ValueError as exc:
                valid = sorted(self.estimator.get_params(deep=True))
                unknown = sorted(k for k in cand if k not in valid)
                why = f"has no parameter(s) {unknown}" if unknown else f"refuses it ({exc})"
                raise ConfigurationError(
                    f"param_grid/param_distributions: the candidate {cand!r} cannot be set: "
                    f"{type(self.estimator).__name__} {why}. Valid parameters (of the estimator as "
                    f"given; a step swapped in brings its own) are {valid}."
                ) from None
        return candidates

    def _run_search(self, evaluate_candidates):  # BaseSearchCV's hook; fit below does the work
        evaluate_candidates(self._candidates())

    # ------------------------------------------------------------------ data
    # ------------------------------------------------------------------ fit
    def fit(self, X, y=None, *, groups=None, featuresCols=None, labelCol=None, **params):
        """Run the search: ``fit(X, y)`` on numpy/pandas, or ``fit(df, featuresCols=..., labelCol=...)``."""
        settings = {k: v for k, v in self.get_params(deep=False).items() if k not in ("mlflow", "progress")}
        with tracking.job_run("ParallelSearchCV", self.mlflow, settings) as run:
            self._search(X, y, groups, featuresCols, labelCol, params)
            tracking.log_search(run, self)
        return self

    def _search(self, X, y, groups, featuresCols, labelCol, params):
        if _is_spark_df(X):
            spark = X.sparkSession
            X, y = search_data.from_dataframe(X, featuresCols, labelCol, self.estimator)
        else:
            spark = _spark_env.active_session("ParallelSearchCV (its fits run on Spark)")
        candidates = self._candidates()
        scorers, refit_metric = self._get_scorers()
        X, y = indexable(X, y)
        fit_params = _check_method_params(X, params=params)
        cv = check_cv(self.cv, y, classifier=is_classifier(self.estimator))
        n_splits = cv.get_n_splits(X, y, groups)
        splits = list(cv.split(X, y, groups))
        if len(splits) != n_splits:
            raise ValueError(
                f"cv.split and cv.get_n_splits return inconsistent results. Expected "
                f"{n_splits} splits, got {len(splits)}"
            )
        base_estimator = clone(self.estimator)
        if self.verbose > 0:
            log.info(
                "Fitting %d folds for each of %d candidates, totalling %d fits",
                n_splits,
                len(candidates),
                len(candidates) * n_splits,
            )
        out = self._evaluate(spark, base_estimator, X, y, candidates, splits, scorers, fit_params)
        _warn_or_raise_about_fit_failures(out, self.error_score)
        if callable(self.scoring):
            _insert_error_scores(out, self.error_score)
        results = self._format_results(candidates, n_splits, out, defaultdict(list))

        self.multimetric_ = isinstance(out[0]["test_scores"], dict)
        if callable(self.scoring) and self.multimetric_:
            self._check_refit_for_multimetric(out[0]["test_scores"])
            refit_metric = self.refit
        if self.refit or not self.multimetric_:
            self.best_index_ = self._select_best_index(self.refit, refit_metric, results)
            if not callable(self.refit):
                self.best_score_ = results[f"mean_test_{refit_metric}"][self.best_index_]
            self.best_params_ = results["params"][self.best_index_]
        if self.refit:
            self.best_estimator_ = clone(base_estimator).set_params(**clone(self.best_params_, safe=False))
            start = time.time()
            if y is not None:
                self.best_estimator_.fit(X, y, **fit_params)
            else:
                self.best_estimator_.fit(X, **fit_params)
            self.refit_time_ = time.time() - start
            if hasattr(self.best_estimator_, "feature_names_in_"):
                self.feature_names_in_ = self.best_estimator_.feature_names_in_
        self.scorer_ = scorers._scorers if isinstance(scorers, _MultimetricScorer) else scorers
        self.cv_results_ = results
        self.n_splits_ = n_splits

    def _evaluate(self, spark, base_estimator, X, y, candidates, splits, scorers, fit_params) -> List[dict]:
        """``_fit_and_score`` of every (candidate, fold) on Spark, in scikit-learn's order."""
        kwargs = dict(
            scorer=scorers,
            verbose=self.verbose,
            fit_params=fit_params,
            score_params={},
            return_train_score=self.return_train_score,
            return_n_test_samples=True,
            return_times=True,
            return_parameters=False,
            error_score=self.error_score,
        )
        kwargs = {k: v for k, v in kwargs.items() if k in _FIT_AND_SCORE_ARGS}
        job = Job(
            base_estimator, X, y, candidates, [(np.asarray(tr), np.asarray(te)) for tr, te in splits], kwargs
        )
        payload = serialization.travelling(job, "the estimator, data or scoring")
        n_units = len(candidates) * len(splits)
        p, n_parts = self._tasks(spark, base_estimator, X, y, len(payload), n_units)
        gpus, profile = gpus_mod.plan_models(spark, base_estimator, self.use_gpu, "use_gpu")
        spec = SearchSpec(serialization.digest(payload), payload, n_units, n_parts, gpus=gpus)
        log.info("ParallelSearchCV: %d fits in %d tasks (%s)", n_units, n_parts, p.summary())
        df = spark.range(0, n_parts, 1, n_parts)
        with progress.fits(spark, n_units, "fits", self.progress) as channel:
            spec = dataclasses.replace(spec, progress=channel)
            results = launch.run_on_groups(
                df,
                search_task,
                spec,
                expected_groups=range(n_units),
                description=f"sparkml_dist: fitting {n_units} (candidate, fold) pairs",
                what="fit",
                profile=profile,
            )
        return [results[(u, 0)] for u in range(n_units)]

    def _tasks(self, spark, estimator, X, y, payload_bytes: int, n_units: int):
        """(plan, tasks): fits at once are capped by slots, Python memory (data + a fold copy + the
        model) and max_concurrent; when only slots cap them, 4 tasks per slot let Spark balance."""
        p = plan.plan_concurrency(
            spark, 2 * payload_bytes + _model_estimate(estimator, X, y), max_concurrent=self.max_concurrent
        )
        capped = self.max_concurrent is not None or p.models_per_executor < p.slots_per_executor
        return p, min(n_units, p.concurrency * (1 if capped else _UNITS_PER_SLOT))


def _model_estimate(estimator, X, y) -> int:
    """Bytes of one fitted model: a fit on 200 rows measured on the driver, scaled to all rows."""
    n = min(len(y) if y is not None else X.shape[0], 200)
    try:
        from sklearn.utils import _safe_indexing

        idx = np.arange(n)
        sample = clone(estimator)
        sample.fit(_safe_indexing(X, idx), None if y is None else _safe_indexing(y, idx))
        return plan.estimator_bytes(sample) * max(1, (len(y) if y is not None else X.shape[0]) // n)
    except Exception:  # the sample may be unfit for the estimator (one class...): data size bounds it
        return int(getattr(X, "nbytes", 0) or 0)
