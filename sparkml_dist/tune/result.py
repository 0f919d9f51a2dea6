"""What a :class:`~sparkml_dist.tune.Tuner` keeps of each trial, and its result.  [driver]"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Optional, Tuple

from ..errors import WorkerError

log = logging.getLogger(__name__)


@dataclass(eq=False)
class TrialRecord:
    trial: Any  # the optuna.Trial
    params: Dict[str, Any]
    state: str = "running"  # -> complete | stopped | failed | cancelled
    value: Optional[float] = None
    history: Dict[int, Dict[str, float]] = field(default_factory=dict)
    returned: Any = None
    error: Optional[str] = None
    started: Optional[float] = None
    seconds: Optional[float] = None
    stop_reason: Optional[str] = None
    tag: Any = None  # its Spark job's JobTag
    send: Any = None  # answers its channel connection
    child: Any = None  # its MLflow child run
    answers: Any = None  # a gang trial's answers by step (tune.gang.StepAnswers)

    @property
    def last_step(self) -> Optional[int]:
        return max(self.history) if self.history else None

    def final_metrics(self, metric: str) -> Dict[str, Any]:
        """What the function returned that its reports did not already log (MLflow's child run)."""
        reported = {k for m in self.history.values() for k in m}
        out = dict(self.returned) if isinstance(self.returned, dict) else {}
        if self.value is not None:
            out.setdefault(metric, self.value)
        return {k: v for k, v in out.items() if k not in reported}

    def absorb(self, result: dict) -> None:
        """Take in what the trial's task sent back (its own record of reports wins: it also holds
        those made after the driver stopped it)."""
        self.seconds = result.get("seconds", time.time() - (self.started or time.time()))
        for step, metrics in (result.get("reports") or {}).items():
            self.history[int(step)] = dict(metrics)
        self.returned = result.get("returned")
        if not result.get("ok"):
            self.state, self.error = "failed", result.get("error")


def trial_value(result: dict, rec: TrialRecord, metric: str) -> Tuple[Optional[float], Optional[str]]:
    """(value of ``metric`` for a finished trial, or None; why it is missing, when the function
    succeeded but neither returned nor reported it)."""
    if not result.get("ok"):
        return None, None
    out = result.get("returned")
    if isinstance(out, (int, float)) and not isinstance(out, bool):
        return float(out), None
    if isinstance(out, dict) and isinstance(out.get(metric), (int, float)):
        return float(out[metric]), None
    reported = [rec.history[s][metric] for s in sorted(rec.history) if metric in rec.history[s]]
    if reported:
        return float(reported[-1]), None
    keys = sorted({k for m in rec.history.values() for k in m})
    return None, f"it returned {out!r:.200} and reported {keys or 'nothing'}"


def best_record(records: Iterable[TrialRecord], mode: str) -> Optional[TrialRecord]:
    """The completed trial with the best value (None when none completed)."""
    done = [r for r in records if r.state == "complete" and not math.isnan(r.value)]
    if not done:
        return None
    return (min if mode == "min" else max)(done, key=lambda r: r.value)


@dataclass
class TuneResult:
    """``best_params`` / ``best_value`` / ``best_trial`` of the completed trials, ``trials`` (a pandas
    DataFrame, one row per trial: ``trial``, ``state``, ``value``, ``duration``, ``steps``,
    ``last_step``, ``error``, ``stop_reason``, ``returned`` (what the function returned) and a
    ``params_<name>`` column per parameter), ``wall_seconds`` and the Optuna ``study``."""

    best_params: Optional[Dict[str, Any]]
    best_value: Optional[float]
    best_trial: Optional[int]
    trials: Any
    wall_seconds: float
    study: Any = None

    @classmethod
    def build(cls, records: Dict[int, TrialRecord], tuner, study, wall: float) -> "TuneResult":
        import pandas as pd

        rows = []
        for n in sorted(records):
            r = records[n]
            rows.append(
                {
                    "trial": n,
                    "state": r.state,
                    "value": r.value,
                    "duration": r.seconds,
                    "steps": len(r.history),
                    "last_step": r.last_step,
                    "error": r.error,
                    "stop_reason": r.stop_reason if r.state in ("stopped", "cancelled") else None,
                    "returned": r.returned,
                    **{f"params_{k}": v for k, v in r.params.items()},
                }
            )
        trials = pd.DataFrame(rows)
        best = best_record(records.values(), tuner.mode)
        if best is None:
            failed = [r for r in records.values() if r.state == "failed"]
            if failed and len(failed) == len(records):
                first = min(failed, key=lambda r: r.trial.number)
                raise WorkerError(
                    f"all {len(records)} trials failed; trial {first.trial.number} "
                    f"(params {first.params}):\n{first.error}"
                )
            log.warning("Tuner: no trial completed (%s)", trials["state"].value_counts().to_dict())
            return cls(None, None, None, trials, wall, study)
        return cls(dict(best.params), best.value, best.trial.number, trials, wall, study)

    def __repr__(self) -> str:
        states = self.trials["state"].value_counts().to_dict() if len(self.trials) else {}
        return (
            f"TuneResult(best_value={self.best_value}, best_params={self.best_params}, "
            f"trials={states}, wall_seconds={self.wall_seconds:.1f})"
        )
