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

from ..lazy_names import lazy_names

# Loaded on first use (PEP 562), so that a trial's task or a gang trial's rank, importing
# ``tune.trial`` only, does not also import the driver's tuner, scheduler and Optuna: ~0.1 s off
# every gang trial's start (each trial's ranks are new processes forked from the warm pools).
_HOMES = {
    "Tuner": "tuner",
    "TuneResult": "result",
    "Trial": "trial",
    "Bandit": "policies",
    "MedianStopping": "policies",
    "TruncationSelection": "policies",
    "uniform": "space",
    "loguniform": "space",
    "quniform": "space",
    "randint": "space",
    "lograndint": "space",
    "choice": "space",
}


__getattr__, __dir__ = lazy_names(__name__, _HOMES, globals())

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
