"""A study that survives the driver: ``Tuner(storage=...)`` resumes where a stopped tuning left off.  [driver]

``storage`` is an Optuna storage: a database URL (``"sqlite:///tuning.db"``, ``"postgresql://..."``:
Optuna's RDB storage), a path to a journal file (``"/dbfs/tuning/study.log"``: Optuna's
``JournalStorage``, one appended line per event, safe for several writers), or an
``optuna.storages.BaseStorage``.  The study (``study_name``) is created there, or loaded when it
exists: then

* its finished trials (complete, stopped early, failed) are kept: they count toward
  ``max_trials``, their values and reports appear in the result, and the early-stopping policy
  sees their reports as the trials that ran before (Optuna's pruners read them from the storage);
* trials it left running (the driver stopped mid-trial) are marked failed and run again, with the
  same parameters, under new numbers;

so a tuning started again with the same storage ends with ``max_trials`` trials in all.

Example::

    Tuner(train, space, metric="loss", max_trials=32, storage="sqlite:///tuning.db",
          study_name="lr-search").run()        # run it again after a crash: it goes on
"""

from __future__ import annotations

import os
from typing import Any, Dict, Tuple

from ..errors import ConfigurationError
from .result import TrialRecord

_STATES = {"COMPLETE": "complete", "PRUNED": "stopped", "FAIL": "failed"}


def _storage(optuna, storage: Any):
    if isinstance(storage, optuna.storages.BaseStorage):
        return storage
    if not isinstance(storage, str) or not storage:
        raise ConfigurationError(
            f"storage must be a database URL ('sqlite:///tuning.db'), a journal file's path or an "
            f"optuna.storages.BaseStorage, got {storage!r}"
        )
    if "://" in storage:
        return optuna.storages.RDBStorage(storage)
    from optuna.storages.journal import JournalFileBackend

    os.makedirs(os.path.dirname(os.path.abspath(storage)), exist_ok=True)
    return optuna.storages.JournalStorage(JournalFileBackend(storage))


def open_study(optuna, tuner, direction: str, sampler, pruner) -> Tuple[Any, Dict[int, TrialRecord]]:
    """The tuning's study (in memory without ``storage``) and the finished trials it keeps."""
    if tuner.storage is None:
        return optuna.create_study(direction=direction, sampler=sampler, pruner=pruner), {}
    study = optuna.create_study(
        study_name=tuner.study_name,
        storage=_storage(optuna, tuner.storage),
        direction=direction,
        sampler=sampler,
        pruner=pruner,
        load_if_exists=True,
    )
    kept: Dict[int, TrialRecord] = {}
    running = optuna.trial.TrialState.RUNNING
    for frozen in study.get_trials(deepcopy=False):
        if frozen.state == running:  # its driver stopped mid-trial: run it again
            study._storage.set_trial_user_attr(frozen._trial_id, "sparkml_dist_rerun", True)
            study._storage.set_trial_state_values(frozen._trial_id, state=optuna.trial.TrialState.FAIL)
            study.enqueue_trial(dict(frozen.params), user_attrs={"sparkml_dist_rerun_of": frozen.number})
        elif frozen.state.name in _STATES and "sparkml_dist_rerun" not in frozen.user_attrs:
            kept[frozen.number] = _record(frozen, tuner)
    return study, kept


def _record(frozen, tuner) -> TrialRecord:
    """What the tuner keeps of a trial an earlier run finished."""
    rec = TrialRecord(frozen, {**frozen.params, **tuner.constants})
    rec.state = _STATES[frozen.state.name]
    rec.value = frozen.value if rec.state in ("complete", "stopped") else None
    rec.history = {int(step): {tuner.metric: value} for step, value in frozen.intermediate_values.items()}
    if frozen.datetime_start and frozen.datetime_complete:
        rec.seconds = (frozen.datetime_complete - frozen.datetime_start).total_seconds()
    rec.error = frozen.user_attrs.get("sparkml_dist_error")
    return rec
