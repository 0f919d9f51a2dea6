"""One trial of a :class:`~sparkml_dist.tune.Tuner` inside its Spark task.  [executor]

``trial_task`` is the task of a one-partition Spark job: it unpickles the user's function once per
Python worker, connects back to the driver's channel (authenticated with the run's secret), calls
``fn(params, trial)`` and sends what it returns (or its traceback) back through the collection
layer.  :class:`Trial` is what the function gets: ``report(step, **metrics)`` sends metrics to the
driver, which answers whether the trial should stop; ``should_stop()`` reads that answer.
"""

from __future__ import annotations

import math
import os
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Iterator, Optional, Tuple

import pyarrow as pa

from .. import collection, serialization
from ..channel import LogClient
from ..gpus import task_addresses
from ..runner.protocol import IN_TRIAL_ENV
from ..tracking import metric_values

# the tuner's frames on the log channel (sparkml_dist.channel), both ways
FRAME_REPORT = "report"  # trial -> driver: {"trial", "seq", "step", "metrics"}
# driver -> trial: {"seq", "stop"} answering a report, or {"stop": true} at any time

ACK_WAIT = 5.0  # seconds report() waits for the driver's answer before returning anyway
GANG_ACK_WAIT = 600.0  # ... on a rank of a gang trial, whose answer waits for rank 0's report


@dataclass(frozen=True)
class TrialSpec:
    number: int
    params: Dict[str, Any]
    payload: bytes  # the pickled function
    key: str
    channel: Tuple[str, int]
    secret: bytes
    gpus: Optional[Tuple[str, ...]] = None  # local mode: the driver's GPUs this trial may use


class Trial:
    """What a trial's function gets next to its parameters.

    Attributes:
        number: the trial's number (0, 1, ...), as in the results' ``trial`` column.
        params: the parameters drawn for this trial.
        gpus: the GPU addresses Spark (or, in local mode, the tuner) gave this trial; empty without.
        device: ``"cuda:<first GPU>"`` when it has GPUs, else ``"cpu"``.
    """

    def __init__(
        self, number: int, params: Dict[str, Any], gpus=(), client: Optional[LogClient] = None,
        rank: Optional[int] = None,
    ):  # fmt: skip
        self.number = number
        self.params = dict(params)
        self.gpus = tuple(gpus or ())
        self.device = f"cuda:{self.gpus[0]}" if self.gpus else "cpu"
        self.rank = rank  # a rank of a gang trial (ranks_per_trial > 1); None: a one-task trial
        self.reports: Dict[int, Dict[str, float]] = {}
        self._client = client
        self._stop = threading.Event()
        self._acks: Dict[int, threading.Event] = {}
        self._answers: Dict[int, bool] = {}
        self._seq = 0
        self._lock = threading.Lock()

    # the driver's answers (reader thread)
    def _on_frame(self, message: dict) -> None:
        seq = message.get("seq")
        if self.rank is None and message.get("stop"):
            self._stop.set()
        elif self.rank is not None and isinstance(seq, int) and message.get("stop"):
            self._answers[seq] = True  # a gang stops only by a report's answer: the same step on every rank
        event = self._acks.get(seq)
        if event is not None:
            event.set()

    def report(self, step: int, **metrics) -> None:
        """Send this step's metrics to the driver; returns once the driver has answered (at most a
        few seconds), so :meth:`should_stop` right after reflects this report."""
        if not metrics:
            raise ValueError("trial.report(step, name=value, ...): give at least one metric")
        values = metric_values("trial.report", step, metrics, step_required=True)
        self.reports[step] = values
        if self._client is None or self._stop.is_set() or not self._client.connected:
            return
        with self._lock:
            self._seq += 1
            seq = self._seq
            event = self._acks[seq] = threading.Event()
        frame = {
            "type": FRAME_REPORT,
            "trial": self.number,
            "seq": seq,
            "step": step,
            "metrics": _jsonable(values),
        }
        if self.rank is not None:
            frame["rank"] = self.rank
        self._client.send(frame)
        # a gang's rank waits for the answer rank 0's report of this step brings (every rank then
        # stops at the same step); a one-task trial goes on after a few seconds without one
        event.wait(GANG_ACK_WAIT if self.rank is not None else ACK_WAIT)
        self._acks.pop(seq, None)
        if self._answers.pop(seq, False):
            self._stop.set()

    def should_stop(self) -> bool:
        """True once the driver has stopped this trial (early stopping, or the tuning's timeout):
        return (your last reported metrics are kept).  On a gang trial's ranks it turns true after
        the report of one step on every rank, so they leave their collectives together."""
        return self._stop.is_set()


def _jsonable(values: Dict[str, float]) -> Dict[str, Any]:
    return {k: (None if math.isnan(v) or math.isinf(v) else v) for k, v in values.items()}


def _task_gpus(spec: TrialSpec) -> Tuple[str, ...]:
    if spec.gpus:
        return spec.gpus
    return tuple(task_addresses())


def _plain(out: Any) -> Any:
    """Numbers (numpy, 0-d tensors) as floats; other values as they are."""
    if isinstance(out, dict):
        return {k: _plain(v) for k, v in out.items()}
    if isinstance(out, bool) or out is None or isinstance(out, str):
        return out
    try:
        return float(out)
    except (TypeError, ValueError):
        return out


def run_trial(spec: TrialSpec) -> dict:
    """Call the function for this trial; what the driver gets back (never raises)."""
    fn = serialization.cached_loads(spec.payload, spec.key)
    trial = Trial(spec.number, spec.params, _task_gpus(spec))
    started = time.time()
    unreachable = None
    try:
        trial._client = LogClient(*spec.channel, spec.secret, on_frame=trial._on_frame, retry_for=10.0)
    except OSError as exc:  # the trial still runs: its reports come back with its result
        unreachable = f"{spec.channel[0]}:{spec.channel[1]} ({exc})"
    os.environ[IN_TRIAL_ENV] = str(spec.number)
    try:
        out = fn(dict(spec.params), trial)
        result = {"ok": True, "returned": _plain(out)}
    except Exception:  # recorded as a failed trial; the tuning goes on
        result = {"ok": False, "error": traceback.format_exc()}
    finally:
        os.environ.pop(IN_TRIAL_ENV, None)
        if trial._client is not None:
            trial._client.close()
    result.update(
        reports=trial.reports,
        stopped=trial.should_stop(),
        started=started,
        seconds=time.time() - started,
        unreachable=unreachable,
    )
    return result


def run_gang_rank(spec: TrialSpec) -> Optional[dict]:
    """One rank of a gang trial (``BarrierRunner(ranks_per_trial)``'s function): ``fn(params,
    trial)`` with a :class:`Trial` of this rank; rank 0's result is the trial's (what
    :func:`run_trial` gives); a rank that raises fails the gang, its traceback the trial's error."""
    from ..runner import context

    fn = serialization.cached_loads(spec.payload, spec.key)
    ctx = context()
    gpus = tuple(d.split(":", 1)[1] for d in ctx.devices)
    trial = Trial(spec.number, spec.params, gpus, rank=ctx.rank)
    started, unreachable = time.time(), None
    try:
        trial._client = LogClient(*spec.channel, spec.secret, on_frame=trial._on_frame, retry_for=10.0)
    except OSError as exc:  # its reports come back with its result: no early stopping then
        unreachable = f"{spec.channel[0]}:{spec.channel[1]} ({exc})"
    try:
        out = fn(dict(spec.params), trial)
    finally:
        if trial._client is not None:
            trial._client.close()
    if ctx.rank != 0:
        return None
    return {
        "ok": True,
        "returned": _plain(out),
        "reports": trial.reports,
        "stopped": trial.should_stop(),
        "started": started,
        "seconds": time.time() - started,
        "unreachable": unreachable,
    }


def trial_task(batches: Iterable[pa.RecordBatch], spec: TrialSpec) -> Iterator[pa.RecordBatch]:
    for _ in batches:  # the job's one row: nothing to read
        pass
    yield collection.encode(spec.number, 0, run_trial(spec))
