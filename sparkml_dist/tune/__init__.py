"""Hyperparameter tuning of any training function on Spark, with early stopping.  [driver]

* :class:`Tuner` - trials as Spark tasks, Optuna's samplers and pruners (:mod:`.tuner`);
* the space builders :func:`uniform`, :func:`loguniform`, :func:`quniform`, :func:`randint`,
  :func:`lograndint`, :func:`choice` (:mod:`.space`);
* the early termination policies :class:`Bandit`, :class:`MedianStopping`,
  :class:`TruncationSelection` (:mod:`.policies`);
* :class:`Trial` - what the function gets (runs on executors, :mod:`.trial`).

Needs the ``tune`` extra (optuna).

Example::

    from sparkml_dist.tune import Tuner, loguniform, choice

    def train(trial):
        for epoch in range(10):
            loss = ...                                # train with trial.params["lr"], ...
            trial.report(epoch, loss=loss)            # early stopping looks at these
        return {"loss": loss}

    result = Tuner(train, {"lr": loguniform(1e-4, 1e-1), "hidden": choice([32, 64])},
                   metric="loss", mode="min", max_trials=20).run()
    result.best_params, result.trials                 # the best trial, and every trial's row
"""

from .policies import Bandit, MedianStopping, TruncationSelection
from .result import TuneResult
from .space import choice, lograndint, loguniform, quniform, randint, uniform
from .trial import Trial
from .tuner import Tuner

__all__ = [
    "Tuner",
    "TuneResult",
    "Trial",
    "Bandit",
    "MedianStopping",
    "TruncationSelection",
    "uniform",
    "loguniform",
    "quniform",
    "randint",
    "lograndint",
    "choice",
]
