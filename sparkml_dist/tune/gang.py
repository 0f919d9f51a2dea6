"""Trials that are gangs of ranks: each a barrier run of ``ranks_per_trial`` ranks.  [driver]

With ``Tuner(..., ranks_per_trial=k)`` (or ``data=``), each trial is a
:class:`~sparkml_dist.runner.BarrierRunner` run of ``k`` ranks started from the driver by the
trial's thread: every rank calls ``fn(params, trial)`` with the parameters drawn once, on the
driver; the trial's value is rank 0's (:func:`~sparkml_dist.tune.trial.run_gang_rank`).

**Admission.**  A gang's ranks are one barrier stage: Spark starts all ``k`` tasks together once
``k`` slots are free and none before, so a gang waiting for slots holds none.  As many gangs run at
once as the slots hold (:func:`~sparkml_dist.tune.resources.plan_gangs`), each trial thread taking
the next trial the moment its gang ends.  Ranks come from the executors' warm pools, as any run's.

**One step, one answer.**  Every rank reports (``trial.report``) and waits for the driver's
answer; the driver decides at rank 0's report of a step (the pruner sees rank 0's metrics only)
and gives the other ranks' reports of that step the same answer (:class:`StepAnswers`), so every
rank's ``should_stop()`` turns true after the same step and the gang leaves its collectives
together.  A rank reporting a step rank 0 did not report is told to stop and the trial fails,
naming both.

**The data, staged once.**  ``Tuner(..., data=df)`` calls ``run_with_data`` for every trial on one
copy of the rows: a plain Parquet scan as it is, any other DataFrame written once as Parquet before
the first trial (:func:`sparkml_dist.runner.stage_once`) and removed after the last.

Example::

    gangs = Gangs(tuner, spark)
    result = gangs.run(spec, tag)     # rank 0's result, or {"ok": False, "error": the rank's traceback}
    gangs.close()
"""

from __future__ import annotations

import threading
from typing import Dict, List, Optional, Tuple

from ..errors import SparkMLDistError


class Gangs:
    """How the trials of one tuning run as gangs: the runner's settings, the rows staged once."""

    def __init__(self, tuner, spark) -> None:
        from ..runner import stage_once

        self.k, self.spark = tuner.ranks_per_trial, spark
        self.options = dict(tuner.gang_options)
        self.data, self._remove = stage_once(tuner.data) if tuner.data is not None else (None, lambda: None)

    def run(self, spec, tag) -> dict:
        """One trial's gang under the trial's job ``tag`` (cancelling it cancels the gang): rank
        0's result, or the failure (a rank that raised: its traceback)."""
        from ..runner import BarrierRunner
        from .trial import run_gang_rank

        runner = BarrierRunner(self.k, spark=self.spark, log_ranks="none", mlflow=False, **self.options)
        try:
            with tag.scope():
                if self.data is None:
                    return runner.run(run_gang_rank, spec)
                return runner.run_with_data(self.data, run_gang_rank, spec)
        except SparkMLDistError as exc:
            return {"ok": False, "error": str(exc)}

    def close(self) -> None:
        self._remove()


class StepAnswers:
    """One gang trial's answers by step: rank 0's report decides, the others' wait for it."""

    def __init__(self) -> None:
        self.decided: Dict[int, bool] = {}  # step -> stop?
        self.waiting: Dict[int, List[Tuple[int, object]]] = {}  # step -> [(seq, send)] of other ranks
        self.mismatch: Optional[str] = None
        self._lock = threading.Lock()

    def decide(self, step: int, stop: bool) -> List[Tuple[int, object, bool]]:
        """Rank 0 reported ``step`` (the decision ``stop``): the other ranks' answers now due,
        ``(seq, send, stop)``; a rank waiting on an earlier step rank 0 skipped is told to stop."""
        with self._lock:
            self.decided[step] = stop
            due = [(seq, send, stop) for seq, send in self.waiting.pop(step, [])]
            for earlier in [s for s in self.waiting if s < step]:
                self.mismatch = (
                    self.mismatch or f"a rank reported step {earlier}, which rank 0 did not report"
                )
                due += [(seq, send, True) for seq, send in self.waiting.pop(earlier)]
        return due

    def ask(self, rank: int, step: int, seq: int, send) -> Optional[bool]:
        """Rank ``rank`` reported ``step``: its answer when rank 0's is known, else None (it waits)."""
        with self._lock:
            if step in self.decided:
                return self.decided[step]
            if self.decided and max(self.decided) > step:
                self.mismatch = (
                    self.mismatch or f"rank {rank} reported step {step}, which rank 0 did not report"
                )
                return True
            self.waiting.setdefault(step, []).append((seq, send))
            return None
