"""Early termination policies for a :class:`~sparkml_dist.tune.Tuner`, as Optuna pruners.  [driver]

Three policies with Azure ML HyperDrive's names and meanings, each decided
on the driver every time a trial reports its metric at a step:

* :class:`Bandit` - stop a trial whose metric at a step is not within the slack of the best
  metric any trial reported at that step: ``slack_factor`` f (maximize: below ``best / (1 + f)``;
  minimize: above ``best * (1 + f)``, for positive metrics) or ``slack_amount`` a (``best - a`` /
  ``best + a``).  Optuna has no such pruner: :class:`BanditPruner` is one.
* :class:`MedianStopping` - stop a trial whose best metric so far is worse than the median of the
  completed trials' at the same step: Optuna's ``MedianPruner``.
* :class:`TruncationSelection` - stop the trials in the worst ``truncation_percentage`` percent at
  each evaluation: Optuna's ``PercentilePruner(100 - truncation_percentage)``.

All three evaluate at steps ``delay_evaluation, delay_evaluation + evaluation_interval, ...``.
``early_stopping=`` takes one of these objects, its name (``"bandit"``, ``"median"``,
``"truncation"``, defaults below), a dict ``{"policy": "bandit", "slack_factor": 0.2, ...}`` (YAML
jobs) or any ``optuna.pruners.BasePruner``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Optional

from .. import arg_checks
from ..errors import ConfigurationError

try:
    import optuna
    from optuna.pruners import BasePruner
    from optuna.trial import TrialState
except ImportError:  # pragma: no cover - depends on the environment
    optuna = None
    BasePruner = object


def _check_schedule(evaluation_interval: int, delay_evaluation: int) -> None:
    arg_checks.integer("evaluation_interval", evaluation_interval, 1)
    arg_checks.integer("delay_evaluation", delay_evaluation, 0)


@dataclass(frozen=True)
class Bandit:
    """Stop trials not within ``slack_factor`` (relative) or ``slack_amount`` (absolute) of the best."""

    slack_factor: Optional[float] = None
    slack_amount: Optional[float] = None
    evaluation_interval: int = 1
    delay_evaluation: int = 0

    def __post_init__(self):
        if (self.slack_factor is None) == (self.slack_amount is None):
            if self.slack_factor is None:  # the bare name: Azure's documented example slack
                object.__setattr__(self, "slack_factor", 0.1)
            else:
                raise ConfigurationError("early_stopping Bandit: give slack_factor or slack_amount, not both")
        slack = self.slack_factor if self.slack_factor is not None else self.slack_amount
        if not isinstance(slack, (int, float)) or slack < 0:
            raise ConfigurationError(f"early_stopping Bandit: the slack must be a number >= 0, got {slack!r}")
        _check_schedule(self.evaluation_interval, self.delay_evaluation)

    def pruner(self):
        return BanditPruner(self)


@dataclass(frozen=True)
class MedianStopping:
    """Stop trials whose best metric is worse than the median of completed trials at that step."""

    evaluation_interval: int = 1
    delay_evaluation: int = 0
    startup_trials: int = 5  # completed trials before any is stopped (Optuna's n_startup_trials)

    def __post_init__(self):
        _check_schedule(self.evaluation_interval, self.delay_evaluation)

    def pruner(self):
        return optuna.pruners.MedianPruner(
            n_startup_trials=self.startup_trials,
            n_warmup_steps=self.delay_evaluation,
            interval_steps=self.evaluation_interval,
        )


@dataclass(frozen=True)
class TruncationSelection:
    """Stop the worst ``truncation_percentage`` percent of trials at each evaluation."""

    truncation_percentage: float = 20.0
    evaluation_interval: int = 1
    delay_evaluation: int = 0
    startup_trials: int = 5

    def __post_init__(self):
        pct = self.truncation_percentage
        if not isinstance(pct, (int, float)) or not 0 < pct < 100:
            raise ConfigurationError(f"truncation_percentage must be in (0, 100), got {pct!r}")
        _check_schedule(self.evaluation_interval, self.delay_evaluation)

    def pruner(self):
        return optuna.pruners.PercentilePruner(
            100.0 - float(self.truncation_percentage),
            n_startup_trials=self.startup_trials,
            n_warmup_steps=self.delay_evaluation,
            interval_steps=self.evaluation_interval,
        )


POLICIES = {"bandit": Bandit, "median": MedianStopping, "truncation": TruncationSelection}


def pruner_of(spec: Any):
    """The Optuna pruner for ``early_stopping`` (None: Optuna's NopPruner, no trial is stopped)."""
    if spec is None:
        return optuna.pruners.NopPruner()
    if isinstance(spec, BasePruner):
        return spec
    if isinstance(spec, str):
        spec = {"policy": spec}
    if isinstance(spec, dict):
        options = dict(spec)
        name = options.pop("policy", None)
        if name not in POLICIES:
            raise ConfigurationError(
                f"early_stopping: unknown policy {name!r}; use one of {sorted(POLICIES)}, a "
                "tune.Bandit/MedianStopping/TruncationSelection, or an optuna.pruners.BasePruner"
            )
        try:
            spec = POLICIES[name](**options)
        except TypeError as exc:
            raise ConfigurationError(f"early_stopping {name!r}: {exc}") from None
    if isinstance(spec, tuple(POLICIES.values())):
        return spec.pruner()
    raise ConfigurationError(
        f"early_stopping must be None, 'bandit', 'median', 'truncation', a dict with 'policy', a policy "
        f"object or an optuna.pruners.BasePruner, got {spec!r}"
    )


def describe(spec: Any) -> dict:
    """Plain parameters of a policy (for tracking)."""
    if spec is None:
        return {}
    if isinstance(spec, str):
        return {"policy": spec}
    if isinstance(spec, dict):
        return dict(spec)
    if isinstance(spec, tuple(POLICIES.values())):
        name = next(k for k, v in POLICIES.items() if isinstance(spec, v))
        return {"policy": name, **asdict(spec)}
    return {"policy": type(spec).__name__}


def _evaluated_at(step: int, policy) -> bool:
    delay, interval = policy.delay_evaluation, policy.evaluation_interval
    return step >= delay and (step - delay) % interval == 0


class BanditPruner(BasePruner):
    """Optuna pruner with the bandit policy's semantics (see :class:`Bandit`)."""

    def __init__(self, policy: Bandit) -> None:
        self.policy = policy

    def prune(self, study, trial) -> bool:
        step = trial.last_step
        if step is None or not _evaluated_at(step, self.policy):
            return False
        value = trial.intermediate_values[step]
        if value is None or math.isnan(value):
            return False
        states = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
        at_step = [
            t.intermediate_values[step]
            for t in study.get_trials(deepcopy=False, states=states)
            if t.number != trial.number
            and step in t.intermediate_values
            and not math.isnan(t.intermediate_values[step])
        ]
        if not at_step:
            return False
        maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
        best = max(at_step) if maximize else min(at_step)
        if self.policy.slack_factor is not None:
            f = float(self.policy.slack_factor)
            slack = abs(best) * (f / (1 + f) if maximize else f)
        else:
            slack = float(self.policy.slack_amount)
        return value < best - slack if maximize else value > best + slack
