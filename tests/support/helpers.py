"""Estimators used by tests.  Importable by executors (PYTHONPATH holds the repository root)."""

import os

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.tree import DecisionTreeClassifier


def kill_my_executor_jvm(sig=None):
    """SIGKILL (or ``sig``: SIGPWR decommissions it) the executor JVM (CoarseGrainedExecutorBackend)
    this rank runs under.  A rank forked by a warm pool is no descendant of its executor: its task
    is, and holds the other end of the rank's control pipe, found by the pipe's inode."""
    import signal

    import psutil

    from sparkml_dist.runner import protocol

    sig = signal.SIGKILL if sig is None else sig
    holders = [psutil.Process()]  # a Python worker (an estimator's fit): its executor is above it
    ctrl = os.environ.get(protocol.CTRL_ENV)
    pipe = os.readlink(f"/proc/self/fd/{ctrl}") if ctrl else None
    for pid in psutil.pids() if pipe else ():
        try:
            if pid != os.getpid() and any(
                os.readlink(f"/proc/{pid}/fd/{fd}") == pipe for fd in os.listdir(f"/proc/{pid}/fd")
            ):
                holders.append(psutil.Process(pid))
        except OSError:
            continue
    for process in holders:
        while process is not None:
            if "CoarseGrainedExecutorBackend" in " ".join(process.cmdline()):
                os.kill(process.pid, sig)
                return
            process = process.parent()
    raise RuntimeError("no executor JVM above this rank or its task")


class FailingClassifier(ClassifierMixin, BaseEstimator):
    """Raises in fit() for one group (recognized by its random_state)."""

    def __init__(self, bad_state=None, random_state=None):
        self.bad_state = bad_state
        self.random_state = random_state

    def fit(self, X, y):
        if self.random_state == self.bad_state:
            raise RuntimeError(f"deliberate failure for random_state={self.random_state}")
        self.classes_ = np.unique(y)
        return self

    def predict(self, X):
        return np.zeros(len(X), dtype=int)

    def predict_proba(self, X):
        return np.tile([1.0] + [0.0] * (len(self.classes_) - 1), (len(X), 1))


class CrashOnceClassifier(DecisionTreeClassifier):
    """Kills its Python worker (os._exit) the first time any member is fitted: a lost task."""

    def __init__(self, marker=None, max_depth=None, random_state=None):
        super().__init__(max_depth=max_depth, random_state=random_state)
        self.marker = marker

    def fit(self, X, y, sample_weight=None):
        if self.marker and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            self._fault()
        return super().fit(X, y, sample_weight=sample_weight)

    def _fault(self):
        os._exit(3)


class FailOnKeyRegressor(RegressorMixin, BaseEstimator):
    """A linear regressor that raises when the fitted slope of the first feature has a given sign:
    in the grouped tests, only key 'c' (slope -1) fails."""

    def __init__(self, bad_slope_sign=-1):
        self.bad_slope_sign = bad_slope_sign

    def fit(self, X, y):
        from sklearn.linear_model import LinearRegression

        self.model_ = LinearRegression().fit(X, y)
        if np.sign(self.model_.coef_[0]) == self.bad_slope_sign:
            raise ValueError("injected failure for a negative slope")
        return self

    def predict(self, X):
        return self.model_.predict(X)


class KillExecutorOnceClassifier(CrashOnceClassifier):
    """SIGKILLs the executor JVM running it the first time any member is fitted."""

    def _fault(self):
        import time

        kill_my_executor_jvm()
        time.sleep(600)


class DeviceRecorder(ClassifierMixin, BaseEstimator):
    """A classifier with a ``device`` parameter (as XGBoost has) that remembers where it was fitted."""

    def __init__(self, device="cpu", alpha=0.0):
        self.device = device
        self.alpha = alpha

    def fit(self, X, y, sample_weight=None):
        self.classes_ = np.unique(y)
        self.fitted_on_ = self.device
        return self

    def predict_proba(self, X):
        return np.full((len(X), len(self.classes_)), 1.0 / len(self.classes_))

    def predict(self, X):
        return self.classes_[[0] * len(X)]


def on_gpu_one(estimator, X, y):
    """A scorer: 1.0 when the estimator was fitted on cuda:1 (what the GPU search test deals)."""
    return float(estimator.fitted_on_ == "cuda:1")
