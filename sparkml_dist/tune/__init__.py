"""Hyperparameter tuning of any training function on Spark, with early stopping.  [driver]

* :class:`Tuner` - trials as Spark tasks, Optuna's samplers and pruners (:mod:`.tuner`);
* the space builders :func:`uniform`, :func:`loguniform`, :func:`quniform`, :func:`randint`,
  :func:`lograndint`, :func:`choice` (:mod:`.space`);
* the early termination policies :class:`Bandit`, :class:`MedianStopping`,
  :class:`TruncationSelection` (:mod:`.policies`);
* :class:`Trial` - what the function gets (runs on executors, :mod:`.trial`).

Needs the ``tune`` extra (optuna).
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
